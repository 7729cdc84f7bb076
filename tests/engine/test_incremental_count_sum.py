"""``count``/``sum`` joined to bindings that are their groups, by one ``CountSumJoin``.

When every aggregate of a run is a ``count`` or a ``sum`` of a variable over the same
stream and the rule's bindings are exactly the groups (``grp(G)`` with groups ``G``),
one operator keeps the group state in numpy arrays and joins it (ADR 0104). These
tests drive epochs of inserts and deletes through such rules — large epochs (the
numpy path) and small ones (the per-group path), group keys always mixed (``1``,
``1.0``, ``true``, ``"1"``, ``x"01"`` are five groups), summed values sometimes ints,
sometimes mixed types (floats summed exactly, strings and bools blocking the sum),
sometimes near the int64 bounds (an overflowing sum derives nothing, and derives again
once a retraction brings it back), bindings changing in the same epochs — and compare
every relation with a fresh batch evaluation after each epoch, in both dialects.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine.batch import BatchEvaluator
from merklog.engine.dataflow import CountSumJoin
from merklog.engine.dataflow.lazydelta import SignedRows
from merklog.engine.incremental import IncrementalEngine, MultiAggregateJoin
from merklog.engine.program import Program
from merklog.engine.values import row_to_engine

from .incremental_check import KEYS, MIXED, assert_matches_batch, ops_of, summed_value

TEXT = """
stats(G, C, S) :- grp(G), C := count : p(G, _), S := sum V : p(G, V).
two(G, S, T) :- grp(G), S := sum V : p(G, V), T := sum W : p(G, W).
cnt(G, H, C) :- q(G, H), C := count : r(G, H, _).
sums(G, H, S, C) :- q(G, H), S := sum V : r(G, H, V), C := count : r(G, H, _).
total(N, S) :- N := count : p(_, _), S := sum V : p(_, V).
many(G, C) :- grp(G), C := count : p(G, _), C > 2.
wide(G, H, C) :- q(G, H), C := count : p(G, _).
"""

RELS = ("stats", "two", "cnt", "sums", "total", "many", "wide", "p", "q", "r", "grp")
MIXED_SUMS = [*MIXED, 1e16, -1e16]


def _value(rng: random.Random, kind: str) -> object:
    return summed_value(rng, kind, mixed=MIXED_SUMS)


def _facts(rng: random.Random, n: int, kind: str, arity: int) -> set[tuple]:
    """``n`` distinct rows in engine form (``p(1, 2)``, ``p(1.0, 2)`` and ``p(true, 2)``
    are three rows): ``arity - 1`` mixed keys and a value."""
    out: set[tuple] = set()
    while len(out) < n:
        keys = tuple(rng.choice(KEYS[:6] if arity == 3 else KEYS) for _ in range(arity - 1))
        out.add(row_to_engine((*keys, _value(rng, kind))))
    return out


@settings(max_examples=15, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(
        st.tuples(
            st.sampled_from([1, 5, 30, 200, 600]),
            st.sampled_from(["int", "int", "mixed", "big"]),
            st.floats(0, 1),
            st.booleans(),
        ),
        min_size=2,
        max_size=6,
    ),
)
def test_count_sum_joins_equal_a_fresh_batch_run(seed: int, epochs: list) -> None:
    rng = random.Random(seed)
    checked = Program.parse(TEXT).checked
    engine = IncrementalEngine(checked)
    all_grp = {row_to_engine((k,)) for k in KEYS}
    base: dict[str, set[tuple]] = {
        "grp": {r for r in all_grp if rng.random() < 0.7},
        "q": {row_to_engine((a, b)) for a in KEYS[:6] for b in KEYS[:6] if rng.random() < 0.5},
        "p": _facts(rng, 300, "int", 2),
        "r": _facts(rng, 300, "int", 3),
    }
    engine.step(inserts={rel: list(rows) for rel, rows in base.items()})
    assert_matches_batch(engine, base, checked, RELS)
    for size, kind, drop, churn in epochs:
        deletes: dict[str, list] = {}
        inserts: dict[str, list] = {}
        for rel, arity in (("p", 2), ("r", 3)):
            gone = {r for r in base[rel] if rng.random() < drop / 3}
            new = _facts(rng, size, kind, arity) - gone
            base[rel] = (base[rel] - gone) | new
            deletes[rel], inserts[rel] = list(gone), list(new)
        if churn:  # bindings change in the same epoch as the aggregates
            grp_new = {r for r in all_grp if rng.random() < 0.5}
            deletes["grp"], inserts["grp"] = list(base["grp"] - grp_new), list(grp_new)
            base["grp"] = grp_new
        engine.step(deletes=deletes, inserts=inserts)
        assert_matches_batch(engine, base, checked, RELS)
    # One small epoch (the per-group path), then every aggregated row retracted at
    # once: count and sum fall back to 0.
    one: set[tuple] = set()
    while not one:
        one = _facts(rng, 1, "int", 2) - base["p"]
    engine.step(inserts={"p": list(one)})
    base["p"] |= one
    assert_matches_batch(engine, base, checked, RELS)
    engine.step(deletes={"p": list(base["p"]), "r": list(base["r"])})
    base["p"], base["r"] = set(), set()
    assert_matches_batch(engine, base, checked, RELS)
    joins = ops_of(engine, CountSumJoin)
    assert len(joins) == 6  # all but ``wide``, whose bindings are not its groups
    assert sum(j.vectorised for j in joins) > 0
    assert sum(j.per_group for j in joins) > 0
    assert any(type(n.op) is MultiAggregateJoin or "wide" in n.label for n in engine.circuit.nodes
               if hasattr(n, "op"))  # fmt: skip


def test_groups_without_a_value_block_and_recover_in_both_paths() -> None:
    """An int64 overflow of a group's total, and a string in it, block the join; the
    group derives again when they are retracted — in large (numpy) and small epochs."""
    checked = Program.parse(TEXT).checked
    engine = IncrementalEngine(checked)
    one_f = row_to_engine((1.0,))[0]
    base: dict[str, set[tuple]] = {
        "grp": {(1,), (2,), (one_f,)},
        "p": set(),
        "q": set(),
        "r": set(),
    }
    engine.step(inserts={"grp": list(base["grp"])})
    filler = iter(range(10**6, 2 * 10**6))

    def epoch(ins: set[tuple] = frozenset(), dels: set[tuple] = frozenset(), large=False) -> None:
        more = {(2, next(filler)) for _ in range(100)} if large else set()
        engine.step(inserts={"p": list(ins | more)}, deletes={"p": list(dels)})
        base["p"] = (base["p"] - dels) | ins | more
        assert_matches_batch(engine, base, checked, RELS)

    def stats_of(key: object) -> set[tuple]:
        return {
            r for r in engine.relation("stats").engine if r[0] == key and type(r[0]) is type(key)
        }

    epoch({(1, 2**62), (1, 2**62 - 5)})  # small: 2**63 - 5 still fits
    assert stats_of(1) == {(1, 2, 2**63 - 5)}
    epoch({(1, 100)}, large=True)  # the numpy path meets the overflow
    assert stats_of(1) == set()  # no value: the group joins nothing
    joins = ops_of(engine, CountSumJoin)
    assert sum(j.slow_groups for j in joins) > 0 and sum(j.vectorised for j in joins) > 0
    epoch({(1, "x"), (one_f, 1.5)})  # a string in group 1; a float sum for key 1.0
    epoch(dels={(1, 100)}, large=True)  # back in range, but the string still blocks
    assert stats_of(1) == set()
    epoch(dels={(1, "x")})
    assert stats_of(1) == {(1, 2, 2**63 - 5)}  # derives again
    assert stats_of(one_f) == {(one_f, 1, row_to_engine((1.5,))[0])}


def test_large_epochs_hand_on_signed_rows() -> None:
    """A large epoch of the benchmark's shape leaves the join as a ``SignedRows`` delta
    and the relation's distinct applies it without a per-row loop."""
    engine = IncrementalEngine(Program.parse(TEXT).checked)
    engine.step(inserts={"grp": [(g,) for g in range(50)], "p": [(g % 50, g) for g in range(500)]})
    seen: list[object] = []
    engine.inspect_nodes(lambda node, ts, v: seen.append(v) if "stats" == node.label else None)
    engine.step(inserts={"p": [(g % 50, 1000 + g) for g in range(200)]})
    assert seen and all(type(v) is SignedRows for v in seen)
    want = {(g, 14, sum(range(g, 500, 50)) + sum(range(1000 + g, 1200, 50))) for g in range(50)}
    assert engine.relation("stats").engine == want
    assert engine.count("stats") == 50


