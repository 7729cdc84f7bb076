"""The node's program: checked on load, then evaluated epoch by epoch over deltas.

:func:`compile_program` parses (merklog or Soufflé syntax), runs every static
check of :func:`merklog.engine.checks.check_program` (range restriction, safe
negation, aggregate scoping, arity, stratification, ``@next`` finiteness) and
builds a :class:`ProgramRunner`. A bad program raises
:class:`~merklog.node.errors.NodeInputError` whose text starts
``SOURCE:LINE:COL:`` — before anything in the node changes.

The runner drives :class:`merklog.engine.incremental.IncrementalEngine`: each
epoch it is fed the visible-set +1/−1 changes as inserts/deletes, one-epoch
events (inbox ``@async`` messages, the ``tick`` clock, ``@next`` tuples restored
after a restart) and returns the output deltas. Only when the incremental
compiler rejects a construct (:class:`~merklog.engine.incremental.CompileError`)
does the runner fall back to re-running the batch evaluator each epoch and
diffing — logged as a warning naming the reason.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from merklog.engine import ast
from merklog.engine.rows import DeltaMap, RowSet
from merklog.engine.values import row_to_engine
from merklog.store import Fact

from .errors import NodeInputError

log = logging.getLogger(__name__)

Row = tuple
Deltas = dict[str, dict[Row, int]]
Outbox = list[tuple[Any, Fact]]


class ProgramError(NodeInputError):
    """A program failed to parse or a static check (text is ``SOURCE:LINE:COL: …``)."""


class _BatchFallback:
    """Re-evaluates the whole program each epoch (BatchEvaluator) and diffs the result."""

    def __init__(self, checked: Any) -> None:
        from merklog.engine.batch import BatchEvaluator

        program = checked.program
        strata = [list(s.rules) for s in checked.strata if not s.temporal]
        self.evaluator = BatchEvaluator(program.rules, strata=strata, int_bits=checked.int_bits)
        # Every set here holds rows in engine form, so 1, 1.0 and true stay apart.
        self.base: dict[str, set[Row]] = {}
        for rel, row in program.facts:
            self.base.setdefault(rel, set()).add(row_to_engine(tuple(row)))
        self.current: dict[str, set[Row]] = {}
        self.next: dict[str, set[Row]] = {}
        self.live: list[Fact] = []

    def step(
        self,
        inserts: Mapping[str, Iterable[Row]],
        deletes: Mapping[str, Iterable[Row]],
        events: Mapping[str, Iterable[Row]],
    ) -> tuple[Deltas, Outbox]:
        for rel, rows in deletes.items():
            self.base.setdefault(rel, set()).difference_update(map(row_to_engine, rows))
        for rel, rows in inserts.items():
            self.base.setdefault(rel, set()).update(map(row_to_engine, rows))
        db = {rel: set(rows) for rel, rows in self.base.items()}
        for source in (events, self.next):
            for rel, rows in source.items():
                db.setdefault(rel, set()).update(map(row_to_engine, rows))
        result = self.evaluator.step(db)
        new = {rel: set(result.relations.engine(rel)) for rel in result.relations}
        deltas: Deltas = {}
        for rel in set(new) | set(self.current):
            now, old = new.get(rel, set()), self.current.get(rel, set())
            d = {r: 1 for r in now - old}
            d.update({r: -1 for r in old - now})
            if d:
                deltas[rel] = DeltaMap(d)
        self.current = {rel: rows for rel, rows in new.items() if rows}
        self.next = {
            rel: set(map(row_to_engine, rows)) for rel, rows in result.next_tuples.items() if rows
        }
        self.live = [fact for _dest, fact in result.outbox]
        return deltas, list(result.outbox)

    def relation(self, rel: str) -> set[Row]:
        return set(self.current.get(rel, ()))  # engine form

    def count(self, rel: str) -> int:
        return len(self.current.get(rel, ()))

    def next_tuples(self) -> dict[str, set[Row]]:
        return {rel: RowSet(set(rows)) for rel, rows in self.next.items()}

    def async_live(self) -> list[Fact]:
        return list(self.live)


class _Incremental:
    """The incremental engine behind the runner's interface."""

    def __init__(self, checked: Any) -> None:
        from merklog.engine.incremental import IncrementalEngine

        self.engine = IncrementalEngine(checked)
        self.async_heads = sorted({r.head.rel for r in checked.program.rules if r.time == "async"})

    def step(
        self,
        inserts: Mapping[str, Iterable[Row]],
        deletes: Mapping[str, Iterable[Row]],
        events: Mapping[str, Iterable[Row]],
    ) -> tuple[Deltas, Outbox]:
        deltas = self.engine.step(inserts=inserts, deletes=deletes, events=events)
        last = self.engine.last
        return deltas, list(last.outbox) if last is not None else []

    def relation(self, rel: str) -> set[Row]:
        return self.engine.relation(rel).engine  # engine form

    def count(self, rel: str) -> int:
        return self.engine.count(rel)

    def next_tuples(self) -> dict[str, set[Row]]:
        last = self.engine.last
        return last.next_tuples if last is not None else {}

    def async_live(self) -> list[Fact]:
        # A list: a set of Facts would merge ping(1), ping(1.0) and ping(true).
        return [
            Fact(rel, row) for rel in self.async_heads for row in self.engine.async_relation(rel)
        ]


