"""Differential test: after every epoch the incremental engine equals a from-scratch
evaluation (the naive oracle and, when importable, the batch reference evaluator),
over random stratified programs and random insert/delete sequences."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine import ast
from merklog.engine.batch import BatchEvaluator
from merklog.engine.incremental import IncrementalEngine

from .incremental_naive import evaluate, next_tuples

EDB = {"a": 2, "b": 2, "c": 1}
IDB = ["p0", "p1", "p2", "p3"]
LEVEL = {"p0": 0, "p1": 0, "p2": 1, "p3": 1}
DOMAIN = st.integers(0, 3)
VARS = ["X", "Y", "Z", "W"]
EXAMPLES = int(os.environ.get("MERKLOG_DIFF_EXAMPLES", "500"))


@st.composite
def programs(
    draw: st.DrawFn,
    temporal: bool = False,
    domain: st.SearchStrategy = DOMAIN,
    funcs: tuple[str, ...] = ("count", "sum", "min", "max"),
) -> tuple[list[ast.Rule], dict[str, int]]:
    """Random stratified programs: p0/p1 may be mutually recursive, p2/p3 likewise on top;
    negation and aggregation only reach a lower level. ``temporal`` adds @next rules
    (free to negate anything) and arithmetic bindings kept in a finite domain.
    ``domain`` draws the constants; ``funcs`` the aggregate functions."""
    arity = {p: draw(st.integers(1, 2)) for p in IDB}
    arity.update(EDB)
    counter = [0]

    def anon() -> ast.Var:
        counter[0] += 1
        return ast.Var(f"_{counter[0]}", anonymous=True)

    def atom_over(rel: str, pool: list[str], allow_const: bool = True) -> ast.Atom:
        args: list[ast.Term] = []
        for _ in range(arity[rel]):
            kind = draw(st.sampled_from(["var", "var", "var", "anon", "const"]))
            if kind == "const" and allow_const:
                args.append(ast.Const(draw(domain)))
            elif kind == "anon":
                args.append(anon())
            else:
                args.append(ast.Var(draw(st.sampled_from(pool))))
        return ast.Atom(rel, tuple(args))

    rules = []
    n_next = draw(st.integers(1, 3)) if temporal else 0
    n_now = draw(st.integers(1, 6))
    for index in range(n_now + n_next):
        inductive = index >= n_now
        head_rel = draw(st.sampled_from(IDB))
        level = LEVEL[head_rel]
        lower = list(EDB) + [p for p in IDB if LEVEL[p] < level]
        same_or_lower = lower + [p for p in IDB if LEVEL[p] == level]
        if inductive:  # the final stratum reads (and may negate) every relation
            lower = same_or_lower = list(EDB) + IDB
        body: list[ast.BodyLiteral] = []
        for _ in range(draw(st.integers(1, 3))):
            rel = draw(st.sampled_from(same_or_lower))
            body.append(ast.Positive(atom_over(rel, VARS)))
        bound = sorted({v.name for lit in body for v in ast.literal_vars(lit) if not v.anonymous})
        if not bound:
            first = body[0]
            assert isinstance(first, ast.Positive)
            args = list(first.atom.args)
            args[0] = ast.Var("X")
            body[0] = ast.Positive(ast.Atom(first.atom.rel, tuple(args)))
            bound = ["X"]
        if draw(st.booleans()):
            op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
            right = (
                ast.Var(draw(st.sampled_from(bound)))
                if draw(st.booleans())
                else ast.Const(draw(domain))
            )
            body.append(ast.Comparison(op, ast.Var(draw(st.sampled_from(bound))), right))
        if draw(st.booleans()):
            rel = draw(st.sampled_from(lower))
            body.append(ast.Negated(atom_over(rel, bound)))
        result_vars: list[str] = []
        if temporal and draw(st.booleans()):
            expr = ast.BinOp(
                "%",
                ast.BinOp("+", ast.Var(draw(st.sampled_from(bound))), ast.Const(draw(domain))),
                ast.Const(4),
            )
            body.append(ast.Comparison("==", ast.Var("V"), expr))
            result_vars.append("V")
        if draw(st.booleans()):
            rel = draw(st.sampled_from(lower))
            func = draw(st.sampled_from(funcs))
            locals_ = ["L1", "L2"]
            agg_atom = atom_over(rel, locals_ + bound[:1], allow_const=False)
            inner = {v.name for v in ast.atom_vars(agg_atom) if not v.anonymous}
            local_in = [v for v in inner if v in locals_]
            if func != "count" and not local_in:
                func = "count"
            arg = None if func == "count" else ast.Var(local_in[0])
            body.append(ast.Aggregate(ast.Var("R"), func, arg, (ast.Positive(agg_atom),)))
            result_vars.append("R")
        head_pool = bound + result_vars
        head_args = tuple(
            ast.Var(draw(st.sampled_from(head_pool)))
            if draw(st.integers(0, 4))
            else ast.Const(draw(domain))
            for _ in range(arity[head_rel])
        )
        time = "next" if inductive else "now"
        rules.append(ast.Rule(ast.Atom(head_rel, head_args), tuple(body), time=time))
    return rules, arity


def fact(rel: str) -> st.SearchStrategy:
    return st.tuples(st.just(rel), st.tuples(*[DOMAIN] * EDB[rel]))


any_fact = st.one_of(*[fact(r) for r in EDB])
epochs = st.lists(
    st.tuples(st.lists(any_fact, max_size=8), st.lists(any_fact, max_size=5)),
    min_size=1,
    max_size=5,
)

STRATA = [["p0", "p1"], ["p2", "p3"]]


def _split(changes: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for rel, row in changes:
        out.setdefault(rel, []).append(row)
    return out


@settings(max_examples=EXAMPLES, deadline=None)
@given(programs(), epochs)
def test_incremental_equals_from_scratch_after_every_epoch(prog, batches) -> None:
    rules, _arity = prog
    engine = IncrementalEngine(rules)
    base: dict[str, set] = {}
    for inserts, deletes in batches:
        ins: dict[str, list] = {}
        dels: dict[str, list] = {}
        for rel, row in deletes:
            dels.setdefault(rel, []).append(row)
            base.setdefault(rel, set()).discard(row)
        for rel, row in inserts:
            ins.setdefault(rel, []).append(row)
            base.setdefault(rel, set()).add(row)
        before = {rel: engine.relation(rel) for rel in [*EDB, *IDB]}
        deltas = engine.step(inserts=ins, deletes=dels)
        expected = evaluate(rules, STRATA, base)
        for rel in [*EDB, *IDB]:
            got = engine.relation(rel)
            assert got == expected.get(rel, set()), (rel, [str(r) for r in rules])
            change = {row: 1 for row in got - before[rel]}
            change.update({row: -1 for row in before[rel] - got})
            assert deltas.get(rel, {}) == change, rel
        reference = BatchEvaluator(rules).evaluate(base)
        for rel in [*EDB, *IDB]:
            assert engine.relation(rel) == set(reference.get(rel, set())), rel


@settings(max_examples=max(1, EXAMPLES // 2), deadline=None)
@given(programs(temporal=True), epochs, st.lists(st.lists(any_fact, max_size=4), max_size=5))
def test_incremental_equals_from_scratch_with_next_rules_and_events(prog, batches, events):
    """Epoch semantics: base facts + this epoch's events + last epoch's @next tuples."""
    rules, _arity = prog
    engine = IncrementalEngine(rules)
    batch = BatchEvaluator(rules)
    base: dict[str, set] = {}
    carried: dict[str, set] = {}
    for t, (inserts, deletes) in enumerate(batches):
        for rel, row in deletes:
            base.setdefault(rel, set()).discard(row)
        for rel, row in inserts:
            base.setdefault(rel, set()).add(row)
        now = events[t] if t < len(events) else []
        engine.step(inserts=_split(inserts), deletes=_split(deletes), events=_split(now))
        db = {rel: set(rows) for rel, rows in base.items()}
        for rel, row in now:
            db.setdefault(rel, set()).add(row)
        for rel, rows in carried.items():
            db.setdefault(rel, set()).update(rows)
        expected = evaluate(rules, STRATA, db)
        step = batch.step(db)
        for rel in [*EDB, *IDB]:
            got = engine.relation(rel)
            assert got == expected.get(rel, set()), (t, rel, [str(r) for r in rules])
            assert got == set(step.relations.get(rel, set())), (t, rel)
        carried = next_tuples(rules, expected)
        assert {k: v for k, v in step.next_tuples.items() if v} == carried
        for rel in IDB:
            assert engine.next_relation(rel) == carried.get(rel, set()), (t, rel)
