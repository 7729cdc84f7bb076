"""The vectorised aggregate path against a fresh batch run, over mixed-type values.

A ``count``/``sum`` batch of at least :data:`~merklog.engine.dataflow.VECTOR_MIN`
rows is reduced per group in numpy (:mod:`merklog.engine.dataflow.grouping`);
smaller ones, and batches whose summed values are not all int64 ints, go row by
row. These tests drive epochs of both sizes and both kinds through one engine —
group keys always mixed (``1``, ``1.0``, ``true``, ``"1"``, ``x"01"`` are five
groups), summed values sometimes all ints (vectorised), sometimes mixed or near
the int64 bounds (per tuple) — compare every relation with a fresh batch
evaluation after each epoch, and check that both paths ran.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine.dataflow import (
    VECTOR_MIN,
    BatchCache,
    GroupAggregate,
    Timestamp,
    group_sums,
)
from merklog.engine.incremental import AggregateJoin, IncrementalEngine
from merklog.engine.program import Program
from merklog.engine.values import TRUE, Float, row_to_engine

from .incremental_check import KEYS, assert_matches_batch, ops_of, summed_value

TEXT = """
stats(G, C, S) :- grp(G), C := count : p(G, _), S := sum V : p(G, V).
dbl(G, S) :- grp(G), S := sum V * 2 : p(G, V).
low(G, M) :- grp(G), M := min V : p(G, V).
total(N, S) :- N := count : p(_, _), S := sum V : p(_, V).
by2(G, H, C, S) :- q(G, H), C := count : r(G, H, _), S := sum V : r(G, H, V).
exact(G) :- want(G, C), C := count : p(G, _).
lonely(G) :- grp(G), !p(G, 1).
"""

RELS = ("stats", "dbl", "low", "total", "by2", "exact", "lonely", "p", "q", "r")


def _value(rng: random.Random, kind: str) -> object:
    return summed_value(rng, kind)


def _facts(rng: random.Random, n: int, kind: str) -> set[tuple]:
    """``n`` distinct ``p(key, value)`` rows in engine form (a set of plain rows would
    merge ``p(1, 2)``, ``p(1.0, 2)`` and ``p(true, 2)``)."""
    out: set[tuple] = set()
    while len(out) < n:
        out.add(row_to_engine((rng.choice(KEYS), _value(rng, kind))))
    return out


def _facts3(rng: random.Random, n: int, kind: str) -> set[tuple]:
    out: set[tuple] = set()
    while len(out) < n:
        out.add(row_to_engine((rng.choice(KEYS), rng.choice(KEYS), _value(rng, kind))))
    return out


def _check(engine: IncrementalEngine, base: dict[str, set[tuple]], checked) -> None:
    assert_matches_batch(engine, base, checked, RELS)


@settings(max_examples=10, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(
        st.tuples(
            st.sampled_from([1, 7, VECTOR_MIN - 1, VECTOR_MIN, 3 * VECTOR_MIN]),
            st.sampled_from(["int", "mixed", "big"]),
            st.floats(0, 1),
        ),
        min_size=2,
        max_size=6,
    ),
)
def test_large_and_small_epochs_equal_a_fresh_batch_run(seed: int, epochs: list) -> None:
    rng = random.Random(seed)
    checked = Program.parse(TEXT).checked
    engine = IncrementalEngine(checked)
    base: dict[str, set[tuple]] = {
        "grp": {row_to_engine((k,)) for k in KEYS},
        "q": {row_to_engine((a, b)) for a in KEYS[:5] for b in KEYS[3:8]},
        "want": {row_to_engine((k, rng.randrange(4))) for k in KEYS},
        "p": set(),
        "r": set(),
    }
    # A first bulk epoch of int values (the vectorised path), then the drawn epochs.
    p0, r0 = _facts(rng, 2 * VECTOR_MIN, "int"), _facts3(rng, 2 * VECTOR_MIN, "int")
    base["p"] |= p0
    base["r"] |= r0
    engine.step(inserts={**{k: list(v) for k, v in base.items() if k not in ("p", "r")},
                         "p": list(p0), "r": list(r0)})  # fmt: skip
    _check(engine, base, checked)
    for size, kind, drop in epochs:
        gone_p = {r for r in base["p"] if rng.random() < drop / 4}
        gone_r = {r for r in base["r"] if rng.random() < drop / 4}
        new_p, new_r = _facts(rng, size, kind), _facts3(rng, size, kind)
        base["p"] = (base["p"] - gone_p) | new_p
        base["r"] = (base["r"] - gone_r) | new_r
        engine.step(
            deletes={"p": list(gone_p), "r": list(gone_r)},
            inserts={"p": list(new_p), "r": list(new_r)},
        )
        _check(engine, base, checked)
    # Retract everything in one epoch: groups empty, count/sum fall back to 0.
    engine.step(deletes={"p": list(base["p"]), "r": list(base["r"])})
    base["p"], base["r"] = set(), set()
    _check(engine, base, checked)
    aggs = ops_of(engine, GroupAggregate)
    assert sum(op.vectorised for op in aggs) > 0
    assert sum(op.per_tuple for op in aggs) > 0
    assert any(op.bound is not None for op in ops_of(engine, AggregateJoin))


def test_group_keys_keep_value_identity() -> None:
    rows = [(1, 5), (Float(1.0), 5), (TRUE, 5), ("1", 5), (b"\x01", 5), (1, 6)]
    sums = group_sums(dict.fromkeys(rows, 1), [0], lambda r: r[1])
    assert sums is not None
    assert sums.keys == [(1,), (Float(1.0),), (TRUE,), ("1",), (b"\x01",)]
    assert sums.counts == [2, 1, 1, 1, 1]
    assert sums.sums == [11, 5, 5, 5, 5]
    assert [type(k[0]) for k in sums.keys][:3] == [int, Float, type(TRUE)]


def test_group_sums_declines_what_int64_cannot_hold_exactly() -> None:
    def value(r: tuple) -> object:
        return r[1]

    assert group_sums({(1, 0.5): 1, (1, 2): 1}, [0], value) is None  # a float value
    assert group_sums({(1, TRUE): 1}, [0], value) is None  # a bool is not an int
    assert group_sums({(1, 2**63): 1}, [0], value) is None  # outside int64
    # Each value fits, but their partial sums could leave int64.
    assert group_sums({(1, 2**62): 1, (2, 2**62): 1}, [0], value) is None
    assert group_sums({(1, 2**62): 1}, [0], value) is not None
    assert group_sums({(1, 2): 2**63}, [0], value) is None  # a weight outside int64


def test_aggregates_over_one_stream_share_one_read_of_a_batch() -> None:
    cache = BatchCache()
    delta = {(g % 3, g): 1 for g in range(VECTOR_MIN)}
    count = GroupAggregate("count", [0], cache=cache)
    total = GroupAggregate("sum", [0], lambda r: r[1], cache=cache)
    out_c, out_s = count.eval(Timestamp(0), delta), total.eval(Timestamp(0), delta)
    ts = Timestamp(0)
    assert cache.get(delta, ts).groups([0]) is cache.get(delta, ts).groups([0])
    # The same timestamp with another delta, or another timestamp, is another batch.
    assert cache.get(dict(delta), ts) is not cache.get(delta, ts)
    assert cache.get(delta, Timestamp(1)) is not cache.get(delta, ts)
    assert out_c == {(0, 86): 1, (1, 85): 1, (2, 85): 1}
    assert out_s == {(g, sum(range(g, VECTOR_MIN, 3))): 1 for g in range(3)}
    assert count.vectorised == total.vectorised == 1