class ProgramRunner:
    """A checked program (possibly empty) evaluated epoch by epoch over deltas.

    ``mode`` is ``"incremental"`` or ``"batch"`` (the fallback). ``digest``
    identifies the program text, so persisted ``@next`` tuples are only
    restored into the program that derived them.
    """

    def __init__(
        self, checked: Any, text: str = "", source: str = "<program>", engine: str = "auto"
    ) -> None:
        from merklog.engine.incremental import CompileError

        self.checked = checked
        self.text = text
        self.source = source
        self.digest = hashlib.sha256(text.encode()).hexdigest()
        self.heads = frozenset(r.head.rel for r in checked.program.rules)
        self.mode = "incremental"
        if engine not in ("auto", "batch"):
            raise ValueError(f"engine must be auto or batch, got {engine!r}")
        try:
            if engine == "batch":  # forced (benchmarks, comparisons): no warning
                self.mode = "batch"
                self._impl: _Incremental | _BatchFallback = _BatchFallback(checked)
            else:
                self._impl = _Incremental(checked)
        except CompileError as exc:
            log.warning(
                "%s: the incremental engine rejected the program (%s); "
                "falling back to re-running the batch evaluator every epoch",
                source,
                exc,
            )
            self.mode = "batch"
            self._impl = _BatchFallback(checked)

    def check_fact(self, fact: Fact) -> None:
        """Refuse (NodeInputError) a fact that does not fit the program's ``.decl``
        declarations; call before storing it (``put``), so nothing is stored."""
        why = self.checked.schema.problem(fact.rel, fact.args)
        if why is not None:
            raise NodeInputError(f"{fact} does not fit: {why}")

    def step(
        self,
        inserts: Mapping[str, Iterable[Row]],
        deletes: Mapping[str, Iterable[Row]],
        events: Mapping[str, Iterable[Row]],
    ) -> tuple[Deltas, Outbox]:
        """One epoch: apply base changes (deletes first) and this epoch's events; return
        ``({relation: {row: +1 | -1}}, [(destination, @async Fact), …])``."""
        return self._impl.step(inserts, deletes, events)

    def async_live(self) -> list[Fact]:
        """``@async`` tuples whose rule body holds now (each is sent once per episode);
        a list, since ``Fact`` equality would merge ``m(1)``, ``m(1.0)`` and ``m(true)``."""
        return self._impl.async_live()

    def relation(self, rel: str) -> set[Row]:
        """Current tuples of ``rel``: stored, event, ``@next`` and derived alike."""
        return self._impl.relation(rel)

    def count(self, rel: str) -> int:
        """Number of tuples in ``rel`` without copying it."""
        return self._impl.count(rel)

    def next_tuples(self) -> dict[str, set[Row]]:
        """Tuples the ``@next`` rules derived in the last epoch (true at the next one)."""
        return self._impl.next_tuples()


def check(text: str, source: str = "<program>") -> Any:
    """Parse and statically check ``text``; a CheckedProgram or ProgramError (line:col)."""
    from merklog.engine.checks import check_program
    from merklog.engine.errors import EngineError
    from merklog.engine.program import parse_text

    try:
        return check_program(parse_text(text))
    except EngineError as exc:
        raise ProgramError(f"{source}:{exc}") from exc


def compile_program(text: str, source: str = "<program>", engine: str = "auto") -> ProgramRunner:
    """A runner for ``text`` after every static check passed (ProgramError otherwise).
    ``engine="batch"`` forces the batch evaluator (for comparisons)."""
    return ProgramRunner(check(text, source), text, source, engine)


def empty_program() -> ProgramRunner:
    """The runner used while no program is loaded: stored facts only."""
    from merklog.engine.checks import check_program

    return ProgramRunner(check_program(ast.Program()), "", "<none>")
