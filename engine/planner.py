"""The ONE planner: orders rule bodies and queries for every backend.

The batch evaluator (tuple at a time), the columnar executor (set at a time),
the incremental compiler (dataflow circuits) and the Spark ``analyze`` job all
evaluate a body by walking the :class:`Plan` built here, so they agree on what
is evaluated when, and a body no backend could evaluate is rejected once, with
a position, by the static checks (:func:`merklog.engine.checks.check_rule` and
``check_query_body`` call :func:`plan_rule` / :func:`plan_query`).

A plan is a sequence of steps, each evaluated with the variables bound by the
steps before it (``Step.bound``):

- :class:`Exists` — a positive atom sharing no variable with the rest of the
  body or the head (``a(), c(_, _), d(7, X)`` with ``X`` used nowhere else): a
  guard checked once ("is there a matching tuple?"), never joined, so several
  such atoms never form a cross product (Soufflé evaluates them the same way).
  All existence checks come first; they need no bindings.
- :class:`Scan` — join a positive atom (optionally ``C := atom``, a CID
  selection) on the argument positions known before it (``key``), binding the
  others. An argument that is an arithmetic expression is a lookup key when its
  variables are bound before the scan; otherwise the planner replaces it with a
  fresh variable (``#1``, …) and adds the equality ``#1 == expr`` as an ordinary
  pending comparison, so ``choose(2*n, n, c)`` binds ``n`` and ``c`` and then
  checks the first column (Soufflé's "binding through arithmetic").
- :class:`Filter` — a comparison whose both sides are bound.
- :class:`Assign` — ``V == term`` (either side) with ``V`` unbound and ``term``
  bound: binds ``V`` — only when this is the equality the rule's text chooses to
  bind ``V`` (:func:`equality_binders`): never when an atom of the body binds
  ``V`` (the atom does, and the equality filters after it: ``1 == 1.0`` holds, but
  a lookup of ``p(1)`` would not find ``p(1.0)``), and among several equalities
  that could bind ``V``, the first written that can. So the body order picked
  here, the delta variant and the backend never change a derived value.
- :class:`Negate` — ``!atom`` once its named variables and expressions are bound
  (``_`` is a wildcard).
- :class:`Aggregate` — once its grouping variables are bound; its body has its
  own plans (:attr:`Aggregate.inner` with the groups bound, for backends that
  evaluate per group; :attr:`Aggregate.inner_free` without, for backends that
  compute every group at once — ``None`` when a grouping variable is only
  constrained, not bound, by the aggregate's body).

Ordering (after the existence checks and the semi-naive delta atom, which goes
first): the cheapest ready literal wins — filters and negations (they only
shrink the bindings), then assignments, aggregates, fully bound atoms, and
finally atoms by how many of their arguments are bound (most first; between atoms of
one class, the one that makes the most filters and negations ready, then source
order). When only literals that need an unbound variable remain the
body is unschedulable: :class:`~merklog.engine.errors.UnschedulableError` with
the variable's line:col.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from . import ast
from .errors import UnschedulableError

# ----------------------------------------------------------------------------- steps


@dataclass(frozen=True, slots=True)
class Scan:
    """Join the tuples of ``lit.atom`` matching the known positions ``key``.

    ``lit`` is the literal as planned: its atom's non-key expression arguments
    are already replaced by fresh variables (the original is ``source``).
    ``delta``: read the semi-naive delta of the relation instead of all of it.
    """

    lit: ast.Positive
    bound: frozenset[str]
    key: tuple[int, ...]
    delta: bool = False
    source: ast.Positive | None = field(default=None, compare=False)

    @property
    def atom(self) -> ast.Atom:
        return self.lit.atom


@dataclass(frozen=True, slots=True)
class Exists:
    """A guard: the body continues (bindings unchanged) iff ``lit.atom`` has a matching
    tuple (constants equal, repeated variables equal). Evaluated once per plan run."""

    lit: ast.Positive
    bound: frozenset[str]
    delta: bool = False

    @property
    def atom(self) -> ast.Atom:
        return self.lit.atom


@dataclass(frozen=True, slots=True)
class Filter:
    """Keep the bindings for which the comparison holds (both sides bound)."""

    lit: ast.Comparison
    bound: frozenset[str]


@dataclass(frozen=True, slots=True)
class Assign:
    """``var == term``: bind ``var`` (unbound) to the value of ``term`` (bound)."""

    lit: ast.Comparison
    bound: frozenset[str]
    var: ast.Var
    term: ast.Term


@dataclass(frozen=True, slots=True)
class Negate:
    """Drop the bindings for which ``lit.atom`` has a matching tuple."""

    lit: ast.Negated
    bound: frozenset[str]


@dataclass(frozen=True, slots=True)
class Aggregate:
    """Bind (or check) ``lit.result`` to the aggregate of the group given by ``groups``."""

    lit: ast.Aggregate
    bound: frozenset[str]
    groups: tuple[str, ...]
    inner: Plan
    inner_free: Plan | None


Step = Scan | Exists | Filter | Assign | Negate | Aggregate


@dataclass(frozen=True, slots=True)
class Plan:
    """An ordered body: ``steps`` evaluated in turn; ``bound`` after the last one."""

    steps: tuple[Step, ...]
    bound: frozenset[str]

    def __iter__(self):
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def describe(self) -> list[str]:
        """One line per step (``scan edge(X, Y) key=(0,)``…): for tests and ``explain``."""
        out = []
        for s in self.steps:
            kind = type(s).__name__.lower()
            extra = f" key={s.key}" if isinstance(s, Scan) else ""
            extra += " delta" if isinstance(s, Scan | Exists) and s.delta else ""
            out.append(f"{kind} {s.lit}{extra}")
        return out


# ----------------------------------------------------------------------------- helpers


def _groups(body: Iterable[ast.BodyLiteral], agg: ast.Aggregate) -> tuple[str, ...]:
    """The grouping variables of ``agg`` in ``body`` (sorted): :func:`merklog.engine.ast.grouping_vars`."""
    return tuple(sorted(ast.grouping_vars(body, agg)))


def _names(term: ast.Term) -> set[str]:
    return {v.name for v in ast.term_vars(term)}


def _lit_names(lit: ast.BodyLiteral) -> set[str]:
    return {v.name for v in ast.literal_vars(lit)}


def _first_unbound(lit: ast.BodyLiteral, bound: set[str]) -> ast.Var | None:
    if isinstance(lit, ast.Aggregate):
        return None
    for v in ast.literal_vars(lit):
        if v.name not in bound and not (isinstance(lit, ast.Negated) and v.anonymous):
            return v
    return None


class _Fresh:
    """Names for the variables that replace expression arguments (never user names)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, pos: ast.Pos) -> ast.Var:
        self.n += 1
        return ast.Var(f"#{self.n}", False, pos)


