"""The one planner (engine/planner.py), through every backend that consumes it.

Each test evaluates the same program with the batch evaluator (tuple at a time),
the columnar executor (forced on where the program fits it) and the incremental
engine, and checks the answers agree with what the rule means.
"""

from __future__ import annotations

import pytest

from merklog.engine import Program
from merklog.engine.checks import check_query_body
from merklog.engine.errors import (
    EngineError,
    RangeRestrictionError,
    UnsafeNegationError,
    UnschedulableError,
)
from merklog.engine.incremental import IncrementalEngine
from merklog.engine.parser import parse_program, parse_query_body
from merklog.engine.planner import (
    Aggregate,
    Assign,
    Exists,
    Filter,
    Negate,
    Scan,
    plan_body,
    plan_rule,
)


def _batch(text: str, facts: dict, backend: str = "auto") -> dict:
    rels = Program.parse(text, backend=backend).evaluate(facts)
    return {name: set(rels[name]) for name in rels}


def _incremental(text: str, facts: dict) -> IncrementalEngine:
    engine = IncrementalEngine(Program.parse(text).checked)
    engine.step(inserts=facts)
    return engine


# ----------------------------------------------------------------------------- existence checks


def test_atoms_sharing_no_variable_are_existence_checks_not_a_cross_product() -> None:
    # 2000^3 * 500 combinations if c, d and e were joined: hours, not seconds.
    text = "r(X) :- f(X), a(), b(), c(_, _, _), d(_), e(_).\n"
    n = 2000
    facts = {
        "f": {(i,) for i in range(500)},
        "a": {()},
        "b": {()},
        "c": {(i, i + 1, "x") for i in range(n)},
        "d": {(i,) for i in range(n)},
        "e": {(float(i),) for i in range(n)},
    }
    plan = plan_rule(parse_program(text).rules[0])
    kinds = [(type(s).__name__, s.atom.rel) for s in plan.steps]
    assert kinds == [
        ("Exists", "a"),
        ("Exists", "b"),
        ("Exists", "c"),
        ("Exists", "d"),
        ("Exists", "e"),
        ("Scan", "f"),
    ]
    want = {(i,) for i in range(500)}
    assert _batch(text, facts)["r"] == want
    assert _batch(text, facts, backend="tuple")["r"] == want
    engine = _incremental(text, facts)
    assert engine.relation("r") == want
    # The guard follows its atom: no e-tuple left, nothing derived; one back, all back.
    engine.step(deletes={"e": facts["e"]})
    assert engine.relation("r") == set()
    engine.step(inserts={"e": {("back",)}})
    assert engine.relation("r") == want


def test_existence_checks_on_the_columnar_executor() -> None:
    text = "r(X, Y) :- f(X, Y), c(_, _, _), d(Z, Z), e(7).\n"
    n = 3000
    facts = {
        "f": {(i, i % 7) for i in range(n)},
        "c": {(i, i + 1, i + 2) for i in range(n)},
        "d": {(i, i + 1) for i in range(n)} | {(5, 5)},
        "e": {(i,) for i in range(n)},
    }
    plan = plan_rule(parse_program(text).rules[0])
    assert [type(s) for s in plan.steps] == [Exists, Exists, Exists, Scan]
    want = facts["f"]
    assert _batch(text, facts, backend="columnar")["r"] == want
    assert _batch(text, facts, backend="tuple")["r"] == want
    # d(Z, Z) needs a row whose columns are equal; e(7) needs the constant 7.
    no_repeat = dict(facts, d={(i, i + 1) for i in range(n)})
    assert _batch(text, no_repeat, backend="columnar")["r"] == set()
    assert _batch(text, no_repeat, backend="tuple")["r"] == set()
    assert _incremental(text, no_repeat).relation("r") == set()
    no_seven = dict(facts, e={(7.5,), ("7",), (True,)})
    assert _batch(text, no_seven, backend="tuple")["r"] == set()


def test_an_existence_check_in_a_recursive_rule_reads_the_delta() -> None:
    text = "p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z), on(_).\n"
    facts = {"e": {(i, i + 1) for i in range(30)}, "on": {(1,)}}
    want = {(i, j) for i in range(30) for j in range(i + 1, 31)}
    for backend in ("tuple", "columnar"):
        assert _batch(text, facts, backend=backend)["p"] == want
    assert _incremental(text, facts).relation("p") == want
    assert _batch(text, {"e": facts["e"]}, backend="tuple")["p"] == facts["e"]


