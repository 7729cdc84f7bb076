"""Static checks of a parsed program, run before any evaluation.

:func:`check_program` raises the first problem found (in this order) or returns
a :class:`CheckedProgram` carrying the strata, arities, EDB and IDB:

1. arity: a relation is used with one number of arguments everywhere
   (facts, heads, bodies, ``.decl``); a rest pattern ``r(X, ...)`` needs at least
   as many columns as it names -> :class:`ArityError`;
2. per rule, the *binding analysis* (order independent, evaluators may reorder):
   a variable is **bound** by a plain argument of a positive atom, by a CID
   selection ``C := atom``, by an aggregate's result, or by ``V == term`` whose
   other side is bound (to a fixpoint). Variables inside arithmetic never bind.
   (Whether a variable is bound is all that matters here; *which* equality binds
   it, when several could, is :func:`merklog.engine.planner.equality_binders`.)
   Then:
   - every head variable, comparison variable and variable inside an arithmetic
     argument is bound -> :class:`RangeRestrictionError` (a ``_`` in a head can
     never be bound, so it is the same error);
   - every named variable of a negated atom is bound -> :class:`UnsafeNegationError`
     (``_`` inside a negation is a wildcard: "no tuple with any value here");
   - aggregates (Dialog query-engine spec §Aggregation): the body's variables form a lexical
     scope; those also used elsewhere in the rule body are grouping variables
     and must be bound there; the aggregated parameter must be otherwise unbound
     and (single-atom body) appear exactly once in the atom; a variable bound only
     inside an aggregate is not visible outside -> :class:`AggregateScopeError`;
   - ``@async``: the head's first argument (destination peer) is a variable bound
     in the body or a constant -> :class:`AsyncHeadError`;
3. stratification (Dialog query-engine spec §1.3.3) -> :class:`UnstratifiableError` naming the cycle;
4. ``@next`` finiteness (Dialog query-engine spec §1.3.1): each inductive rule must
   (1) contain its head atom as a positive body atom with identical arguments, or
   (2) contain a positive atom over an *instantaneous* relation: one that is not
   the head of an ``@next`` rule and does not depend (through deductive rules,
   transitively) on such a head -> :class:`NextRuleFinitenessError`.

:func:`check_query` validates a query atom against a checked program.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .ast import (
    NOPOS,
    Aggregate,
    Atom,
    BodyLiteral,
    Comparison,
    Const,
    Negated,
    Pos,
    Positive,
    Program,
    Rule,
    Term,
    Var,
    body_atoms,
    literal_vars,
    outside_vars,
    term_vars,
)
from .errors import (
    AggregateScopeError,
    ArityError,
    AsyncHeadError,
    NextRuleFinitenessError,
    ParseError,
    RangeRestrictionError,
    UnknownRelationError,
    UnsafeNegationError,
)
from .planner import Plan, plan_query, plan_rule
from .schema import Schema, check_declarations
from .stratify import Stratum, stratify


def _arguments(n: int | str) -> str:
    """``1 argument``, ``2 arguments`` (``n`` may be a text such as ``2 or 3``)."""
    return f"{n} argument" if str(n) == "1" else f"{n} arguments"


@dataclass(frozen=True)
class CheckedProgram:
    """A program that passed every static check, with its stratification."""

    program: Program
    strata: tuple[Stratum, ...]
    arities: Mapping[str, int]
    edb: frozenset[str]
    idb: frozenset[str]

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.program.rules

    @property
    def facts(self):
        return self.program.facts

    @property
    def dialect(self) -> str:
        return self.program.dialect

    @property
    def int_bits(self) -> int:
        """Integer width of the dialect's arithmetic (Soufflé: 32, merklog: 64)."""
        return 32 if self.program.dialect == "souffle" else 64

    @property
    def relations(self) -> frozenset[str]:
        return frozenset(self.arities)

    @property
    def schema(self) -> Schema:
        """The relation declarations; ``schema.check_fact(rel, args)`` refuses a misfit."""
        return Schema.of(self.program)


# ----------------------------------------------------------------- arity