SOUFFLE = """
.decl grp(g: number)
.input grp
.decl p(g: number, v: number)
.input p
.decl s(g: number, c: number, t: number)
.output s
s(g, c, t) :- grp(g), c = count : p(g, _), t = sum v : p(g, v).
"""


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.sampled_from([1, 20, 300]), min_size=1, max_size=4))
def test_souffle_sums_wrap_at_32_bits_in_both_paths(seed: int, sizes: list[int]) -> None:
    rng = random.Random(seed)
    checked = Program.parse(SOUFFLE, dialect="souffle").checked
    assert checked.int_bits == 32
    engine = IncrementalEngine(checked)
    base: dict[str, set[tuple]] = {"grp": {(g,) for g in range(6)}, "p": set()}
    engine.step(inserts={"grp": list(base["grp"])})

    def check() -> None:
        strata = [list(s.rules) for s in checked.strata if not s.temporal]
        ref = BatchEvaluator(checked.program.rules, strata=strata, int_bits=32).evaluate(base)
        assert engine.relation("s").engine == ref.engine("s")

    for size in sizes:
        gone = {r for r in base["p"] if rng.random() < 0.3}
        new: set[tuple] = set()
        while len(new) < size:
            new.add(
                (rng.randrange(6), rng.choice([2**31 - 1, -(2**31), 2**40]) - rng.randrange(99))
            )
        new -= gone
        base["p"] = (base["p"] - gone) | new
        engine.step(deletes={"p": list(gone)}, inserts={"p": list(new)})
        check()
    joins = ops_of(engine, CountSumJoin)
    assert len(joins) == 1
    assert joins[0].vectorised + joins[0].per_group > 1


