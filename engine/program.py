"""The user-facing engine API: parse a program once, evaluate it on facts, query it, run epochs.

>>> p = Program.parse("path(X, Y) :- edge(X, Y).\\npath(X, Y) :- path(X, Z), edge(Z, Y).")
>>> sorted(p.query("path(1, X)", facts={"edge": [(1, 2), (2, 3)]}))
[(2,), (3,)]

Facts are given either as a mapping ``relation -> iterable of tuples`` or as an
iterable of :class:`~merklog.store.Fact`. Results are :class:`Relations`
(``relation -> set of tuples``). ``run`` evaluates epochs (seed 000 §1.3.1):
the database at epoch ``t`` is the program's inline facts, the sources'
persistent EDB, that epoch's transient inputs and the ``@next`` tuples derived
at ``t-1``; ``@async`` tuples are collected into each epoch's outbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from merklog.store import Fact, Value

from . import ast
from .batch import BatchEvaluator, Relations, Row, as_rel, sort_rows
from .io import Sink, Source

FactsInput = Mapping[str, Iterable[Row]] | Iterable[Fact] | None


def detect_dialect(text: str) -> str:
    """``"souffle"`` when the text uses Soufflé directives (``.decl`` …), else ``"merklog"``."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith((".decl", ".type", ".input", ".output", ".comp", ".init")):
            return "souffle"
    return "merklog"


def parse_text(text: str, dialect: str = "auto") -> ast.Program:
    """Parse program text with the frontend of ``dialect`` (``auto``, ``merklog``, ``souffle``)."""
    if dialect == "auto":
        dialect = detect_dialect(text)
    if dialect == "souffle":
        from .souffle import parse_souffle

        return parse_souffle(text)
    if dialect != "merklog":
        raise ValueError(f"unknown dialect {dialect!r} (expected auto, merklog or souffle)")
    from .parser import parse_program

    return parse_program(text)


def normalise_facts(facts: FactsInput) -> dict[str, Any]:
    """Facts as ``relation -> rows`` (rows: a set of tuples, or columns kept as given)."""
    out: dict[str, Any] = {}
    if facts is None:
        return out
    if isinstance(facts, Mapping):
        for rel, rows in facts.items():
            out[rel] = rows if hasattr(rows, "ndim") else {tuple(r) for r in rows}
        return out
    for fact in facts:
        rel, args = fact
        out.setdefault(rel, set()).add(tuple(args))
    return out


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    for rel, rows in more.items():
        if rel not in into:
            into[rel] = rows
        else:
            into[rel] = set(as_rel(into[rel]).tuples) | set(as_rel(rows).tuples)


@dataclass
class EpochResult:
    """What one epoch produced; handed to every sink and returned by :meth:`Program.run`."""

    epoch: int
    relations: Relations
    outbox: list[tuple[Value, Fact]] = field(default_factory=list)
    next_tuples: dict[str, set[Row]] = field(default_factory=dict)
    previous: Relations | None = None

    def inserted(self) -> dict[str, set[Row]]:
        """Tuples present now but not at the previous epoch, per relation."""
        return self._diff(self.relations, self.previous)

    def deleted(self) -> dict[str, set[Row]]:
        """Tuples present at the previous epoch but not now, per relation."""
        return self._diff(self.previous, self.relations)

    @staticmethod
    def _diff(a: Relations | None, b: Relations | None) -> dict[str, set[Row]]:
        out: dict[str, set[Row]] = {}
        if a is None:
            return out
        for rel in a:
            extra = a[rel] - (b[rel] if b is not None and rel in b else set())
            if extra:
                out[rel] = extra
        return out


