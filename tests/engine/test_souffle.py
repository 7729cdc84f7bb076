"""Soufflé frontend: programs in Soufflé's test-suite style run unchanged with Soufflé's
output (expected results derived by hand), and constructs outside merklog are rejected
with an ``UnsupportedError`` naming them at line:col."""

from __future__ import annotations

import pytest

from merklog.engine.ast import Aggregate, Declaration
from merklog.engine.errors import ArityError, ParseError, UnknownRelationError, UnsupportedError
from merklog.engine.program import Program
from merklog.engine.souffle import parse_souffle


def run(text: str, facts: dict | None = None) -> dict[str, set[tuple]]:
    prog = Program.parse(text, dialect="souffle")
    assert prog.dialect == "souffle" and prog.int_bits == 32
    rels = prog.evaluate(facts or {})
    return {rel: set(rels[rel]) for rel in prog.ast.outputs}


def test_transitive_closure():
    out = run(
        """
        // transitive closure, as in Soufflé's tests/evaluation
        .decl edge(x: number, y: number)
        .input edge
        .decl path(x: number, y: number)
        .output path
        path(x, y) :- edge(x, y).
        path(x, z) :- path(x, y), edge(y, z).
        """,
        {"edge": {(1, 2), (2, 3), (3, 4)}},
    )
    assert out == {"path": {(1, 2), (2, 3), (3, 4), (1, 3), (2, 4), (1, 4)}}


def test_same_generation_with_types_and_inline_facts():
    out = run(
        """
        .type Person <: symbol
        .type Name = Person
        .decl parent(child: Name, parent: Person)
        parent("b", "a"). parent("c", "a"). parent("d", "b"). parent("e", "c").
        .decl sg(x: Person, y: Person)
        .output sg
        sg(x, y) :- parent(x, p), parent(y, p), x != y.
        sg(x, y) :- parent(x, px), sg(px, py), parent(y, py).
        """
    )
    assert out == {"sg": {("b", "c"), ("c", "b"), ("d", "e"), ("e", "d")}}


def test_aggregates_in_both_forms():
    out = run(
        """
        .decl sale(shop: symbol, item: symbol, amount: number)
        sale("s1", "a", 3). sale("s1", "b", 4). sale("s2", "a", 10).
        .decl shop(s: symbol)
        shop("s1"). shop("s2"). shop("s3").
        .decl stats(s: symbol, n: number, total: number)
        .decl extremes(lo: number, hi: number)
        .output stats, extremes
        stats(s, n, t) :- shop(s), n = count : { sale(s, _, _) }, t = sum a : { sale(s, _, a) }.
        extremes(lo, hi) :- lo = min a : sale(_, _, a), hi = max a : { sale(_, _, a) }.
        """
    )
    assert out == {
        "stats": {("s1", 2, 7), ("s2", 1, 10), ("s3", 0, 0)},
        "extremes": {(3, 10)},
    }


def test_negation_disjunction_and_multiple_heads():
    out = run(
        """
        .decl node(x: number)
        .decl edge(x: number, y: number)
        node(1). node(2). node(3). node(4).
        edge(1, 2). edge(2, 3).
        .decl reach(x: number)
        .decl unreach(x: number)
        .decl endpoint(x: number)
        .decl a(x: number)
        .decl b(x: number)
        .output unreach, endpoint, a, b
        reach(1).
        reach(y) :- reach(x), edge(x, y).
        unreach(x) :- node(x), !reach(x).
        endpoint(x) :- (edge(x, _) ; edge(_, x)), !node(x + 10).
        a(x), b(x) :- node(x), (x = 1 ; x > 3).
        """
    )
    assert out == {
        "unreach": {(4,)},
        "endpoint": {(1,), (2,), (3,)},
        "a": {(1,), (4,)},
        "b": {(1,), (4,)},
    }


def test_32_bit_arithmetic_and_truncating_division():
    out = run(
        """
        .decl n(x: number)
        n(2147483647). n(-7).
        .decl r(x: number, s: number, q: number, m: number)
        .output r
        r(x, x + 1, x / 2, x % 2) :- n(x).
        """
    )
    assert out == {"r": {(2147483647, -2147483648, 1073741823, 1), (-7, -6, -3, -1)}}