def test_small_vectorised_epochs_over_many_groups() -> None:
    """Thousands of groups and epochs of ~60 rows: the numpy path sorts the epoch's group
    ids instead of scanning every group's slot; keys and values of mixed types."""
    rng = random.Random(5)
    checked = Program.parse(TEXT).checked
    engine = IncrementalEngine(checked)
    keys = [row_to_engine((k,))[0] for k in [*range(1500), *map(float, range(600)), "x", True]]
    base: dict[str, set[tuple]] = {
        "grp": {(k,) for k in keys if rng.random() < 0.8},
        "p": {(rng.choice(keys), rng.randrange(-50, 50)) for _ in range(3000)},
        "q": set(),
        "r": set(),
    }
    engine.step(inserts={rel: list(rows) for rel, rows in base.items()})
    joins = ops_of(engine, CountSumJoin)
    before = sum(j.vectorised for j in joins)
    for kind in ["int", "int", "mixed", "int", "big", "int"]:
        gone = set(rng.sample(sorted(base["p"], key=repr), 30))
        new: set[tuple] = set()
        while len(new) < 30:
            new.add(row_to_engine((rng.choice(keys), _value(rng, kind))))
        new -= gone
        base["p"] = (base["p"] - gone) | new
        engine.step(deletes={"p": list(gone)}, inserts={"p": list(new)})
        assert_matches_batch(engine, base, checked, RELS)
    assert sum(j.vectorised for j in joins) > before + 4
