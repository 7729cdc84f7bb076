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

A *reload* epoch — the first after a home is opened or a program is loaded —
does not feed the whole store through that engine. :meth:`ProgramRunner.evaluate_all`
evaluates it from scratch with the batch evaluator (columnar over int64 arrays
where it can, as ``merklog eval`` does) and keeps the result as a *snapshot*
that answers queries, counts and the epoch's ``@next``/``@async`` output. The
per-epoch engine gets the whole base only at the first later epoch that changes
something (:meth:`ProgramRunner.step`), or at once when the node starts running
(ADR 0070): a one-shot command on a stopped home never builds incremental state.

An epoch is evaluated, then published (:meth:`ProgramRunner.publish`): until then
:meth:`ProgramRunner.relation`, :meth:`~ProgramRunner.relation_matching` and
:meth:`~ProgramRunner.count` answer the epoch before, so the node's reads never wait
for an evaluation and never see half of one (ADR 0205).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from merklog.engine import ast
from merklog.engine.rows import DeltaMap, RowSet, engine_rows
from merklog.engine.values import row_holds, row_to_engine
from merklog.store import Fact

from .errors import NodeInputError, RefusedFact
from .querycheck import program_arities

log = logging.getLogger(__name__)

#: The setting that gives a node's evaluations their memory budget (ADR 0207).
MEMORY_SETTING = "node.eval_memory_mb"


def memory_limit(config: Any) -> int | None:
    """The memory budget ``config`` sets for evaluations (epochs and queries), in bytes;
    None: the engine's default (half the machine's memory, ADR 0207)."""
    mb = int(config.get(MEMORY_SETTING) or 0)
    return mb * 1024 * 1024 if mb > 0 else None

Row = tuple
Deltas = dict[str, dict[Row, int]]
Outbox = list[tuple[Any, Fact]]


class ProgramError(NodeInputError):
    """A program failed to parse or a static check (text is ``SOURCE:LINE:COL: …``)."""


def _engine_form(rows: Iterable[Row]) -> Iterable[Row]:
    """Rows in engine form; an int64 fact matrix (how the node holds an all-int relation,
    see :mod:`merklog.node.edb`) has plain-int rows already."""
    if isinstance(rows, np.ndarray):
        return map(tuple, rows.tolist())
    return map(row_to_engine, rows)


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
        #: The evaluated epoch's (current, next, live), until :meth:`publish`.
        self._unpublished: tuple[dict, dict, list[Fact]] | None = None

    def step(
        self,
        inserts: Mapping[str, Iterable[Row]],
        deletes: Mapping[str, Iterable[Row]],
        events: Mapping[str, Iterable[Row]],
    ) -> tuple[Deltas, Outbox]:
        for rel, rows in deletes.items():
            self.base.setdefault(rel, set()).difference_update(_engine_form(rows))
        for rel, rows in inserts.items():
            self.base.setdefault(rel, set()).update(_engine_form(rows))
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
        nxt = result.next_tuples
        self._unpublished = (
            {rel: rows for rel, rows in new.items() if rows},
            {rel: set(map(row_to_engine, rows)) for rel, rows in nxt.items() if rows},
            [fact for _dest, fact in result.outbox],
        )
        return deltas, list(result.outbox)

    def publish(self) -> None:
        """Show the epoch :meth:`step` evaluated."""
        if self._unpublished is not None:
            (self.current, self.next, self.live), self._unpublished = self._unpublished, None

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
        deltas = self.engine.step(inserts=inserts, deletes=deletes, events=events, publish=False)
        last = self.engine.last
        return deltas, list(last.outbox) if last is not None else []

    def publish(self) -> None:
        """Show the epoch :meth:`step` evaluated."""
        self.engine.publish()

    def relation(self, rel: str) -> set[Row]:
        return self.engine.relation(rel).engine  # engine form

    def relation_matching(self, rel: str, consts: dict[int, Any]) -> set[Row]:
        return self.engine.relation_matching(rel, consts).engine  # engine form

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


@dataclass
class _Snapshot:
    """A reload epoch evaluated from scratch by the batch evaluator."""

    relations: Any  # merklog.engine.batch.Relations (columnar relations stay arrays)
    next: dict[str, RowSet]
    outbox: Outbox
    #: The epoch had one-epoch events: the next epoch withdraws them, so it is not idle.
    had_events: bool