# ----------------------------------------------------------------------------- planning


def plan_rule(rule: ast.Rule, delta: int | None = None, *, expr_keys: bool = True) -> Plan:
    """The plan of a rule's body (``delta``: index of the semi-naive delta atom)."""
    keep = {v.name for v in ast.atom_vars(rule.head)}
    return plan_body(rule.body, keep=keep, delta=delta, expr_keys=expr_keys)


def plan_query(body: Sequence[ast.BodyLiteral], *, expr_keys: bool = True) -> Plan:
    """The plan of a query (a conjunction): its named variables are the answer columns."""
    keep: set[str] = set()
    for lit in body:
        names = [lit.result] if isinstance(lit, ast.Aggregate) else ast.literal_vars(lit)
        keep.update(v.name for v in names if not v.anonymous)
    return plan_body(tuple(body), keep=keep, expr_keys=expr_keys)


def plan_body(
    body: Sequence[ast.BodyLiteral],
    *,
    bound: Iterable[str] = (),
    keep: Iterable[str] = (),
    delta: int | None = None,
    expr_keys: bool = True,
    local_exists: bool = True,
    _fresh: _Fresh | None = None,
) -> Plan:
    """Order ``body`` given the already ``bound`` variables (module docstring).

    ``keep``: variables needed after the body (the head, the query's columns):
    an atom sharing a variable with them is not an existence check.
    ``delta``: index in ``body`` of the atom scheduled first, reading the delta.
    ``expr_keys=False``: every expression argument becomes a fresh variable and an
    equality (for backends that cannot look tuples up by computed values).
    ``local_exists=False`` (aggregate bodies, whose every binding counts): only
    atoms without variables are existence checks.
    Raises :class:`~merklog.engine.errors.UnschedulableError`.
    """
    body = tuple(body)
    fresh = _fresh or _Fresh()
    bound_now = set(bound)
    keep = set(keep) | bound_now
    steps: list[Step] = []
    pending: list[tuple[int, ast.BodyLiteral]] = []

    # Existence checks: positive atoms sharing no variable with anything else.
    for i, lit in enumerate(body):
        if _is_existence(i, lit, body, keep, local_exists):
            assert isinstance(lit, ast.Positive)
            steps.append(Exists(lit, frozenset(bound_now), delta == i))
        else:
            pending.append((i, lit))

    def take(i: int, lit: ast.BodyLiteral, as_delta: bool = False) -> None:
        pending.remove((i, lit))
        _schedule(lit, bound_now, steps, pending, body, as_delta, expr_keys, fresh)

    binders = equality_binders(body, bound_now)
    if delta is not None and not isinstance(body[delta], ast.Positive):
        raise ValueError(f"the delta literal {body[delta]} is not a positive atom")
    if delta is not None and any(j == delta for j, _ in pending):
        take(delta, body[delta], as_delta=True)
    while pending:
        best: tuple[tuple[int, int], int, ast.BodyLiteral] | None = None
        for i, lit in pending:
            score = _score(i, lit, bound_now, body, binders)
            if score is None:
                continue
            rank = (score, -_shrinks_next(lit, bound_now, pending, binders))
            if best is None or rank < best[0]:
                best = (rank, i, lit)
        if best is None:
            _unschedulable(pending, bound_now, body)
        assert best is not None
        take(best[1], best[2])
    return Plan(tuple(steps), frozenset(bound_now))


