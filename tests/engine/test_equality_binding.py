"""Which ``V == term`` binds a variable depends on the rule's text only (ADR 0208,
docs/language.md "Which equality binds a variable"): never on the body order, the
semi-naive delta variant or the evaluator. ``2 == 2.0`` holds but ``2`` and ``2.0``
are distinct values, so the binding equality decides the derived value."""

from __future__ import annotations

import itertools

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merklog.engine import Program, ast, planner
from merklog.engine.batch import BatchEvaluator
from merklog.engine.columnar import Ineligible
from merklog.engine.errors import EngineError
from merklog.engine.incremental import IncrementalEngine
from merklog.engine.parser import parse_program
from merklog.engine.values import row_to_engine
from merklog.node.cli import cli


def typed(rows) -> set[tuple]:
    """Rows as (type, value) pairs: compares like merklog identity, unlike Python ``==``."""
    return {tuple((type(v), v) for v in row) for row in rows}


def batch(text: str, facts: dict, rel: str, backend: str, semi_naive: bool = True):
    """``rel`` after a batch evaluation; None when the columnar executor declines."""
    checked = Program.parse(text).checked
    strata = [list(s.rules) for s in checked.strata if not s.temporal]
    ev = BatchEvaluator(
        checked.program.rules, strata=strata, semi_naive=semi_naive, backend=backend
    )
    base = {r: {row_to_engine(t) for t in rows} for r, rows in facts.items()}
    try:
        return typed(ev.evaluate(base)[rel])
    except Ineligible:
        assert backend == "columnar"
        return None


def every_batch(text: str, facts: dict, rel: str) -> list[set[tuple]]:
    """``rel`` by every batch mode: Program, tuple/auto/columnar, semi-naive or naive."""
    out = [typed(Program.parse(text).evaluate(facts)[rel])]
    for backend, semi in itertools.product(("tuple", "auto", "columnar"), (True, False)):
        got = batch(text, facts, rel, backend, semi)
        if got is not None:
            out.append(got)
    return out


def incremental_epochs(text: str, epochs: list[tuple[dict, dict]], rel: str) -> list[set[tuple]]:
    """``rel`` after each epoch of (inserts, deletes)."""
    engine = IncrementalEngine(Program.parse(text).checked)
    out = []
    for inserts, deletes in epochs:
        engine.step(inserts=inserts, deletes=deletes)
        out.append(typed(engine.relation(rel)))
    return out


REPRO_A = "r(Y) :- a(X), b(Z), Y == X * 1.0, Y == Z."
REPRO_A_SWAPPED_ATOMS = "r(Y) :- b(Z), a(X), Y == X * 1.0, Y == Z."
REPRO_B = "n(X) :- base(X).\nn(Y) :- r(Y), Y < 0.\nr(Y) :- n(X), n(Z), Y == X * 1.0, Y == Z.\n"
F2 = (float, 2.0)
I2 = (int, 2)

# (program, facts, expected r): the reported repros and their variations
CASES = [
    (REPRO_A, {"a": [(2,)], "b": [(2,)]}, {(F2,)}),
    (REPRO_A_SWAPPED_ATOMS, {"a": [(2,)], "b": [(2,)]}, {(F2,)}),
    ("r(Y) :- a(X), b(Z), Y == Z, Y == X * 1.0.", {"a": [(2,)], "b": [(2,)]}, {(I2,)}),
    ("r(Y) :- a(X), Y == X, Y == X * 1.0.", {"a": [(2,), (2.0,)]}, {(I2,), (F2,)}),
    ("r(Y) :- a(X), Y == X * 1.0, Y == X.", {"a": [(2,), (2.0,)]}, {(F2,)}),
    ("r(Y) :- a(X), Y == X, 2 == Y.", {"a": [(2,), (2.0,)]}, {(I2,), (F2,)}),
    ("r(Y) :- a(X), 2 == Y, Y == X.", {"a": [(2,), (2.0,)]}, {(I2,)}),
    # a variable an atom binds: the atom binds it, the equality filters
    ("r(X) :- a(X), X == 2.0.", {"a": [(2,)]}, {(I2,)}),
    ("r(X) :- X == 2.0, a(X).", {"a": [(2,)]}, {(I2,)}),
    ("r(X) :- 2.0 == X, a(X), X == 2.", {"a": [(2,), (2.0,), (True,)]}, {(I2,), (F2,)}),
    # chains: repeatedly, the first equality that can bind binds. Here W == X (Y == W
    # cannot bind yet), then Y == W, which comes before Y == 2.0 ...
    ("r(Y) :- Y == W, W == X, Y == 2.0, a(X).", {"a": [(2,)]}, {(I2,)}),
    # ... and here Y == 2.0 comes before W == X, so Y is 2.0 and Y == W binds W to it
    ("r(Y, W) :- Y == W, Y == 2.0, W == X, a(X).", {"a": [(2,)]}, {(F2, F2)}),
    # an aggregate binds its result; the equality filters it
    ("r(N) :- a(X), N == X * 1.0, N := count : a(_).", {"a": [(1,)]}, {((int, 1),)}),
    # ... unless its groups need the equality's variable (then the equality binds, the
    # aggregate checks: count 1 is not 1.0)
    ("r(N) :- a(X), N == X * 1.0, G == N, N := count : b(G).", {"a": [(1,)], "b": [(1.0,)]}, set()),
    ("r(N) :- a(X), N == X, G == N, N := count : b(G).", {"a": [(1,)], "b": [(1,)]}, {((int, 1),)}),
    (REPRO_B, {"base": [(2,)]}, {(F2,)}),
]


