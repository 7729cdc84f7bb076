"""The abstract syntax of merklog programs, shared by every frontend and evaluator.

Frontends (the Dialog/merklog parser, the Soufflé frontend, the conformance
adapter) produce these nodes; the static checks, the stratifier, the batch
evaluator, the incremental compiler and the Spark ``analyze`` job consume them.

Normal form, so consumers handle one shape only:
- every rule has exactly ONE head; a rule written with several heads, or with a
  disjunctive body, is expanded by the frontend into several :class:`Rule` objects;
- each ``_`` wildcard is a distinct :class:`Var` with ``anonymous=True`` and a
  unique name (``_1``, ``_2``, …) so evaluators need no special case;
- equality ``A == B`` (Soufflé ``A = B``) is a :class:`Comparison`; when one side
  is a variable not bound elsewhere and the other side is ground at that point it
  *binds* the variable (the checks accept this as range restricting).

Positions (``pos``) are 1-based ``(line, column)`` of the construct's first
character and are excluded from equality so that ASTs compare structurally.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal as TypingLiteral

from merklog.store import Value, format_value

from .pos import NOPOS, Pos
from .values import from_engine, to_engine

# --------------------------------------------------------------------- terms


@dataclass(frozen=True, slots=True)
class Var:
    """A variable. ``anonymous`` marks a renamed ``_`` wildcard."""

    name: str
    anonymous: bool = False
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return "_" if self.anonymous else self.name


@dataclass(frozen=True, slots=True)
class Const:
    """A constant: one merklog value (int64, float, str, bytes, bool, Link).

    ``value`` is the plain value as written; evaluators use its engine form
    (:func:`merklog.engine.values.to_engine`). Equality and hashing follow value
    identity, so ``Const(1)``, ``Const(1.0)`` and ``Const(True)`` are three
    constants (Python's ``1 == 1.0 == True`` would merge rules and caches)."""

    value: Value
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __eq__(self, other: object) -> bool:
        if type(other) is not Const:
            return NotImplemented
        return to_engine(self.value) == to_engine(other.value)

    def __hash__(self) -> int:
        return hash(to_engine(self.value))

    def __str__(self) -> str:
        return format_value(from_engine(self.value))


ArithOp = TypingLiteral["+", "-", "*", "/", "%"]


@dataclass(frozen=True, slots=True)
class BinOp:
    """Arithmetic ``left op right``; its semantics (int64 vs Soufflé int32, truncating
    division, division by zero, mixed types) live in one place, :mod:`merklog.engine.arith`."""

    op: ArithOp
    left: Term
    right: Term
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


@dataclass(frozen=True, slots=True)
class Neg:
    """Unary minus."""

    operand: Term
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return f"-{self.operand}"


Term = Var | Const | BinOp | Neg

# --------------------------------------------------------------------- atoms and literals


@dataclass(frozen=True, slots=True)
class Atom:
    """``rel(a1, …, an)``; ``rest=True`` for ``rel(a1, …, ...)``: matches any further arguments."""

    rel: str
    args: tuple[Term, ...]
    rest: bool = False
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        parts = [str(a) for a in self.args] + (["..."] if self.rest else [])
        return f"{self.rel}({', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class Positive:
    """Selection ``atom`` or, with ``cid``, ``C := atom`` (binds/filters the fact's CID)."""

    atom: Atom
    cid: Var | None = None
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return f"{self.cid} := {self.atom}" if self.cid is not None else str(self.atom)


@dataclass(frozen=True, slots=True)
class Negated:
    """Negation ``!atom`` (also written ``not atom``)."""

    atom: Atom
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return f"!{self.atom}"


CompareOp = TypingLiteral["==", "!=", "<", "<=", ">", ">="]


@dataclass(frozen=True, slots=True)
class Comparison:
    """Constraint ``left op right`` (``==`` may bind an otherwise unbound variable)."""

    op: CompareOp
    left: Term
    right: Term
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"


AggFunc = TypingLiteral["count", "sum", "min", "max"]


@dataclass(frozen=True, slots=True)
class Aggregate:
    """``result := func [arg] : body``.

    Dialog writes one atom as the body; Soufflé writes ``{ l1, l2, … }``, so the
    body is a conjunction of :class:`Positive`, :class:`Negated` and
    :class:`Comparison`. Variables of the body that also occur outside the
    aggregate (in the rest of the rule body) are the grouping variables; all
    other body variables are local to the aggregate's scope. ``arg`` is ``None``
    for ``count`` and the aggregated term otherwise. Semantics (Soufflé
    conventions): aggregates range over the *distinct* bindings of the body;
    count/sum over nothing give 0; min/max over nothing derive nothing.
    """

    result: Var
    func: AggFunc
    arg: Term | None
    body: tuple[BodyLiteral, ...]
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        arg = f" {self.arg}" if self.arg is not None else ""
        inner = ", ".join(str(b) for b in self.body)
        return f"{self.result} := {self.func}{arg} : {inner}"


BodyLiteral = Positive | Negated | Comparison | Aggregate

# --------------------------------------------------------------------- rules and programs

HeadTime = TypingLiteral["now", "next", "async"]


@dataclass(frozen=True, slots=True)
class Rule:
    """``head[@next|@async] :- body.`` with exactly one head.

    ``time="next"``: derived tuples hold at the next epoch (inductive rule).
    ``time="async"``: the head's first argument is the destination peer
    (written ``p(@Peer, X)@async``); tuples go to the outbox and arrive at that
    peer at some later epoch. Head arguments may be arithmetic terms.
    """

    head: Atom
    body: tuple[BodyLiteral, ...]
    time: HeadTime = "now"
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    @property
    def inductive(self) -> bool:
        return self.time == "next"

    @property
    def computes_values(self) -> bool:
        """Whether the rule can derive a value its inputs do not hold: arithmetic in its
        head or body, or an aggregate. A recursion of rules that cannot only ever
        derives tuples of values it was given, so it always reaches a fixpoint."""

        def computed(term: object) -> bool:
            return isinstance(term, BinOp | Neg)

        if any(computed(a) for a in self.head.args):
            return True
        for lit in self.body:
            if isinstance(lit, Aggregate):
                return True
            if isinstance(lit, Comparison) and (computed(lit.left) or computed(lit.right)):
                return True
        return False

    def __str__(self) -> str:
        suffix = {"now": "", "next": "@next", "async": "@async"}[self.time]
        head = str(self.head)
        if self.time == "async" and self.head.args:
            head = f"{self.head.rel}(@{', '.join(str(a) for a in self.head.args)})"
        if not self.body:
            return f"{head}{suffix}."
        return f"{head}{suffix} :- {', '.join(str(b) for b in self.body)}."


ColumnType = TypingLiteral[
    "number", "unsigned", "float", "symbol", "any", "int", "str", "bytes", "bool", "cid"
]


@dataclass(frozen=True, slots=True)
class Declaration:
    """A relation's declared schema (``.decl`` in both dialects; merklog types
    ``int float str bytes bool cid any``, Soufflé ``number unsigned float symbol``)."""

    rel: str
    columns: tuple[tuple[str, ColumnType], ...]
    pos: Pos = field(default=NOPOS, compare=False, hash=False, repr=False)

    @property
    def arity(self) -> int:
        return len(self.columns)


@dataclass(frozen=True, slots=True)
class Program:
    """A whole parsed program: rules, inline ground facts, declarations, I/O directives."""

    rules: tuple[Rule, ...] = ()
    facts: tuple[tuple[str, tuple[Value, ...]], ...] = ()
    declarations: tuple[Declaration, ...] = ()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    dialect: str = "merklog"
    #: Source position of each entry of ``facts`` (same order) when parsed from text;
    #: empty for programs built in code. Lets checks point at a bad fact.
    fact_positions: tuple[Pos, ...] = field(default=(), compare=False, repr=False)


# --------------------------------------------------------------------- helpers


def term_vars(term: Term) -> Iterator[Var]:
    """Every variable occurring in a term, left to right."""
    if isinstance(term, Var):
        yield term
    elif isinstance(term, BinOp):
        yield from term_vars(term.left)
        yield from term_vars(term.right)
    elif isinstance(term, Neg):
        yield from term_vars(term.operand)


def atom_vars(atom: Atom) -> Iterator[Var]:
    """Every variable in an atom's arguments."""
    for arg in atom.args:
        yield from term_vars(arg)


def literal_vars(lit: BodyLiteral) -> Iterator[Var]:
    """Every variable a body literal mentions (for aggregates: result and body variables)."""
    if isinstance(lit, Positive):
        yield from atom_vars(lit.atom)
        if lit.cid is not None:
            yield lit.cid
    elif isinstance(lit, Negated):
        yield from atom_vars(lit.atom)
    elif isinstance(lit, Comparison):
        yield from term_vars(lit.left)
        yield from term_vars(lit.right)
    elif isinstance(lit, Aggregate):
        yield lit.result
        if lit.arg is not None:
            yield from term_vars(lit.arg)
        for inner in lit.body:
            yield from literal_vars(inner)


def body_atoms(lit: BodyLiteral) -> Iterator[tuple[Atom, str]]:
    """Atoms a literal reads, with polarity: ``"pos"``, ``"neg"`` or ``"agg"`` (inside an aggregate)."""
    if isinstance(lit, Positive):
        yield lit.atom, "pos"
    elif isinstance(lit, Negated):
        yield lit.atom, "neg"
    elif isinstance(lit, Aggregate):
        for inner in lit.body:
            for atom, _polarity in body_atoms(inner):
                yield atom, "agg"


def outside_vars(body: Iterable[BodyLiteral], agg: Aggregate) -> set[str]:
    """Variables of the rule body visible outside ``agg`` (another aggregate's body is
    its own scope: only its result is visible)."""
    outside: set[str] = set()
    for lit in body:
        if lit is agg:
            continue
        if isinstance(lit, Aggregate):
            outside.add(lit.result.name)
        else:
            outside.update(v.name for v in literal_vars(lit))
    return outside


def grouping_vars(body: Iterable[BodyLiteral], agg: Aggregate) -> set[str]:
    """Variables of ``agg``'s body also visible in the rest of the rule body (its groups)."""
    return {v.name for inner in agg.body for v in literal_vars(inner)} & outside_vars(body, agg)


def atom_bound_vars(body: Iterable[BodyLiteral]) -> set[str]:
    """Variables a positive atom of ``body`` binds (plain arguments and CID variables).

    ``X == term`` binds such a variable never, it filters: binding ``X`` to ``1``
    first and then looking ``p(X)`` up would miss ``p(1.0)``, which ``X == 1``
    accepts (int vs float compares numerically), so the answer would depend on
    the order the body is evaluated in."""
    out: set[str] = set()
    for lit in body:
        if isinstance(lit, Positive):
            out.update(a.name for a in lit.atom.args if isinstance(a, Var))
            if lit.cid is not None:
                out.add(lit.cid.name)
    return out


def read_arities(rules: Iterable[Rule]) -> dict[str, tuple[int, bool]]:
    """How the rules read each relation: ``(arity, False)`` when some head or atom
    fixes it, else ``(least arity, True)`` for relations read only through rest
    patterns ``r(X, ...)``. Rows of other lengths are never matched."""
    exact: dict[str, int] = {}
    least: dict[str, int] = {}
    for rule in rules:
        exact.setdefault(rule.head.rel, len(rule.head.args))
        for lit in rule.body:
            for atom, _pol in body_atoms(lit):
                if atom.rest:
                    least[atom.rel] = max(least.get(atom.rel, 0), len(atom.args))
                else:
                    exact.setdefault(atom.rel, len(atom.args))
    out = {rel: (n, False) for rel, n in exact.items()}
    for rel, n in least.items():
        out.setdefault(rel, (n, True))
    return out