def test_program_structure():
    prog = parse_souffle(
        """
        .type Id <: number
        .decl e(a: Id, b: float) btree
        .decl s(x: symbol)
        .input e(IO=file)
        .output s(IO=stdout)
        s("x").
        /* block */ s(y) :- e(_, _), s(y).
        """
    )
    assert prog.dialect == "souffle"
    assert prog.declarations[0] == Declaration("e", (("a", "number"), ("b", "float")))
    assert prog.inputs == ("e",) and prog.outputs == ("s",)
    assert prog.facts == (("s", ("x",)),)


def test_single_atom_aggregate_is_an_aggregate():
    prog = parse_souffle(".decl a(x: number)\n.decl c(n: number)\nc(n) :- n = count : a(_).")
    assert isinstance(prog.rules[0].body[0], Aggregate)


@pytest.mark.parametrize(
    ("text", "line", "col", "construct"),
    [
        (
            ".decl a(x: number)\n.type T = A {x: number} | B {}",
            2,
            11,
            "algebraic data types (ADTs)",
        ),
        (".comp C { }", 1, 1, "components (.comp)"),
        (".init c = C", 1, 1, "component instantiation (.init)"),
        (".decl a(x: symbol)\n.decl b(x: symbol)\nb(cat(x, x)) :- a(x).", 3, 3, "functor cat(…)"),
        (
            ".decl a(x: symbol)\n.decl b(x: number)\nb(n) :- a(x), n = strlen(x).",
            3,
            19,
            "functor strlen(…)",
        ),
        (
            ".decl a(x: number)\n.decl b(x: number)\nb(@f(x)) :- a(x).",
            3,
            3,
            "user-defined functor @…",
        ),
        (".decl a(x: number) choice-domain x", 1, 20, "choice-domain"),
        (".decl a(x: number) eqrel", 1, 20, "eqrel relations"),
        (".decl a(x: number)\n.decl b(x: number)\nb($) :- a(_).", 3, 3, "auto-increment counter $"),
        (".decl a(x: number)\n.decl b(x: number)\nb([x, x]) :- a(x).", 3, 3, "records [ … ]"),
        (".decl a(x: number)\n.decl b(x: number)\nb(x ^ 2) :- a(x).", 3, 5, "exponentiation ^"),
        (
            ".decl a(x: number)\n.decl b(x: number)\nb(x band 1) :- a(x).",
            3,
            5,
            "bitwise/logical operator band",
        ),
        (
            ".decl a(x: number)\n.decl m(x: number)\nm(y) :- y = mean x : a(x).",
            3,
            13,
            "mean aggregate",
        ),
        (".decl a(x: number)\n.printsize a", 2, 1, ".printsize"),
        ('.decl a(x: number)\n.input a(filename="x.csv")', 2, 10, "I/O parameter filename"),
        ('#include "x.dl"\n.decl a(x: number)', 1, 1, "C preprocessor directive"),
        (
            ".decl a(x: number)\n.decl b(x: number)\na(x) <= a(y) :- b(x), b(y).",
            3,
            6,
            "subsumption rules (<=)",
        ),
    ],
)
def test_unsupported_constructs_are_named(text, line, col, construct):
    with pytest.raises(UnsupportedError) as info:
        parse_souffle(text)
    err = info.value
    assert err.construct == construct
    assert err.message == f"unsupported Soufflé construct: {construct}"
    assert (err.line, err.col) == (line, col), str(err)


def test_undeclared_relation_and_arity():
    with pytest.raises(UnknownRelationError) as info:
        parse_souffle(".decl a(x: number)\na(x) :- b(x).")
    assert (info.value.line, info.value.col) == (2, 9)
    assert info.value.message == "relation b is not declared"
    with pytest.raises(UnknownRelationError) as info:
        parse_souffle(".decl a(x: number)\n.output a, c")
    assert (info.value.line, info.value.col) == (2, 12)
    with pytest.raises(ArityError):
        Program.parse(".decl a(x: number, y: number)\na(1).", dialect="souffle")
    with pytest.raises(ParseError) as perr:
        parse_souffle(".decl a(x: number)\n.decl a(x: number)")
    assert (perr.value.line, perr.value.col) == (2, 7)
    with pytest.raises(ParseError):
        parse_souffle(".decl a(x: number)\na(2147483648).")