@pytest.mark.parametrize(("text", "facts", "want"), CASES)
def test_every_batch_mode_gives_the_rules_answer(text: str, facts: dict, want: set) -> None:
    for got in every_batch(text, facts, "r"):
        assert got == want


@pytest.mark.parametrize(("text", "facts", "want"), CASES)
def test_incremental_gives_the_rules_answer_over_epochs(text: str, facts: dict, want) -> None:
    epochs = [
        (facts, {}),  # everything arrives
        ({}, facts),  # everything leaves
        (facts, {}),  # and comes back
        ({}, {}),  # a quiet epoch
    ]
    got = incremental_epochs(text, epochs, "r")
    assert got == [want, set(), want, want]


def test_incremental_when_facts_arrive_one_relation_at_a_time() -> None:
    epochs = [({"a": [(2,)]}, {}), ({"b": [(2,)]}, {}), ({"b": [(2.0,)]}, {"b": [(2,)]})]
    for text in (REPRO_A, REPRO_A_SWAPPED_ATOMS):
        assert incremental_epochs(text, epochs, "r") == [set(), {(F2,)}, {(F2,)}]


@pytest.mark.parametrize("text", [REPRO_A, REPRO_A_SWAPPED_ATOMS])
def test_eval_cli_repro(tmp_path, text: str) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "p.dl").write_text(text + "\n")
    (tmp_path / "f" / "a.facts").write_text("2\n")
    (tmp_path / "f" / "b.facts").write_text("2\n")
    args = ["eval", str(tmp_path / "p.dl"), "--facts", str(tmp_path / "f")]
    res = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "o"), "--sorted"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "r.csv").read_text() == "2.0\n"


def test_eval_cli_repro_b(tmp_path) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "p.dl").write_text(REPRO_B)
    (tmp_path / "f" / "base.facts").write_text("2\n")
    args = ["eval", str(tmp_path / "p.dl"), "--facts", str(tmp_path / "f")]
    res = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "o"), "--sorted"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "r.csv").read_text() == "2.0\n"


# ------------------------------------------------------------------ the planner


def _rule(text: str) -> ast.Rule:
    return parse_program(text).rules[-1]


def _assigns(plan: planner.Plan) -> set[tuple[str, ast.BodyLiteral]]:
    return {(s.var.name, s.lit) for s in plan if isinstance(s, planner.Assign)}


def _equalities(body) -> list[ast.BodyLiteral]:
    return [lit for lit in body if isinstance(lit, ast.Comparison) and lit.op == "=="]


@pytest.mark.parametrize("expr_keys", [True, False])
def test_every_delta_variant_and_order_assigns_the_same_equality(expr_keys: bool) -> None:
    rule = _rule(REPRO_B.splitlines()[-1])
    first = _equalities(rule.body)[0]  # Y == X * 1.0
    seen = set()
    for body in itertools.permutations(rule.body):
        if _equalities(body) != _equalities(rule.body):
            continue  # the rule reads the equalities in the order written
        r = ast.Rule(rule.head, tuple(body), rule.time, rule.pos)
        atoms = [i for i, lit in enumerate(body) if isinstance(lit, ast.Positive)]
        for delta in [None, *atoms]:
            seen.add(frozenset(_assigns(planner.plan_rule(r, delta, expr_keys=expr_keys))))
    assert seen == {frozenset({("Y", first)})}


