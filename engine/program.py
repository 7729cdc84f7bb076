"""The user-facing engine API: parse a program once, evaluate it on facts, query it, run epochs.

>>> p = Program.parse("path(X, Y) :- edge(X, Y).\\npath(X, Y) :- path(X, Z), edge(Z, Y).")
>>> sorted(p.query("path(1, X)", facts={"edge": [(1, 2), (2, 3)]}))
[(2,), (3,)]

Facts are given either as a mapping ``relation -> iterable of tuples`` or as an
iterable of :class:`~merklog.store.Fact`. Results are :class:`Relations`
(``relation -> set of tuples``). ``run`` evaluates epochs (Dialog query-engine spec §1.3.1):
the database at epoch ``t`` is the program's inline facts, the sources'
persistent EDB, that epoch's transient inputs and the ``@next`` tuples derived
at ``t-1``; ``@async`` tuples are collected into each epoch's outbox.

Values keep their identity (docs/language.md, "Value identity"): facts may hold
plain merklog values, which are converted to engine form
(:mod:`merklog.engine.values`) before they meet in a set, and every result
leaves as plain values in containers that keep ``1``, ``1.0`` and ``true``
apart (:class:`~merklog.engine.rows.RowSet`, sorted lists).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from merklog.store import Fact, Value
from merklog.store.gcpause import gc_paused
from merklog.store.values import INT64_MAX, INT64_MIN

from . import ast
from .batch import BatchEvaluator, Relations, Row, as_rel, sort_rows
from .errors import NotAValueError, UnknownDialectError
from .io import Sink, Source
from .rows import EngineSet, RowSet, engine_rows
from .values import Float, row_from_engine, row_to_engine

FactsInput = Mapping[str, Iterable[Row]] | Iterable[Fact] | None


def detect_dialect(text: str) -> str:
    """``"souffle"`` when the text uses Soufflé directives (``.decl`` …), else ``"merklog"``.

    Read on the merklog lexer's tokens, so comments and strings hold no directive and a
    declaration may share its line with clauses or span lines: ``.decl e(a: int).``
    (its ``)`` followed by a ``.``) is merklog's, a ``.decl`` without that period and
    every ``.type``, ``.input``, ``.output``, ``.comp`` or ``.init`` is Soufflé's. QA:
    read line by line, ``.decl e(a: int). e(1).`` on one line, a declaration over two
    lines or one followed by a comment were taken for Soufflé, and a ``.output`` inside a
    ``/* */`` comment switched a merklog program to Soufflé. Text the merklog lexer
    refuses (Soufflé's ``#include``, ``'`` …) is read line by line as before."""
    from .errors import ParseError
    from .lexer import tokenize

    try:
        tokens = tokenize(text)
    except ParseError:
        return _detect_by_lines(text)
    for k, tok in enumerate(tokens):
        if tok.kind != "DIRECTIVE":
            continue
        if tok.value == ".decl" and _merklog_decl_at(tokens, k):
            continue
        if tok.value in _SOUFFLE_DIRECTIVES:
            return "souffle"
    return "merklog"


_SOUFFLE_DIRECTIVES = (".decl", ".type", ".input", ".output", ".comp", ".init")


def _merklog_decl_at(tokens: list, k: int) -> bool:
    """Whether the ``.decl`` at ``tokens[k]`` is a merklog declaration: a name, a
    parenthesised column list (no nested parentheses), then a period."""
    if k + 2 >= len(tokens) or tokens[k + 1].kind != "NAME":
        return False
    if (tokens[k + 2].kind, tokens[k + 2].value) != ("OP", "("):
        return False
    for j in range(k + 3, len(tokens)):
        tok = tokens[j]
        if tok.kind == "OP" and tok.value == "(":
            return False
        if tok.kind == "OP" and tok.value == ")":
            nxt = tokens[j + 1] if j + 1 < len(tokens) else None
            return nxt is not None and nxt.kind == "OP" and nxt.value == "."
    return False


def _detect_by_lines(text: str) -> str:
    """:func:`detect_dialect` for text the merklog lexer refuses: line by line."""
    for line in text.splitlines():
        stripped = line.strip().lstrip("\ufeff")  # a byte-order mark is no text
        if stripped.startswith(".decl") and _MERKLOG_DECL.match(stripped):
            continue  # ``.decl edge(src: int, dst: int).``: a merklog declaration
        if stripped.startswith(_SOUFFLE_DIRECTIVES):
            return "souffle"
    return "merklog"


#: A merklog declaration line: ends with ``).`` (Soufflé's ``.decl`` has no period).
_MERKLOG_DECL = re.compile(r"\.decl\s+[a-z]\w*\s*\([^()]*\)\s*\.\s*(?:(?://|%).*)?$")


def parse_text(text: str, dialect: str = "auto") -> ast.Program:
    """Parse program text with the frontend of ``dialect`` (``auto``, ``merklog``, ``souffle``)."""
    if dialect == "auto":
        dialect = detect_dialect(text)
    if dialect == "souffle":
        from .souffle import parse_souffle

        return parse_souffle(text)
    if dialect != "merklog":
        raise UnknownDialectError(
            f"unknown dialect {dialect!r} (expected auto, merklog or souffle)"
        )
    from .parser import parse_program

    return parse_program(text)


def normalise_facts(facts: FactsInput) -> dict[str, Any]:
    """Facts as ``relation -> rows`` (a set of engine-form tuples, or columns kept as given).

    Raises ValueError naming the relation when a row holds a non-merklog value."""
    out: dict[str, Any] = {}
    if facts is None:
        return out
    grouped: Mapping[str, Any]
    if isinstance(facts, Mapping):
        grouped = facts
    else:
        lists: dict[str, list[Row]] = {}
        for fact in facts:
            rel, args = fact
            lists.setdefault(rel, []).append(tuple(args))
        grouped = lists
    for rel, rows in grouped.items():
        if hasattr(rows, "ndim"):
            if rows.ndim != 2:  # a 1-D array raised a bare IndexError
                raise NotAValueError(
                    f"facts for {rel}: a numpy array of facts has 2 dimensions (one row per"
                    f" fact), not {rows.ndim}"
                )
            if rows.dtype.kind == "i" and rows.dtype.itemsize == 8:  # int64: columns as given
                out[rel] = rows
                continue
            rows = [tuple(row) for row in rows.tolist()]  # floats, bools: as Python values
        trusted = isinstance(rows, EngineSet | RowSet)  # made by merklog: merklog values
        try:
            out[rel] = engine_rows(rows)
            if not trusted:
                _refuse_out_of_range(out[rel])
        except NotAValueError as exc:
            raise NotAValueError(f"facts for {rel}: {exc.message}") from None
    return out


#: A lone surrogate: text with one has no UTF-8 encoding.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_out_of_range(rows: Iterable[Row]) -> None:
    """NotAValueError for a float that is NaN or infinite, or an int outside int64, in
    engine-form ``rows``: no merklog value, yet taken (two NaN facts made two rows of one
    fact, and a CID of an int over 2**63 failed in the DAG-CBOR encoder, QA). One pass
    over the values, the ints and floats checked together."""
    values = list(chain.from_iterable(rows))
    ints = [v for v in values if type(v) is int]
    if ints and (min(ints) < INT64_MIN or max(ints) > INT64_MAX):
        bad = next(v for v in ints if not INT64_MIN <= v <= INT64_MAX)
        raise NotAValueError(f"int {bad} is outside int64 (-2**63 to 2**63-1)")
    floats = [v for v in values if type(v) is Float]
    if floats and not all(map(math.isfinite, floats)):
        bad = next(v for v in floats if not math.isfinite(v))
        raise NotAValueError(f"float {float(bad)} is not finite (NaN and infinities are no value)")
    for text in (v for v in values if type(v) is str and not v.isascii()):
        found = _SURROGATE.search(text)
        if found is not None:  # no UTF-8, so no DAG-CBOR and no CID (QA: a bare ValueError)
            raise NotAValueError(
                f"string holds {found.group()!r} at {found.start()}, a lone surrogate (strings"
                " must be valid Unicode)"
            )


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
    next_tuples: dict[str, RowSet] = field(default_factory=dict)
    previous: Relations | None = None

    def inserted(self) -> dict[str, RowSet]:
        """Tuples present now but not at the previous epoch, per relation."""
        return self._diff(self.relations, self.previous)

    def deleted(self) -> dict[str, RowSet]:
        """Tuples present at the previous epoch but not now, per relation."""
        return self._diff(self.previous, self.relations)

    @staticmethod
    def _diff(a: Relations | None, b: Relations | None) -> dict[str, RowSet]:
        out: dict[str, RowSet] = {}
        if a is None:
            return out
        for rel in a:
            extra = a.engine(rel) - (b.engine(rel) if b is not None and rel in b else set())
            if extra:
                out[rel] = RowSet(extra)
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

        self._schema = self.checked.schema
        # Relations body atoms read that no rule, inline fact or declaration defines.
        defined = set(self.checked.idb) | {rel for rel, _a in program.facts}
        defined |= {d.rel for d in program.declarations}
        self._read_only = {
            atom.rel
            for rule in program.rules
            for lit in rule.body
            for atom, _pol in ast.body_atoms(lit)
            if atom.rel not in defined
        }
        self._inline: dict[str, set[Row]] = {}
        for rel, args in program.facts:
            self._inline.setdefault(rel, set()).add(row_to_engine(tuple(args)))

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
        self.check_fact_arities(base)
        self._schema.check_facts(base)
        _merge(base, self._inline)
        return base

    def check_fact_arities(self, facts: Mapping[str, Any]) -> None:
        """Raise :class:`~merklog.engine.errors.ArityError` (line:col of the atom) when
        the program reads a relation with an arity none of its given facts has.

        ``facts`` maps a relation to its rows (or a 2-D array, or a set of arities).
        Facts of another arity are otherwise simply never matched."""
        from .checks import check_fact_arities

        arities: dict[str, set[int]] = {}
        for rel, rows in facts.items():
            if rel not in self._read_only:
                continue  # defined by the program, or not read: nothing to check
            if hasattr(rows, "ndim"):
                arities[rel] = {rows.shape[1]} if len(rows) else set()
            elif rows and all(type(r) is int for r in rows):
                arities[rel] = set(rows)
            else:
                arities[rel] = set(map(len, rows))
        check_fact_arities(self.checked, arities)

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
        with gc_paused():  # converting and evaluating allocate no cycles (see BatchEvaluator)
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
        if atom.rel not in rels:
            found: set[Row] = set()
        elif isinstance(rels, Relations):
            found = rels.engine(atom.rel)
        else:  # any mapping of relation -> rows (plain or engine values)
            found = engine_rows(rels[atom.rel])
        rows = match_atom(atom, found, self.int_bits)
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
        live: set[tuple[str, tuple]] = set()  # @async tuples whose body held last epoch
        for t in range(n):
            for source in sources:
                inserts, deletes = source.poll(t)
                for rel, args in deletes:
                    persistent.get(rel, set()).discard(row_to_engine(tuple(args)))
                for rel, args in inserts:
                    persistent.setdefault(rel, set()).add(row_to_engine(tuple(args)))
            base = normalise_facts(epochs[t] if t < len(epochs) else None)
            _merge(base, {rel: set(rows) for rel, rows in persistent.items()})
            _merge(base, carried)
            self.check_fact_arities(base)
            _merge(base, self._inline)
            step = self._evaluator.step(base)
            keys = [(fact.rel, row_to_engine(fact.args)) for _dest, fact in step.outbox]
            # An @async tuple is sent once, at the epoch it becomes derived (as the
            # incremental engine does: docs/language.md, "@async delivery").
            outbox = [m for m, k in zip(step.outbox, keys, strict=True) if k not in live]
            live = set(keys)
            result = EpochResult(
                epoch=t,
                relations=self._complete(step.relations),
                outbox=outbox,
                next_tuples=step.next_tuples,
                previous=previous,
            )
            for sink in sinks:
                sink.emit(result)
            results.append(result)
            carried = {rel: set(rows.engine) for rel, rows in step.next_tuples.items()}
            previous = result.relations
        return results


def _parse_query(text: str, dialect: str) -> ast.Atom:
    from .parser import parse_query

    return parse_query(text)


def match_atom(atom: ast.Atom, rows: Iterable[Row], int_bits: int = 64) -> list[tuple]:
    """Distinct, sorted bindings (plain values) of ``atom``'s named variables over
    engine-form ``rows``. A constant selects by value identity, as in a rule body:
    ``p(1)`` matches ``p(1)``, not ``p(1.0)`` or ``p(true)``."""
    from .arith import NoBinding
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
        if any(row[i] != c for i, c in consts):
            continue
        if any(row[i] != row[j] for i, j in repeats):
            continue
        out.add(tuple(row[i] for i in first.values()))
    return [row_from_engine(r) for r in sort_rows(out)]


__all__ = ["EpochResult", "Program", "Relations", "detect_dialect", "match_atom", "parse_text"]
