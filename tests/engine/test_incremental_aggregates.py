"""Aggregates and ``@async`` agree between the batch, columnar and incremental engines.

One regression test per bug of issue 10's "Incremental engine" list: rest patterns
inside aggregates, the integer width of ``sum`` in both dialects, ``sum`` over
values that are not numbers, one float summation order, and one ``@async``
delivery rule (sent once, at the epoch the tuple becomes derived).
"""

from __future__ import annotations

import itertools

import pytest

from merklog.engine.arith import ExactSum, NoBinding, sum_values
from merklog.engine.columnar import Ineligible
from merklog.engine.incremental import IncrementalEngine
from merklog.engine.program import Program
from merklog.engine.values import Float
from merklog.store import Fact


def results(text: str, facts: dict, rel: str, dialect: str = "merklog") -> list[set]:
    """``rel`` after evaluating ``facts`` with batch (tuple), columnar (forced) and
    incremental evaluation (inserted in one epoch)."""
    out = []
    for backend in ("tuple", "columnar"):
        prog = Program.parse(text, dialect=dialect, backend=backend)
        try:
            rels = prog.evaluate(facts)
        except Ineligible:  # forced columnar on a stratum it does not implement
            rels = Program.parse(text, dialect=dialect, backend="tuple").evaluate(facts)
        out.append(set(rels[rel]) if rel in rels else set())
    prog = Program.parse(text, dialect=dialect)
    eng = IncrementalEngine(prog.checked)
    eng.step(inserts=facts)
    out.append(eng.relation(rel))
    return out


def assert_all(text: str, facts: dict, rel: str, expected: set, dialect: str = "merklog"):
    got = results(text, facts, rel, dialect)
    assert got == [expected] * 3, dict(zip(("batch", "columnar", "incremental"), got, strict=True))


def test_count_over_a_rest_pattern_counts_tuples() -> None:
    assert_all("c(N) :- N := count : p(...).", {"p": [(1, 5), (1, 6), (2, 6)]}, "c", {(3,)})


def test_sum_over_a_rest_pattern_sums_each_tuple() -> None:
    assert_all("s(N) :- N := sum X : p(X, ...).", {"p": [(5, 1), (5, 2)]}, "s", {(10,)})


def test_rest_pattern_count_follows_deletes() -> None:
    eng = IncrementalEngine(Program.parse("c(K, N) :- k(K), N := count : p(K, ...).").checked)
    eng.step(inserts={"k": [(1,)], "p": [(1, 5), (1, 6), (1, 6, 7)]})
    assert eng.relation("c") == {(1, 3)}
    eng.step(deletes={"p": [(1, 6)]})
    assert eng.relation("c") == {(1, 2)}


def test_int64_sum_overflow_derives_nothing() -> None:
    big = 2**62
    text = "s(N) :- N := sum X : p(X)."
    assert_all(text, {"p": [(big,), (big + 1,)]}, "s", set())
    # The exact sum decides, not the order of partial sums.
    assert_all(text, {"p": [(2**63 - 1,), (1,), (-5,)]}, "s", {(2**63 - 5,)})


def test_int64_sum_overflow_recovers_after_a_delete() -> None:
    eng = IncrementalEngine(Program.parse("s(N) :- N := sum X : p(X).").checked)
    eng.step(inserts={"p": [(2**62,), (2**62 + 1,)]})
    assert eng.relation("s") == set()
    eng.step(deletes={"p": [(2**62 + 1,)]})
    assert eng.relation("s") == {(2**62,)}


def test_souffle_sum_wraps_at_32_bits() -> None:
    text = """
    .decl p(x: number)
    .input p
    .decl s(x: number)
    .output s
    s(n) :- n = sum x : p(x).
    """
    expected = {(-3,)}  # 2**32 - 3 wrapped to int32
    got = results(text, {"p": [(2**31 - 1,), (2**31 - 2,)]}, "s", dialect="souffle")
    assert got == [expected] * 3


def test_sum_over_non_numbers_derives_nothing() -> None:
    text = "s(K, N) :- k(K), N := sum X : p(K, X)."
    facts = {"k": [(1,), (2,), (3,)], "p": [(1, "a"), (1, 2), (2, 3), (2, 4.5)]}
    assert_all(text, facts, "s", {(2, 7.5), (3, 0)})


def test_sum_over_a_string_in_a_recursive_stratum_derives_nothing() -> None:
    text = """
    r(X) :- s(X).
    r(Y) :- r(X), e(X, Y), T := sum V : w(V), Y < T.
    """
    facts = {"s": [(1,)], "e": [(1, 2), (2, 3)], "w": [(10,), ("a",)]}
    assert_all(text, facts, "r", {(1,)})
    eng = IncrementalEngine(Program.parse(text).checked)
    eng.step(inserts=facts)
    eng.step(deletes={"w": [("a",)]})
    assert eng.relation("r") == {(1,), (2,), (3,)}


def test_float_sum_is_exact_and_order_independent() -> None:
    text = "s(N) :- N := sum X : p(X)."
    values = [1e16, 1.0, -1e16]
    assert_all(text, {"p": [(v,) for v in values]}, "s", {(1.0,)})
    for order in itertools.permutations(values):
        assert sum_values(order) == Float(1.0)
        eng = IncrementalEngine(Program.parse(text).checked)
        for v in order:  # one value per epoch, in this order
            eng.step(inserts={"p": [(v,)]})
        assert eng.relation("s") == {(1.0,)}


def test_float_sum_overflow_derives_nothing() -> None:
    facts = {"p": [(1e308, 1), (1e308, 2)]}
    assert_all("s(N) :- N := sum X : p(X, _).", facts, "s", set())


def test_exact_sum_retracts_exactly() -> None:
    acc = ExactSum()
    for v in (0.1, 0.2, 1e16, 3):
        acc.add(v)
    acc.add(1e16, -1)
    assert acc.result() == sum_values([0.1, 0.2, 3])
    acc.add("x")
    with pytest.raises(NoBinding):
        acc.result()
    acc.add("x", -1)
    assert acc.result(32) == sum_values([0.1, 0.2, 3])


def test_async_is_sent_once_by_batch_run_and_incremental_alike() -> None:
    text = "ping(@P, X)@async :- peer(P), want(X)."
    prog = Program.parse(text)
    peer, want = [("peer", ("p1",))], [("want", (1,))]
    # Epoch 0 and 1: body holds; epoch 2: it does not; epoch 3: it holds again.
    epochs = [peer + want, peer + want, peer, peer + want]
    batch = [r.outbox for r in prog.run([[Fact(r, a) for r, a in e] for e in epochs])]
    eng = IncrementalEngine(prog.checked)
    incremental = []
    for e in epochs:
        events: dict = {}
        for rel, args in e:
            events.setdefault(rel, []).append(args)
        eng.step(events=events)
        incremental.append(eng.outbox)
    sent = [("p1", Fact("ping", ("p1", 1)))]
    assert batch == [sent, [], [], sent]
    assert incremental == batch


def test_count_over_a_ground_atom_with_many_outer_rows() -> None:
    """``R := count : e1(7)`` has no body variables (columnar raised IndexError)."""
    facts = {"e2": [(i,) for i in range(1200)], "e1": [(7,), (8,)]}
    assert_all(
        "q(X, R) :- e2(X), R := count : e1(7).", facts, "q", {(i, 1) for i in range(1200)}
    )