class _Arities:
    def __init__(self) -> None:
        self.arity: dict[str, tuple[int, Pos]] = {}
        self.at_least: dict[str, tuple[int, Pos]] = {}

    def use(self, rel: str, n: int, pos: Pos, rest: bool = False) -> None:
        if rest:
            known = self.arity.get(rel)
            if known is not None and known[0] < n:
                raise ArityError.at(
                    pos,
                    f"relation {rel} has {_arguments(known[0])} (at {known[1]}) "
                    f"but this pattern names {n}",
                    "a rest pattern r(X, ...) may not name more columns than the relation has",
                )
            if n > self.at_least.get(rel, (-1, pos))[0]:
                self.at_least[rel] = (n, pos)
            return
        known = self.arity.get(rel)
        if known is None:
            least = self.at_least.get(rel)
            if least is not None and n < least[0]:
                raise ArityError.at(
                    pos,
                    f"relation {rel} used with {_arguments(n)} here but a pattern at {least[1]} "
                    f"names {least[0]}",
                )
            self.arity[rel] = (n, pos)
        elif known[0] != n:
            where = f" at {known[1]}" if known[1] != NOPOS else " elsewhere"
            here = f" at {pos}" if pos != NOPOS else " here"
            raise ArityError.at(
                pos,
                f"{rel} has arity {known[0]}{where} and {n}{here}",
                f"a relation is its name and arity: use {rel} with {_arguments(known[0])} "
                "everywhere, or give the other one another name",
                relation=rel,
                arities=(known[0], n),
            )

    def atom(self, atom: Atom) -> None:
        self.use(atom.rel, len(atom.args), atom.pos, atom.rest)


def _collect_arities(program: Program) -> dict[str, int]:
    ar = _Arities()
    for decl in program.declarations:
        ar.use(decl.rel, decl.arity, decl.pos)
    positions = program.fact_positions
    for i, (rel, args) in enumerate(program.facts):
        ar.use(rel, len(args), positions[i] if i < len(positions) else NOPOS)
    for rule in program.rules:
        ar.atom(rule.head)
        for lit in rule.body:
            for atom, _ in body_atoms(lit):
                ar.atom(atom)
    out = {rel: n for rel, (n, _) in ar.arity.items()}
    for rel, (n, _) in ar.at_least.items():
        out.setdefault(rel, n)
    return out


# ----------------------------------------------------------------- binding analysis


def _plain_vars(atom: Atom) -> Iterable[Var]:
    for arg in atom.args:
        if isinstance(arg, Var):
            yield arg


def _is_ground(term: Term, bound: set[str]) -> bool:
    return all(v.name in bound for v in term_vars(term))


def _bind_equalities(comparisons: list[Comparison], bound: set[str]) -> None:
    changed = True
    while changed:
        changed = False
        for c in comparisons:
            if c.op != "==":
                continue
            for side, other in ((c.left, c.right), (c.right, c.left)):
                if isinstance(side, Var) and side.name not in bound and _is_ground(other, bound):
                    bound.add(side.name)
                    changed = True


def _first_unbound(terms: Iterable[Term], bound: set[str]) -> Var | None:
    for term in terms:
        for v in term_vars(term):
            if v.name not in bound:
                return v
    return None


def _scope(
    lits: tuple[BodyLiteral, ...], outer: set[str], rule: Rule, local_of: dict[str, Aggregate]
) -> set[str]:
    """Check one conjunction (a rule body or an aggregate body) whose enclosing
    scope already binds ``outer``; returns the variables it binds."""
    bound = set(outer)
    comparisons: list[Comparison] = []
    aggregates: list[Aggregate] = []
    for lit in lits:
        if isinstance(lit, Positive):
            bound.update(v.name for v in _plain_vars(lit.atom))
            if lit.cid is not None:
                bound.add(lit.cid.name)
        elif isinstance(lit, Comparison):
            comparisons.append(lit)
        elif isinstance(lit, Aggregate):
            aggregates.append(lit)
            bound.add(lit.result.name)
    _bind_equalities(comparisons, bound)

    # Aggregates: grouping variables must be bound by the rest of this scope.
    for agg in aggregates:
        # the one definition of an aggregate's scope and groups, shared with the planner
        inner_vars = {v.name for lit in agg.body for v in literal_vars(lit)}
        _check_aggregate(agg, inner_vars, outside_vars(lits, agg), bound, rule, local_of)

    for lit in lits:
        if isinstance(lit, Positive):
            for arg in lit.atom.args:
                if not isinstance(arg, Var):
                    v = _first_unbound([arg], bound)
                    if v is not None:
                        _unbound(v, rule, local_of, "an arithmetic argument")
        elif isinstance(lit, Comparison):
            v = _first_unbound([lit.left, lit.right], bound)
            if v is not None:
                _unbound(v, rule, local_of, f"the comparison {lit}")
        elif isinstance(lit, Negated):
            for arg in lit.atom.args:
                for v in term_vars(arg):
                    if v.anonymous and isinstance(arg, Var):
                        continue
                    if v.name not in bound:
                        if v.name in local_of:
                            _leak(v, local_of[v.name])
                        raise UnsafeNegationError.at(
                            v.pos if v.pos != NOPOS else lit.pos,
                            f"variable {v} of the negated atom {lit.atom} is not bound "
                            "by a positive predicate",
                            "bind it in a positive atom of the same rule, or write _ to mean "
                            "'any value'",
                            variable=v.name,
                        )
    return bound


