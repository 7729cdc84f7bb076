"""Several aggregates over the same groups, joined by one ``MultiAggregateJoin``.

``stats(G, C, S) :- grp(G), C := count : p(G, _), S := sum V : p(G, V).`` joins
both aggregates to the bindings at once (ADR 0091): one ``group -> value tuple``
table, a changed group's bindings emitted once with the old tuple and once with the
new. These tests drive epochs of inserts and deletes — small and large (the
vectorised aggregate path), group keys always mixed (``1``, ``1.0``, ``true``,
``"1"``, ``x"01"`` are five groups), values sometimes ints, sometimes mixed types
(``sum`` over strings derives nothing), sometimes near the int64 bounds (an
overflowing ``sum`` derives nothing), bindings changing in the same epochs — and
compare every relation with a fresh batch evaluation after each epoch.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine.dataflow import VECTOR_MIN, CountSumJoin
from merklog.engine.incremental import AggregateJoin, IncrementalEngine, MultiAggregateJoin
from merklog.engine.program import Program
from merklog.engine.values import row_to_engine

from .incremental_check import KEYS, assert_matches_batch, summed_value

TEXT = """
stats(G, C, S) :- grp(G), C := count : p(G, _), S := sum V : p(G, V).
four(G, C, S, L, H) :- grp(G), C := count : p(G, _), S := sum V : p(G, V),
    L := min V : p(G, V), H := max V : p(G, V).
pairs(G, H, C, S) :- q(G, H), C := count : p(G, _), S := sum V : p(G, V).
rev(S, G, C) :- grp(G), C := count : p(G, _), S := sum V : p(G, V).
total(N, S) :- N := count : p(_, _), S := sum V : p(_, V).
same(G) :- grp(G), C := count : p(G, _), C := sum V : p(G, V).
"""

RELS = ("stats", "four", "pairs", "rev", "total", "same", "p", "q", "grp")


def _value(rng: random.Random, kind: str) -> object:
    return summed_value(rng, kind, small=True)  # sums that equal counts for ``same``


def _facts(rng: random.Random, n: int, kind: str) -> set[tuple]:
    """``n`` distinct ``p(key, value)`` rows in engine form (``p(1, 2)``, ``p(1.0, 2)``
    and ``p(true, 2)`` are three rows)."""
    out: set[tuple] = set()
    while len(out) < n:
        out.add(row_to_engine((rng.choice(KEYS), _value(rng, kind))))
    return out


def _check(engine: IncrementalEngine, base: dict[str, set[tuple]], checked) -> None:
    assert_matches_batch(engine, base, checked, RELS)


def _ops(engine: IncrementalEngine, kind: type) -> list:
    return [n.op for n in engine.circuit.nodes if type(getattr(n, "op", None)) is kind]


@settings(max_examples=12, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(
        st.tuples(
            st.sampled_from([1, 5, 40, VECTOR_MIN, 3 * VECTOR_MIN]),
            st.sampled_from(["int", "mixed", "big"]),
            st.floats(0, 1),
            st.booleans(),
        ),
        min_size=2,
        max_size=6,
    ),
)
def test_fused_aggregate_joins_equal_a_fresh_batch_run(seed: int, epochs: list) -> None:
    rng = random.Random(seed)
    checked = Program.parse(TEXT).checked
    engine = IncrementalEngine(checked)
    base: dict[str, set[tuple]] = {
        "grp": {row_to_engine((k,)) for k in KEYS[::2]},
        "q": {row_to_engine((a, b)) for a in KEYS[:6] for b in KEYS[4:8]},
        "p": _facts(rng, 2 * VECTOR_MIN, "int"),
    }
    engine.step(inserts={rel: list(rows) for rel, rows in base.items()})
    _check(engine, base, checked)
    for size, kind, drop, churn in epochs:
        gone = {r for r in base["p"] if rng.random() < drop / 4}
        new = _facts(rng, size, kind) - gone
        base["p"] = (base["p"] - gone) | new
        deletes, inserts = {"p": list(gone)}, {"p": list(new)}
        if churn:  # bindings change in the same epoch as the aggregates
            all_grp = {row_to_engine((k,)) for k in KEYS}
            grp_new = {r for r in all_grp if rng.random() < 0.5}
            deletes["grp"], inserts["grp"] = list(base["grp"] - grp_new), list(grp_new)
            base["grp"] = grp_new
        engine.step(deletes=deletes, inserts=inserts)
        _check(engine, base, checked)
    # Retract every p in one epoch: count/sum fall back to 0, min/max to nothing.
    engine.step(deletes={"p": list(base["p"])})
    base["p"] = set()
    _check(engine, base, checked)
    joins = _ops(engine, MultiAggregateJoin)
    assert len(joins) == 2  # four (min/max), pairs (bindings not the groups); ``same``
    # binds C twice. stats, rev, total and same's count fold count/sum into one
    # CountSumJoin each (ADR 0104)
    assert len(_ops(engine, CountSumJoin)) == 4
    assert sum(j.direct for j in joins) > 0  # count/sum: the GroupAggregate's changes
    assert sum(j.rederived for j in joins) > 0  # min/max: re-derived from the rows
    assert any(op.bound is not None for op in _ops(engine, AggregateJoin))


def test_identity_head_needs_no_projection() -> None:
    """``stats(G, C, S)`` is the binding itself: its rule's last operator is the join."""
    engine = IncrementalEngine(Program.parse(TEXT).checked)
    labels = {n.label for n in engine.circuit.nodes if hasattr(n, "op")}
    rules = {str(r) for r in Program.parse(TEXT).checked.program.rules}
    kept = {lbl for lbl in labels if lbl in rules}
    assert any(lbl.startswith("rev(") for lbl in kept)  # reordered: a projection
    assert not any(lbl.startswith("stats(") for lbl in kept)  # identity: none