def test_variables_of_the_head_or_another_literal_are_not_existence_checks() -> None:
    rule = parse_program("r(X) :- a(X), b(Y), Y > 2, c(_).").rules[0]
    # b first: its bindings are filtered (Y > 2) before a is scanned for each of them
    steps = plan_rule(rule).steps
    assert [type(s) for s in steps] == [Exists, Scan, Filter, Scan]
    assert steps[1].lit.atom.rel == "b"
    rule = parse_program("r(X) :- a(X), b(Z, _).").rules[0]
    assert [type(s) for s in plan_rule(rule).steps] == [Exists, Scan]
    rule = parse_program("r(Z) :- a(X), b(Z, _).").rules[0]
    assert [type(s) for s in plan_rule(rule).steps] == [Exists, Scan]


def test_aggregate_bodies_count_every_binding() -> None:
    # Inside an aggregate only variable-free atoms are guards: `count : {c(_), d(_)}` in
    # Soufflé syntax counts bindings of both wildcards, so those atoms stay scans.
    rule = parse_program("r(N) :- N := count : c(_).").rules[0]
    (agg,) = plan_rule(rule).steps
    assert isinstance(agg, Aggregate)
    assert [type(s) for s in agg.inner.steps] == [Scan]
    text = ".decl c(x: number)\n.decl d(x: number)\n.decl r(n: number)\n" + (
        "r(n) :- n = count : { c(_), d(_) }.\n"
    )
    rels = Program.parse(text).evaluate({"c": {(1,), (2,)}, "d": {(1,), (2,), (3,)}})
    assert set(rels["r"]) == {(6,)}


# ----------------------------------------------------------------------------- arithmetic arguments


def test_arithmetic_argument_binds_through_the_other_arguments() -> None:
    text = (
        ".decl choose(a: number, b: number, c: number)\n.decl r(n: number, c: number)\n"
        "r(n, c) :- choose(2*n, n, c).\n"
    )
    facts = {"choose": {(4, 2, 10), (5, 2, 11), (6, 3, 12), (0, 0, 13), (-2, -1, 14), (8, 3, 15)}}
    want = {(2, 10), (3, 12), (0, 13), (-1, 14)}
    assert _batch(text, facts)["r"] == want
    assert _batch(text, facts, backend="tuple")["r"] == want
    assert _incremental(text, facts).relation("r") == want
    plan = plan_rule(parse_program("r(N, C) :- choose(2*N, N, C).").rules[0])
    scan, check = plan.steps
    assert isinstance(scan, Scan) and isinstance(check, Filter)
    assert scan.key == () and str(check.lit).endswith("== (2 * N)")


def test_arithmetic_argument_is_a_lookup_key_once_bound() -> None:
    text = "r(X, Y) :- a(X), b(X + 1, Y).\n"
    plan = plan_rule(parse_program(text).rules[0])
    assert [type(s) for s in plan.steps] == [Scan, Scan]
    assert plan.steps[1].key == (0,)
    facts = {"a": {(1,), (2,), (3,)}, "b": {(2, "two"), (4, "four"), (9, "nine")}}
    want = {(1, "two"), (3, "four")}
    assert _batch(text, facts, backend="tuple")["r"] == want
    assert _incremental(text, facts).relation("r") == want


def test_arithmetic_argument_of_the_semi_naive_delta_atom() -> None:
    # r(X, X + Y) read first as the delta: X + Y is checked after q binds Y.
    text = "p(X) :- s(X).\np(Z) :- p(X), q(Y), link(X, X + Y, Z).\n"
    facts = {
        "s": {(1,)},
        "q": {(10,)},
        "link": {(1, 11, 2), (2, 12, 3), (3, 99, 4), (3, 13, 5)},
    }
    want = {(1,), (2,), (3,), (5,)}
    assert _batch(text, facts, backend="tuple")["p"] == want
    assert _incremental(text, facts).relation("p") == want
    rule = parse_program(text).rules[1]
    steps = plan_rule(rule, delta=0).steps
    assert isinstance(steps[0], Scan) and steps[0].delta


# ----------------------------------------------------------------------------- static errors