def _check_aggregate(
    agg: Aggregate,
    inner_vars: set[str],
    outside: set[str],
    bound: set[str],
    rule: Rule,
    local_of: dict[str, Aggregate],
) -> None:
    grouping = inner_vars & outside  # = ast.grouping_vars(body, agg)
    for lit in agg.body:
        for v in literal_vars(lit):
            if v.name in grouping and v.name not in bound and not v.anonymous:
                raise AggregateScopeError.at(
                    v.pos,
                    f"variable {v} is shared between the aggregate and the rest of the body "
                    "but bound only inside the aggregate",
                    "bind grouping variables with a positive atom outside the aggregate",
                )
    if agg.result.name in inner_vars or (
        agg.arg is not None and agg.result.name in {v.name for v in term_vars(agg.arg)}
    ):
        raise AggregateScopeError.at(
            agg.result.pos,
            f"the aggregate result {agg.result} also appears inside the aggregate",
            "use a fresh variable for the result",
        )
    if agg.arg is not None:
        for v in term_vars(agg.arg):
            if v.name in outside:
                raise AggregateScopeError.at(
                    v.pos,
                    f"the aggregated variable {v} must be otherwise unbound, "
                    f"but it is used outside the aggregate",
                    f"aggregate over a fresh variable: N := {agg.func} V2 : rel(..., V2, ...)",
                )
        if isinstance(agg.arg, Var) and len(agg.body) == 1 and isinstance(agg.body[0], Positive):
            occurrences = sum(1 for a in agg.body[0].atom.args if a == agg.arg)
            if occurrences != 1:
                raise AggregateScopeError.at(
                    agg.arg.pos,
                    f"the aggregated variable {agg.arg} must appear exactly once in "
                    f"{agg.body[0].atom} (it appears {occurrences} times)",
                    "name the aggregated column once; use other variables to filter",
                )
    inner_bound = _scope(agg.body, bound & grouping, rule, local_of)
    if agg.arg is not None:
        v = _first_unbound([agg.arg], inner_bound)
        if v is not None:
            raise AggregateScopeError.at(
                v.pos,
                f"the aggregated term {agg.arg} is not bound by the aggregate's body",
                "the aggregated variable must appear in a positive atom of the aggregate",
            )
    for name in inner_vars - grouping:
        local_of.setdefault(name, agg)


def _leak(v: Var, agg: Aggregate) -> None:
    raise AggregateScopeError.at(
        v.pos,
        f"variable {v} is bound only inside the aggregate at {agg.pos}, "
        "and aggregate variables are not visible outside it",
        "bind the variable outside the aggregate too (e.g. with a positive atom)",
        variable=v.name,
    )


def _unbound(v: Var, rule: Rule, local_of: dict[str, Aggregate], where: str) -> None:
    if v.name in local_of:
        _leak(v, local_of[v.name])
    if v.anonymous:
        raise RangeRestrictionError.at(
            v.pos,
            f"a wildcard _ in {where} can never be bound",
            "name a variable bound by a positive body atom instead of _",
            variable=v.name,
            wildcard=True,
        )
    raise RangeRestrictionError.at(
        v.pos,
        f"variable {v} in {where} is not bound by a positive body predicate",
        "bind it with a positive atom, a CID selection C := atom, an aggregate, or X == term",
        variable=v.name,
    )