class Program:
    """A checked, stratified program ready to evaluate (see module docstring)."""

    def __init__(self, program: ast.Program, backend: str = "auto") -> None:
        from .checks import check_program

        self.checked = check_program(program)
        self.ast = program
        self.backend = backend
        strata = [list(s.rules) for s in self.checked.strata if not s.temporal]
        self._evaluator = BatchEvaluator(
            program.rules, strata=strata, int_bits=self.checked.int_bits, backend=backend
        )

        self._exact_arities = exact_arities(program)

    @classmethod
    def parse(cls, text: str, dialect: str = "auto", backend: str = "auto") -> Program:
        """Parse and check ``text``; raises an :class:`~merklog.engine.errors.EngineError`."""
        return cls(parse_text(text, dialect), backend=backend)

    # ---------------------------------------------------------------- metadata
    @property
    def dialect(self) -> str:
        return self.ast.dialect

    @property
    def int_bits(self) -> int:
        return self.checked.int_bits

    @property
    def idb(self) -> frozenset[str]:
        """Relations derived by rules."""
        return self.checked.idb

    @property
    def edb(self) -> frozenset[str]:
        """Relations only given as facts."""
        return self.checked.edb

    @property
    def arities(self) -> Mapping[str, int]:
        return self.checked.arities

    @property
    def stateful(self) -> frozenset[str]:
        """Relations that are heads of ``@next`` rules (carried from epoch to epoch)."""
        return frozenset(r.head.rel for r in self.ast.rules if r.time == "next")

    # ---------------------------------------------------------------- evaluation
    def _base(self, facts: FactsInput) -> dict[str, Any]:
        base = normalise_facts(facts)
        self._check_arities(base)
        inline: dict[str, set[Row]] = {}
        for rel, args in self.ast.facts:
            inline.setdefault(rel, set()).add(tuple(args))
        _merge(base, inline)
        return base

    def _check_arities(self, base: Mapping[str, Any]) -> None:
        for rel, rows in base.items():
            want = self._exact_arities.get(rel)
            if want is None:
                continue
            if hasattr(rows, "ndim"):
                widths = {rows.shape[1]}
            else:
                widths = {len(r) for r in rows}
            bad = widths - {want}
            if bad:
                raise ValueError(
                    f"facts for {rel} have {sorted(bad)[0]} arguments; the program uses {want}"
                )

    def _complete(self, rels: Relations) -> Relations:
        """Every relation the program knows appears in the result (empty when underived)."""
        missing = [r for r in self.arities if r not in rels]
        if not missing:
            return rels
        merged = {name: rels._rels[name] for name in rels}
        for name in missing:
            merged[name] = as_rel(())
        return Relations(merged)

    def evaluate(self, facts: FactsInput = None) -> Relations:
        """Every relation (given and derived) after all deductive strata reach their fixpoint."""
        return self._complete(self._evaluator.evaluate(self._base(facts)))

    def query(
        self,
        query: str | ast.Atom,
        facts: FactsInput = None,
        *,
        relations: Relations | None = None,
        bindings: bool = False,
    ) -> list[tuple[Value, ...]] | list[dict[str, Value]]:
        """Rows matching ``query`` (``"path(1, X)"``): the values of its named variables.

        Rows are tuples in the order the variables first appear (``bindings=True``:
        dicts ``name -> value``), sorted and distinct. A query without variables
        returns ``[()]`` when it holds and ``[]`` otherwise. Pass ``relations`` to
        query an earlier result instead of evaluating ``facts``.
        """
        from .checks import check_query, check_query_body

        atom = query if isinstance(query, ast.Atom) else _parse_query(query, self.dialect)
        check_query(self.checked, atom)
        check_query_body((ast.Positive(atom, None, atom.pos),))  # p(X + 1): X never bound
        rels = relations if relations is not None else self.evaluate(facts)
        rows = match_atom(atom, rels[atom.rel] if atom.rel in rels else set(), self.int_bits)
        names = [v.name for v in ast.atom_vars(atom) if not v.anonymous]
        names = list(dict.fromkeys(names))
        if bindings:
            return [dict(zip(names, r, strict=True)) for r in rows]
        return rows

    def run(
        self,
        epochs: Sequence[FactsInput] = (),
        *,
        sources: Iterable[Source] = (),
        sinks: Iterable[Sink] = (),
        count: int | None = None,
        initial: FactsInput = None,
    ) -> list[EpochResult]:
        """Evaluate ``count`` (default ``len(epochs)``) epochs, carrying ``@next`` tuples.

        ``epochs[t]`` holds transient facts true only at epoch ``t`` (events such
        as clicks); ``sources`` are polled for ``(inserts, deletes)`` to a
        persistent EDB at the start of each epoch; ``initial`` seeds the state of
        epoch 0 (e.g. the first value of a ``@next`` relation); ``sinks`` receive
        every :class:`EpochResult` at the end of its epoch.
        """
        sources = list(sources)
        sinks = list(sinks)
        n = len(epochs) if count is None else count
        persistent: dict[str, set[Row]] = {}
        carried: dict[str, set[Row]] = {
            rel: set(as_rel(rows).tuples) for rel, rows in normalise_facts(initial).items()
        }
        previous: Relations | None = None
        results: list[EpochResult] = []
        for t in range(n):
            for source in sources:
                inserts, deletes = source.poll(t)
                for rel, args in deletes:
                    persistent.get(rel, set()).discard(tuple(args))
                for rel, args in inserts:
                    persistent.setdefault(rel, set()).add(tuple(args))
            base = self._base(epochs[t] if t < len(epochs) else None)
            _merge(base, {rel: set(rows) for rel, rows in persistent.items()})
            _merge(base, carried)
            self._check_arities(base)
            step = self._evaluator.step(base)
            result = EpochResult(
                epoch=t,
                relations=self._complete(step.relations),
                outbox=step.outbox,
                next_tuples=step.next_tuples,
                previous=previous,
            )
            for sink in sinks:
                sink.emit(result)
            results.append(result)
            carried = {rel: set(rows) for rel, rows in step.next_tuples.items()}
            previous = result.relations
        return results