class ProgramRunner:
    """A checked program (possibly empty) evaluated epoch by epoch over deltas.

    ``mode`` is ``"incremental"`` or ``"batch"`` (the fallback). ``digest``
    identifies the program text: the epoch state records which program derived its
    ``@next`` tuples (see :meth:`carried`).
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
        prog = checked.program
        #: Whether the program says anything: a rule, a fact or a declaration (QA: a
        #: program of blanks or comments was shown as loaded, one of "" as none).
        self.says_anything = bool(prog.rules or prog.facts or prog.declarations)
        self.mode = "incremental"
        if engine not in ("auto", "batch"):
            raise NodeInputError(f"engine must be auto or batch, got {engine!r}")
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
        #: Bytes this process may grow to while an epoch evaluates (None: the engine's
        #: default, half the memory): :func:`merklog.engine.interrupt.memory_budget`.
        self.memory_limit: int | None = None
        #: Whether the per-epoch engine has been fed an epoch: its state is then no longer
        #: that of a fresh engine, and a reload (:meth:`evaluate_all`) replaces it.
        self._fed = False
        self._snapshot: _Snapshot | None = None
        #: What :meth:`publish` does to show the epoch last evaluated, in order.
        self._unpublished: list[Callable[[], None]] = []

    def publish(self) -> None:
        """Show the epoch :meth:`step` or :meth:`evaluate_all` evaluated: from now on
        :meth:`relation`, :meth:`relation_matching`, :meth:`count`, :meth:`next_tuples`
        and :meth:`async_live` answer it (before, the epoch before it). Work in
        proportion to the epoch's changes; nothing to do when it is shown already. An
        evaluation that raised leaves nothing to publish: reads keep the last good epoch.
        """
        todo, self._unpublished = self._unpublished, []
        for show in todo:
            show()

    def _drop_snapshot(self) -> None:
        self._snapshot = None

    def _fresh_impl(self) -> None:
        """A per-epoch engine with no state, of the same mode, for the next :meth:`step`
        to feed the whole base. The engine of a failed epoch (a recursion without fixpoint)
        is half updated: it still held the retracted seed and ran away again on the next
        write, and one the node put back after a failed program load had missed the
        changes that load's epoch took."""
        if self._fed:
            self._impl = (
                _Incremental(self.checked)
                if self.mode == "incremental"
                else _BatchFallback(self.checked)
            )
            self._fed = False

    def check_fact(self, fact: Fact) -> None:
        """Refuse (NodeInputError) a fact that does not fit the program's ``.decl``
        declarations; call before storing it (``put``), so nothing is stored."""
        why = self.checked.schema.problem(fact.rel, fact.args)
        if why is not None:
            raise RefusedFact(f"{fact} does not fit: {why}", fact)

    def carried(self, tuples: Mapping[str, Iterable[Row]], digest: str) -> dict[str, set[Row]]:
        """The ``@next`` tuples a committed epoch derived (``tuples``, by the program of
        ``digest``) that this program takes as the events of its next epoch, as fresh
        engine-form sets: all of them when it is that program; else those of relations
        it mentions with the same arity whose rows fit its ``.decl`` declarations
        (ADR 0175). A tuple of a relation the program no longer has is dropped: it
        would hold for one epoch in a relation nothing of the program reads."""
        same = digest == self.digest
        arities = {} if same else program_arities(self.checked.program)
        schema = self.checked.schema
        out: dict[str, set[Row]] = {}
        for rel, rows in tuples.items():
            engine = engine_rows(rows)
            if not same:
                known = arities.get(rel, ())
                engine = {
                    row for row in engine if len(row) in known and schema.problem(rel, row) is None
                }
            if engine:
                out[rel] = set(engine)
        return out

    def evaluate_all(self, base: Mapping[str, Any], events: Mapping[str, Iterable[Row]]) -> Outbox:
        """A reload epoch: the program over the whole ``base`` (relation → int64 array or
        engine-form rows) and this epoch's ``events``, evaluated from scratch by the batch
        evaluator; returns the ``@async`` outbox. Once published (:meth:`publish`), the
        result is the snapshot that :meth:`relation`, :meth:`count`, :meth:`next_tuples`
        and :meth:`async_live` answer from until :meth:`step` hands the base to the
        per-epoch engine."""
        from merklog.engine.batch import BatchEvaluator, as_rel

        self.publish()  # an epoch evaluated before comes first
        checked = self.checked
        strata = [list(s.rules) for s in checked.strata if not s.temporal]
        evaluator = BatchEvaluator(checked.program.rules, strata=strata, int_bits=checked.int_bits)
        db: dict[str, Any] = dict(base)
        inline: dict[str, list[Row]] = {}
        for rel, row in checked.program.facts:
            inline.setdefault(rel, []).append(tuple(row))
        for source in (inline, events):
            for rel, rows in source.items():
                extra = engine_rows(rows)  # engine form before rows meet in a set
                if not extra:
                    continue
                db[rel] = set(as_rel(db[rel]).tuples) | extra if rel in db else extra
        result = self._within_budget(evaluator.step, db)
        outbox = list(result.outbox)
        snapshot = _Snapshot(result.relations, result.next_tuples, outbox, bool(events))
        # Published: the next step feeds the whole base to an engine that has none.
        self._unpublished = [self._fresh_impl, partial(setattr, self, "_snapshot", snapshot)]
        return outbox

    def _within_budget(self, evaluate: Callable[..., Any], *args: Any) -> Any:
        """``evaluate(*args)`` under the node's memory budget (``node.eval_memory_mb``,
        ADR 0207). A failed evaluation's memory is released before its error is raised:
        what its rounds derived lived in its frames, which the error's traceback kept
        for as long as the node kept the error (the epoch loop keeps the last one), and
        the engine lets go of a stopped recursion's state itself."""
        from merklog.engine.errors import EngineError
        from merklog.engine.interrupt import memory_budget, release_memory

        failed: EngineError | None = None
        with memory_budget(self.memory_limit, MEMORY_SETTING):
            try:
                return evaluate(*args)
            except EngineError as exc:
                failed = exc
        failed.__traceback__ = None  # the failed evaluation's frames go now
        del evaluate, args
        release_memory()  # a failure is rare, and it freed up to the budget
        raise failed

    @property
    def snapshot(self) -> bool:
        """Whether the last epoch's state is a batch snapshot (:meth:`evaluate_all`)."""
        return self._snapshot is not None

    @property
    def snapshot_moves(self) -> bool:
        """Whether the snapshot's epoch had one-epoch events or derived ``@next`` tuples:
        then the epoch after it differs from it even without changes of its own (its
        events are withdrawn, its ``@next`` tuples hold). False without a snapshot."""
        snap = self._snapshot
        return snap is not None and (snap.had_events or any(snap.next.values()))

    def step(
        self,
        inserts: Mapping[str, Iterable[Row]],
        deletes: Mapping[str, Iterable[Row]],
        events: Mapping[str, Iterable[Row]],
        base: Callable[[], Mapping[str, Iterable[Row]]] | None = None,
        keep_snapshot: bool = True,
        want_deltas: bool = True,
    ) -> tuple[Deltas, Outbox]:
        """One epoch: apply base changes (deletes first) and this epoch's events; return
        ``({relation: {row: +1 | -1}}, [(destination, @async Fact), …])``.

        After :meth:`evaluate_all`, ``base()`` gives the whole base *with* this epoch's
        changes applied. An epoch that changes nothing (no changes, no events now or in
        the snapshot's epoch, no ``@next`` tuples from it) keeps the snapshot when
        ``keep_snapshot``; otherwise the per-epoch engine is fed the whole base and the
        returned deltas are against the snapshot (computed only when ``want_deltas``;
        else empty)."""
        self.publish()  # an epoch evaluated before comes first
        snap = self._snapshot
        impl = self._impl
        if snap is None:
            self._fed = True  # also when the step fails: its state may be half updated
            out = self._within_budget(impl.step, inserts, deletes, events)
            self._unpublished = [impl.publish]
            return out
        carried = {rel: rows for rel, rows in snap.next.items() if rows}
        if keep_snapshot and not (inserts or deletes or events or snap.had_events or carried):
            return {}, []
        if base is None:
            raise ValueError("the first epoch after a snapshot needs the whole base")
        # The snapshot's @next tuples hold now: one-epoch events to the fresh engine, as
        # the tuples restored after a restart are.
        now = {rel: engine_rows(rows) for rel, rows in events.items()}
        for rel, rows in carried.items():
            now[rel] = now[rel] | rows.engine if rel in now else set(rows.engine)
        self._fed = True
        fresh, outbox = self._within_budget(impl.step, base(), {}, now)
        self._unpublished = [impl.publish, self._drop_snapshot]
        if not want_deltas:
            return {}, outbox
        return _against(snap.relations, fresh), outbox

    def async_live(self) -> list[Fact]:
        """``@async`` tuples whose rule body holds now (each is sent once per episode);
        a list, since ``Fact`` equality would merge ``m(1)``, ``m(1.0)`` and ``m(true)``."""
        if self._snapshot is not None:
            return [fact for _dest, fact in self._snapshot.outbox]
        return self._impl.async_live()

    def relation(self, rel: str) -> set[Row]:
        """Current tuples of ``rel``: stored, event, ``@next`` and derived alike."""
        snap = self._snapshot
        if snap is not None:
            return set(snap.relations.engine(rel)) if rel in snap.relations else set()
        return self._impl.relation(rel)

    def relation_matching(self, rel: str, consts: dict[int, Any]) -> set[Row]:
        """The tuples of :meth:`relation` whose column ``c`` holds ``consts[c]`` (engine
        values, by identity): a stored int64 relation answers without a tuple per row
        (a point query such as ``edge(1, Y)``), from incremental state or a reload's
        snapshot alike."""
        impl = self._impl
        snap = self._snapshot
        if snap is not None:
            return snap.relations.matching(rel, consts)
        if isinstance(impl, _Incremental):
            return impl.relation_matching(rel, consts)
        return {row for row in self.relation(rel) if row_holds(row, consts)}

    def count(self, rel: str) -> int:
        """Number of tuples in ``rel`` without copying it."""
        if self._snapshot is not None:
            return self._snapshot.relations.count(rel)
        return self._impl.count(rel)

    def next_tuples(self) -> dict[str, set[Row]]:
        """Tuples the ``@next`` rules derived in the last epoch (true at the next one)."""
        if self._snapshot is not None:
            return dict(self._snapshot.next)
        return self._impl.next_tuples()

    def all_new(self) -> Deltas:
        """Every tuple of every relation as a ``+1`` delta: what a reload epoch changed
        for a listener that saw the previous program (built only when someone listens)."""
        snap = self._snapshot
        if snap is None:
            raise ValueError("all_new() follows evaluate_all()")
        rels = snap.relations
        return {
            rel: DeltaMap(dict.fromkeys(rels.engine(rel), 1)) for rel in rels if rels.count(rel)
        }


