"""Soufflé's variable scoping for aggregates, rewritten into merklog's.

merklog scopes an aggregate simply: a variable of its body that also occurs in
the rest of the rule body is a grouping variable, every other one is local, and
the result variable must not occur inside. Soufflé (``ast/analysis/Aggregate``
and ``ast/transform/GroundWitnesses`` in the souffle-lang/souffle repository;
https://souffle-lang.github.io/aggregates) classifies an aggregate's variables
as

- *injected*: grounded outside the aggregate (with the aggregate itself
  contributing nothing) and not in its target expression — the outer value
  flows in, as merklog's grouping variables do;
- *witnesses* (``min``/``max`` only): grounded inside the aggregate body, used
  outside it, and not grounded outside — the head receives the values of the
  tuples that reach the extreme;
- *local*: everything else, including target-expression variables and
  variables that merely share a name with an outer one (shadowing).

:func:`resolve_aggregate_scopes` rewrites a parsed Soufflé rule so merklog's
simpler rules give Soufflé's answer:

- ``perfect(x) :- gen(x), x = sum inv : e_factor(x, inv).`` — ``x`` is injected
  *and* the result: the result becomes a fresh variable ``r`` and ``x == r`` is
  added (the sum over ``x``'s factors must equal ``x``);
- ``max_recipe(a) :- a = max a : recipe(a, _, _, _).`` — the inner ``a`` is
  local: it is renamed inside the aggregate, so ``a`` is the overall maximum;
- ``longest(y, x, l) :- l = max m : length(x, y, m).`` — ``x`` and ``y`` are
  witnesses: they are renamed inside the aggregate, and the aggregate body is
  repeated outside it with the target variable replaced by the result
  (``length(x, y, l)``), exactly Soufflé's GroundWitnesses transformation, so
  every tuple reaching the maximum is a witness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .ast import (
    Aggregate,
    Atom,
    BinOp,
    BodyLiteral,
    Comparison,
    Neg,
    Negated,
    Positive,
    Rule,
    Term,
    Var,
    atom_vars,
    literal_vars,
    term_vars,
)


def _rename_term(term: Term, names: Mapping[str, str]) -> Term:
    if isinstance(term, Var):
        new = names.get(term.name)
        return term if new is None else Var(new, term.anonymous, term.pos)
    if isinstance(term, BinOp):
        return BinOp(
            term.op, _rename_term(term.left, names), _rename_term(term.right, names), term.pos
        )
    if isinstance(term, Neg):
        return Neg(_rename_term(term.operand, names), term.pos)
    return term


def _rename_atom(atom: Atom, names: Mapping[str, str]) -> Atom:
    args = tuple(_rename_term(a, names) for a in atom.args)
    return Atom(atom.rel, args, atom.rest, atom.pos)


def _rename(lit: BodyLiteral, names: Mapping[str, str]) -> BodyLiteral:
    """``lit`` with variables renamed per ``names`` (others unchanged)."""
    if isinstance(lit, Positive):
        cid = lit.cid
        if cid is not None:
            cid = _rename_term(cid, names)  # type: ignore[assignment]
        return Positive(_rename_atom(lit.atom, names), cid, lit.pos)  # type: ignore[arg-type]
    if isinstance(lit, Negated):
        return Negated(_rename_atom(lit.atom, names), lit.pos)
    if isinstance(lit, Comparison):
        return Comparison(
            lit.op, _rename_term(lit.left, names), _rename_term(lit.right, names), lit.pos
        )
    assert isinstance(lit, Aggregate)
    return Aggregate(
        _rename_term(lit.result, names),  # type: ignore[arg-type]
        lit.func,
        None if lit.arg is None else _rename_term(lit.arg, names),
        tuple(_rename(inner, names) for inner in lit.body),
        lit.pos,
    )


def _names(terms: Iterable[Term]) -> set[str]:
    return {v.name for t in terms for v in term_vars(t)}


def grounded(lits: Iterable[BodyLiteral], extra: Iterable[str] = ()) -> set[str]:
    """Variables a conjunction grounds (Soufflé's ``getGroundedTerms``, for variables):
    positive atom arguments, aggregate results, and ``v = term`` with ``term`` grounded."""
    lits = list(lits)
    out = set(extra)
    for lit in lits:
        if isinstance(lit, Positive):
            out |= {a.name for a in lit.atom.args if isinstance(a, Var)}
            if lit.cid is not None:
                out.add(lit.cid.name)
        elif isinstance(lit, Aggregate):
            out.add(lit.result.name)
    changed = True
    while changed:
        changed = False
        for lit in lits:
            if not isinstance(lit, Comparison) or lit.op != "==":
                continue
            for var, other in ((lit.left, lit.right), (lit.right, lit.left)):
                if isinstance(var, Var) and var.name not in out and _names([other]) <= out:
                    out.add(var.name)
                    changed = True
    return out


class _Fresh:
    """Variable names not used anywhere in a rule."""

    def __init__(self, rule: Rule) -> None:
        self.used = {v.name for v in atom_vars(rule.head)}
        self.used |= {v.name for lit in rule.body for v in literal_vars(lit)}

    def __call__(self, base: str) -> str:
        k = 1
        while f"{base}_{k}" in self.used:
            k += 1
        name = f"{base}_{k}"
        self.used.add(name)
        return name


def resolve_aggregate_scopes(rule: Rule) -> Rule:
    """Rewrite ``rule``'s top-level aggregates from Soufflé's scoping to merklog's
    (module docstring); rules without aggregates come back unchanged."""
    if not any(isinstance(lit, Aggregate) for lit in rule.body):
        return rule
    fresh = _Fresh(rule)
    body = list(rule.body)
    for agg in [lit for lit in rule.body if isinstance(lit, Aggregate)]:
        i = next(k for k, lit in enumerate(body) if lit is agg)
        others = body[:i] + body[i + 1 :]
        inside = {v.name for lit in agg.body for v in literal_vars(lit)}
        target = _names([agg.arg]) if agg.arg is not None else set()
        inside |= target
        outer = grounded(others)
        injected = (inside & outer) - target
        outside = {v.name for v in atom_vars(rule.head)}
        outside |= {v.name for lit in others for v in literal_vars(lit)}
        outside.add(agg.result.name)
        witnesses: set[str] = set()
        if agg.func in ("min", "max") and isinstance(agg.arg, Var):
            in_body = grounded(agg.body)
            all_outer = grounded(others, extra=[agg.result.name])
            witnesses = (
                {v for v in inside & in_body & outside if v not in all_outer} - injected - target
            )
        # Local variables that also occur outside are a different variable inside.
        renames = {v: fresh(v) for v in sorted(inside - injected) if v in outside}
        result = agg.result
        extra: list[BodyLiteral] = []
        if result.name in injected:
            # ``x = sum … x …`` with x grounded outside: a constraint on x.
            new = Var(fresh(result.name), False, result.pos)
            extra.append(Comparison("==", result, new, agg.pos))
            result = new
        if witnesses:
            # Soufflé's GroundWitnesses: repeat the body outside, target -> result.
            assert isinstance(agg.arg, Var)
            copy = {v: fresh(v) for v in inside - injected - witnesses}
            copy[agg.arg.name] = result.name
            extra.extend(_rename(lit, copy) for lit in agg.body)
        inner = _rename(Aggregate(agg.result, agg.func, agg.arg, agg.body, agg.pos), renames)
        assert isinstance(inner, Aggregate)
        body[i] = Aggregate(result, inner.func, inner.arg, inner.body, agg.pos)
        body[i + 1 : i + 1] = extra
    return Rule(rule.head, tuple(body), rule.time, rule.pos)


__all__ = ["grounded", "resolve_aggregate_scopes"]
