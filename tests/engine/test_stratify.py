"""Dialog query-engine spec §1.3.3 stratification: precedence graph, SCCs, topological order, temporal stratum."""

from __future__ import annotations

import pytest

from merklog.engine.errors import UnstratifiableError
from merklog.engine.parser import parse_program
from merklog.engine.stratify import precedence_graph, stratify, strongly_connected


def strata_of(text: str):
    return stratify(parse_program(text).rules)


def test_dependencies_come_first_and_recursion_is_marked():
    strata = strata_of(
        "unreach(X) :- node(X), !path(1, X).\n"
        "path(X, Y) :- edge(X, Y).\n"
        "path(X, Z) :- path(X, Y), edge(Y, Z).\n"
        "size(N) :- N := count : unreach(_).\n"
    )
    assert [sorted(s.relations) for s in strata] == [["path"], ["unreach"], ["size"]]
    assert [s.index for s in strata] == [0, 1, 2]
    assert [s.recursive for s in strata] == [True, False, False]
    assert len(strata[0].rules) == 2 and strata[0].rules[0].head.rel == "path"


def test_mutual_recursion_is_one_stratum():
    strata = strata_of(
        "even(X) :- zero(X). even(Y) :- odd(X), succ(X, Y). odd(Y) :- even(X), succ(X, Y)."
    )
    assert [sorted(s.relations) for s in strata] == [["even", "odd"]]
    assert strata[0].recursive and len(strata[0].rules) == 3


def test_inductive_and_async_rules_form_the_final_stratum():
    strata = strata_of(
        "checkbox(Id, S)@next :- checkbox(Id, S), !clicks(Id).\n"
        "view(Id) :- checkbox(Id, true).\n"
        "ping(@P, X)@async :- peer(P), view(X).\n"
    )
    assert [sorted(s.relations) for s in strata] == [["view"], ["checkbox", "ping"]]
    assert strata[-1].temporal and not strata[0].temporal
    assert [r.time for r in strata[-1].rules] == ["next", "async"]


def test_negative_self_dependency_through_next_is_allowed():
    # Dialog query-engine spec §1.3.1: the checkbox negates itself safely across time
    strata_of("c(X)@next :- c(X), !c(X).")


def test_precedence_graph_polarities():
    vertices, edges = precedence_graph(
        parse_program("a(X) :- b(X), !c(X), N := count : d(X, _), N > 0.").rules
    )
    assert vertices == ["a", "b", "c", "d"]
    assert [(e.head, e.body, e.negative) for e in edges] == [
        ("a", "b", False),
        ("a", "c", True),
        ("a", "d", True),
    ]


def test_tarjan_is_iterative_on_a_long_chain():
    n = 20000
    succ = {f"r{i}": [f"r{i + 1}"] for i in range(n)}
    succ[f"r{n}"] = ["r0"]
    comps = strongly_connected([f"r{i}" for i in range(n + 1)], succ)
    assert len(comps) == 1 and len(comps[0]) == n + 1
    chain = {f"r{i}": [f"r{i + 1}"] for i in range(n)}
    comps = strongly_connected([f"r{i}" for i in range(n + 1)], chain)
    assert [c[0] for c in comps[:2]] == [f"r{n}", f"r{n - 1}"]


def test_unstratifiable_cycle_through_aggregation():
    with pytest.raises(UnstratifiableError) as info:
        strata_of("a(X) :- e(X), N := count : b(X, _), N > 0.\nb(X, Y) :- a(X), e(Y).")
    assert info.value.cycle == ("a", "b", "a")
    assert (info.value.line, info.value.col) == (1, 15)
