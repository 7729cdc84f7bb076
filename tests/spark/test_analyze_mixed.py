"""analyze over columns that mix value types == the local engine (small inputs given in
Python; the export-based three-way comparison is tests/spark/test_parity.py)."""

from __future__ import annotations

import random

import pyarrow.parquet as pq
import pytest

from merklog.engine.parser import parse_program
from merklog.engine.program import Program
from merklog.engine.rows import RowSet, engine_rows
from merklog.node.spark.analyze import evaluate, relations_from_rows, write_outputs
from merklog.node.spark.schema import decode_args
from merklog.node.spark.typed import link_order_key
from merklog.store import Link
from merklog.store.link import uvarint

pytestmark = pytest.mark.spark


def _link(rng: random.Random) -> Link:
    """A CIDv1 of a random codec and digest length (so raw lengths differ too): codecs
    multiformats knows (a Link refuses others), with varints of one to three bytes."""
    codec = rng.choice([0x55, 0x70, 0x71, 0x0129, 0xB220])
    digest = rng.randbytes(rng.choice([0, 1, 2, 5, 20, 32]))
    return Link(bytes([0x01]) + uvarint(codec) + bytes([0x00, len(digest)]) + digest)


def test_link_order_key_orders_cids_by_their_bytes(spark):
    rng = random.Random(7)
    links = list({_link(rng) for _ in range(300)})
    df = spark.createDataFrame([(str(x),) for x in links], "c string")
    got = [Link.parse(r["c"]) for r in df.orderBy(link_order_key(df["c"])).collect()]
    assert got == sorted(links, key=lambda x: x.raw)
    assert sorted(links, key=str) != got  # the plain text order is another order


def test_mixed_columns_match_the_engine(spark):
    rng = random.Random(3)
    lo, hi = sorted((Link.for_block(rng.randbytes(4), 0x71) for _ in range(2)), key=lambda x: x.raw)
    while str(lo) < str(hi):  # CIDs whose text order is not their byte order
        lo, hi = sorted(
            (Link.for_block(rng.randbytes(4), 0x71) for _ in range(2)), key=lambda x: x.raw
        )
    mix = [1, 1.0, True, False, 0, 0.0, "1", "", b"\x01", b"\xff\x00", b"", lo, hi, 2.5, -7]
    mix += [2**53, 2.0**53, 2**53 + 1, 2**63 - 1, -(2**63), 1e308]
    base = {
        "m": [(v,) for v in mix],
        "s": [(1,), ("1",), (b"\x01",), (True,)],
        "pair": [(1, 1.0), (1, 1), (True, True), (1.0, 1.0), ("a", "a"), (2, True), (True, 2)]
        + [("zz", 0), ("zz", 0.0), (4, 2), (4, 2.0)],
        "kv": [(k, v) for k in (1, 1.0, True, "k") for v in rng.sample(mix, 6)]
        + [(2, 2**63 - 1), (2, 1), (4, 2.5), (4, 1), (5, lo), (5, hi), (6, "x"), (6, 1)]
        + [(7, 1e308), (7, 1.7e308), (8, 2**53 + 1), (8, 1.0), (9, b"\xff"), (9, b"\x01\x00")]
        + [(20, 0), (21, 2), (21, 0), (22, 1.0), (22, 0.5), (22, 0.5)],
        "k": [(1,), (1.0,), (True,), (4,), (8,), (10,)],
        "none": [],
    }
    text = """
        j(X) :- m(X), s(X).
        n(X) :- m(X), !s(X).
        c1(X) :- m(X), X == 1.
        c2(X, Y) :- m(X), m(Y), X < Y, Y <= 1.
        rep(X) :- pair(X, X).
        kon(V) :- kv(1, V).
        kontrue(V) :- kv(true, V).
        plus(X, Y) :- m(X), Y == X + 1.
        twice(X, Y) :- m(X), Y == X + X.
        minus(X, Y) :- m(X), Y == -X.
        cnt(K, N) :- kv(K, _), N := count : kv(K, _).
        sm(K, S) :- kv(K, _), S := sum V : kv(K, V).
        smk(K, S) :- k(K), S := sum V : kv(K, V).
        smx(K, S) :- k(K), S := sum V * 2 : kv(K, V).
        mn(K, S) :- kv(K, _), S := min V : kv(K, V).
        mx(K, S) :- kv(K, _), S := max V : kv(K, V).
        gmin(M) :- M := min V : m(V).
        gmax(M) :- M := max V : m(V).
        big(X) :- m(X), X > 9007199254740992.0.
        u(X) :- m(X), X == 1.
        u(X) :- s(X).
        rec(X, Y) :- pair(X, Y).
        rec(X, Z) :- rec(X, Y), pair(Y, Z).
        cids(C, X) :- C := m(X).
        p(1). p(1.0). p(true).
        q(X) :- p(X).
        bound(K, N) :- pair(K, N), N := count : kv(K, _).
        bound0(K, N) :- pair(K, N), N := count : none(K).
        boundsum(K, S) :- kv(K, S), S := sum V : kv(K, V).
    """
    program = parse_program(text)
    expected = Program.parse(text).evaluate(base)
    got = evaluate(spark, program, relations_from_rows(spark, base))
    for rel in sorted({r.head.rel for r in program.rules}):
        assert got.rows(rel) == expected[rel], rel
    assert len(got.rows("q")) == 3 and len(got.rows("c1")) == 2  # 1 and 1.0, not true
    assert (5, lo) in got.rows("mn") and (5, hi) in got.rows("mx")  # CIDs by bytes
    assert (8, float(2**53 + 2)) in got.rows("sm")  # exact, rounded once
    assert (10, 0) in got.rows("smk") and (10, 0.0) not in got.rows("smk")  # the int 0
    assert ("zz", 0) in got.rows("bound") and ("zz", 0.0) not in got.rows("bound")
    assert (4, 2) in got.rows("bound") and ("zz", 0) in got.rows("bound0")
    assert (20, 0) in got.rows("boundsum") and (21, 2) in got.rows("boundsum")


