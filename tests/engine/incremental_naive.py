"""A deliberately naive from-scratch Datalog evaluator used as a second oracle for the
incremental engine's differential tests (arithmetic from merklog.engine.arith; Python comparisons).

Semantics follow :mod:`merklog.engine.ast`: aggregates range over the distinct
bindings of their body's variables, count/sum over nothing give 0, min/max
derive nothing; variables of a negated atom that occur nowhere else are existential.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence

from merklog.engine import ast
from merklog.engine.arith import NoBinding, arith, negate

CMP = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _vars(lit: ast.BodyLiteral) -> set[str]:
    return {v.name for v in ast.literal_vars(lit)}


def _val(term: ast.Term, env: Mapping[str, object]) -> object:
    """A term's value; raises NoBinding when arithmetic has none (the binding is dropped)."""
    if isinstance(term, ast.Const):
        return term.value
    if isinstance(term, ast.BinOp):
        return arith(term.op, _val(term.left, env), _val(term.right, env))
    if isinstance(term, ast.Neg):
        return negate(_val(term.operand, env))
    assert isinstance(term, ast.Var)
    return env[term.name]


def _match(atom: ast.Atom, row: tuple, env: dict) -> dict | None:
    if len(row) != len(atom.args) and not (atom.rest and len(row) >= len(atom.args)):
        return None
    out = dict(env)
    for a, v in zip(atom.args, row, strict=False):
        if isinstance(a, ast.Const):
            if a.value != v:
                return None
        elif a.name in out:
            if out[a.name] != v:
                return None
        else:
            out[a.name] = v
    return out


def _grouping(body: Sequence[ast.BodyLiteral], agg: ast.Aggregate) -> list[str]:
    outside: set[str] = set()
    for lit in body:
        if lit is agg:
            continue
        outside |= {agg_result(lit)} if isinstance(lit, ast.Aggregate) else _vars(lit)
    inner = set().union(*(_vars(b) for b in agg.body))
    return sorted(inner & outside)


def agg_result(lit: ast.Aggregate) -> str:
    return lit.result.name


def solve(
    body: Sequence[ast.BodyLiteral],
    db: Mapping[str, set],
    env: dict,
    full: Sequence[ast.BodyLiteral] | None = None,
) -> Iterator[dict]:
    """All bindings of ``body`` extending ``env`` (``full``: the whole conjunction, for scoping)."""
    if full is None:
        full = body
    pending = list(body)
    if not pending:
        yield env
        return
    bound = set(env)
    for i, lit in enumerate(pending):
        ready = False
        if isinstance(lit, ast.Positive):
            ready = True
        elif isinstance(lit, ast.Comparison):
            ready = _vars(lit) <= bound or (
                lit.op == "=="
                and (
                    (isinstance(lit.left, ast.Var) and _vars_t(lit.right) <= bound)
                    or (isinstance(lit.right, ast.Var) and _vars_t(lit.left) <= bound)
                )
            )
        elif isinstance(lit, ast.Negated):
            others = set().union(*(_vars(x) for x in full if x is not lit), set())
            ready = (_vars(lit) & others) <= bound
        else:
            ready = set(_grouping(full, lit)) <= bound
        if ready:
            rest = pending[:i] + pending[i + 1 :]
            yield from _apply(lit, rest, full, db, env)
            return
    raise ValueError(f"cannot schedule {body}")


def _vars_t(term: ast.Term) -> set[str]:
    return {v.name for v in ast.term_vars(term)}


def _apply(lit, rest, full, db, env) -> Iterator[dict]:
    if isinstance(lit, ast.Positive):
        for row in list(db.get(lit.atom.rel, ())):
            m = _match(lit.atom, row, env)
            if m is not None:
                yield from solve(rest, db, m, full)
    elif isinstance(lit, ast.Comparison):
        lv = set(_vars_t(lit.left)) <= set(env)
        rv = set(_vars_t(lit.right)) <= set(env)
        if lv and rv:
            try:
                ok = CMP[lit.op](_val(lit.left, env), _val(lit.right, env))
            except (TypeError, NoBinding):
                ok = False
            if ok:
                yield from solve(rest, db, env, full)
        else:
            var, other = (lit.left, lit.right) if rv else (lit.right, lit.left)
            try:
                value = _val(other, env)
            except NoBinding:
                return
            yield from solve(rest, db, {**env, var.name: value}, full)
    elif isinstance(lit, ast.Negated):
        if not any(_match(lit.atom, row, env) is not None for row in db.get(lit.atom.rel, ())):
            yield from solve(rest, db, env, full)
    else:
        groups = _grouping(full, lit)
        inner_vars = sorted(set().union(*(_vars(b) for b in lit.body)))
        genv = {g: env[g] for g in groups}
        bindings = {tuple(b[v] for v in inner_vars) for b in solve(lit.body, db, genv)}
        values = [dict(zip(inner_vars, b, strict=True)) for b in bindings]
        if lit.func == "count":
            result = len(values)
        elif lit.func == "sum":
            result = sum(_val(lit.arg, b) for b in values)
        elif not values:
            return
        elif lit.func == "min":
            result = min(_val(lit.arg, b) for b in values)
        else:
            result = max(_val(lit.arg, b) for b in values)
        name = lit.result.name
        if name in env:
            if env[name] == result:
                yield from solve(rest, db, env, full)
        else:
            yield from solve(rest, db, {**env, name: result}, full)


def evaluate(
    rules: Sequence[ast.Rule], strata: Sequence[Sequence[str]], base: Mapping[str, set]
) -> dict[str, set]:
    """Naive stratified fixpoint: every rule re-run in full until nothing changes."""
    db = {rel: set(rows) for rel, rows in base.items()}
    for stratum in strata:
        members = set(stratum)
        srules = [r for r in rules if r.time == "now" and r.head.rel in members]
        while True:
            changed = False
            for r in srules:
                for env in list(solve(r.body, db, {})):
                    try:
                        row = tuple(_val(a, env) for a in r.head.args)
                    except NoBinding:
                        continue
                    target = db.setdefault(r.head.rel, set())
                    if row not in target:
                        target.add(row)
                        changed = True
            if not changed:
                break
    return {rel: rows for rel, rows in db.items() if rows}


def next_tuples(rules: Sequence[ast.Rule], db: Mapping[str, set]) -> dict[str, set]:
    """Tuples the ``@next`` rules derive from a fully evaluated epoch."""
    out: dict[str, set] = {}
    for r in rules:
        if r.time != "next":
            continue
        for env in solve(r.body, db, {}):
            try:
                row = tuple(_val(a, env) for a in r.head.args)
            except NoBinding:
                continue
            out.setdefault(r.head.rel, set()).add(row)
    return out