#: The most literals one rule or query body may have, counting those inside its
#: aggregates. The tuple executor compiles a body into a chain of closures, each
#: calling the next, and the incremental engine walks the same plan: bodies of about
#: 1,000 literals overflowed Python's stack (an internal RecursionError). Far beyond
#: real programs; a longer body is a LINE:COL error, as a term nested too deep is.
MAX_BODY_LITERALS = 256


def _flat_literals(body: Iterable[BodyLiteral]) -> Iterable[BodyLiteral]:
    """The literals of a body in order, each aggregate followed by its own body's."""
    for lit in body:
        yield lit
        if isinstance(lit, Aggregate):
            yield from _flat_literals(lit.body)


def check_body_length(rule: Rule) -> None:
    """Raise :class:`ParseError` at the first literal beyond :data:`MAX_BODY_LITERALS`."""
    for n, lit in enumerate(_flat_literals(rule.body), 1):
        if n > MAX_BODY_LITERALS:
            raise ParseError.at(
                lit.pos if lit.pos != NOPOS else rule.pos,
                f"this body has more than {MAX_BODY_LITERALS} literals",
                "split it: derive an intermediate relation from part of the body in a rule"
                " of its own and read that relation here",
            )


def check_rule(rule: Rule) -> None:
    """Body length, range restriction, safe negation, aggregate scoping and @async head
    of one rule."""
    check_body_length(rule)
    local_of: dict[str, Aggregate] = {}
    bound = _scope(rule.body, set(), rule, local_of)
    head = rule.head
    if rule.time == "async":
        peer = head.args[0] if head.args else None
        if not isinstance(peer, Var | Const):
            raise AsyncHeadError.at(
                head.pos,
                f"the destination peer of {head.rel}(@…)@async must be a variable or a constant",
                "write p(@Peer, X)@async with Peer bound in the body",
            )
        if isinstance(peer, Var) and (peer.anonymous or peer.name not in bound):
            raise AsyncHeadError.at(
                peer.pos,
                f"the destination peer {peer} of the @async head is not bound in the body",
                "bind the peer variable with a positive atom, e.g. peer(P)",
            )
    v = _first_unbound(head.args, bound)
    if v is not None:
        _unbound(v, rule, local_of, f"the head {head}")
    # The planner's verdict: a body no evaluation order can run is a static error
    # here (UnschedulableError, line:col), never an evaluator's internal error.
    plan_rule(rule)


# ----------------------------------------------------------------- @next finiteness


def _temporal_relations(rules: tuple[Rule, ...]) -> set[str]:
    """Heads of @next rules plus every relation depending on one through deductive rules."""
    temporal = {r.head.rel for r in rules if r.time == "next"}
    deps: dict[str, set[str]] = {}
    for r in rules:
        if r.time == "now":
            deps.setdefault(r.head.rel, set()).update(
                a.rel for lit in r.body for a, _ in body_atoms(lit)
            )
    changed = True
    while changed:
        changed = False
        for head, body in deps.items():
            if head not in temporal and body & temporal:
                temporal.add(head)
                changed = True
    return temporal


def check_next_rules(program: Program) -> None:
    """Dialog query-engine spec §1.3.1: every @next rule satisfies property (1) or (2) (module docstring)."""
    temporal = _temporal_relations(program.rules)
    for rule in program.rules:
        if rule.time != "next":
            continue
        head = rule.head
        positives = [lit for lit in rule.body if isinstance(lit, Positive)]
        if any(
            p.atom.rel == head.rel and p.atom.args == head.args and not p.atom.rest
            for p in positives
        ):
            continue
        if any(p.atom.rel not in temporal for p in positives):
            continue
        raise NextRuleFinitenessError.at(
            head.pos,
            f"the @next rule for {head.rel} could change the database forever: its body neither "
            f"repeats {head} nor reads a positive instantaneous relation",
            "copy state forward with the same arguments (p(X)@next :- p(X), …) or trigger on "
            "an event relation that is not derived from @next heads",
        )


# ----------------------------------------------------------------- entry points