def test_integer_division_truncates_like_the_engine(spark):
    """``/`` truncates toward zero exactly (no rounding of a quotient near a whole number,
    9999999 / 10000000 is 0), in native int columns and in columns that mix types."""
    big = [2**53, 2**53 + 1, 2**63 - 1, -(2**63), -(2**63) + 1, -1, 1, 7, -7]
    ints = [9999999, -9999999, 29999999, 10000000, 19999999, -29999999] + big
    base = {"i": [(x,) for x in ints], "m": [(x,) for x in ints] + [(1.5,), ("1",), (True,)]}
    text = """
        q(X, Y, Z) :- i(X), i(Y), Z == X / Y.
        mq(X, Y, Z) :- m(X), m(Y), Z == X / Y.
    """
    program = parse_program(text)
    expected = Program.parse(text).evaluate(base)
    got = evaluate(spark, program, relations_from_rows(spark, base))
    for rel in ("q", "mq"):
        assert got.rows(rel) == expected[rel], rel
        rows = got.rows(rel)
        assert (9999999, 10000000, 0) in rows and (-9999999, 10000000, 0) in rows
        assert (29999999, 10000000, 2) in rows
        assert (2**53, 2**53 + 1, 0) in rows and (2**63 - 1, -(2**63), 0) in rows
        assert (2**63 - 1, 2**53 + 1, 1023) in rows
        assert not [r for r in rows if r[:2] == (-(2**63), -1)]  # overflows: no value


def test_int64_min_remainder_minus_one_is_zero(spark):
    """``-2^63 % -1`` is 0 (in range; only ``-2^63 / -1`` overflows), in native int columns
    and in columns that mix types, as in the engine."""
    ints = [-(2**63), -(2**63) + 1, 2**63 - 1, -1, 1, 7, -7, 0]
    base = {"i": [(x,) for x in ints], "m": [(x,) for x in ints] + [(1.5,), ("1",), (True,)]}
    text = """
        r(X, Y, Z) :- i(X), i(Y), Z == X % Y.
        r1(Z) :- i(X), Z == X % -1.
        mr(X, Y, Z) :- m(X), m(Y), Z == X % Y.
    """
    program = parse_program(text)
    expected = Program.parse(text).evaluate(base)
    got = evaluate(spark, program, relations_from_rows(spark, base))
    for rel in ("r", "r1", "mr"):
        assert got.rows(rel) == expected[rel], rel
    assert (-(2**63), -1, 0) in got.rows("r") and (-(2**63), -1, 0) in got.rows("mr")


def test_mixed_outputs_round_trip_exactly(spark, tmp_path):
    rows = [(1, "a"), (1.0, "a"), (True, b"\x00"), ("1", 2.5), (Link.for_block(b"x", 0x55), 0)]
    program = parse_program("o(X, Y) :- m(X, Y).")
    result = evaluate(spark, program, relations_from_rows(spark, {"m": rows}))
    paths = write_outputs(result, ["o"], tmp_path / "pq", "parquet")
    table = pq.read_table(paths["o"]).to_pylist()
    assert _rows([decode_args(r["args"]) for r in table]) == _rows(rows)
    write_outputs(result, ["o"], tmp_path / "csv", "csv")
    text = "".join(p.read_text() for p in sorted((tmp_path / "csv" / "o").glob("*.csv")))
    facts = parse_program("".join(f"o({line}).\n" for line in text.strip().splitlines()[1:]))
    assert _rows([tuple(a) for _r, a in facts.facts]) == _rows(rows)


def _rows(rows: list[tuple]) -> RowSet:
    """Rows compared by identity (``1``, ``1.0`` and ``true`` stay three rows)."""
    return RowSet(engine_rows(rows))