def test_dialect_is_auto_detected():
    prog = Program.parse(".decl a(x: number)\n.output a\na(1).")
    assert prog.dialect == "souffle"


def test_merklog_eval_cli_runs_a_souffle_program_over_fact_files(tmp_path):
    from click.testing import CliRunner

    from merklog.node.cli import cli

    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "edge.facts").write_text("a\tb\nb\tc\n", encoding="utf-8")
    program = tmp_path / "reach.dl"
    program.write_text(
        ".decl edge(x: symbol, y: symbol)\n"
        ".input edge\n"
        ".decl reach(x: symbol, y: symbol)\n"
        ".output reach\n"
        "reach(x, y) :- edge(x, y).\n"
        "reach(x, z) :- reach(x, y), edge(y, z).\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        ["eval", str(program), "--facts", str(tmp_path / "facts"), "--out", str(out), "--sorted"],
    )
    assert result.exit_code == 0, result.output
    rows = (out / "reach.csv").read_text(encoding="utf-8").splitlines()  # unsorted by default
    assert sorted(rows) == ["a\tb", "a\tc", "b\tc"]

    bad = tmp_path / "bad.dl"
    bad.write_text(".decl a(x: number)\n.decl b(x: symbol)\nb(cat(x, x)) :- a(x).\n")
    result = CliRunner().invoke(
        cli, ["eval", str(bad), "--facts", str(tmp_path / "facts"), "--out", str(out)]
    )
    assert result.exit_code == 1
    assert "3:3: unsupported Soufflé construct: functor cat(…)" in result.output


def test_souffle_queries_use_lowercase_variables():
    from merklog.engine.ast import Const, Var
    from merklog.engine.souffle import parse_souffle_query

    atom = parse_souffle_query("path(1, x)")
    assert atom.args == (Const(1), Var("x"))


def test_union_types_and_old_style_type_directives():
    prog = parse_souffle(
        ".number_type Age\n.symbol_type Name\n.type A <: number\n.type B <: number\n"
        ".type AB = A | B\n.decl p(n: Name, a: Age, x: AB)\n"
    )
    assert prog.declarations[0].columns == (("n", "symbol"), ("a", "number"), ("x", "number"))
    with pytest.raises(ParseError) as info:
        parse_souffle(".type S <: symbol\n.type N <: number\n.type U = S | N\n")
    assert "mixes base types" in info.value.message


def test_recursive_aggregation_is_unstratifiable_as_in_souffle():
    from merklog.engine.errors import UnstratifiableError

    with pytest.raises(UnstratifiableError) as info:
        Program.parse(
            ".decl edge(x: number, y: number, w: number)\n"
            ".decl dist(x: number, d: number)\n"
            "dist(1, 0).\n"
            "dist(y, d) :- edge(x, y, w), dist(x, dx), d = min z : { dist(x, z0), z = z0 + w }.\n",
            dialect="souffle",
        )
    assert info.value.cycle == ("dist", "dist")


def test_rules_with_plan_and_nested_groups():
    out = run(
        """
        .decl e(x: number, y: number)
        e(1, 2). e(2, 3). e(3, 1). e(5, 6).
        .decl t(x: number, y: number)
        .output t
        t(x, y) :- e(x, y).
        t(x, z) :- t(x, y), e(y, z).
        .plan 1:(2,1)
        .decl odd(x: number)
        .output odd
        odd(x) :- t(x, _), ((x % 2 = 1, x < 5) ; x = 6).
        """
    )
    assert out["odd"] == {(1,), (3,)}
    assert len(out["t"]) == 10


# ---------------------------------------------------------------- aggregate scoping
# Soufflé classifies an aggregate's variables as injected, local or witnesses
# (souffle-lang/souffle: ast/analysis/Aggregate, ast/transform/GroundWitnesses).