def _is_existence(
    i: int,
    lit: ast.BodyLiteral,
    body: tuple[ast.BodyLiteral, ...],
    keep: set[str],
    local_exists: bool,
) -> bool:
    if not isinstance(lit, ast.Positive):
        return False
    if not all(isinstance(a, ast.Var | ast.Const) for a in lit.atom.args):
        return False
    mine = _lit_names(lit)
    if not local_exists:
        # Aggregate bodies count every binding, and a rest pattern's unnamed
        # arguments are part of it (``count : p(...)`` counts p's tuples).
        return not mine and not lit.atom.rest
    if not mine:
        return True
    if mine & keep:
        return False
    return not any(mine & _lit_names(other) for j, other in enumerate(body) if j != i)


def equality_binders(body: Sequence[ast.BodyLiteral], bound: Iterable[str] = ()) -> dict[int, str]:
    """Which literal of ``body`` binds each variable that no positive atom binds.

    The rule (docs/language.md, "Which equality binds a variable"; ADR 0208),
    read off the text alone, so that neither the order the planner picks, nor
    the semi-naive delta variant, nor the evaluator can change it: starting from
    ``bound`` and the variables positive atoms bind (:func:`ast.atom_bound_vars`),
    repeat

    1. every aggregate whose grouping variables are bound binds its result (if
       still unbound);
    2. then the *first* equality in the order written whose one side is a
       variable ``V`` not bound yet and whose other side's variables are all
       bound binds ``V``;

    until neither applies. Returns ``{index in body: variable}`` for the binding
    equalities and for the aggregates that bind their result; every other
    equality is a filter, and an aggregate whose result an equality binds checks
    it. ``1 == 1.0`` holds but ``1`` and ``1.0`` are distinct values, so which
    side binds decides the derived value: ``Y == X * 1.0, Y == Z`` binds ``Y`` to
    the float whatever the order of the body.
    """
    body = tuple(body)
    known = set(bound) | ast.atom_bound_vars(body)
    out: dict[int, str] = {}
    aggs = [(i, lit) for i, lit in enumerate(body) if isinstance(lit, ast.Aggregate)]
    groups = {i: set(ast.grouping_vars(body, lit)) for i, lit in aggs}
    eqs = [
        (i, lit) for i, lit in enumerate(body) if isinstance(lit, ast.Comparison) and lit.op == "=="
    ]
    while True:
        for i, agg in aggs:
            if agg.result.name not in known and groups[i] <= known:
                known.add(agg.result.name)
                out[i] = agg.result.name
        for i, eq in eqs:
            if i in out:
                continue
            var = _binds(eq, known)
            if var is not None:
                known.add(var)
                out[i] = var
                break
        else:
            return out


