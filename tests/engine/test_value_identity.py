"""Values keep their identity end to end: ``1``, ``1.0``, ``true``, ``"1"`` and ``x"01"``
are five values with five CIDs in every evaluation path (batch, columnar, incremental,
``merklog eval``), and comparison follows docs/language.md. One test per bug of the
"Values lose their identity" report, plus mixed-type differential tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine import Program
from merklog.engine.batch import BatchEvaluator
from merklog.engine.columnar import Ineligible
from merklog.engine.incremental import IncrementalEngine
from merklog.engine.parser import parse_program
from merklog.engine.values import row_to_engine, to_engine
from merklog.node.cli import cli
from merklog.store import fact_cid, make_fact

from .test_incremental_differential import EDB, IDB, programs

MIXED = [1, 1.0, True, "1", b"\x01"]


def typed(rows) -> set[tuple]:
    """Rows as (type, value) pairs: compares like merklog identity, unlike Python ``==``."""
    return {tuple((type(v), v) for v in row) for row in rows}


def query(text: str, q: str, facts: dict, backend: str = "auto") -> list[tuple]:
    return Program.parse(text, backend=backend).query(q, facts=facts)


# ------------------------------------------------------------------ the reported bugs


@pytest.mark.parametrize("backend", ["tuple", "auto"])
def test_one_row_per_value(backend: str) -> None:
    rows = query("q(X) :- p(X).", "p(X)", {"p": [(v,) for v in MIXED]}, backend)
    assert len(rows) == 5
    assert typed(rows) == typed((v,) for v in MIXED)
    assert typed(query("q(X) :- p(X).", "q(X)", {"p": [(v,) for v in MIXED]}, backend)) == typed(
        rows
    )


def test_count_counts_distinct_values() -> None:
    facts = {"p": [(1,), (1.0,), (True,)]}
    assert query("c(N) :- N := count : p(_).", "c(N)", facts) == [(3,)]
    engine = IncrementalEngine(Program.parse("c(N) :- N := count : p(_).").checked)
    engine.step(inserts=facts)
    assert list(engine.relation("c")) == [(3,)]


def test_equality_with_one_is_numeric_and_never_invents_values() -> None:
    prog = "q(X) :- p(X), X == 1."
    assert query(prog, "q(X)", {"p": [(True,)]}) == []
    got = query(prog, "q(X)", {"p": [(1,), (1.0,), (True,)]})
    assert typed(got) == {((int, 1),), ((float, 1.0),)}
    assert query("q(X) :- p(X), X != 1.", "q(X)", {"p": [(True,)]}) == [(True,)]
    assert query("q(X) :- p(X), X != 1.", "q(X)", {"p": [(1,), (1.0,)]}) == []


def test_negation_does_not_confuse_true_with_one() -> None:
    assert query("q(X) :- p(X), !r(X).", "q(X)", {"p": [(True,)], "r": [(1,)]}) == [(True,)]
    assert query("q(X) :- p(X), !r(X).", "q(X)", {"p": [(1.0,)], "r": [(1,)]}) == [(1.0,)]


def test_constant_in_an_atom_selects_by_identity() -> None:
    facts = {"p": [(True, "t"), (1, "i"), (1.0, "f")]}
    assert query("q(Y) :- p(true, Y).", "q(Y)", facts) == [("t",)]
    assert query("q(Y) :- p(1, Y).", "q(Y)", facts) == [("i",)]
    assert query("q(Y) :- p(1.0, Y).", "q(Y)", facts) == [("f",)]
    assert Program.parse("q(Y) :- p(_, Y).").query("p(1.0, Y)", facts=facts) == [("f",)]


def test_repeated_variable_matches_identical_values_only() -> None:
    facts = {"p": [(1, 1.0), (1, True), (1, 1), ("1", 1)]}
    assert query("q(X) :- p(X, X).", "q(X)", facts) == [(1,)]


def test_cid_selection_gives_the_stored_facts_cids() -> None:
    rows = query("c(C) :- C := p(_).", "c(C)", {"p": [(v,) for v in MIXED]})
    assert {r[0] for r in rows} == {fact_cid(make_fact("p", (v,))) for v in MIXED}
    engine = IncrementalEngine(Program.parse("c(C) :- C := p(_).").checked)
    engine.step(inserts={"p": [(v,) for v in MIXED]})
    assert {r[0] for r in engine.relation("c")} == {r[0] for r in rows}


def test_incremental_delete_of_one_keeps_one_point_oh_and_true() -> None:
    engine = IncrementalEngine(Program.parse("q(X) :- p(X).").checked)
    engine.step(inserts={"p": [(1,), (1.0,), (True,)]})
    deltas = engine.step(deletes={"p": [(1,)]})
    assert typed(engine.relation("q")) == {((float, 1.0),), ((bool, True),)}
    assert typed(deltas["q"]) == {((int, 1),)} and list(deltas["q"].values()) == [-1]


def test_negative_zero_is_the_stored_zero() -> None:
    prog = Program.parse("p(-0.0). p(0.0). q(X) :- p(X).")
    rows = prog.query("q(X)")
    assert typed(rows) == {((float, 0.0),)} and str(rows[0][0]) == "0.0"
    (cid,) = Program.parse("c(C) :- C := p(_).\np(-0.0).").query("c(C)")
    assert cid[0] == fact_cid(make_fact("p", (0.0,)))


def test_float_arithmetic_stays_float() -> None:
    got = query("q(Y) :- p(X), Y == X + 0.5.", "q(Y)", {"p": [(1.5,), (1,)]})
    assert typed(got) == {((float, 2.0),), ((float, 1.5),)}
    got = query("s(S) :- S := sum X : p(X).", "s(S)", {"p": [(0.5,), (1.5,)]})
    assert typed(got) == {((float, 2.0),)}


def test_sum_over_a_bool_derives_nothing_and_min_orders_bool_first() -> None:
    assert query("s(S) :- S := sum X : p(X).", "s(S)", {"p": [(1,), (True,)]}) == []
    got = query("m(M) :- M := min X : p(X).", "m(M)", {"p": [(1,), (True,), ("a",)]})
    assert typed(got) == {((bool, True),)}


def test_bool_is_not_ordered_against_numbers() -> None:
    assert query("q(X) :- p(X), X > 0.", "q(X)", {"p": [(True,), (1,), (0.5,)]}) == [(0.5,), (1,)]


def test_async_outbox_and_next_tuples_hold_plain_values() -> None:
    prog = Program.parse("out(@P, X)@async :- peer(P), p(X).\nn(X)@next :- p(X).")
    (result,) = prog.run([{"peer": [("b",)], "p": [(1.0,), (True,), (1,)]}])
    args = [fact.args for _dest, fact in result.outbox]
    assert typed(args) == typed([("b", 1.0), ("b", True), ("b", 1)]) and len(args) == 3
    assert all(dest == "b" for dest, _fact in result.outbox)
    assert typed(result.next_tuples["n"]) == typed([(1.0,), (True,), (1,)])


def test_program_constants_keep_their_type() -> None:
    prog = Program.parse('q(1). q(1.0). q(true). q("1"). q(x"01"). r(X) :- q(X).')
    assert typed(prog.query("r(X)")) == typed((v,) for v in MIXED)
    assert typed(prog.evaluate()["r"]) == typed((v,) for v in MIXED)


def test_query_over_given_relations_keeps_identity() -> None:
    prog = Program.parse("q(X) :- p(X).")
    got = prog.query("q(X)", relations={"q": [(1,), (1.0,), (True,)]})
    assert got == [(True,), (1,), (1.0,)] and typed(got) == typed([(True,), (1,), (1.0,)])


def test_rowset_keeps_identity_but_iterates_plain_values() -> None:
    rels = Program.parse("r(X) :- q(X).").evaluate({"q": [(1,), (1.0,), (True,)]})
    rows = rels["r"]
    assert len(rows) == 3 and (1.0,) in rows and (True,) in rows and (0,) not in rows
    assert len(rows - {(1,)}) == 2 and (1.0,) in rows - {(1,)}
    assert {type(r[0]) for r in rows} == {int, float, bool}
    assert rels.sorted("r") == [(True,), (1,), (1.0,)]


# ------------------------------------------------------------------ merklog eval


def test_eval_writes_one_line_per_value_and_floats_as_floats(tmp_path: Path) -> None:
    prog = tmp_path / "p.dl"
    prog.write_text(
        'p(1). p(1.0). p(true). p(x"01"). p(2.5).\n'
        "q(X) :- p(X).\nc(N) :- N := count : p(_).\ns(S) :- S := sum X : h(X).\n"
    )
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "h.facts").write_text("1.0\n1\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        ["eval", str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out), "--sorted"],
    )
    assert result.exit_code == 0, result.output
    # eval writes rows in no particular order unless --sorted
    assert sorted((out / "q.csv").read_text().splitlines()) == ["01", "1", "1.0", "2.5", "true"]
    assert (out / "c.csv").read_text() == "5\n"
    assert (out / "s.csv").read_text() == "2.0\n"  # int 1 + float 1.0: a float


@pytest.mark.parametrize(
    ("program", "rel", "lines"),
    [
        ("p(1). p(1.0). p(true).\nq(X) :- p(X).", "q", ["true", "1", "1.0"]),
        ("p(1). p(1.0). p(true).\nc(N) :- N := count : p(_).", "c", ["3"]),
        ("p(true).\nq(X) :- p(X), X == 1.", "q", []),
        ("p(true).\nq(X) :- p(X), X != 1.", "q", ["true"]),
        ("p(true). r(1).\nq(X) :- p(X), !r(X).", "q", ["true"]),
        ('p(true, "t"). p(1, "i"). p(1.0, "f").\nq(Y) :- p(true, Y).', "q", ["t"]),
        ("p(1). p(1.0). p(true).\nc(C) :- C := p(_).", "c", None),
        ("p(-0.0). p(0.0).\nq(X) :- p(X).", "q", ["0.0"]),
    ],
)
def test_eval_keeps_value_identity(tmp_path: Path, program: str, rel: str, lines) -> None:
    prog = tmp_path / "p.dl"
    prog.write_text(program + "\n")
    (tmp_path / "facts").mkdir()
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["eval", str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    got = (out / f"{rel}.csv").read_text().splitlines()
    if lines is None:  # C := p(_): the three stored facts' CIDs
        assert sorted(got) == sorted(str(fact_cid(make_fact("p", (v,)))) for v in (1, 1.0, True))
    else:
        assert sorted(got) == sorted(lines)


def test_eval_reports_an_arity_that_matches_no_facts(tmp_path: Path) -> None:
    prog = tmp_path / "p.dl"
    prog.write_text("p(X) :-\n  edge(X).\n")
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "edge.facts").write_text("1\t2\n")
    result = CliRunner().invoke(
        cli, ["eval", str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    facts = tmp_path / "facts" / "edge.facts"
    assert f"{prog}:2:3: edge has arity 2 in {facts} and 1 here" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ columnar executor


@pytest.mark.parametrize("n", [10, 1000, 1500])
def test_columnar_count_over_a_ground_body(n: int) -> None:
    prog = "q(X, R) :- e2(X), R := count : e1(7)."
    facts = {"e2": [(i,) for i in range(n)], "e1": [(7,), (8,)]}
    want = {(i, 1) for i in range(n)}
    for backend in ("auto", "columnar", "tuple"):
        assert set(Program.parse(prog, backend=backend).evaluate(facts)["q"]) == want
    facts["e1"] = [(8,)]
    assert set(Program.parse(prog, backend="columnar").evaluate(facts)["q"]) == {
        (i, 0) for i in range(n)
    }


def test_columnar_keeps_mixed_values_apart() -> None:
    prog = "j(X, Y) :- p(X), r(X, Y).\nn(X) :- p(X), !r(X, _).\nc(N) :- N := count : p(_)."
    values = [*MIXED, 2, 0.0, False, "a"]
    facts = {"p": [(v,) for v in values], "r": [(1, "int"), (1.0, "float"), (True, "bool")]}
    tuple_rels = Program.parse(prog, backend="tuple").evaluate(facts)
    col_rels = Program.parse(prog, backend="columnar").evaluate(facts)
    for rel in ("j", "n", "c"):
        assert typed(col_rels[rel]) == typed(tuple_rels[rel]), rel
    assert typed(col_rels["j"]) == typed([(1, "int"), (1.0, "float"), (True, "bool")])
    assert col_rels["c"] == {(len(values),)}


def test_array_facts_keep_their_dtype_as_value_type() -> None:
    import numpy as np

    prog = Program.parse("q(X) :- p(X, _).")
    floats = prog.query("q(X)", facts={"p": np.array([[1.0, 2.0], [1.5, 0.0]])})
    assert typed(floats) == {((float, 1.0),), ((float, 1.5),)}
    ints = prog.query("q(X)", facts={"p": np.array([[1, 2], [3, 4]], dtype=np.int64)})
    assert typed(ints) == {((int, 1),), ((int, 3),)}
    bools = prog.query("q(X)", facts={"p": np.array([[True, False]])})
    assert typed(bools) == {((bool, True),)}


def test_columnar_declines_comparisons_over_encoded_floats() -> None:
    prog = Program.parse("q(X) :- p(X), r(Y), X == Y.", backend="columnar")
    with pytest.raises(Ineligible):
        prog.evaluate({"p": [(1,)], "r": [(1.0,)]})
    got = Program.parse("q(X) :- p(X), r(Y), X == Y.").evaluate({"p": [(1,)], "r": [(1.0,)]})
    assert got["q"] == {(1,)}


# ------------------------------------------------------------------ relations are name/arity


def test_static_arity_error_names_both_arities_and_places() -> None:
    from merklog.engine.errors import ArityError

    with pytest.raises(ArityError) as err:
        Program.parse("edge(1, 2).\nr(X) :-\n    edge(X, Y, Z).")
    assert err.value.message == "edge has arity 2 at 1:1 and 3 at 3:5"
    assert (err.value.line, err.value.col) == (3, 5)


def test_program_reading_an_arity_no_fact_has_is_an_error_with_position() -> None:
    from merklog.engine.errors import ArityError

    prog = Program.parse("p(X) :- edge(X).")
    with pytest.raises(ArityError, match="edge has arity 2 in the facts and 1 here"):
        prog.evaluate({"edge": [(1, 2)]})
    # With facts of both arities only edge/1 is read: edge/2 is another relation.
    assert prog.query("p(X)", facts={"edge": [(1, 2), (7,)]}) == [(7,)]


@pytest.mark.parametrize("backend", ["tuple", "columnar", "auto"])
def test_facts_of_another_arity_are_never_matched(backend: str) -> None:
    rules = parse_program("r(X, Y, Z) :- edge(X, Y, Z).\ns(X) :- edge(X, _, _).").rules
    base = {"edge": [(1, 2), (3, 4, 5), (6,)]}
    rels = BatchEvaluator(rules, backend=backend).evaluate(base)
    assert set(rels["r"]) == {(3, 4, 5)}
    assert set(rels["s"]) == {(3,)}
    assert set(rels["edge"]) == {(1, 2), (3, 4, 5), (6,)}  # given facts are handed back
    engine = IncrementalEngine(rules)
    engine.step(inserts=base)
    assert set(engine.relation("r")) == {(3, 4, 5)}
    engine.step(deletes={"edge": [(3, 4, 5)]}, inserts={"edge": [(1, 2, 3)]})
    assert set(engine.relation("r")) == {(1, 2, 3)}


# ------------------------------------------------------------------ differential, mixed types

MIXED_DOMAIN = st.sampled_from([0, 1, 1.0, True, False, "1", b"\x01", -0.0, 2.5])
EXAMPLES = int(os.environ.get("MERKLOG_DIFF_EXAMPLES", "500")) // 2


def _fact(rel: str) -> st.SearchStrategy:
    return st.tuples(st.just(rel), st.tuples(*[MIXED_DOMAIN] * EDB[rel]))


_any_fact = st.one_of(*[_fact(r) for r in EDB])
_epochs = st.lists(
    st.tuples(st.lists(_any_fact, max_size=8), st.lists(_any_fact, max_size=5)),
    min_size=1,
    max_size=4,
)


def _engine_sets(rels, names) -> dict[str, set]:
    return {rel: set(rels.engine(rel)) if rel in rels else set() for rel in names}


@settings(max_examples=EXAMPLES, deadline=None)
@given(programs(domain=MIXED_DOMAIN, funcs=("count", "min", "max")), _epochs)
def test_batch_columnar_incremental_agree_on_mixed_values(prog, batches) -> None:
    """Random stratified programs over 1 / 1.0 / true / "1" / x"01" / -0.0: the
    incremental engine after every epoch, the tuple evaluator and the columnar
    executor (forced; skipped where it declines a stratum) give the same rows."""
    rules, _arity = prog
    names = [*EDB, *IDB]
    engine = IncrementalEngine(rules)
    base: dict[str, set] = {}
    for inserts, deletes in batches:
        ins: dict[str, list] = {}
        dels: dict[str, list] = {}
        for rel, row in deletes:
            dels.setdefault(rel, []).append(row)
            base.setdefault(rel, set()).discard(row_to_engine(row))
        for rel, row in inserts:
            ins.setdefault(rel, []).append(row)
            base.setdefault(rel, set()).add(row_to_engine(row))
        engine.step(inserts=ins, deletes=dels)
        reference = _engine_sets(BatchEvaluator(rules, backend="tuple").evaluate(base), names)
        for rel in names:
            assert engine.relation(rel).engine == reference[rel], (rel, [str(r) for r in rules])
        try:
            columnar = BatchEvaluator(rules, backend="columnar").evaluate(base)
        except Ineligible:
            continue
        assert _engine_sets(columnar, names) == reference, [str(r) for r in rules]


_FIXED = """
j(X, Y) :- a(X, Y), c(Y).
k(X) :- a(X, X).
n(X) :- a(X, _), !c(X).
m(X, N) :- c(X), N := count : a(X, _).
t(Y) :- a(1, Y).
u(Y) :- a(true, Y).
v(Y) :- a(1.0, Y).
"""


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(_fact("a"), max_size=30), st.lists(_fact("c"), max_size=8))
def test_columnar_equals_tuple_on_mixed_joins_negation_and_constants(a_facts, c_facts) -> None:
    """Programs the columnar executor accepts (joins, repeated variables, negation,
    count, constants): forced columnar == tuple == incremental, row for row."""
    facts = {"a": [row for _r, row in a_facts], "c": [row for _r, row in c_facts]}
    rels = {}
    for backend in ("tuple", "columnar"):
        evaluated = Program.parse(_FIXED, backend=backend).evaluate(facts)
        rels[backend] = {rel: set(evaluated.engine(rel)) for rel in "jkntuv"}
    assert rels["columnar"] == rels["tuple"]
    engine = IncrementalEngine(Program.parse(_FIXED).checked)
    engine.step(inserts=facts)
    assert {rel: engine.relation(rel).engine for rel in "jkntuv"} == rels["tuple"]


# ------------------------------------------------------------------ expressions inside atoms

ARITH_VALUES = st.sampled_from([0, 1, 2, 3, -1, 1.0, 2.0, 4.0, 0.5, 1.5, "s", True, b"\x01"])


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.sampled_from(["+", "-", "*", "/", "%"]),
    st.sampled_from(["0", "1", "2", "2.0", "0.5", "-1"]),
    st.lists(ARITH_VALUES, max_size=6),
    st.lists(st.tuples(ARITH_VALUES, ARITH_VALUES), max_size=8),
)
def test_expression_arguments_compare_as_equality_in_every_evaluator(op, const, ps, qs) -> None:
    """``q(X * 2)`` keeps the bindings whose value equals a ``q`` tuple's under ``==``
    (``2`` finds ``q(2.0)``), whatever the body's order, and an argument without a value
    (``X / 0``, ``"s" + 1``) drops the binding, under negation too. The tuple evaluator
    looked the value up by identity (``a`` empty, ``c`` not), the incremental engine's
    negation too, and both kept a negated binding whose expression had no value. The
    reference is the rules' meaning, computed here with ``arith`` and ``values_equal``."""
    from merklog.engine.arith import NoBinding, arith, values_equal

    p_rows = {row_to_engine((v,)) for v in ps}
    q_rows = {row_to_engine(t) for t in qs}
    c = to_engine(float(const)) if "." in const else int(const)
    want: dict[str, set] = {"a": set(), "c": set(), "n": set(), "w": set()}
    for (x,) in p_rows:
        try:
            value = arith(op, x, c)
        except NoBinding:
            continue  # no value: every rule drops this binding
        matches = [row for row in q_rows if values_equal(row[0], value)]
        if matches:
            want["a"].add((x,))
            want["c"].add((x,))
            want["w"].update((x, row[1]) for row in matches)
        else:
            want["n"].add((x,))
    expr = f"X {op} {const}"
    text = f"""
    a(X) :- p(X), q({expr}, _).
    c(X) :- q({expr}, _), p(X).
    n(X) :- p(X), !q({expr}, _).
    w(X, Y) :- p(X), q({expr}, Y).
    """
    rules = parse_program(text).rules
    base = {"p": p_rows, "q": q_rows}
    engine = IncrementalEngine(rules)
    engine.step(inserts={rel: list(rows) for rel, rows in base.items()})
    assert {rel: engine.relation(rel).engine for rel in want} == want, ("incremental", text)
    for backend in ("tuple", "auto"):
        got = _engine_sets(BatchEvaluator(rules, backend=backend).evaluate(base), want)
        assert got == want, (backend, text, ps, qs)