def check_program(program: Program) -> CheckedProgram:
    """Run every static check; return the stratified program or raise an EngineError."""
    arities = _collect_arities(program)
    check_declarations(program)
    for rule in program.rules:
        check_rule(rule)
    strata = stratify(program.rules)
    check_next_rules(program)
    idb = frozenset(r.head.rel for r in program.rules)
    edb = frozenset(arities) - idb
    return CheckedProgram(program, tuple(strata), arities, edb, idb)


def check_fact_arities(checked: CheckedProgram, fact_arities: Mapping[str, Iterable[int]]) -> None:
    """Raise :class:`ArityError` when a body atom reads a relation with an arity that
    matches neither the program (a head, an inline fact, a declaration) nor any of the
    given facts of that name, e.g. ``p(X) :- edge(X).`` over stored ``edge/2`` facts:
    "edge has arity 2 in the facts and 1 at 1:9". ``fact_arities`` maps a relation
    to the arities its facts have (from a store, fact files or a call's facts);
    relations without facts are not checked (their facts may come later)."""
    program = checked.program
    defined = set(checked.idb) | {rel for rel, _args in program.facts}
    defined |= {d.rel for d in program.declarations}
    for rule in program.rules:
        for lit in rule.body:
            for atom, _pol in body_atoms(lit):
                rel = atom.rel
                if rel in defined or rel not in fact_arities:
                    continue
                have = set(fact_arities[rel])
                n = len(atom.args)
                if not have or any(k >= n if atom.rest else k == n for k in have):
                    continue
                shown = " or ".join(str(k) for k in sorted(have))
                raise ArityError.at(
                    atom.pos,
                    f"{rel} has arity {shown} in the facts and {n} here",
                    f"a relation is its name and arity: read {rel} with {_arguments(shown)}",
                    relation=rel,
                    arities=(min(have), n),
                )


def check_query(program: CheckedProgram | Program, atom: Atom) -> None:
    """A query atom must name a known relation with its arity; raises otherwise."""
    checked = program if isinstance(program, CheckedProgram) else None
    arities = checked.arities if checked is not None else _collect_arities(program)  # type: ignore[arg-type]
    if atom.rel not in arities:
        close = difflib.get_close_matches(atom.rel, list(arities), n=1)
        hint = (
            f"did you mean {close[0]}?" if close else "query a relation defined by facts or rules"
        )
        raise UnknownRelationError.at(
            atom.pos, f"unknown relation {atom.rel} in the query", hint, relation=atom.rel
        )
    n = arities[atom.rel]
    if (atom.rest and len(atom.args) > n) or (not atom.rest and len(atom.args) != n):
        raise ArityError.at(
            atom.pos,
            f"relation {atom.rel} has {_arguments(n)} but the query gives {len(atom.args)}",
        )


def query_columns(body: tuple[BodyLiteral, ...]) -> list[Var]:
    """A conjunctive query's answer columns: its named variables in order of first
    appearance (of an aggregate, only the result: its body is a scope of its own)."""
    seen: dict[str, Var] = {}
    for lit in body:
        names = [lit.result] if isinstance(lit, Aggregate) else list(literal_vars(lit))
        for v in names:
            if not v.anonymous and v.name not in seen:
                seen[v.name] = v
    return list(seen.values())


def check_query_body(
    body: tuple[BodyLiteral, ...], program: CheckedProgram | Program | None = None
) -> Plan:
    """Check a conjunctive query (``edge(X, Y), !edge(Y, X)``) as the body of a rule
    whose head is :func:`query_columns`, and return its plan. Raises the same
    line:col errors as a rule would (unbound variables, unsafe negation, aggregate
    scope, unschedulable body); with ``program``, also unknown relations and arities."""
    if program is not None:
        for lit in body:
            for atom, _pol in body_atoms(lit):
                check_query(program, atom)
    pos = body[0].pos if body else NOPOS
    head = Atom("query", tuple(query_columns(body)), False, pos)
    check_rule(Rule(head, body, "now", pos))
    return plan_query(body)


__all__ = [
    "MAX_BODY_LITERALS",
    "CheckedProgram",
    "check_body_length",
    "check_fact_arities",
    "check_next_rules",
    "check_program",
    "check_query",
    "check_query_body",
    "check_rule",
    "query_columns",
]