def _binds(eq: ast.Comparison, known: set[str]) -> str | None:
    """The variable ``eq`` can bind given the ``known`` variables, else None."""
    for side, other in ((eq.left, eq.right), (eq.right, eq.left)):
        if isinstance(side, ast.Var) and side.name not in known and _names(other) <= known:
            return side.name
    return None


def _score(
    i: int,
    lit: ast.BodyLiteral,
    bound: set[str],
    body: tuple[ast.BodyLiteral, ...],
    binders: dict[int, str],
) -> int | None:
    """Cost class of evaluating ``lit`` (``body[i]``) now (lower first); None when it
    cannot run yet.

    ``binders`` (:func:`equality_binders`): an equality binds only the variable the
    rule gives it — never one an atom binds (binding ``X`` to ``1`` first and then
    looking ``p(X)`` up would miss ``p(1.0)``, which ``X == 1`` accepts), never one
    another equality binds; every other comparison waits until both sides are
    bound. An aggregate runs once its groups are bound, and, when it does not bind
    its result, once its result is bound too (it then checks it)."""
    if isinstance(lit, ast.Comparison):
        lg, rg = _names(lit.left) <= bound, _names(lit.right) <= bound
        if lg and rg:
            return 0
        var = binders.get(i)
        if var is not None and var not in bound:
            var_side, other = (lit.left, lit.right)
            if not (isinstance(var_side, ast.Var) and var_side.name == var):
                var_side, other = other, var_side
            if _names(other) <= bound:
                return 1
        return None
    if isinstance(lit, ast.Negated):
        for a in lit.atom.args:
            if isinstance(a, ast.Var) and a.anonymous:
                continue
            if not _names(a) <= bound:
                return None
        return 0
    if isinstance(lit, ast.Aggregate):
        if binders.get(i) is None and lit.result.name not in bound:
            return None
        return 2 if set(ast.grouping_vars(body, lit)) <= bound else None
    assert isinstance(lit, ast.Positive)
    args = lit.atom.args
    nb = sum(1 for a in args if not isinstance(a, ast.Var) and _names(a) <= bound)
    nb += sum(1 for a in args if isinstance(a, ast.Var) and a.name in bound)
    if lit.cid is not None and lit.cid.name in bound:
        nb += 100
    return 3 if nb >= len(args) and args else 10 - min(nb, 6)


def _shrinks_next(
    lit: ast.BodyLiteral,
    bound: set[str],
    pending: list[tuple[int, ast.BodyLiteral]],
    binders: dict[int, str],
) -> int:
    """How many pending filters (comparisons that bind nothing) and negations an atom
    ``lit`` would make ready: between atoms of one cost class the planner scans first
    the one whose bindings are filtered at once. QA: ``kq(A, B, C, D, E), tt(X, Y),
    X < 40`` scanned kq first and tested ``X < 40`` for every pair of 15,000 x 15,000
    tuples (50 s); scanning tt first filters it to 40 tuples before kq is read."""
    if not isinstance(lit, ast.Positive):
        return 0
    after = bound | {v.name for v in ast.atom_vars(lit.atom)}
    count = 0
    for j, other in pending:
        if other is lit:
            continue
        if isinstance(other, ast.Comparison) and j not in binders:
            names = _names(other.left) | _names(other.right)
        elif isinstance(other, ast.Negated):
            args = [a for a in other.atom.args if not (isinstance(a, ast.Var) and a.anonymous)]
            names = {n for a in args for n in _names(a)}
        else:
            continue
        if names <= after and not names <= bound:
            count += 1
    return count


