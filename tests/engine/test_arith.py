"""Arithmetic and comparison semantics shared by every evaluator (engine/arith.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from merklog.engine.arith import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    NoBinding,
    arith,
    compare,
    make_arith,
    make_compare,
    negate,
    sort_key,
)
from merklog.engine.values import FALSE, TRUE, Float, from_engine, to_engine
from merklog.store import Link

CID = Link.for_dag_cbor(b"\xa0")


@pytest.mark.parametrize(
    ("op", "a", "b", "want"),
    [
        ("+", 2, 3, 5),
        ("-", 2, 3, -1),
        ("*", -4, 3, -12),
        ("/", 7, 2, 3),
        ("/", -7, 2, -3),
        ("/", 7, -2, -3),
        ("/", -7, -2, 3),
        ("%", 7, 2, 1),
        ("%", -7, 2, -1),
        ("%", 7, -2, 1),
        ("+", 1, 0.5, 1.5),
        ("/", 1, 2.0, 0.5),
        ("%", -7.5, 2, -1.5),
        ("+", "ab", "cd", "abcd"),
        ("+", b"\x00", b"\x01", b"\x00\x01"),
    ],
)
def test_arith_values(op, a, b, want):
    want = to_engine(want)  # results are engine values: a float result is a Float
    assert arith(op, a, b) == want
    assert type(arith(op, a, b)) is type(want)
    assert make_arith(op)(a, b) == want
    # Engine-form operands give the same results.
    assert arith(op, to_engine(a), to_engine(b)) == want


@pytest.mark.parametrize(
    ("op", "a", "b"),
    [
        ("/", 1, 0),
        ("%", 1, 0),
        ("/", 1.0, 0),
        ("%", 1.5, 0.0),
        ("+", INT64_MAX, 1),
        ("-", INT64_MIN, 1),
        ("*", INT64_MAX, 2),
        ("/", INT64_MIN, -1),
        ("*", 1e308, 10.0),
        ("+", "a", 1),
        ("-", "a", "b"),
        ("+", True, 1),
        ("+", CID, CID),
    ],
)
def test_arith_without_a_value_raises_no_binding(op, a, b):
    with pytest.raises(NoBinding):
        arith(op, a, b)
    with pytest.raises(NoBinding):
        make_arith(op)(a, b)


def test_soufflé_32_bit_wraps_twos_complement():
    assert arith("+", INT32_MAX, 1, int_bits=32) == INT32_MIN
    assert arith("*", 65536, 65536, int_bits=32) == 0
    assert arith("-", INT32_MIN, 1, int_bits=32) == INT32_MAX
    assert arith("/", INT32_MIN, -1, int_bits=32) == INT32_MIN
    assert make_arith("+", 32)(INT32_MAX, 1) == INT32_MIN
    assert negate(INT32_MIN, 32) == INT32_MIN
    with pytest.raises(NoBinding):
        negate(INT64_MIN)
    assert negate(2.5) == Float(-2.5) and negate(Float(0.0)) == Float(0.0)


def test_negative_zero_is_normalised():
    r = arith("*", -1.0, 0.0)
    assert r == Float(0.0) and str(from_engine(r)) == "0.0"


@given(st.integers(INT64_MIN, INT64_MAX), st.integers(INT64_MIN, INT64_MAX).filter(bool))
def test_truncating_division_identity(a, b):
    try:
        q = arith("/", a, b)
    except NoBinding:
        assert (a, b) == (INT64_MIN, -1)
        return
    r = arith("%", a, b)
    assert q * b + r == a
    assert abs(r) < abs(b)
    assert r == 0 or (r > 0) == (a > 0)


@pytest.mark.parametrize(
    ("op", "a", "b", "want"),
    [
        ("==", 1, 1.0, True),
        ("<", 1, 1.5, True),
        ("==", True, 1, False),
        ("!=", True, 1, True),
        ("<", False, True, True),
        ("==", "a", "a", True),
        ("<", "a", "b", True),
        ("<", b"\x00", b"\x01", True),
        ("==", "1", 1, False),
        ("!=", "1", 1, True),
        ("<", "1", 2, False),
        (">=", "1", 2, False),
        ("==", CID, CID, True),
        ("<=", CID, CID, True),
        ("<", 1, "a", False),
        ("<", 2**62, 2**62 + 1.0, False),
    ],
)
def test_compare(op, a, b, want):
    assert compare(op, a, b) is want
    assert make_compare(op)(a, b) is want
    assert compare(op, to_engine(a), to_engine(b)) is want


@pytest.mark.parametrize("op", ["<", "<=", ">", ">="])
def test_bool_is_not_ordered_against_numbers(op):
    for num in (0, 1, 2, 0.5, 1.0):
        assert compare(op, TRUE, to_engine(num)) is False
        assert compare(op, to_engine(num), FALSE) is False


def test_engine_bools_compare_like_bools():
    assert compare("<", FALSE, TRUE) and compare("<=", TRUE, TRUE) and compare(">=", TRUE, FALSE)
    assert compare("==", TRUE, TRUE) and not compare("==", TRUE, FALSE)
    assert not compare("==", TRUE, 1) and compare("!=", FALSE, 0)


def test_int_and_float_compare_exactly():
    big = 2**53 + 1
    assert compare(">", big, Float(2.0**53)) and not compare("==", big, Float(2.0**53))
    assert compare("==", 3, Float(3.0)) and compare("<=", Float(3.0), 3)


def test_float_results_are_floats_even_when_whole():
    assert arith("+", Float(0.5), Float(0.5)) == Float(1.0)
    assert arith("+", Float(0.5), Float(0.5)) != 1
    assert arith("*", 2, Float(-0.0)) == Float(0.0)


def test_sort_key_total_order_across_types():
    values = [CID, b"\x00", "a", 2.5, 1, True, False]
    assert sorted(values, key=sort_key) == [False, True, 1, 2.5, "a", b"\x00", CID]
    engine = [to_engine(v) for v in values]
    assert [from_engine(v) for v in sorted(engine, key=sort_key)] == sorted(values, key=sort_key)


def test_sort_key_puts_an_int_before_the_equal_float():
    assert sorted([Float(1.0), 1, TRUE], key=sort_key) == [TRUE, 1, Float(1.0)]
    assert sorted([1, Float(1.0)], key=sort_key) == sorted([Float(1.0), 1], key=sort_key)


def test_unknown_operators_are_programming_errors():
    with pytest.raises(ValueError):
        make_arith("^")
    with pytest.raises(ValueError):
        make_compare("=")