def exact_arities(program: ast.Program) -> dict[str, int]:
    """Arities fixed by a head, a fact or a body atom without a rest pattern (``...``)."""
    out: dict[str, int] = {}
    for rel, args in program.facts:
        out[rel] = len(args)
    for rule in program.rules:
        out[rule.head.rel] = len(rule.head.args)
        for lit in rule.body:
            for atom, _pol in ast.body_atoms(lit):
                if not atom.rest:
                    out[atom.rel] = len(atom.args)
    for decl in program.declarations:
        out[decl.rel] = decl.arity
    return out


def _parse_query(text: str, dialect: str) -> ast.Atom:
    from .parser import parse_query

    return parse_query(text)


def match_atom(atom: ast.Atom, rows: Iterable[Row], int_bits: int = 64) -> list[tuple]:
    """Distinct, sorted bindings of ``atom``'s named variables over ``rows``."""
    from .arith import NoBinding, values_equal
    from .batch import Context, RuleCompiler

    comp = RuleCompiler(Context(), int_bits)
    consts: list[tuple[int, Any]] = []
    first: dict[str, int] = {}
    repeats: list[tuple[int, int]] = []
    for i, arg in enumerate(atom.args):
        if isinstance(arg, ast.Var):
            if arg.anonymous:
                continue
            if arg.name in first:
                repeats.append((i, first[arg.name]))
            else:
                first[arg.name] = i
        else:
            try:
                consts.append((i, comp.term(arg)([])))
            except NoBinding:
                return []
    n = len(atom.args)
    out: set[tuple] = set()
    for row in rows:
        if len(row) < n or (not atom.rest and len(row) != n):
            continue
        if any(not values_equal(row[i], c) for i, c in consts):
            continue
        if any(row[i] != row[j] for i, j in repeats):
            continue
        out.add(tuple(row[i] for i in first.values()))
    return sort_rows(out)


__all__ = ["EpochResult", "Program", "Relations", "detect_dialect", "match_atom", "parse_text"]