def _schedule(
    lit: ast.BodyLiteral,
    bound: set[str],
    steps: list[Step],
    pending: list[tuple[int, ast.BodyLiteral]],
    body: tuple[ast.BodyLiteral, ...],
    as_delta: bool,
    expr_keys: bool,
    fresh: _Fresh,
) -> None:
    before = frozenset(bound)
    if isinstance(lit, ast.Positive):
        args: list[ast.Term] = []
        key: list[int] = []
        for p, a in enumerate(lit.atom.args):
            if isinstance(a, ast.Var):
                if a.name in bound:
                    key.append(p)
                args.append(a)
            elif isinstance(a, ast.Const) or (expr_keys and _names(a) <= bound):
                key.append(p)
                args.append(a)
            else:
                # Binding through arithmetic: scan the column into a fresh variable,
                # check it against the expression once its variables are bound.
                v = fresh(getattr(a, "pos", ast.NOPOS))
                args.append(v)
                pending.insert(
                    0, (-fresh.n, ast.Comparison("==", v, a, getattr(a, "pos", lit.pos)))
                )
        planned = lit
        if tuple(args) != lit.atom.args:
            atom = ast.Atom(lit.atom.rel, tuple(args), lit.atom.rest, lit.atom.pos)
            planned = ast.Positive(atom, lit.cid, lit.pos)
        steps.append(Scan(planned, before, tuple(key), as_delta, lit))
        bound.update(_lit_names(planned))
    elif isinstance(lit, ast.Comparison):
        lg, rg = _names(lit.left) <= bound, _names(lit.right) <= bound
        if lg and rg:
            steps.append(Filter(lit, before))
        else:
            var, term = (lit.left, lit.right) if rg else (lit.right, lit.left)
            assert isinstance(var, ast.Var) and var.name not in bound
            steps.append(Assign(lit, before, var, term))
            bound.add(var.name)
    elif isinstance(lit, ast.Negated):
        steps.append(Negate(lit, before))
    else:
        assert isinstance(lit, ast.Aggregate)
        groups = _groups(body, lit)
        inner_keep = set(groups) | (_names(lit.arg) if lit.arg is not None else set())
        inner = plan_body(
            lit.body,
            bound=groups,
            keep=inner_keep,
            expr_keys=expr_keys,
            local_exists=False,
            _fresh=fresh,
        )
        try:
            inner_free: Plan | None = plan_body(
                lit.body, keep=inner_keep, expr_keys=expr_keys, local_exists=False, _fresh=fresh
            )
            if not set(groups) <= inner_free.bound:
                inner_free = None
        except UnschedulableError:
            inner_free = None
        steps.append(Aggregate(lit, before, groups, inner, inner_free))
        bound.add(lit.result.name)


def _unschedulable(
    pending: list[tuple[int, ast.BodyLiteral]], bound: set[str], body: tuple[ast.BodyLiteral, ...]
) -> None:
    for _i, lit in sorted(pending, key=lambda p: (p[0] < 0, p[0])):
        if isinstance(lit, ast.Aggregate):
            missing = sorted(ast.grouping_vars(body, lit) - bound)
            where = lit.pos
            what = f"the grouping variables {', '.join(missing)} of {lit} are never bound"
        else:
            v = _first_unbound(lit, bound)
            where = v.pos if v is not None and v.pos != ast.NOPOS else lit.pos
            if v is None:
                what = f"{lit} cannot be evaluated"
            elif v.anonymous:
                what = f"a wildcard _ in {lit} can never be bound"
            else:
                what = f"variable {v} in {lit} is never bound"
        raise UnschedulableError.at(
            where,
            f"cannot order this body: {what}",
            "bind every variable with a positive atom, a CID selection C := atom, an "
            "aggregate or X == term before using it in a comparison, negation or arithmetic",
            literal=str(lit),
        )


__all__ = [
    "Aggregate",
    "Assign",
    "Exists",
    "Filter",
    "Negate",
    "Plan",
    "Scan",
    "Step",
    "equality_binders",
    "plan_body",
    "plan_query",
    "plan_rule",
]
