"""The engine value representation keeps merklog value identity where Python would not."""

from __future__ import annotations

import copy
import pickle

from hypothesis import given
from hypothesis import strategies as st

from merklog.engine.values import (
    FALSE,
    TRUE,
    Bool,
    Float,
    from_engine,
    row_from_engine,
    row_to_engine,
    to_engine,
    value_type,
)
from merklog.store import Link, fact_cid, make_fact

merklog_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.sampled_from([0, 1, 0.0, 1.0, -0.0, True, False, "1", b"\x01"]),
)


def test_one_and_one_point_oh_and_true_are_three_values() -> None:
    vals = {to_engine(1), to_engine(1.0), to_engine(True), to_engine("1"), to_engine(b"\x01")}
    assert len(vals) == 5
    assert (1,) != (TRUE,)
    assert (1,) != (Float(1.0),)
    assert Float(1.0) != 1 and 1 != Float(1.0)
    assert TRUE != 1 and FALSE != 0 and FALSE != Float(0.0)


def test_negative_zero_is_normalised_like_the_store() -> None:
    assert str(float(to_engine(-0.0))) == "0.0"
    assert fact_cid(make_fact("p", (from_engine(to_engine(-0.0)),))) == fact_cid(
        make_fact("p", (0.0,))
    )


def test_bool_singletons_survive_copy_and_pickle() -> None:
    assert Bool(True) is TRUE and Bool(False) is FALSE
    assert copy.deepcopy(TRUE) is TRUE
    assert pickle.loads(pickle.dumps((TRUE, Float(2.5)))) == (TRUE, Float(2.5))
    assert FALSE < TRUE and not TRUE < FALSE


def test_float_orders_exactly_against_ints() -> None:
    assert Float(9007199254740992.0) < 9007199254740993
    assert not Float(9007199254740992.0) > 9007199254740993


@given(st.lists(merklog_values, max_size=6))
def test_engine_identity_is_cid_identity(values: list) -> None:
    """Two values are one engine value exactly when they have one fact CID."""
    for a in values:
        for b in values:
            same_engine = to_engine(a) == to_engine(b)
            same_cid = fact_cid(make_fact("p", (a,))) == fact_cid(make_fact("p", (b,)))
            assert same_engine == same_cid, (a, b)
            if same_engine:
                assert hash(to_engine(a)) == hash(to_engine(b))


@given(st.lists(merklog_values, max_size=6))
def test_round_trip_keeps_type_and_value(values: list) -> None:
    row = tuple(values)
    back = row_from_engine(row_to_engine(row))
    assert [type(v) for v in back] == [type(v) for v in row]
    assert [value_type(v) for v in back] == [value_type(v) for v in row_to_engine(row)]
    assert all(
        fact_cid(make_fact("p", (a,))) == fact_cid(make_fact("p", (b,)))
        for a, b in zip(row, back, strict=True)
    )


def test_links_pass_through() -> None:
    link = fact_cid(make_fact("p", (1,)))
    assert isinstance(link, Link) and to_engine(link) is link and value_type(link) == "cid"