@pytest.mark.parametrize(
    ("query", "error", "where"),
    [
        ("!edge(X, Y)", UnsafeNegationError, (1, 7)),
        ("edge(X, Y), Z > 1", RangeRestrictionError, (1, 13)),
        ("edge(X, _), W == V + 1", RangeRestrictionError, (1, 13)),
    ],
)
def test_unschedulable_queries_are_static_errors(query: str, error: type, where: tuple) -> None:
    body = parse_query_body(query)
    with pytest.raises(error) as err:
        check_query_body(body)
    assert isinstance(err.value, EngineError)
    assert (err.value.line, err.value.col) == where
    assert err.value.hint


def test_program_query_with_an_unbound_expression_is_a_static_error() -> None:
    program = Program.parse("p(1). p(2).")
    with pytest.raises(RangeRestrictionError) as err:
        program.query("p(X + 1)")
    assert (err.value.line, err.value.col) == (1, 3)
    assert program.query("p(1 + 1)") == [()]


def test_the_planner_reports_the_unbound_variable_with_its_position() -> None:
    body = parse_query_body("edge(X, Y),\n  Z > 1")
    with pytest.raises(UnschedulableError) as err:
        plan_body(body)
    assert (err.value.line, err.value.col) == (2, 3)
    assert "variable Z" in str(err.value) and "hint:" in str(err.value)


def test_a_checked_program_always_has_a_plan() -> None:
    text = (
        "r(X, N) :- a(X, Y), N := count : b(X, _), !c(Y), Y == Z, d(Z), X > 1.\n"
        "s(X) :- a(X, _), W := sum V : b(X, V), W >= 0, T == W * 2, T < 100.\n"
    )
    for rule in Program.parse(text).ast.rules:
        steps = plan_rule(rule).steps
        kinds = {type(s) for s in steps}
        assert kinds <= {Scan, Exists, Filter, Assign, Negate, Aggregate}
        bound: set[str] = set()
        for s in steps:  # every step only reads what the steps before it bound
            assert s.bound == frozenset(bound)
            bound |= {v.name for v in _binds(s)}


def _binds(step):
    from merklog.engine import ast

    if isinstance(step, Scan):
        return list(ast.literal_vars(step.lit))
    if isinstance(step, Assign):
        return [step.var]
    if isinstance(step, Aggregate):
        return [step.lit.result]
    return []


def test_an_existence_check_on_the_recursive_relation_itself() -> None:
    # p(_) is a guard on p: one seed makes every s-tuple a p-tuple; without a seed the
    # least fixpoint is empty again (incrementally too: the support is retracted).
    text = "p(X) :- seed(X).\np(X) :- s(X), p(_).\n"
    facts = {"seed": {(1,)}, "s": {(i,) for i in range(5)}}
    want = {(i,) for i in range(5)}
    assert _batch(text, facts, backend="tuple")["p"] == want
    assert _batch(text, facts)["p"] == want
    engine = _incremental(text, facts)
    assert engine.relation("p") == want
    engine.step(deletes={"seed": {(1,)}})
    assert engine.relation("p") == set()
    engine.step(inserts={"seed": {(9,)}})
    assert engine.relation("p") == want | {(9,)}


def test_between_atoms_of_one_cost_the_one_a_filter_follows_is_scanned_first() -> None:
    """QA: ``kq(A, B), tt(X, Y), X < 40`` scanned kq first (source order) and tested
    ``X < 40`` on every pair: 15,000 x 15,000 tuples took 50 s on a node. The atom whose
    bindings a pending filter or negation tests is scanned first; otherwise source order
    decides, and a plan's answer never depends on it."""

    def order(text: str) -> list[str]:
        body = parse_program(f"r(A, X) :- {text}.").rules[0]
        return [
            s.lit.atom.rel if isinstance(s, Scan | Negate) else type(s).__name__
            for s in plan_rule(body).steps
        ]

    assert order("kq(A, B), tt(X, Y), X < 40") == ["tt", "Filter", "kq"]
    assert order("kq(A, B), tt(X, Y), !bad(X)") == ["tt", "bad", "kq"]
    assert order("kq(A, B), tt(X, Y)") == ["kq", "tt"]  # nothing to filter: as written
    facts = {"kq": {(i, i * 7) for i in range(200)}, "tt": {(i, i + 1) for i in range(200)}}
    for backend in ("tuple", "columnar"):
        got = _batch("r(A, X) :- kq(A, B), tt(X, Y), X < 3.", facts, backend=backend)["r"]
        assert got == {(a, x) for a in range(200) for x in range(3)}