def test_only_ascii_digits_are_numbers_in_datalog_text() -> None:
    """QA: ``ud(١٢).`` was the int 12 and ``ud(１.５).`` the float 1.5 (the lexer's and the
    fact reader's ``\\d`` took every Unicode digit, and ``int()`` read them), while a fact
    file keeps ``١٢`` as a string: one spelling, two values. Datalog numbers are ASCII;
    anything else is a syntax error at the character."""
    import pytest

    from merklog.engine.errors import ParseError
    from merklog.engine.parser import parse_facts

    for text in ("ud(١٢).", "ud(１.５).", "ud(1e١).", "ud(1, ٣)."):
        with pytest.raises(ParseError, match="unexpected character"):
            parse_facts(text)
        with pytest.raises(ParseError):
            Program.parse(text)
    assert [f.args for f in parse_facts("ud(12). ud(1.5e3). ud(0x1F).")] == [
        (12,),
        (1500.0,),
        (31,),
    ]


def test_given_facts_are_checked_and_named_like_the_nodes() -> None:
    """QA: ``Program.evaluate`` took a string with a lone surrogate (a bare ValueError from
    the DAG-CBOR encoder later, or the invalid value returned), named numpy's bool as
    "bool is not a merklog value", and refused ``bytearray`` that the node reads as bytes."""
    import numpy as np
    import pytest

    from merklog.engine.errors import NotAValueError

    program = Program.parse("q(X) :- p(X).")
    with pytest.raises(NotAValueError, match="lone surrogate"):
        program.evaluate({"p": [("\ud800",)]})
    with pytest.raises(NotAValueError, match="numpy.bool is not a merklog value"):
        program.evaluate({"p": [(np.bool_(True),)]})
    got = program.evaluate({"p": [(bytearray(b"x"),), (memoryview(b"y"),), (b"x",)]})["q"]
    assert sorted(got) == [(b"x",), (b"y",)]


def test_a_declaration_given_as_facts_is_named_for_what_it_is() -> None:
    """QA: ``merklog put '.decl v(x: int).'`` hinted at ``--dialect souffle``, which put
    does not have (and the declaration is merklog's)."""
    import pytest

    from merklog.engine.errors import ParseError
    from merklog.engine.parser import parse_facts

    with pytest.raises(ParseError) as err:
        parse_facts(".decl v(x: int).")
    assert "expected a fact" in str(err.value)
    assert "belong in a program" in err.value.hint and "dialect" not in err.value.hint
