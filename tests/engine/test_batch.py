"""The batch evaluator: semi-naive fixpoint, aggregates, CIDs, rest patterns, epochs.

Programs are parsed with the Dialog parser and evaluated by :class:`BatchEvaluator`
directly (the user-facing API is tested in test_program.py). Every program runs on
the tuple path, the columnar path and naive iteration, which must all agree.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from merklog.engine.batch import BatchEvaluator, Relations
from merklog.engine.parser import parse_program
from merklog.store import Fact, Link, fact_cid

TC = """
path(X, Y) :- edge(X, Y).
path(X, Y) :- path(X, Z), edge(Z, Y).
"""


def run(text: str, base: dict, backend: str = "tuple", semi_naive: bool = True) -> Relations:
    program = parse_program(text)
    base = {rel: set(rows) for rel, rows in base.items()}
    for rel, args in program.facts:
        base.setdefault(rel, set()).add(tuple(args))
    return BatchEvaluator(program.rules, backend=backend, semi_naive=semi_naive).evaluate(base)


def all_paths(text: str, base: dict) -> dict:
    """Evaluate on every path; assert they agree; return the relations as plain sets."""
    results = [
        run(text, base, "tuple").to_dict(),
        run(text, base, "tuple", semi_naive=False).to_dict(),
        run(text, base, "auto").to_dict(),
    ]
    assert results[0] == results[1] == results[2]
    return results[0]


def closure(edges: set[tuple[int, int]]) -> set[tuple[int, int]]:
    reach = set(edges)
    while True:
        extra = {(a, d) for (a, b) in reach for (c, d) in edges if b == c} - reach
        if not extra:
            return reach
        reach |= extra


def test_transitive_closure_of_a_chain() -> None:
    edges = {(i, i + 1) for i in range(30)}
    got = all_paths(TC, {"edge": edges})
    assert got["path"] == {(i, j) for i in range(31) for j in range(i + 1, 31)}


graphs = st.sets(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=40)


@given(graphs)
def test_semi_naive_agrees_with_naive_and_reference(edges: set) -> None:
    got = all_paths(TC, {"edge": edges})
    assert got["path"] == closure(edges)


@given(graphs)
def test_columnar_path_agrees_with_tuple_path(edges: set) -> None:
    program = (
        TC
        + """
        node(X) :- edge(X, _).
        node(Y) :- edge(_, Y).
        unreach(X) :- node(X), !path(0, X).
        outdeg(X, N) :- node(X), N := count : edge(X, _).
        far(X, M) :- node(X), M := max Y : path(X, Y).
        near(X, M) :- node(X), M := min Y : path(X, Y).
        total(S) :- S := sum Y : edge(_, Y).
        sg(X, Y) :- edge(P, X), edge(P, Y), X != Y.
        sg(X, Y) :- edge(A, X), sg(A, B), edge(B, Y).
        loop(X) :- path(X, X).
    """
    )
    tuple_path = run(program, {"edge": edges}, "tuple").to_dict()
    columnar = run(program, {"edge": edges}, "columnar").to_dict()
    naive_columnar = run(program, {"edge": edges}, "columnar", semi_naive=False).to_dict()
    assert columnar == tuple_path == naive_columnar


wide_nodes = st.sampled_from([0, 1, -5, 10**6, 2**30, -(2**29), 17, 123_456_789])


@given(st.sets(st.tuples(wide_nodes, wide_nodes), max_size=30))
def test_columnar_wide_value_ranges_agree_with_tuple_path(edges: set) -> None:
    # values far apart: packed keys exceed direct addressing, sorted key runs deduplicate
    program = TC + "\nnode(X) :- edge(X, _).\nunreach(X) :- node(X), !path(0, X)."
    tuple_path = run(program, {"edge": edges}, "tuple").to_dict()
    assert run(program, {"edge": edges}, "columnar").to_dict() == tuple_path


mixed_nodes = st.sampled_from(["a", "b", "c", b"\x00", 1, 2, -3, 7, "d", "zz"])


@given(st.sets(st.tuples(mixed_nodes, mixed_nodes), max_size=30))
def test_columnar_dictionary_encoding_agrees_with_tuple_path(edges: set) -> None:
    program = (
        TC
        + """
        node(X) :- edge(X, _).
        node(Y) :- edge(_, Y).
        unreach(X) :- node(X), !path("a", X).
        outdeg(X, N) :- node(X), N := count : edge(X, _).
        tagged(X, "hub") :- outdeg(X, N), N != 1.
        notself(X, Y) :- edge(X, Y), X != Y, Y != 2.
        froma(Y) :- edge(X, Y), X == "a".
    """
    )
    base = {"edge": edges}
    tuple_path = run(program, base, "tuple").to_dict()
    assert run(program, base, "columnar").to_dict() == tuple_path


def test_dictionary_encoded_results_decode_and_chain_across_strata() -> None:
    edges = {(f"n{i}", f"n{i + 1}") for i in range(300)} | {("n5", 7), (7, "n2")}
    text = TC + (
        '\nfromStart(Y) :- path("n0", Y).\nlast(X) :- fromStart(X), !edge(X, _).'
        "\nlabel(X, N) :- fromStart(X), N := count : path(X, _)."
    )
    rels = run(text, {"edge": edges}, "columnar")
    assert rels.columns("path") is None  # encoded, so not exposed as raw ints
    assert rels.count("fromStart") == 301
    assert rels["last"] == {("n300",)}
    assert ("n3", "n70") in rels["path"]
    assert ("n299", 1) in rels["label"]
    assert rels.to_dict() == run(text, {"edge": edges}, "tuple").to_dict()


def test_columnar_executor_is_used_for_large_integer_strata() -> None:
    edges = {(i, i + 1) for i in range(25_000)}
    rels = run("next2(X, Z) :- edge(X, Y), edge(Y, Z).", {"edge": edges}, "auto")
    assert rels.columns("next2") is not None  # produced set-at-a-time
    assert rels.count("next2") == 24_999
    assert (0, 2) in rels["next2"]


def test_count_and_sum_over_nothing_are_zero_min_max_derive_nothing() -> None:
    text = """
        n(G, C) :- group(G), C := count : item(G, _).
        s(G, S) :- group(G), S := sum V : item(G, V).
        lo(G, M) :- group(G), M := min V : item(G, V).
        hi(G, M) :- group(G), M := max V : item(G, V).
        all(C) :- C := count : item(_, _).
        none(C) :- C := count : missing(_).
    """
    got = all_paths(
        text,
        {"group": {("a",), ("b",)}, "item": {("a", 3), ("a", 4), ("a", -1)}, "missing": set()},
    )
    assert got["n"] == {("a", 3), ("b", 0)}
    assert got["s"] == {("a", 6), ("b", 0)}
    assert got["lo"] == {("a", -1)}
    assert got["hi"] == {("a", 4)}
    assert got["all"] == {(3,)}
    assert got["none"] == {(0,)}


def test_aggregates_range_over_distinct_body_bindings() -> None:
    # sum V over order(_, V): two orders of the same amount both count (distinct bindings
    # of the anonymous id), but the projection to V alone would collapse them.
    text = "t(S) :- S := sum V : order(_, V).\nc(N) :- N := count : order(_, 5)."
    got = all_paths(text, {"order": {(1, 5), (2, 5), (3, 7)}})
    assert got["t"] == {(17,)}
    assert got["c"] == {(2,)}


def test_negation_with_anonymous_variable_and_comparisons() -> None:
    text = """
        lonely(X) :- person(X), !friend(X, _).
        older(X, Y) :- age(X, A), age(Y, B), A > B.
        same(X) :- age(X, A), A == 30.
    """
    got = all_paths(
        text,
        {
            "person": {("ann",), ("bob",), ("cy",)},
            "friend": {("ann", "bob")},
            "age": {("ann", 30), ("bob", 25)},
        },
    )
    assert got["lonely"] == {("bob",), ("cy",)}
    assert got["older"] == {("ann", "bob")}
    assert got["same"] == {("ann",)}


def test_equality_binds_and_arithmetic_in_heads_and_constraints() -> None:
    text = """
        double(X, Y) :- n(X), Y == X * 2.
        inc(X + 1) :- n(X).
        q(X, R) :- n(X), R == 10 / X.
        big(X) :- n(X), X * X > 5.
    """
    got = all_paths(text, {"n": {(0,), (3,), (-7,)}})
    assert got["double"] == {(0, 0), (3, 6), (-7, -14)}
    assert got["inc"] == {(1,), (4,), (-6,)}
    assert got["q"] == {(3, 3), (-7, -1)}  # 10 / 0 has no value: no tuple; truncating division
    assert got["big"] == {(-7,), (3,)}


def test_int64_overflow_derives_nothing() -> None:
    got = all_paths("r(Y) :- n(X), Y == X + 1.", {"n": {(2**63 - 1,), (1,)}})
    assert got["r"] == {(2,)}


def test_soufflé_int32_wraps() -> None:
    program = parse_program("r(Y) :- n(X), Y == X + 1.")
    rels = BatchEvaluator(program.rules, int_bits=32).evaluate({"n": {(2**31 - 1,)}})
    assert rels["r"] == {(-(2**31),)}


def test_cid_selection_binds_the_fact_cid_and_filters_by_it() -> None:
    text = """
        categoryCount(Category, Count) :-
            Category := category(...),
            Count := count : product(Category, ...).
        cidOf(N, C) :- C := category(N).
        same(N) :- C := category(N), C := category(M), M == N.
    """
    books, toys = ("books",), ("toys",)
    cb = fact_cid(Fact("category", books))
    ct = fact_cid(Fact("category", toys))
    products = {(cb, "dune", 3), (cb, "emma", 1), (ct, "kite", 2)}
    got = all_paths(text, {"category": {books, toys, ("garden",)}, "product": products})
    cg = fact_cid(Fact("category", ("garden",)))
    assert got["categoryCount"] == {(cb, 2), (ct, 1), (cg, 0)}
    assert got["cidOf"] == {("books", cb), ("toys", ct), ("garden", cg)}
    assert got["same"] == {books, toys, ("garden",)}
    assert all(isinstance(c, Link) for c, _n in got["categoryCount"])


def test_rest_pattern_matches_any_further_arguments() -> None:
    got = all_paths(
        "first(X) :- wide(X, ...).\nhas2(X) :- wide(X, 2, ...).",
        {"wide": {(1, 2, 3, 4), (5, 6, 7, 8)}},
    )
    assert got["first"] == {(1,), (5,)}
    assert got["has2"] == {(1,)}


def test_stratified_negation_over_recursion() -> None:
    text = TC + "\nnode(X) :- edge(X, _).\nnode(Y) :- edge(_, Y).\nun(X) :- node(X), !path(1, X)."
    got = all_paths(text, {"edge": {(1, 2), (2, 3), (4, 5)}})
    assert got["un"] == {(1,), (4,), (5,)}


def test_mutual_recursion_in_one_stratum() -> None:
    text = """
        even(0).
        even(Y) :- odd(X), succ(X, Y).
        odd(Y) :- even(X), succ(X, Y).
    """
    got = all_paths(text, {"succ": {(i, i + 1) for i in range(10)}})
    assert got["even"] == {(i,) for i in range(0, 11, 2)}
    assert got["odd"] == {(i,) for i in range(1, 11, 2)}


def test_step_collects_next_tuples_and_async_outbox() -> None:
    program = parse_program(
        "count(X)@next :- count(X), !tick(1).\nping(@P, X)@async :- peer(P), want(X).\n"
    )
    ev = BatchEvaluator(program.rules)
    out = ev.step({"count": {(1,)}, "peer": {("p1",), ("p2",)}, "want": {(7,)}})
    assert out.next_tuples == {"count": {(1,)}}
    assert sorted(out.outbox) == [
        ("p1", Fact("ping", ("p1", 7))),
        ("p2", Fact("ping", ("p2", 7))),
    ]


def test_unschedulable_body_is_a_positioned_engine_error() -> None:
    from merklog.engine.errors import EngineError, UnschedulableError

    program = parse_program("r(X) :- X > 3.")
    with pytest.raises(UnschedulableError) as err:
        BatchEvaluator(program.rules).evaluate({})
    assert isinstance(err.value, EngineError)
    assert (err.value.line, err.value.col) == (1, 9)


def test_numpy_inputs_are_sets_even_with_repeated_rows() -> None:
    import numpy as np

    from merklog.engine import Program

    sales = np.array([[1, 10], [1, 10], [2, 10], [3, 20]] * 400, dtype=np.int64)
    program = Program.parse(
        "n(G, C) :- grp(G), C := count : sale(_, G).\ns(G, S) :- grp(G), S := sum I : sale(I, G)."
    )
    rels = program.evaluate({"sale": sales, "grp": np.array([[10], [20], [30]])})
    assert rels["n"] == {(10, 2), (20, 1), (30, 0)}
    assert rels["s"] == {(10, 3), (20, 3), (30, 0)}
    assert rels.count("sale") == 3
    assert rels["sale"] == {(1, 10), (2, 10), (3, 20)}
    tuple_rels = Program.parse(
        "n(G, C) :- grp(G), C := count : sale(_, G).", backend="tuple"
    ).evaluate({"sale": [tuple(r) for r in sales.tolist()], "grp": [(10,), (20,), (30,)]})
    assert tuple_rels["n"] == rels["n"]