def _against(old: Any, fresh: Deltas) -> Deltas:
    """Deltas of a fresh engine's first epoch (every tuple ``+1``, against nothing) turned
    into deltas against the snapshot ``old`` (a Relations) the epoch follows."""
    out: Deltas = {}
    for rel in set(fresh) | set(old):
        d = fresh.get(rel)
        items = () if d is None else d.engine.items() if isinstance(d, DeltaMap) else d.items()
        now = {r for r, w in items if w > 0}  # engine-form keys
        was = old.engine(rel) if rel in old else set()
        change = dict.fromkeys(now - was, 1)
        change.update(dict.fromkeys(was - now, -1))
        if change:
            out[rel] = DeltaMap(change)
    return out


def check(text: str, source: str = "<program>") -> Any:
    """Parse and statically check ``text``; a CheckedProgram or ProgramError (line:col)."""
    from merklog.engine.checks import check_program
    from merklog.engine.errors import EngineError
    from merklog.engine.program import parse_text

    try:
        return check_program(parse_text(text))
    except EngineError as exc:
        raise ProgramError(f"{source}:{exc}") from exc


def check_stored_arities(
    runner: ProgramRunner, arities: Callable[[str], set[int]], relations: Iterable[str]
) -> None:
    """ProgramError (``SOURCE:LINE:COL``) when the program reads a stored relation at an
    arity none of its facts has and the program does not define (``q(X) :- v(X, Y).``
    over stored ``v/1``): the engine's fact-arity check, run against the store as
    ``merklog eval`` runs it against its fact files. Such a program loaded and derived
    nothing, where a query of ``v(X, Y)`` says "v exists here as v/1 only" (QA)."""
    from merklog.engine.checks import check_fact_arities
    from merklog.engine.errors import EngineError

    try:
        check_fact_arities(runner.checked, {rel: arities(rel) for rel in relations})
    except EngineError as exc:
        raise ProgramError(f"{runner.source}:{exc}") from exc


def compile_program(text: str, source: str = "<program>", engine: str = "auto") -> ProgramRunner:
    """A runner for ``text`` after every static check passed (ProgramError otherwise).
    ``engine="batch"`` forces the batch evaluator (for comparisons)."""
    return ProgramRunner(check(text, source), text, source, engine)


def empty_program() -> ProgramRunner:
    """The runner used while no program is loaded: stored facts only."""
    from merklog.engine.checks import check_program

    return ProgramRunner(check_program(ast.Program()), "", "<none>")