def test_equality_binders_follow_the_text() -> None:
    body = _rule("r(Y) :- Y == W, W == X, Y == 2.0, a(X).").body
    assert planner.equality_binders(body) == {1: "W", 0: "Y"}
    body = _rule("r(Y) :- Y == W, Y == 2.0, W == X, a(X).").body
    assert planner.equality_binders(body) == {1: "Y", 0: "W"}
    body = _rule("r(Y) :- a(X), 2 == Y, Y == X.").body
    assert planner.equality_binders(body) == {1: "Y"}
    # an atom's variable is never bound by an equality; an aggregate binds its result
    body = _rule("r(X, N) :- X == 1.0, N == 3, a(X), N := count : a(_).").body
    assert planner.equality_binders(body) == {3: "N"}
    # variables bound outside (an aggregate's groups) are never rebound
    body = _rule("r(Y) :- a(X), Y == X.").body
    assert planner.equality_binders(body, {"Y"}) == {}


# ------------------------------------------------------------------ property: order, evaluators

VALUES = [1, 1.0, True, "1", b"\x01", 2, 2.0, 0, 2**53, float(2**53), 2**53 + 1, 2**62]

# atom-bound: X (a), Z (b); equality-bound candidates: Y, W
EQUALITIES = [
    "Y == X",
    "Y == Z",
    "Y == X * 1.0",
    "X * 1.0 == Y",
    "Y == Z + 0",
    "Y == 2",
    "2.0 == Y",
    "Y == W",
    "W == Y",
    "W == X",
    "W == Z * 1.0",
    "W == 1.0",
    "X == Z",
    "X == 2.0",
    "Z == 1",
]
FILTERS = ["Y != 1", "X <= 2", "W != 0.0"]


@st.composite
def programs(draw):
    eqs = draw(st.lists(st.sampled_from(EQUALITIES), min_size=2, max_size=5, unique=True))
    others = draw(st.lists(st.sampled_from(FILTERS), max_size=1))
    recursive = draw(st.booleans())
    atoms = ["n(X)", "n(Z)"] if recursive else ["a(X)", "b(Z)"]
    names = " ".join(eqs)
    head = [v for v in ("Y", "W") if v in names] or ["X"]
    body = [*atoms, *eqs, *others]
    rows = st.lists(st.sampled_from(VALUES).map(lambda v: (v,)), max_size=4, unique_by=repr)
    facts = {"a": draw(rows), "b": draw(rows)}
    shuffled = draw(st.permutations(range(len(body))))
    # the same body in another order, its equalities still in the order written
    is_eq = [lit in eqs for lit in body]
    eq_order = iter(i for i in range(len(body)) if is_eq[i])
    order = [next(eq_order) if is_eq[i] else i for i in shuffled]
    return head, body, recursive, facts, order, shuffled


def _text(head: list[str], body: list[str], recursive: bool) -> str:
    rule = f"r({', '.join(head)}) :- {', '.join(body)}."
    if not recursive:
        return rule
    loop = f'n(Q) :- r(Q{", _" * (len(head) - 1)}), Q == "never".'
    return f"n(X) :- a(X).\nn(X) :- b(X).\n{loop}\n{rule}"


def _check_rows(text: str, facts: dict) -> set[tuple] | None:
    try:
        Program.parse(text)
    except EngineError:
        return None  # Y or W never bound: not a program
    return typed(Program.parse(text, backend="tuple").evaluate(facts)["r"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_moving_literals_never_changes_the_answer(case) -> None:
    """Atoms and filters anywhere, equalities in the order written: one answer, by
    every batch mode and (over epochs) incrementally."""
    head, body, recursive, facts, order, shuffled = case
    text = _text(head, body, recursive)
    want = _check_rows(text, facts)
    if want is None:
        return
    moved = _text(head, [body[i] for i in order], recursive)
    for got in every_batch(moved, facts, "r"):
        assert got == want, (text, moved)
    half = {rel: rows[: len(rows) // 2] for rel, rows in facts.items()}
    rest = {rel: rows[len(rows) // 2 :] for rel, rows in facts.items()}
    got = incremental_epochs(moved, [(half, {}), (rest, {}), ({}, half)], "r")
    assert got == [_check_rows(text, half), want, _check_rows(text, rest)], (text, moved)
    # any order at all (equalities too): the evaluators still agree with each other
    shuffled_text = _text(head, [body[i] for i in shuffled], recursive)
    answers = every_batch(shuffled_text, facts, "r")
    answers += incremental_epochs(shuffled_text, [(facts, {})], "r")
    assert all(a == answers[0] for a in answers), shuffled_text