def test_aggregate_result_bound_outside_and_used_inside_is_a_constraint():
    out = run(
        """
        .decl gen(x: number)
        .input gen
        .decl e_factor(x: number, f: number)
        .input e_factor
        .decl perfect(x: number)
        .output perfect
        perfect(x) :- gen(x), x = sum inv : e_factor(x, inv).
        """,
        {
            "gen": {(6,), (8,), (28,)},
            "e_factor": {(6, 1), (6, 2), (6, 3), (8, 1), (8, 2), (8, 4)}
            | {(28, f) for f in (1, 2, 4, 7, 14)},
        },
    )
    assert out == {"perfect": {(6,), (28,)}}


def test_aggregate_inner_variable_shadowing_the_result_is_local():
    out = run(
        """
        .decl recipe(a: number, b: symbol, c: number, d: number)
        .input recipe
        .decl max_recipe(a: number)
        .output max_recipe
        max_recipe(a) :- a = max a : recipe(a, _, _, _).
        """,
        {"recipe": {(1, "x", 0, 0), (5, "y", 0, 0), (3, "z", 0, 0)}},
    )
    assert out == {"max_recipe": {(5,)}}


def test_min_max_witnesses_reach_the_head():
    text = """
        .decl length(x: number, y: number, m: number)
        .input length
        .decl longest_path(y: number, x: number, l: number)
        .output longest_path
        .decl shortest(x: number, l: number)
        .output shortest
        longest_path(y, x, l) :- l = max m : length(x, y, m).
        shortest(x, l) :- l = min m : { length(x, _, m), m > 1 }.
        """
    facts = {"length": {(1, 2, 5), (2, 3, 7), (3, 4, 7), (1, 4, 2), (9, 9, 1)}}
    out = run(text, facts)
    # Every tuple reaching the extreme is a witness (Soufflé's GroundWitnesses rewrite).
    assert out == {"longest_path": {(3, 2, 7), (4, 3, 7)}, "shortest": {(1, 2)}}
    from merklog.engine.incremental import IncrementalEngine

    prog = Program.parse(text, dialect="souffle")
    eng = IncrementalEngine(prog.checked)
    eng.step(inserts=facts)
    assert eng.relation("longest_path") == out["longest_path"]
    eng.step(deletes={"length": [(2, 3, 7)]})
    assert eng.relation("longest_path") == {(4, 3, 7)}


def test_aggregate_scoping_keeps_injected_variables_grouped():
    out = run(
        """
        .decl w(s: symbol)
        .input w
        .decl c(s: symbol, x: number)
        .input c
        .decl b(s: symbol, n: number)
        .output b
        b(s, n) :- w(s), n = count : { c(s, _) }.
        """,
        {"w": {("a",), ("z",)}, "c": {("a", 1), ("a", 2), ("q", 3)}},
    )
    assert out == {"b": {("a", 2), ("z", 0)}}


def test_integer_literals_of_float_columns_are_floats_as_in_souffle() -> None:
    """QA: ``g(1) :- f(_).`` with ``.decl g(x: float)`` derived the int ``1`` into a float
    relation (value identity keeps ``1`` apart from ``1.0``), so it joined nothing, was
    not negated away, was counted beside ``1.0``, and an inline ``f2(1).`` was refused.
    Soufflé types the literal by its column: the answers below are Soufflé's."""
    program = Program.parse(
        ".decl f(x: float)\n.input f\n.decl g(x: float)\ng(1) :- f(_).\n"
        ".decl h(x: float)\nh(x) :- g(x), f(x).\n"
        ".decl k(x: float)\nk(x) :- f(x), !g(x).\n"
        ".decl u(x: float)\nu(x) :- f(x). u(x) :- g(x).\n"
        ".decl cnt(n: number)\ncnt(n) :- n = count : { u(x) }.\n"
        ".decl k2(x: number)\nk2(1) :- f(1).\n"
        ".decl f2(x: float)\nf2(1).\n",
        dialect="souffle",
    )
    out = program.evaluate({"f": [(1.0,), (2.5,)]})
    got = {rel: sorted(out[rel], key=repr) for rel in ("g", "h", "k", "cnt", "k2", "f2")}
    assert got == {
        "g": [(1.0,)],
        "h": [(1.0,)],
        "k": [(2.5,)],
        "cnt": [(2,)],
        "k2": [(1,)],
        "f2": [(1.0,)],
    }
    assert all(type(v) is float for (v,) in got["g"] + got["h"] + got["f2"])
    assert type(got["k2"][0][0]) is int  # a number column keeps its int
