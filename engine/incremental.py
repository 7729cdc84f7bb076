"""Incremental evaluation: compile a checked program to a dataflow circuit and run epochs.

Every relation becomes a root-circuit stream of *set* deltas (weights ±1 per
epoch). A stratum without recursion is compiled straight into the root
circuit; a recursive stratum becomes a child circuit iterated to a fixed point
each epoch (DBSP nested incrementalisation, Dialog dataflow spec §2.8.2), so inserting *and
deleting* facts is exact through recursion: the child's distinct operators keep
per-iteration history and retract precisely the derivations that lost support.

Rule bodies compile into left-deep pipelines in the order of their plan
(:mod:`merklog.engine.planner`, the one planner of every backend): each positive atom is a filtered,
projected stream of its relation joined (bilinear incremental join) on the
shared variables; comparisons filter or bind; ``!atom`` is an antijoin against
the integrated key set of the negated relation; aggregates are incremental
grouped operators whose result relation is joined back (count/sum over an empty
group give 0, min/max none — the semantics of :class:`merklog.engine.ast.Aggregate`).
``C := atom`` appends the fact's CID (:func:`merklog.store.fact_cid`).
``@next`` heads feed a root feedback node (visible next epoch); ``@async`` heads
go to the outbox.

:func:`compile_program` returns a :class:`CompiledProgram`: the root circuit with
an :class:`InputHandle` per relation and an :class:`OutputHandle` per derived,
``@async`` and ``@next`` relation, and no reference to whoever drives it (the
input/output handle pattern of DBSP's ``RootCircuit::build`` in Feldera's
``crates/dbsp``). The epoch driver (:class:`IncrementalEngine`) polls sources,
applies inserts, deletes and one-epoch events to the base facts as set
operations, pushes the resulting deltas into the input handles, steps the
circuit, reads the output handles and hands the epoch to sinks. Work per epoch
is proportional to the change, not the database.

Values: Z-set keys are rows in engine form (:mod:`merklog.engine.values`), so
deleting ``p(1)`` never retracts ``p(1.0)`` or ``p(true)``. Rows are converted
on the way in (``step``, sources, inline facts, constants when compiling) and
leave as plain values in identity-keeping views (:class:`~merklog.engine.rows.DeltaMap`,
:class:`~merklog.engine.rows.RowSet`); ``C := atom`` hashes the plain values, so
the CID is the stored fact's. Input rows whose length is not the arity the
program reads the relation with are kept (``relation()`` shows them) but never
enter the circuit: relations are name/arity.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from merklog.store import Fact, Value, fact_cid
from merklog.store.gcpause import gc_paused

from . import ast, planner
from .arith import numeric_key
from .arraybase import ArrayBase
from .dataflow import (
    Aggregate,
    BatchCache,
    Circuit,
    CountSumJoin,
    DistinctTrace,
    FeedbackNode,
    Filter,
    FlatMap,
    GroupAggregate,
    IndexWith,
    Inspect,
    Join,
    Map,
    Minus,
    Node,
    Operator,
    Plus,
    Timestamp,
)
from .dataflow.columns import ColumnBatch
from .dataflow.lazydelta import SignedRows
from .errors import MAX_FIXPOINT_ITERATIONS, EngineError, IterationLimitError
from .io import Sink, Source
from .rows import DeltaMap, EngineSet, RowSet, engine_rows
from .stratify import Stratum, stratify
from .values import row_from_engine, row_holds, to_engine

Row = tuple
Delta = dict  # dict[Row, int]


class CompileError(EngineError, ValueError):
    """The program cannot be compiled incrementally (a construct the circuits lack);
    callers fall back to the batch evaluator."""

    code = "incremental_unsupported"
    default_hint = "the batch evaluator runs this program (merklog eval, or engine = batch)"


# ----------------------------------------------------------------------------- results


class EpochResult:
    """One epoch's outcome, handed to every :class:`~merklog.engine.io.Sink`.

    Duck-compatible with :class:`merklog.engine.program.EpochResult`
    (``epoch``, ``relations``, ``outbox``, ``next_tuples``, ``inserted()``,
    ``deleted()``) but built from deltas: ``deltas`` holds ``{row: +1 | -1}``
    per changed relation, and ``relations`` is a *live* read-only view of the
    engine's current state (copy what you keep — the next epoch changes it).
    """

    __slots__ = ("epoch", "_deltas", "outbox", "_engine")

    def __init__(
        self,
        epoch: int,
        deltas: dict[str, Delta],
        outbox: list[tuple[Value, Fact]],
        engine: IncrementalEngine,
    ) -> None:
        self.epoch = epoch
        self._deltas = deltas  # keyed by engine-form rows
        self.outbox = outbox
        self._engine = engine

    previous = None

    @property
    def deltas(self) -> dict[str, DeltaMap]:
        """``relation -> {row: +1 | -1}`` (plain rows out, engine identity kept)."""
        return {rel: DeltaMap(d) for rel, d in self._deltas.items()}

    @property
    def relations(self) -> Mapping[str, set[Row]]:
        return _RelationsView(self._engine)

    @property
    def next_tuples(self) -> dict[str, RowSet]:
        """Tuples the ``@next`` rules derived this epoch (they hold at the next one)."""
        return {rel: RowSet(set(rows)) for rel, rows in self._engine._next_state.items() if rows}

    def inserted(self) -> dict[str, RowSet]:
        """Tuples that appeared this epoch, per relation."""
        out = {rel: {r for r, w in d.items() if w > 0} for rel, d in self._deltas.items()}
        return {rel: RowSet(rows) for rel, rows in out.items() if rows}

    def deleted(self) -> dict[str, RowSet]:
        """Tuples that disappeared this epoch, per relation."""
        out = {rel: {r for r, w in d.items() if w < 0} for rel, d in self._deltas.items()}
        return {rel: RowSet(rows) for rel, rows in out.items() if rows}

    def __repr__(self) -> str:
        return f"EpochResult(epoch={self.epoch}, deltas={self.deltas!r}, outbox={self.outbox!r})"


class _RelationsView(Mapping):
    """Read-only ``relation -> set of rows`` over an engine's current state."""

    def __init__(self, engine: IncrementalEngine) -> None:
        self._engine = engine

    def __getitem__(self, rel: str) -> RowSet:
        if rel not in self._engine._known():
            raise KeyError(rel)
        return self._engine.relation(rel)

    def __iter__(self):
        return iter(sorted(self._engine._known()))

    def __len__(self) -> int:
        return len(self._engine._known())


# ----------------------------------------------------------------------------- helpers


def _arith(int_bits: int) -> tuple[dict[str, Callable[[Any, Any], Any]], Callable, tuple]:
    """Arithmetic closures, comparison factory and 'no value' errors of
    :mod:`merklog.engine.arith` — the one definition shared with the batch evaluator."""
    from . import arith

    ops = {op: arith.make_arith(op, int_bits) for op in ("+", "-", "*", "/", "%")}
    ops["neg"] = lambda a: arith.negate(a, int_bits)
    return ops, arith.make_compare, (arith.NoBinding, ArithmeticError)


def _lambda(src: str, ns: dict[str, Any] | None = None) -> Callable:
    """Compile a small generated lambda (projections and join combiners are hot loops)."""
    return eval(src, dict(ns or {}))  # noqa: S307 - source built from integers only


def _tuple_src(parts: Sequence[str]) -> str:
    if not parts:
        return "()"
    return "(" + ", ".join(parts) + ",)"


def _key_fn(idxs: Sequence[int]) -> Callable[[Row], tuple]:
    return _lambda("lambda r: " + _tuple_src([f"r[{i}]" for i in idxs]))


def _term_vars(term: ast.Term) -> set[str]:
    return {v.name for v in ast.term_vars(term)}


def _as_set(rows: Iterable[Row]) -> set[Row]:
    """A new set of the rows in engine form (one C-level type scan when nothing needs
    converting: :func:`merklog.engine.rows.engine_rows`). A numpy array's rows are read
    as plain values (ints stay ints, floats become ``Float``, bools ``Bool``)."""
    if isinstance(rows, np.ndarray):
        rows = list(map(tuple, rows.tolist()))
    out = engine_rows(rows)
    return set(out) if out is rows or isinstance(out, EngineSet) else out


def _group(facts: Iterable[tuple[str, Row]]) -> dict[str, set[Row]]:
    """``(relation, row)`` pairs grouped per relation, rows in engine form."""
    out: dict[str, list[Row]] = {}
    for rel, row in facts:
        out.setdefault(rel, []).append(row)
    return {rel: _as_set(rows) for rel, rows in out.items()}


def _int_matrix(rows: Any) -> np.ndarray | None:
    """``rows`` as an n x arity int64 matrix if it is a 2-D numpy array of ints (the
    columnar input: every value a real int), else None."""
    if not isinstance(rows, np.ndarray) or rows.ndim != 2:
        return None
    if rows.dtype.kind == "i":
        return rows.astype(np.int64, copy=False)
    if rows.dtype.kind == "u" and (not rows.size or int(rows.max()) < 2**63):
        return rows.astype(np.int64)
    return None


def _op(rows: Iterable[Row], insert: bool) -> tuple[Any, bool, bool]:
    """``(rows as an engine-form set, insert, owned)``: ``owned`` when the set is new
    (not the caller's :class:`EngineSet`/:class:`RowSet` rows), so the engine may keep it.
    An int64 matrix stays a matrix (see :func:`_apply_one`); any other 2-D array is
    read row by row (floats become ``Float``, bools ``Bool``: never ints)."""
    matrix = _int_matrix(rows)
    if matrix is not None:
        return matrix, insert, True
    if isinstance(rows, np.ndarray):
        rows = list(map(tuple, rows.tolist()))
    out = engine_rows(rows)
    return out, insert, not isinstance(rows, EngineSet | RowSet)


def _row_set(rows: Any) -> set[Row]:
    """An op's rows as a set of engine-form tuples (a matrix's rows are plain ints)."""
    if isinstance(rows, np.ndarray):
        return set(map(tuple, rows.tolist()))
    return rows


def _present(base: set[Row] | ArrayBase, rows: set[Row]) -> set[Row]:
    """The rows of ``rows`` that are in ``base``."""
    return base.present(rows) if isinstance(base, ArrayBase) else rows & base


def _add(base: set[Row] | ArrayBase, new: set[Row]) -> None:
    """Add ``new`` (rows not in ``base``) to ``base``."""
    if isinstance(base, ArrayBase):
        base.add_new(new)
    else:
        base |= new


def _remove(base: set[Row] | ArrayBase, gone: set[Row]) -> None:
    """Remove ``gone`` (rows in ``base``) from ``base``."""
    if isinstance(base, ArrayBase):
        base.remove_present(gone)
    else:
        base -= gone


#: A change to the base facts, made when the epoch that computed it is published.
Change = Callable[[], None]


def _keep_program_facts(
    ops: list[tuple[str, Any, bool, bool]], program_facts: Mapping[str, set[Row]]
) -> list[tuple[str, Any, bool, bool]]:
    """``ops`` with the program's own facts left out of every delete: a fact the program
    states holds at every epoch, as the batch evaluator has it, so the retract of a
    stored fact equal to it must not take it away. The base facts hold one copy of a
    row (set semantics); without this, ``edge(1, 2).`` in a program vanished from a
    running node once a stored ``edge(1, 2)`` was put and retracted (its batch
    evaluation, and a restart, still had it)."""
    out = []
    for rel, rows, insert, owned in ops:
        fixed = program_facts.get(rel)
        if not insert and fixed:
            kept = _row_set(rows)
            if not kept.isdisjoint(fixed):
                rows, owned = kept - fixed, True
        out.append((rel, rows, insert, owned))
    return out


def _apply_one(
    edb: dict[str, set[Row] | ArrayBase], rel: str, rows: Any, insert: bool, owned: bool
) -> tuple[Delta | ColumnBatch, Change | None]:
    """A relation's only change of an epoch (no events): its delta, and the change of the
    base facts to make when the epoch is published. Two C-level set operations instead
    of the general before/after comparison of :func:`_apply_general`. An int64 matrix
    inserted into an empty relation becomes its :class:`ArrayBase` and the delta a
    :class:`ColumnBatch`: no tuple is built for it (ADR 0090)."""
    base = edb.get(rel)
    if isinstance(rows, np.ndarray):
        if insert and not base:
            made = ArrayBase.of_distinct_rows(rows)
            delta = ColumnBatch(made.matrix, 1) if len(made.matrix) else {}
            return delta, partial(edb.__setitem__, rel, made)
        rows = _row_set(rows)
    if insert:
        if not base:
            kept = rows if owned else set(rows)
            return dict.fromkeys(rows, 1), partial(edb.__setitem__, rel, kept)
        new = rows - _present(base, rows)
        return dict.fromkeys(new, 1), partial(_add, base, new)
    if not base:
        return {}, None
    gone = _present(base, rows)
    return dict.fromkeys(gone, -1), partial(_remove, base, gone)


def _apply_general(
    edb: dict[str, set[Row] | ArrayBase],
    ops: list[tuple[str, Any, bool, bool]],
    old_events: Mapping[str, set[Row]],
    events_now: Mapping[str, set[Row]],
) -> tuple[dict[str, Delta], list[Change]]:
    """Several changes of one relation (in order: deletes before inserts) and the epoch's
    events: each touched relation's delta, and the changes of the base facts to make
    when the epoch is published. Whole-relation set operations (C loops, not per-row
    Python): the rows the changes touch, whether each was present before, the changes
    played in order over those rows alone, and the difference."""
    ops = [(rel, _row_set(rows), insert, owned) for rel, rows, insert, owned in ops]
    touched: dict[str, set[Row]] = {}
    for rel, rows, _ins, _owned in ops:
        t = touched.get(rel)
        touched[rel] = set(rows) if t is None else t | rows
    for source in (old_events, events_now):
        for rel, rows in source.items():
            t = touched.get(rel)
            touched[rel] = set(rows) if t is None else t | rows
    stored: dict[str, set[Row]] = {}  # the touched rows in the base facts before
    for rel, rows in touched.items():
        stored[rel] = _present(edb[rel], rows) if rel in edb else set()
    after = {rel: set(stored[rel]) for rel in {op[0] for op in ops}}
    for rel, rows, insert, _owned in ops:
        if insert:
            after[rel] |= rows
        else:
            after[rel] -= rows
    changes: list[Change] = []
    for rel, now in after.items():
        was = stored[rel]
        changes.append(partial(_change_base, edb, rel, now - was, was - now))
    out: dict[str, Delta] = {}
    for rel, rows in touched.items():
        was = set(stored[rel])
        if rel in old_events:
            was |= rows & old_events[rel]
        now = set(after.get(rel, stored[rel]))
        if rel in events_now:
            now |= rows & events_now[rel]
        if now == was:
            continue
        delta = dict.fromkeys(now - was, 1)
        delta.update(dict.fromkeys(was - now, -1))
        out[rel] = delta
    return out, changes


def _change_base(
    edb: dict[str, set[Row] | ArrayBase], rel: str, new: set[Row], gone: set[Row]
) -> None:
    """Add ``new`` to and remove ``gone`` from the base facts of ``rel`` (made if absent)."""
    target = edb.setdefault(rel, set())
    _remove(target, gone)
    _add(target, new)


#: An epoch whose changes hold at least this many rows runs with the cyclic garbage
#: collector paused (``merklog.store.gcpause.gc_paused``): a bulk load allocates millions
#: of long-lived tuples and dicts and no cycles, and collections over them found nothing.
GC_PAUSE_ROWS = 20_000


def _sized_rows(*maps: Mapping[str, Iterable[Row]] | None) -> int:
    """How many rows the sized collections of these ``{relation: rows}`` maps hold."""
    return sum(
        len(rows)  # type: ignore[arg-type]
        for m in maps
        if m
        for rows in m.values()
        if hasattr(rows, "__len__")
    )


# ----------------------------------------------------------------------------- operators

_MISSING: Any = object()
_positive = (0).__lt__  # w -> w > 0, a C call (for map over weights)
_NO_VALUE: Any = Aggregate.NO_VALUE  # a non-empty group whose sum has no value


class AggregateJoin(Operator):
    """Extend each binding with its group's aggregate value (root circuit only).

    Inputs: the bindings' Z-set delta and the aggregate relation's delta
    (``(*group, value)`` rows). ``δ(B ⋈ V) = B_old ⋈ δV + δB ⋈ V_new`` over a
    ``group -> value`` table, with ``default`` for groups without rows (0 for
    count/sum; none for min/max) — one operator instead of a join plus an
    antijoin, and no trace of the aggregate side. ``bound`` is the binding column
    that must equal the value when the result variable was already bound.
    ``source``: the :class:`GroupAggregate` whose output is the aggregate input;
    when the input is that operator's last output, its ``group -> (old, new)``
    changes are read directly instead of re-derived from the ``±1`` rows.
    """

    idle_when_empty = True

    def __init__(
        self, key_fn: Callable[[Row], tuple], ngroups: int, default: Any, bound: int | None
    ) -> None:
        self.key_fn = key_fn
        self.ngroups = ngroups
        self.default = default
        self.bound = bound
        self.trace: dict[tuple, dict[Row, int]] = {}
        self.values: dict[tuple, Any] = {}
        self.source: GroupAggregate | None = None

    def bind(self, nested: bool) -> None:
        if nested:
            raise CompileError("AggregateJoin runs in the root circuit only")
        super().bind(nested)

    def _changes(self, agg: Delta) -> dict[tuple, tuple[Any, Any]]:
        """Apply the aggregate relation's delta to the ``group -> value`` table and
        return ``group -> (old, new)`` for the groups whose value really changed
        (defaults filled in; same value of the same type is no change)."""
        last = self.source.last if self.source is not None else None
        if last is not None and last[0] is agg:
            return self._changes_from(last[1])
        values, default, n = self.values, self.default, self.ngroups
        before: dict[tuple, Any] = {}
        for row, w in agg.items():
            k, v = row[:n], row[n]
            if k not in before:
                before[k] = values.get(k, _MISSING)
            if w > 0:
                values[k] = v
            elif k in values and values[k] == v and type(values[k]) is type(v):
                del values[k]
        changed: dict[tuple, tuple[Any, Any]] = {}
        for k, old in before.items():
            new = values.get(k, _MISSING)
            old = default if old is _MISSING else old
            new = default if new is _MISSING else new
            if old is new or (old == new and type(old) is type(new)):
                continue
            changed[k] = (old, new)
        return changed

    def _changes_from(self, groups: Mapping[tuple, tuple[Any, Any]]) -> dict[tuple, tuple]:
        """:meth:`_changes` from the aggregate's own ``group -> (old, new)`` (None: no row)."""
        values, default = self.values, self.default
        changed: dict[tuple, tuple[Any, Any]] = {}
        for k, (old, new) in groups.items():
            if new is None:
                values.pop(k, None)
                new = default
            else:
                values[k] = new
            if old is None:
                old = default
            if old is new or (old == new and type(old) is type(new)):
                continue
            changed[k] = (old, new)
        return changed

    def _emit_changed(self, out: Delta, changed: Mapping[tuple, tuple], new: bool) -> None:
        """For every changed group, its bindings with the new value (``new``) or with the
        old one and negated weights: ``out[binding + (value,)] = ±weight``."""
        get, bound = self.trace.get, self.bound
        which, sign = (1, 1) if new else (0, -1)
        for k, pair in changed.items():
            rows = get(k)
            if not rows:
                continue
            value = pair[which]
            if value is _MISSING or value is _NO_VALUE:
                continue
            if bound is not None:
                for r, w in rows.items():
                    if r[bound] == value:
                        out[r] = sign * w
            elif new:
                for r, w in rows.items():
                    out[(*r, value)] = w
            else:
                for r, w in rows.items():
                    out[(*r, value)] = -w

    def _emit_both(self, out: Delta, changed: Mapping[tuple, tuple]) -> None:
        """:meth:`_emit_changed` old then new in one pass, for an epoch whose bindings did
        not change (``B_old = B_new``: only the aggregate moved)."""
        get, bound = self.trace.get, self.bound
        for k, (old, new) in changed.items():
            rows = get(k)
            if not rows:
                continue
            has_old = old is not _MISSING and old is not _NO_VALUE
            has_new = new is not _MISSING and new is not _NO_VALUE
            if bound is not None:
                for r, w in rows.items():
                    v = r[bound]
                    if has_old and v == old:
                        out[r] = -w
                    if has_new and v == new:
                        out[r] = out.get(r, 0) + w
                        if not out[r]:
                            del out[r]
                continue
            for r, w in rows.items():
                if has_old:
                    out[(*r, old)] = -w
                if has_new:
                    out[(*r, new)] = w

    def eval(self, ts: Timestamp, bindings: Delta, agg: Delta) -> Delta:
        """``-B_old ⋈ V_old + B_new ⋈ V_new`` over the groups whose value changed, and
        ``δB ⋈ V`` over the others. Every output row is written once: rows of different
        groups differ in their key columns, and a changed group's old and new rows
        differ in the value — so no consolidation pass is needed."""
        out: Delta = {}
        trace = self.trace
        changed = self._changes(agg) if agg else {}
        if changed and not bindings:
            self._emit_both(out, changed)
            return out
        if changed:
            self._emit_changed(out, changed, new=False)
        if bindings:
            key_fn, values, default, bound = self.key_fn, self.values, self.default, self.bound
            for r, w in bindings.items():
                k = key_fn(r)
                group = trace.get(k)
                if group is None:
                    trace[k] = {r: w}
                else:
                    c = group.get(r, 0) + w
                    if c:
                        group[r] = c
                    else:
                        del group[r]
                        if not group:
                            del trace[k]
                if k in changed:
                    continue  # emitted below from the group's updated bindings
                v = values.get(k, _MISSING)
                if v is _MISSING:
                    v = default
                    if v is _MISSING:
                        continue
                elif v is _NO_VALUE:
                    continue
                if bound is None:
                    out[(*r, v)] = w
                elif r[bound] == v:
                    out[r] = w
        if changed:
            self._emit_changed(out, changed, new=True)
        return out


class MultiAggregateJoin(Operator):
    """Extend each binding with the values of several aggregates grouped by the same
    variables (root circuit only): ``B ⋈ V1 ⋈ … ⋈ Vm`` as one operator.

    A rule such as ``stats(G, C, S) :- grp(G), C := count : …, S := sum A : ….``
    would otherwise chain one :class:`AggregateJoin` per aggregate, and every changed
    group would cost a retraction and an insertion in each link and in the
    intermediate stream between them. Here the state is one ``group -> value
    tuple`` table, and a group whose tuple changed emits its bindings once with the
    old tuple (negated) and once with the new one (ADR 0091).

    Inputs: the bindings' delta, then one ``(*group, value)`` delta per aggregate.
    ``defaults``: each aggregate's value for a group without rows (0 for count/sum,
    ``_MISSING`` for min/max: no row joins). ``sources``: the :class:`GroupAggregate`
    behind each aggregate input, whose ``group -> (old, new)`` is read directly when
    the input is its last output (as :class:`AggregateJoin` does).
    """

    idle_when_empty = True

    def __init__(
        self,
        key_fn: Callable[[Row], tuple],
        ngroups: int,
        defaults: Sequence[Any],
        sources: Sequence[GroupAggregate | None],
    ) -> None:
        self.key_fn = key_fn
        self.ngroups = ngroups
        self.defaults = tuple(defaults)
        self.sources = tuple(sources)
        #: A value that blocks a join: ``_MISSING`` (a min/max group without rows) or
        #: ``_NO_VALUE`` (an int sum out of range derives nothing). With a min/max
        #: every tuple is checked; otherwise only while some group's tuple holds a
        #: ``_NO_VALUE`` (``nblocked`` of them) or this epoch brings one.
        self.always_check = any(d is _MISSING for d in self.defaults)
        self.nblocked = 0
        self.trace: dict[tuple, dict[Row, int]] = {}
        #: Aggregate deltas read from their source's ``group -> (old, new)`` (``direct``)
        #: or re-derived from the ``±1`` rows (``rederived``): tests check both run.
        self.direct = 0
        self.rederived = 0
        #: group -> the aggregates' current values (groups whose values are all the
        #: defaults are absent).
        self.values: dict[tuple, tuple] = {}

    def bind(self, nested: bool) -> None:
        if nested:
            raise CompileError("MultiAggregateJoin runs in the root circuit only")
        super().bind(nested)

    def _side(self, i: int, agg: Delta) -> Mapping[tuple, tuple[Any, Any]]:
        """Aggregate ``i``'s changed groups as ``group -> (_, new)`` (new None: no row)."""
        source = self.sources[i]
        last = source.last if source is not None else None
        if last is not None and last[0] is agg:
            self.direct += 1
            return last[1]
        self.rederived += 1
        n, values, default = self.ngroups, self.values, self.defaults[i]
        new_of: dict[tuple, Any] = {}
        for row, w in agg.items():
            k, v = row[:n], row[n]
            if w > 0:
                new_of[k] = v
                continue
            cur = new_of.get(k, _MISSING)
            if cur is _MISSING and k not in new_of:
                t = values.get(k)
                cur = default if t is None else t[i]
            elif cur is None:
                continue
            if cur == v and type(cur) is type(v):
                new_of[k] = None
        return {k: (None, v) for k, v in new_of.items()}

    def _changes(
        self, aggs: Sequence[Delta], out: Delta | None = None
    ) -> dict[tuple, tuple[tuple | None, tuple | None]]:
        """Fold the aggregates' deltas into the value table; return ``group -> (old,
        new)`` value tuples of the groups whose tuple changed (None: not joinable).
        ``out``: the epoch changed no binding, so each changed group's rows are emitted
        into ``out`` straight away (``-B ⋈ old + B ⋈ new``) and nothing is returned."""
        values, defaults = self.values, self.defaults
        staged: dict[tuple, tuple[tuple, list]] = {}
        saw_blocker = False
        for i, agg in enumerate(aggs):
            if not agg:
                continue
            default = defaults[i]
            for k, pair in self._side(i, agg).items():
                e = staged.get(k)
                if e is None:
                    t = values.get(k, defaults)
                    e = staged[k] = (t, list(t))
                new = pair[1]
                if new is None:
                    new = default
                elif new is _NO_VALUE:
                    saw_blocker = True
                e[1][i] = new
        changed: dict[tuple, tuple[tuple | None, tuple | None]] = {}
        # Engine values never compare equal across types (ADR 0001), so tuple ``==``
        # is value identity; the type check is only reached when it says equal.
        default_types = tuple(map(type, defaults))
        check = self.always_check or saw_blocker or self.nblocked
        blocked, pop = self._blocked, values.pop
        get = self.trace.get
        for k, (old, new_list) in staged.items():
            new = tuple(new_list)
            if old == new and tuple(map(type, old)) == tuple(map(type, new)):
                continue
            if new == defaults and tuple(map(type, new)) == default_types:
                pop(k, None)
            else:
                values[k] = new
            o, n = old, new
            if check:
                b_old, b_new = blocked(old), blocked(new)
                if b_old or b_new:
                    o, n = (None if b_old else old), (None if b_new else new)
                    self.nblocked += b_new - b_old
            if out is None:
                changed[k] = (o, n)
                continue
            # No binding changed this epoch: emit the group's rows right here.
            rows = get(k)
            if rows:
                for r, w in rows.items():
                    if o is not None:
                        out[r + o] = -w
                    if n is not None:
                        out[r + n] = w
        return changed

    def _blocked(self, vals: tuple) -> bool:
        """True if some aggregate has no value to join for this group (no row for
        min/max, an int sum out of range)."""
        for v in vals:
            if v is _MISSING or v is _NO_VALUE:
                return True
        return False

    def eval(self, ts: Timestamp, bindings: Delta, *aggs: Delta) -> Delta:
        """``-B_old ⋈ V_old + B_new ⋈ V_new`` over the groups whose value tuple changed,
        ``δB ⋈ V`` over the others; every output row is written once (rows of
        different groups differ in their key columns, a group's old and new rows in
        at least one value)."""
        out: Delta = {}
        if not bindings:
            self._changes(aggs, out)
            return out
        changed = self._changes(aggs) if any(aggs) else {}
        trace = self.trace
        get = trace.get
        for k, (old, _new) in changed.items():
            rows = get(k)
            if rows and old is not None:
                for r, w in rows.items():
                    out[r + old] = -w
        if bindings:
            key_fn, values, defaults = self.key_fn, self.values.get, self.defaults
            for r, w in bindings.items():
                k = key_fn(r)
                group = get(k)
                if group is None:
                    trace[k] = {r: w}
                else:
                    c = group.get(r, 0) + w
                    if c:
                        group[r] = c
                    else:
                        del group[r]
                        if not group:
                            del trace[k]
                if k in changed:
                    continue  # emitted below from the group's updated bindings
                vals = values(k, defaults)
                if (self.always_check or self.nblocked) and self._blocked(vals):
                    continue
                out[r + vals] = w
        for k, (_old, new) in changed.items():
            rows = get(k)
            if rows and new is not None:
                for r, w in rows.items():
                    out[r + new] = w
        return out


# ----------------------------------------------------------------------------- scopes


class _Scope:
    """Where a rule body is being compiled: the root circuit or a recursive child."""

    def __init__(self, compiler: _Compiler, circuit: Circuit, local: dict[str, Node]) -> None:
        self.compiler = compiler
        self.circuit = circuit
        self.local = local  # relations defined inside this circuit (recursive feedback)
        self._imports: dict[int, Node] = {}
        # Inside an aggregate, a rest pattern's unmatched arguments are part of the
        # binding (as batch does): ``count : p(...)`` counts p's tuples, not 1.
        self.keep_rest = False

    def lift(self, root_node: Node) -> Node:
        """A root-circuit stream as seen from this scope (imported once into a child)."""
        if not self.circuit.nested:
            return root_node
        node = self._imports.get(id(root_node))
        if node is None:
            node = self.circuit.import_(root_node)
            self._imports[id(root_node)] = node
        return node

    def rel(self, name: str) -> Node:
        node = self.local.get(name)
        if node is not None:
            return node
        return self.lift(self.compiler.rel_node(name))


# ----------------------------------------------------------------------------- compiler


class InputHandle:
    """Where the epoch driver pushes one input relation's delta (DBSP's input handle:
    Feldera's ``RootCircuit::build`` returns such handles next to the circuit)."""

    __slots__ = ("name", "_pending")

    def __init__(self, name: str) -> None:
        self.name = name
        self._pending: Delta = {}

    def push(self, delta: Delta, *, owned: bool = False) -> None:
        """Queue ``delta`` (``{row: ±1}``) for the next :meth:`CompiledProgram.step`.

        ``owned``: the caller hands the dict over and never touches it again, so it
        is queued as it is instead of copied (the engine's own epoch deltas)."""
        if self._pending:
            if isinstance(self._pending, ColumnBatch):
                self._pending = dict(self._pending.rows())
            for row, w in delta.items():
                n = self._pending.get(row, 0) + w
                if n:
                    self._pending[row] = n
                else:
                    del self._pending[row]
        else:
            self._pending = delta if owned else dict(delta)

    def poll(self, ts: Timestamp) -> Delta:
        """The circuit's source callback: hand over the queued delta once."""
        delta, self._pending = self._pending, {}
        return delta


class OutputHandle:
    """One output stream's delta of the last step (DBSP's output handle)."""

    __slots__ = ("name", "delta")

    def __init__(self, name: str) -> None:
        self.name = name
        self.delta: Delta = {}


@dataclass
class CompiledProgram:
    """A program compiled to a root circuit, with its input and output handles.

    The circuit knows nothing of the engine that drives it: the driver pushes
    deltas into ``inputs``, calls :meth:`step`, and reads the deltas of the
    derived relations (``relations``), of the ``@async`` heads (``async_outputs``)
    and of the ``@next`` heads (``next_outputs``). ``inputs_only`` names the
    relations no deductive rule defines (their stream is their input).
    """

    circuit: Circuit
    inputs: dict[str, InputHandle]
    relations: dict[str, OutputHandle]
    async_outputs: dict[str, OutputHandle]
    next_outputs: dict[str, OutputHandle]
    inputs_only: frozenset[str]
    #: Root relations whose current contents are their distinct operator's rows of
    #: positive weight: read there instead of kept a second time by the driver.
    views: dict[str, DistinctTrace] = field(default_factory=dict)

    def step(self) -> None:
        """Evaluate one epoch: consume the pushed inputs, refresh every output handle."""
        for outputs in (self.relations, self.async_outputs, self.next_outputs):
            for handle in outputs.values():
                handle.delta = {}
        self.circuit.step()


def compile_program(
    rules: Sequence[ast.Rule], strata: Sequence[Stratum], int_bits: int = 64
) -> CompiledProgram:
    """Compile stratified ``rules`` to a :class:`CompiledProgram` (circuit + handles)."""
    compiler = _Compiler(rules, strata, int_bits)
    compiler.compile()
    root = compiler.root
    rel_nodes = dict(compiler.rel_nodes)
    inputs_only = frozenset(
        n for n, node in rel_nodes.items() if node is compiler.input_nodes.get(n)
    )
    relations = {n: OutputHandle(n) for n in sorted(rel_nodes)}
    async_outputs = {n: OutputHandle(n) for n in sorted(compiler.async_out)}
    next_outputs = {n: OutputHandle(n) for n in sorted(compiler.next_out)}
    handles = list(relations.values()) + list(async_outputs.values())
    handles += list(next_outputs.values())
    nodes = [rel_nodes[n] for n in relations]
    nodes += [compiler.async_out[n] for n in async_outputs]
    nodes += [compiler.next_out[n] for n in next_outputs]

    def receive(ts: Timestamp, *deltas: Delta) -> None:
        for handle, delta in zip(handles, deltas, strict=True):
            handle.delta = delta

    root.sink(receive, *nodes, label="outputs")
    views = {
        n: op
        for n, op in compiler.derived.items()
        if n in relations and getattr(rel_nodes[n], "op", None) is op
    }
    return CompiledProgram(
        root, compiler.inputs, relations, async_outputs, next_outputs, inputs_only, views
    )


@dataclass
class _Plan:
    """A compiled body: a stream of binding rows and the variable at each column."""

    node: Node | None  # None = the single empty binding (unit)
    vars: list[str]


class _Compiler:
    """Builds the root circuit for a program. Use through :func:`compile_program`."""

    def __init__(
        self,
        rules: Sequence[ast.Rule],
        strata: Sequence[Stratum],
        int_bits: int,
    ) -> None:
        self.rules = rules
        self.strata = strata
        self.int_bits = int_bits
        self._ops: dict[str, Callable] | None = None
        self._compare: Callable | None = None
        self._errors: tuple = (ArithmeticError,)
        self.root = Circuit()
        self.rel_nodes: dict[str, Node] = {}
        self.input_nodes: dict[str, Node] = {}
        self.inputs: dict[str, InputHandle] = {}
        self.derived: dict[str, DistinctTrace] = {}
        self.next_feedback: dict[str, FeedbackNode] = {}
        self.next_nodes: dict[str, Node] = {}
        self.async_nodes: dict[str, Node] = {}
        self._helpers: dict[tuple, Node] = {}
        self._batch_caches: dict[int, BatchCache] = {}
        self._unit: Node | None = None

    # -- arithmetic (lazily: programs without terms or comparisons don't need it)
    def arith(self) -> tuple[dict[str, Callable], Callable, tuple]:
        if self._ops is None:
            self._ops, self._compare, self._errors = _arith(self.int_bits)
        assert self._compare is not None
        return self._ops, self._compare, self._errors

    # -- relation streams
    def rel_node(self, name: str) -> Node:
        node = self.rel_nodes.get(name)
        if node is None:
            raise CompileError(f"relation {name!r} is used before its stratum is compiled")
        return node

    def unit(self) -> Node:
        if self._unit is None:
            self._unit = self.root.source(lambda ts: {(): 1} if ts.epoch == 0 else {}, label="unit")
        return self._unit

    def compile(self) -> None:
        rules = self.rules
        deductive = [r for r in rules if r.time == "now"]
        temporal = [r for r in rules if r.time != "now"]
        names: set[str] = set()
        for r in rules:
            if r.time != "async":
                names.add(r.head.rel)
            for lit in r.body:
                for atom, _pol in ast.body_atoms(lit):
                    names.add(atom.rel)
        heads_now = {r.head.rel for r in deductive}
        heads_next = {r.head.rel for r in rules if r.time == "next"}
        self.unit()
        for name in sorted(names):
            handle = self.inputs[name] = InputHandle(name)
            self.input_nodes[name] = self.root.source(handle.poll, label=name)
        for name in sorted(heads_next):
            self.next_feedback[name] = self.root.feedback(label=f"{name}@next")
        # Relations no deductive rule defines: input (+ @next) only.
        for name in sorted(names - heads_now):
            self.rel_nodes[name] = self._base(name)
        for stratum in self.strata:
            if stratum.temporal:
                continue
            members = sorted(m for m in stratum.relations if m in heads_now)
            if not members:
                continue
            comp_rules = [r for r in stratum.rules if r.time == "now"]
            if stratum.recursive:
                self._recursive_stratum(members, comp_rules)
            else:
                self._flat_stratum(members, comp_rules)
        for r in temporal:
            out = self._rule(_Scope(self, self.root, {}), r)
            target = self.next_nodes if r.time == "next" else self.async_nodes
            prev = target.get(r.head.rel)
            target[r.head.rel] = out if prev is None else self.root.operator(Plus(), prev, out)
        self.next_out = {
            name: self.root.operator(DistinctTrace(), node, label=f"{name}@next")
            for name, node in self.next_nodes.items()
        }
        for name, fb in self.next_feedback.items():
            fb.connect(self.next_out[name])
        self.async_out = {
            name: self.root.operator(DistinctTrace(), node, label=f"{name}@async")
            for name, node in self.async_nodes.items()
        }

    def _base(self, name: str) -> Node:
        """Input (+ previous epoch's @next tuples) of a relation as a set stream."""
        node = self.input_nodes[name]
        fb = self.next_feedback.get(name)
        if fb is None:
            return node
        total = self.root.operator(Plus(), node, fb)
        op = DistinctTrace()
        self.derived[name] = op
        return self.root.operator(op, total, label=name)

    def _flat_stratum(self, members: list[str], rules: list[ast.Rule]) -> None:
        parts: dict[str, list[Node]] = {m: [self.input_nodes[m]] for m in members}
        for m in members:
            if m in self.next_feedback:
                parts[m].append(self.next_feedback[m])
        for r in rules:
            parts[r.head.rel].append(self._rule(_Scope(self, self.root, {}), r))
        for m in members:
            total = self.root.operator(Plus(), *parts[m])
            op = DistinctTrace()
            self.derived[m] = op
            self.rel_nodes[m] = self.root.operator(op, total, label=m)

    def _recursive_stratum(self, members: list[str], rules: list[ast.Rule]) -> None:
        # Root-level helpers (negation keys, aggregate results) first: the child
        # may only import nodes added before it.
        for r in rules:
            self._prepare_helpers(r)
        child_node = self.root.child(label="stratum " + ",".join(members))
        if any(r.computes_values for r in rules):  # may never reach a fixpoint
            child_node.max_iterations = MAX_FIXPOINT_ITERATIONS
            child_node.limit_error = partial(IterationLimitError.after, rules)
        child = child_node.child
        feedback = {m: child.feedback(label=f"{m}@iter") for m in members}
        scope = _Scope(self, child, dict(feedback))
        parts: dict[str, list[Node]] = {m: [scope.lift(self.input_nodes[m])] for m in members}
        for m in members:
            if m in self.next_feedback:
                parts[m].append(scope.lift(self.next_feedback[m]))
        for r in rules:
            parts[r.head.rel].append(self._rule(scope, r))
        for m in members:
            total = child.operator(Plus(), *parts[m])
            distinct = child.operator(DistinctTrace(), total, label=m)
            feedback[m].connect(distinct)
            self.rel_nodes[m] = child_node.export(distinct, label=m)

    # -- rules
    def _prepare_helpers(self, rule: ast.Rule) -> None:
        """Build a rule's root-level helper streams ahead of a child circuit."""
        for step in planner.plan_rule(rule, expr_keys=False):
            if isinstance(step, planner.Negate):
                self._neg_keys(step.lit.atom, self._neg_key_positions(step.lit.atom))
            elif isinstance(step, planner.Aggregate):
                self._agg_relation(step)

    def _rule(self, scope: _Scope, rule: ast.Rule) -> Node:
        plan = self._body(scope, planner.plan_rule(rule, expr_keys=False))
        return self._project(scope, plan, rule.head.args, label=str(rule))

    def _project(
        self, scope: _Scope, plan: _Plan, terms: Sequence[ast.Term], label: str = ""
    ) -> Node:
        idx = {v: i for i, v in enumerate(plan.vars)}
        src = self._plan_node(scope, plan)
        if all(isinstance(t, ast.Var | ast.Const) for t in terms):
            ns: dict[str, Any] = {}
            parts = []
            for t in terms:
                if isinstance(t, ast.Var):
                    if t.name not in idx:
                        raise CompileError(f"head variable {t.name} is not bound by the body")
                    parts.append(f"r[{idx[t.name]}]")
                else:
                    assert isinstance(t, ast.Const)
                    ns[f"c{len(ns)}"] = to_engine(t.value)
                    parts.append(f"c{len(ns) - 1}")
            if parts == [f"r[{i}]" for i in range(len(plan.vars))] and plan.node is not None:
                return src  # the head is the binding itself: no projection (ADR 0091)
            fn = _lambda("lambda r: " + _tuple_src(parts), ns)
            return scope.circuit.operator(Map(fn), src, label=label)
        fns = [self._term(t, idx) for t in terms]
        _ops, _cmp, errors = self.arith()

        def head(r: Row) -> tuple:
            try:
                return (tuple(f(r) for f in fns),)
            except errors:
                return ()

        return scope.circuit.operator(FlatMap(head), src, label=label)

    def _plan_node(self, scope: _Scope, plan: _Plan) -> Node:
        return plan.node if plan.node is not None else scope.lift(self.unit())

    def _term(self, term: ast.Term, idx: Mapping[str, int]) -> Callable[[Row], Any]:
        if isinstance(term, ast.Const):
            value = to_engine(term.value)
            return lambda r: value
        if isinstance(term, ast.Var):
            if term.name not in idx:
                raise CompileError(f"variable {term.name} is not bound")
            i = idx[term.name]
            return lambda r: r[i]
        ops, _cmp, _errors = self.arith()
        if isinstance(term, ast.Neg):
            inner = self._term(term.operand, idx)
            negate = ops["neg"]
            return lambda r: negate(inner(r))
        if isinstance(term, ast.BinOp):
            left, right, fn = self._term(term.left, idx), self._term(term.right, idx), ops[term.op]
            return lambda r: fn(left(r), right(r))
        raise CompileError(f"unknown term {term!r}")

    # -- bodies
    def _body(self, scope: _Scope, body: planner.Plan, start: _Plan | None = None) -> _Plan:
        """Compile a planned conjunction (from ``start``'s bindings, default: the empty
        binding). Expression arguments were planned as fresh variables + equalities
        (``expr_keys=False``), so atoms here hold variables and constants only."""
        plan = start if start is not None else _Plan(None, [])
        steps = list(body.steps)
        i = 0
        while i < len(steps):
            step = steps[i]
            i += 1
            fused = self._fusable(scope, plan, steps, i - 1)
            joined = self._count_sum(scope, plan, fused) if fused else None
            if joined is not None:
                plan = joined
                i += len(fused) - 1
                continue
            if len(fused) > 1:
                plan = self._aggregates(scope, plan, fused)
                i += len(fused) - 1
                continue
            if isinstance(step, planner.Scan):
                plan = self._positive(scope, plan, step.lit)
            elif isinstance(step, planner.Exists):
                plan = self._exists(scope, plan, step)
            elif isinstance(step, planner.Filter | planner.Assign):
                plan = self._comparison(scope, plan, step.lit)
            elif isinstance(step, planner.Negate):
                plan = self._negated(scope, plan, step.lit)
            else:
                assert isinstance(step, planner.Aggregate)
                plan = self._aggregate(scope, plan, step)
        return plan

    def _exists(self, scope: _Scope, plan: _Plan, step: planner.Exists) -> _Plan:
        """A guard: the bindings pass while the atom has a matching tuple. The atom's
        rows collapse to one empty row (a set of at most ``{()}``), joined on no key:
        never a cross product with the atom's rows."""
        c = scope.circuit
        node, _vars = self._atom_stream(scope, ast.Positive(step.atom))
        unit = c.operator(Map(lambda r: ()), node)
        guard = c.operator(DistinctTrace(), unit, label=f"exists {step.atom}")
        if plan.node is None and not plan.vars:
            return _Plan(guard, [])
        left = c.operator(IndexWith(lambda r: ()), self._plan_node(scope, plan))
        right = c.operator(IndexWith(lambda r: ()), guard)
        joined = c.operator(Join(lambda k, a, b: a), left, right, label=f"exists {step.atom}")
        return _Plan(joined, plan.vars)

    def _atom_stream(self, scope: _Scope, lit: ast.Positive) -> tuple[Node, list[str]]:
        """The relation's rows matching the atom's pattern, projected to its variables."""
        atom = lit.atom
        n = len(atom.args)
        conds = [f"len(r) {'>=' if atom.rest else '=='} {n}"]
        ns: dict[str, Any] = {}
        first: dict[str, int] = {}
        for i, a in enumerate(atom.args):
            if isinstance(a, ast.Const):
                name = f"c{len(ns)}"
                ns[name] = to_engine(a.value)
                conds.append(f"r[{i}] == {name}")
            else:
                assert isinstance(a, ast.Var)
                if a.name in first:
                    conds.append(f"r[{i}] == r[{first[a.name]}]")
                else:
                    first[a.name] = i
        vars_ = list(first)
        parts = [f"r[{i}]" for i in first.values()]
        if atom.rest and scope.keep_rest:
            parts.append(f"r[{n}:]")
            vars_.append(f"\0rest{id(atom)}")
        if lit.cid is not None:
            if lit.cid.name in first:
                raise CompileError(f"{lit.cid.name} names both a CID and an argument in {lit}")
            ns["cid"] = fact_cid
            ns["Fact"] = Fact
            ns["rel"] = atom.rel
            ns["plain"] = row_from_engine  # the CID of the stored fact: plain values
            parts.append("cid(Fact(rel, plain(r)))")
            vars_.append(lit.cid.name)
        src = scope.rel(atom.rel)
        trivial = not atom.rest and len(conds) == 1 and parts == [f"r[{i}]" for i in range(n)]
        if trivial:
            return src, vars_
        body = _tuple_src(parts)
        fn = _lambda(f"lambda r: ({body},) if {' and '.join(conds)} else ()", ns)
        return scope.circuit.operator(FlatMap(fn), src, label=str(lit)), vars_

    def _positive(self, scope: _Scope, plan: _Plan, lit: ast.Positive) -> _Plan:
        node, avars = self._atom_stream(scope, lit)
        if plan.node is None and not plan.vars:
            return _Plan(node, avars)
        shared = [v for v in avars if v in plan.vars]
        left_key = _key_fn([plan.vars.index(v) for v in shared])
        right_key = _key_fn([avars.index(v) for v in shared])
        extra = [i for i, v in enumerate(avars) if v not in plan.vars]
        combine = _lambda(
            "lambda k, a, b: a + " + _tuple_src([f"b[{i}]" for i in extra])
            if extra
            else "lambda k, a, b: a"
        )
        c = scope.circuit
        left = c.operator(IndexWith(left_key), self._plan_node(scope, plan))
        right = c.operator(IndexWith(right_key), node)
        joined = c.operator(Join(combine), left, right, label=f"join {lit}")
        return _Plan(joined, plan.vars + [avars[i] for i in extra])

    def _comparison(self, scope: _Scope, plan: _Plan, lit: ast.Comparison) -> _Plan:
        idx = {v: i for i, v in enumerate(plan.vars)}
        bound = set(plan.vars)
        ops, make_compare, errors = self.arith()
        src = self._plan_node(scope, plan)
        lg, rg = _term_vars(lit.left) <= bound, _term_vars(lit.right) <= bound
        if lg and rg:
            left, right = self._term(lit.left, idx), self._term(lit.right, idx)
            compare = make_compare(lit.op)

            def keep(r: Row) -> tuple:
                try:
                    return (r,) if compare(left(r), right(r)) else ()
                except errors:
                    return ()

            return _Plan(scope.circuit.operator(FlatMap(keep), src, label=str(lit)), plan.vars)
        var, other = (lit.left, lit.right) if rg else (lit.right, lit.left)
        assert isinstance(var, ast.Var)
        value = self._term(other, idx)

        def bind(r: Row) -> tuple:
            try:
                return ((*r, value(r)),)
            except errors:
                return ()

        node = scope.circuit.operator(FlatMap(bind), src, label=str(lit))
        return _Plan(node, plan.vars + [var.name])

    # -- negation
    @staticmethod
    def _neg_key_positions(atom: ast.Atom) -> tuple[int, ...]:
        """Argument positions that are ground when the negation runs (the planner
        schedules it once every named variable is bound): all but the ``_`` wildcards."""
        return tuple(
            i for i, a in enumerate(atom.args) if not (isinstance(a, ast.Var) and a.anonymous)
        )

    def _neg_keys(
        self, atom: ast.Atom, key_pos: tuple[int, ...], numeric: tuple[int, ...] = ()
    ) -> Node:
        """Root stream: the set of key tuples of ``atom``'s relation that match its pattern;
        at the key tuple's positions ``numeric`` (the atom's expression arguments) each
        value as its :func:`~merklog.engine.arith.numeric_key` (compared by ``==``)."""
        checks = []
        seen: dict[str, int] = {}
        for i, a in enumerate(atom.args):
            if i in key_pos:
                continue
            assert isinstance(a, ast.Var)
            if a.name in seen:
                checks.append((i, seen[a.name]))
            else:
                seen[a.name] = i
        n = len(atom.args)
        cache_key = ("neg", atom.rel, n, atom.rest, key_pos, tuple(checks), numeric)
        node = self._helpers.get(cache_key)
        if node is not None:
            return node
        conds = [f"len(r) {'>=' if atom.rest else '=='} {n}"]
        conds += [f"r[{a}] == r[{b}]" for a, b in checks]
        src = self.rel_node(atom.rel)
        if not atom.rest and not checks and key_pos == tuple(range(n)) and not numeric:
            node = src
        else:
            proj = _tuple_src(
                [f"_nk(r[{i}])" if j in numeric else f"r[{i}]" for j, i in enumerate(key_pos)]
            )
            fn = _lambda(
                f"lambda r: ({proj},) if {' and '.join(conds)} else ()", {"_nk": numeric_key}
            )
            mapped = self.root.operator(FlatMap(fn), src)
            node = self.root.operator(DistinctTrace(), mapped, label=f"keys !{atom}")
        self._helpers[cache_key] = node
        return node

    def _negated(self, scope: _Scope, plan: _Plan, lit: ast.Negated) -> _Plan:
        atom = lit.atom
        key_pos = self._neg_key_positions(atom)
        keys = scope.lift(self._neg_keys(atom, key_pos))
        idx = {v: i for i, v in enumerate(plan.vars)}
        terms = [atom.args[i] for i in key_pos]
        if all(isinstance(t, ast.Var | ast.Const) for t in terms):
            ns: dict[str, Any] = {}
            parts = []
            for t in terms:
                if isinstance(t, ast.Var):
                    parts.append(f"r[{idx[t.name]}]")
                else:
                    assert isinstance(t, ast.Const)
                    ns[f"c{len(ns)}"] = to_engine(t.value)
                    parts.append(f"c{len(ns) - 1}")
            key_fn = _lambda("lambda r: " + _tuple_src(parts), ns)
        else:
            # Expression arguments compare by == (``!q(X * 2)`` is blocked by q(2.0) when
            # X is 1): both sides' values at those positions as their numeric keys. An
            # argument without a value (``X / 0``) drops the binding, as everywhere.
            fns = [self._term(t, idx) for t in terms]
            _ops, _cmp, errors = self.arith()
            numeric = tuple(
                j for j, t in enumerate(terms) if not isinstance(t, ast.Var | ast.Const)
            )
            no_value = object()

            def key_fn(r: Row) -> Any:
                try:
                    key = [f(r) for f in fns]
                except errors:
                    return no_value
                for j in numeric:
                    key[j] = numeric_key(key[j])
                return tuple(key)

            src = self._plan_node(scope, plan)
            valued = scope.circuit.operator(
                FlatMap(lambda r: () if key_fn(r) is no_value else (r,)),
                src,
                label=f"{lit} has a value",
            )
            plan = _Plan(valued, plan.vars)
            keys = scope.lift(self._neg_keys(atom, key_pos, numeric))

        return self._antijoin(scope, plan, keys, key_fn, label=str(lit))

    def _antijoin(
        self,
        scope: _Scope,
        plan: _Plan,
        keys: Node,
        key_fn: Callable[[Row], Any],
        label: str,
    ) -> _Plan:
        c = scope.circuit
        src = self._plan_node(scope, plan)
        left = c.operator(IndexWith(key_fn), src)
        right = c.operator(IndexWith(lambda r: r), keys)
        matched = c.operator(Join(lambda k, a, b: a), left, right)
        return _Plan(c.operator(Minus(), src, matched, label=label), plan.vars)

    # -- aggregation
    @staticmethod
    def _correlated(agg: ast.Aggregate, groups: list[str]) -> bool:
        """True if some grouping variable is not bound by the aggregate's own atoms
        (it only constrains them, e.g. ``C := count : { e(Y), Y < X }``)."""
        own: set[str] = set()
        for lit in agg.body:
            if isinstance(lit, ast.Positive):
                own |= {v.name for v in ast.atom_vars(lit.atom)}
                if lit.cid is not None:
                    own.add(lit.cid.name)
        return not set(groups) <= own

    def _agg_relation(self, step: planner.Aggregate, seed: Node | None = None) -> Node:
        """Root stream of ``(*group_values, result)`` for every non-empty group.

        ``seed``: for a correlated aggregate, the distinct group keys of the outer
        bindings; the sub-query then starts from them (a magic set), so it is only
        evaluated for groups the rule asks about.
        """
        agg, groups = step.lit, list(step.groups)
        cache_key = ("agg", agg, tuple(groups))
        node = self._helpers.get(cache_key) if seed is None else None
        if node is not None:
            return node
        if seed is not None:
            src, idx = self._agg_body(step, _Plan(seed, list(groups)))
        else:
            src, idx = self._agg_input(step)
        value_fn = None
        value_col = None
        if isinstance(agg.arg, ast.Var) and agg.arg.name in idx:
            value_col = idx[agg.arg.name]
            value_fn = itemgetter(value_col)  # no arithmetic: nothing to skip
        elif agg.arg is not None:
            term = self._term(agg.arg, idx)
            _ops, _cmp, errors = (
                self.arith() if not isinstance(agg.arg, ast.Var | ast.Const) else ({}, None, ())
            )
            skip = Aggregate.SKIP

            def value_fn(r: Row) -> Any:
                try:
                    return term(r)
                except errors:
                    return skip

        from .arith import sort_key

        node = self.root.operator(
            GroupAggregate(
                agg.func,
                [idx[g] for g in groups],
                value_fn,
                order_key=sort_key,
                int_bits=self.int_bits,
                cache=self._batch_cache(src),
                value_col=value_col,
            ),
            src,
            label=str(agg),
        )
        if seed is None:
            self._helpers[cache_key] = node
        return node

    def _agg_input(self, step: planner.Aggregate) -> tuple[Node, dict[str, int]]:
        """The root stream an uncorrelated aggregate folds, and the column of each of its
        variables: compiled once per aggregate, whichever operator then folds it."""
        agg, groups = step.lit, list(step.groups)
        cache_key = ("agg input", agg, tuple(groups))
        hit = self._helpers.get(cache_key)
        if hit is not None:
            return hit  # type: ignore[return-value]
        if self._correlated(agg, groups):
            raise CompileError(
                f"aggregate {agg}: a grouping variable is bound only outside the aggregate; "
                "inside a recursive stratum this correlated aggregate is not supported "
                "incrementally"
            )
        out = self._agg_body(step, None)
        self._helpers[cache_key] = out  # type: ignore[assignment]
        return out

    def _agg_body(self, step: planner.Aggregate, seed: _Plan | None) -> tuple[Node, dict[str, int]]:
        """Compile an aggregate's body (from ``seed``'s bindings for a correlated one)."""
        agg, groups = step.lit, list(step.groups)
        scope = _Scope(self, self.root, {})
        scope.keep_rest = True
        if seed is not None:
            inner = self._body(scope, step.inner, seed)
        elif step.inner_free is not None:
            inner = self._body(scope, step.inner_free)
        else:
            raise CompileError(f"aggregate {agg}: its grouping variables are never bound")
        missing = [g for g in groups if g not in inner.vars]
        if missing:
            raise CompileError(f"aggregate {agg}: grouping variables {missing} are never bound")
        return self._plan_node(scope, inner), {v: i for i, v in enumerate(inner.vars)}

    def _count_sum(
        self, scope: _Scope, plan: _Plan, steps: Sequence[planner.Aggregate]
    ) -> _Plan | None:
        """A fusable run (:meth:`_fusable`) as one :class:`CountSumJoin` (ADR 0104) when
        every aggregate is a ``count`` or a ``sum`` of a variable over the same stream,
        grouped by the same columns, and the bindings are exactly the groups; else None."""
        groups = list(steps[0].groups)
        if plan.vars != groups or any(s.lit.func not in ("count", "sum") for s in steps):
            return None
        if any(s.lit.func == "sum" and not isinstance(s.lit.arg, ast.Var) for s in steps):
            return None
        inputs = [self._agg_input(s) for s in steps]
        src, idx0 = inputs[0]
        key_cols = [idx0[g] for g in groups]
        value_cols: list[int | None] = []
        for step, (node, idx) in zip(steps, inputs, strict=True):
            if node is not src or [idx[g] for g in groups] != key_cols:
                return None
            arg = step.lit.arg
            if step.lit.func == "sum":
                assert isinstance(arg, ast.Var)
                if arg.name not in idx:
                    return None
                value_cols.append(idx[arg.name])
            else:
                value_cols.append(None)
        op = CountSumJoin(
            [s.lit.func for s in steps],
            key_cols,
            value_cols,
            int_bits=self.int_bits,
            cache=self._batch_cache(src),
        )
        label = "join " + ", ".join(str(s.lit) for s in steps)
        joined = scope.circuit.operator(op, self._plan_node(scope, plan), src, label=label)
        return _Plan(joined, plan.vars + [s.lit.result.name for s in steps])

    def _batch_cache(self, src: Node) -> BatchCache:
        """One :class:`BatchCache` per stream: aggregates over it read each batch once."""
        cache = self._batch_caches.get(id(src))
        if cache is None:
            cache = self._batch_caches[id(src)] = BatchCache()
        return cache

    def _fusable(
        self, scope: _Scope, plan: _Plan, steps: Sequence[planner.Step], i: int
    ) -> list[planner.Aggregate]:
        """The run of aggregate steps from ``steps[i]`` that one
        :class:`MultiAggregateJoin` can join (ADR 0091): root circuit, the same
        grouping variables, none correlated, each binding a new, distinct result."""
        run: list[planner.Aggregate] = []
        if scope.circuit.nested:
            return run
        seen = set(plan.vars)
        for step in steps[i:]:
            if not isinstance(step, planner.Aggregate):
                break
            groups = list(step.groups)
            result = step.lit.result.name
            if (run and tuple(groups) != run[0].groups) or result in seen:
                break
            if self._correlated(step.lit, groups):
                break
            run.append(step)
            seen.add(result)
        return run

    def _aggregates(self, scope: _Scope, plan: _Plan, steps: Sequence[planner.Aggregate]) -> _Plan:
        """Several aggregates over the same groups joined to the bindings at once."""
        c = scope.circuit
        src = self._plan_node(scope, plan)
        idx = {v: i for i, v in enumerate(plan.vars)}
        groups = list(steps[0].groups)
        key_fn = _key_fn([idx[g] for g in groups])
        rels, defaults, sources = [], [], []
        for step in steps:
            rel = self._agg_relation(step)
            op = getattr(rel, "op", None)
            rels.append(rel)
            defaults.append(0 if step.lit.func in ("count", "sum") else _MISSING)
            sources.append(op if isinstance(op, GroupAggregate) else None)
        label = "join " + ", ".join(str(s.lit) for s in steps)
        join = MultiAggregateJoin(key_fn, len(groups), defaults, sources)
        joined = c.operator(join, src, *rels, label=label)
        return _Plan(joined, plan.vars + [s.lit.result.name for s in steps])

    def _aggregate(self, scope: _Scope, plan: _Plan, step: planner.Aggregate) -> _Plan:
        agg, groups = step.lit, list(step.groups)
        result = agg.result.name
        c = scope.circuit
        src = self._plan_node(scope, plan)
        idx = {v: i for i, v in enumerate(plan.vars)}
        if self._correlated(agg, groups) and not c.nested:
            keys = c.operator(Map(_key_fn([idx[g] for g in groups])), src)
            seed = c.operator(DistinctTrace(), keys, label=f"groups of {agg}")
            rel = self._agg_relation(step, seed)
        else:
            rel = scope.lift(self._agg_relation(step))
        bound_result = result in idx
        if not c.nested:
            default = 0 if agg.func in ("count", "sum") else _MISSING
            op = AggregateJoin(
                _key_fn([idx[g] for g in groups]),
                len(groups),
                default,
                idx[result] if bound_result else None,
            )
            source = getattr(rel, "op", None)
            op.source = source if isinstance(source, GroupAggregate) else None
            joined = c.operator(op, src, rel, label=f"join {agg}")
            return _Plan(joined, plan.vars + ([] if bound_result else [result]))
        key_vars = groups + ([result] if bound_result else [])
        left_key = _key_fn([idx[v] for v in key_vars])
        right_key = _key_fn(list(range(len(groups))) + ([len(groups)] if bound_result else []))
        combine = _lambda(
            "lambda k, a, b: a" if bound_result else f"lambda k, a, b: a + (b[{len(groups)}],)"
        )
        left = c.operator(IndexWith(left_key), src)
        valued = rel
        if agg.func == "sum":
            n = len(groups)
            valued = c.operator(Filter(lambda r: r[n] is not _NO_VALUE), rel)
        right = c.operator(IndexWith(right_key), valued)
        joined = c.operator(Join(combine), left, right, label=f"join {agg}")
        out_vars = plan.vars + ([] if bound_result else [result])
        if agg.func not in ("count", "sum"):
            return _Plan(joined, out_vars)
        # count/sum over no bindings give 0: bindings whose group has no row.
        group_keys = c.operator(Map(_key_fn(list(range(len(groups))))), rel)
        empty = self._antijoin(
            scope, plan, group_keys, _key_fn([idx[v] for v in groups]), label=f"empty {agg}"
        )
        if bound_result:
            i = idx[result]
            zeros = c.operator(FlatMap(lambda r: (r,) if r[i] == 0 else ()), empty.node)
        else:
            zeros = c.operator(Map(lambda r: (*r, 0)), empty.node)
        return _Plan(c.operator(Plus(), joined, zeros), out_vars)


# ----------------------------------------------------------------------------- the engine


#: A change of the engine's state an epoch makes when published: (state, relation, delta).
_StateChange = tuple[dict[str, dict[Row, int]], str, Delta]


def _apply_state(state: dict[Row, int], delta: Delta) -> None:
    """Apply a relation's ``±1`` delta to its rows (``row -> 1``)."""
    if type(delta) is SignedRows:  # C-level: no Python loop per row
        deque(map(state.pop, delta.neg, repeat(None, len(delta.neg))), maxlen=0)
        state.update(dict.fromkeys(delta.pos, 1))
        return
    for row, w in delta.items():
        if w > 0:
            state[row] = 1
        else:
            state.pop(row, None)


@dataclass
class _Unpublished:
    """An epoch evaluated and not shown yet (see :meth:`IncrementalEngine.publish`)."""

    base: list[Change]
    events: dict[str, set[Row]]
    state: list[_StateChange]
    result: EpochResult
    public: dict[str, DeltaMap]


class IncrementalEngine:
    """Evaluates a program epoch by epoch over deltas.

    >>> engine = IncrementalEngine(Program.parse(text).checked)     # doctest: +SKIP
    >>> engine.step(inserts={"edge": [(1, 2)]})                      # doctest: +SKIP
    {'edge': {(1, 2): 1}, 'path': {(1, 2): 1}}

    ``program`` is a :class:`~merklog.engine.checks.CheckedProgram` (preferred:
    its strata and integer width are used), an :class:`~merklog.engine.ast.Program`
    or a sequence of rules (stratified here). The database at epoch ``t`` is
    the program's inline facts, the persistent base facts (``inserts``/``deletes``
    and sources), that epoch's ``events`` and the ``@next`` tuples of ``t-1``.
    """

    def __init__(
        self,
        program: Any,
        *,
        int_bits: int | None = None,
        sources: Iterable[Source] = (),
        sinks: Iterable[Sink] = (),
    ) -> None:
        strata = getattr(program, "strata", None)
        if int_bits is None:
            int_bits = getattr(program, "int_bits", 64)
        ast_program = getattr(program, "program", program)
        if isinstance(ast_program, ast.Program):
            rules = tuple(ast_program.rules)
            facts = tuple(ast_program.facts)
        else:
            rules = tuple(program)
            facts = ()
        if strata is None:
            strata = stratify(rules)
        self.rules = rules
        self.sources: list[Source] = list(sources)
        self.sinks: list[Sink] = list(sinks)
        self._edb: dict[str, set[Row] | ArrayBase] = {}
        self._events: dict[str, set[Row]] = {}
        self._state: dict[str, dict[Row, int]] = {}
        self._async_state: dict[str, dict[Row, int]] = {}
        self._next_state: dict[str, dict[Row, int]] = {}
        self._hooks: dict[str, list[Callable[[int, Delta], object]]] = {}
        self.last: EpochResult | None = None
        self.epoch = -1
        self.compiled = compile_program(rules, list(strata), int_bits)
        self.circuit = self.compiled.circuit
        self._initial = facts
        #: The program's own facts, per relation in engine form: in the database at every
        #: epoch, whatever the stored facts do (see :func:`_keep_program_facts`).
        self._program_facts = _group([(rel, row) for rel, row in facts])
        self._arity = ast.read_arities(rules)
        for view in self.compiled.views.values():
            view.defer = True  # its weights change when the epoch is published
        #: An epoch evaluated by ``step(publish=False)`` and not shown yet.
        self._unpublished: _Unpublished | None = None

    def _collect(self) -> tuple[dict[str, Delta], list[tuple[Value, Fact]], list[_StateChange]]:
        """Read the output handles after a step: the deltas, the ``@async`` outbox and
        the changes of the engine's state that :meth:`publish` makes."""
        compiled = self.compiled
        deltas: dict[str, Delta] = {}
        outbox: list[tuple[Value, Fact]] = []
        changes: list[_StateChange] = []
        views = compiled.views
        for name, handle in compiled.relations.items():
            delta = handle.delta
            if delta:
                deltas[name] = delta
                if name not in compiled.inputs_only and name not in views:
                    changes.append((self._state, name, delta))
        for name, handle in compiled.async_outputs.items():
            delta = handle.delta
            if delta:
                changes.append((self._async_state, name, delta))
                for row, w in delta.items():
                    if w > 0:
                        plain = row_from_engine(row)
                        outbox.append((plain[0] if plain else None, Fact(name, plain)))
        for name, handle in compiled.next_outputs.items():
            if handle.delta:
                changes.append((self._next_state, name, handle.delta))
        return deltas, outbox, changes

    def _known(self) -> set[str]:
        names = set(self.compiled.relations) | set(self._edb) | set(self._events)
        return names

    # -- public API
    def add_source(self, source: Source) -> None:
        """Register a source polled at the start of each epoch."""
        self.sources.append(source)

    def add_sink(self, sink: Sink) -> None:
        """Register a sink called with each epoch's :class:`EpochResult` at its end."""
        self.sinks.append(sink)

    def inspect(self, relation: str, callback: Callable[[int, Delta], object]) -> None:
        """Call ``callback(epoch, delta)`` whenever ``relation`` changes (debugging aid)."""
        self._hooks.setdefault(relation, []).append(callback)

    def inspect_nodes(self, callback: Callable[[Node, Timestamp, Any], object]) -> None:
        """Wrap every operator so ``callback(node, ts, value)`` sees each non-empty output
        (nested circuits included): the :class:`~merklog.engine.dataflow.Inspect` hook."""

        def wrap(circuit: Circuit) -> None:
            for node in circuit.nodes:
                op = getattr(node, "op", None)
                if op is not None:
                    inner_eval = op.eval
                    spy = Inspect(lambda ts, v, node=node: callback(node, ts, v))

                    def patched(ts, *inputs, _inner=inner_eval, _spy=spy):  # type: ignore[no-untyped-def]
                        return _spy.eval(ts, _inner(ts, *inputs))

                    op.eval = patched  # type: ignore[method-assign]
                child = getattr(node, "child", None)
                if isinstance(child, Circuit):
                    wrap(child)

        wrap(self.circuit)

    def step(
        self,
        inserts: Mapping[str, Iterable[Row]] | None = None,
        deletes: Mapping[str, Iterable[Row]] | None = None,
        events: Mapping[str, Iterable[Row]] | None = None,
        *,
        publish: bool = True,
    ) -> dict[str, DeltaMap]:
        """Run one epoch and return ``{relation: {row: +1 | -1}}`` for what changed.

        ``inserts``/``deletes`` change the persistent base facts (set semantics;
        deletes apply before inserts). ``events`` hold for this epoch only and are
        withdrawn automatically at the next one (clicks, incoming messages).
        Sources are polled first; sinks receive the :class:`EpochResult` last.

        ``publish=False`` evaluates the epoch without showing it: :meth:`relation`,
        :meth:`relation_matching`, :meth:`count`, :meth:`relations`,
        :meth:`async_relation` and :meth:`next_relation` answer the previous epoch until
        :meth:`publish` (work proportional to the epoch's changes), so a reader on
        another thread never meets a half-evaluated epoch; it and :meth:`publish` take
        turns under the caller's lock. ``last`` is the evaluated epoch at once (its
        deltas and outbox). An evaluation that raises shows nothing of itself, and
        leaves the circuit half updated: such an engine is to be replaced.
        """
        if self._unpublished is not None:  # the previous epoch comes first
            self.publish()
        large = _sized_rows(inserts, deletes, events) >= GC_PAUSE_ROWS
        with gc_paused() if large else nullcontext():
            deltas = self._step(inserts, deletes, events)
            if publish:
                self.publish()
            return deltas

    def publish(self) -> None:
        """Show the epoch :meth:`step` evaluated with ``publish=False``: change the base
        facts, events and relation contents as it computed, then call the hooks and
        sinks. Nothing to do if every evaluated epoch is shown."""
        unpublished, self._unpublished = self._unpublished, None
        if unpublished is None:
            return
        for change in unpublished.base:
            change()
        self._events = unpublished.events
        for state, name, delta in unpublished.state:
            _apply_state(state.setdefault(name, {}), delta)
        for view in self.compiled.views.values():
            view.integrate()
        result = unpublished.result
        public = unpublished.public
        for rel, hooks in self._hooks.items():
            d = public.get(rel)
            if d:
                for hook in hooks:
                    hook(result.epoch, d)
        for sink in self.sinks:
            sink.emit(result)

    def _step(
        self,
        inserts: Mapping[str, Iterable[Row]] | None,
        deletes: Mapping[str, Iterable[Row]] | None,
        events: Mapping[str, Iterable[Row]] | None,
    ) -> dict[str, DeltaMap]:
        """Evaluate one epoch and leave it for :meth:`publish`; return its deltas."""
        epoch = self.epoch + 1
        edb = self._edb
        old_events = self._events
        # Every change as whole-relation set operations (C loops, not per-row Python):
        # the rows a relation's changes touch, whether each was present before, the
        # changes applied in order (deletes before inserts), and the difference.
        ops: list[tuple[str, Any, bool, bool]] = []  # (rel, rows, insert, owned)
        if epoch == 0:
            for rel, rows in _group([(rel, row) for rel, row in self._initial]).items():
                ops.append((rel, rows, True, True))
        for source in self.sources:
            polled = source.poll(epoch)
            if polled:
                ins, dels = polled
                ops += [(rel, rows, False, True) for rel, rows in _group(dels).items()]
                ops += [(rel, rows, True, True) for rel, rows in _group(ins).items()]
        for rel, rows in (deletes or {}).items():
            ops.append((rel, *_op(rows, False)))
        for rel, rows in (inserts or {}).items():
            ops.append((rel, *_op(rows, True)))
        if self._program_facts:
            ops = _keep_program_facts(ops, self._program_facts)
        events_now = {rel: _as_set(rows) for rel, rows in (events or {}).items()}
        pending: dict[str, Delta] = {}
        extra: dict[str, Delta] = {}
        base_changes: list[Change] = []
        inputs = self.compiled.inputs
        by_rel: dict[str, list[tuple[str, Any, bool, bool]]] = {}
        for op in ops:
            by_rel.setdefault(op[0], []).append(op)
        general: list[tuple[str, Any, bool, bool]] = []
        for rel, rel_ops in by_rel.items():
            if len(rel_ops) == 1 and rel not in old_events and rel not in events_now:
                delta, change = _apply_one(edb, *rel_ops[0])
                if change is not None:
                    base_changes.append(change)
                if delta:
                    (pending if rel in inputs else extra)[rel] = delta
            else:
                general += rel_ops
        if general or old_events or events_now:
            deltas_of, changes = _apply_general(edb, general, old_events, events_now)
            base_changes += changes
            for rel, delta in deltas_of.items():
                (pending if rel in inputs else extra)[rel] = delta
        arities = self._arity
        for rel, delta in pending.items():
            want = arities.get(rel)
            if want is not None:
                # Rows of another arity than the program reads never reach the circuit.
                n, rest = want
                if isinstance(delta, ColumnBatch):
                    if delta.arity < n if rest else delta.arity != n:
                        extra[rel] = delta.rows()
                        continue
                    inputs[rel].push(delta, owned=True)
                    continue
                lengths = set(map(len, delta))  # one C-level pass; usually {n}
                if any(m < n if rest else m != n for m in lengths):
                    bad = [r for r in delta if (len(r) < n if rest else len(r) != n)]
                    extra[rel] = {r: delta.pop(r) for r in bad}
            inputs[rel].push(delta, owned=True)
        self.compiled.step()
        self.epoch = epoch
        deltas, outbox, state_changes = self._collect()
        for rel, d in extra.items():
            deltas[rel] = {**deltas[rel], **d} if rel in deltas else d
        result = EpochResult(epoch, deltas, outbox, self)
        self.last = result
        public = result.deltas
        self._unpublished = _Unpublished(base_changes, events_now, state_changes, result, public)
        return public

    def relation(self, name: str) -> RowSet:
        """The current contents of a relation (base facts, events and derived tuples),
        a copy: plain values when iterated, engine identity for ``in``/``len``/``==``."""
        view = self.compiled.views.get(name)
        if view is not None:
            counts = view.integrated()
            return RowSet(set(compress(counts, map(_positive, counts.values()))))
        if name in self._state:
            return RowSet(set(self._state[name]))
        rows = set(self._edb.get(name, ()))
        rows |= self._events.get(name, set())
        return RowSet(rows)

    def relation_matching(self, name: str, consts: dict[int, object]) -> RowSet:
        """The rows of :meth:`relation` whose column ``c`` holds ``consts[c]`` (engine
        values, by identity). A stored relation held as an int64 matrix
        (:class:`~merklog.engine.arraybase.ArrayBase`) answers without a tuple per row."""
        edb = self._edb.get(name)
        if (
            isinstance(edb, ArrayBase)
            and name not in self.compiled.views
            and name not in self._state
            and not self._events.get(name)
        ):
            return RowSet(set(edb.matching(consts)))
        rows = self.relation(name).engine
        return RowSet({r for r in rows if row_holds(r, consts)})

    def __len__(self) -> int:
        return sum(len(self.relation(n)) for n in self._known())

    def count(self, name: str) -> int:
        """Number of tuples in a relation, without copying it."""
        view = self.compiled.views.get(name)
        if view is not None:
            return sum(map(_positive, view.integrated().values()))
        if name in self._state:
            return len(self._state[name])
        edb = self._edb.get(name, set())
        return len(edb) + len(self._events.get(name, set()) - edb)

    def relations(self) -> dict[str, RowSet]:
        """Every non-empty relation's current contents."""
        out = {n: self.relation(n) for n in sorted(self._known())}
        return {n: rows for n, rows in out.items() if rows}

    def async_relation(self, name: str) -> RowSet:
        """``@async`` tuples whose rule body currently holds (the outbox's live view)."""
        return RowSet(set(self._async_state.get(name, {})))

    def next_relation(self, name: str) -> RowSet:
        """Tuples the ``@next`` rules derived this epoch for ``name`` (true next epoch)."""
        return RowSet(set(self._next_state.get(name, {})))

    @property
    def outbox(self) -> list[tuple[Value, Fact]]:
        """The ``@async`` tuples newly derived in the last epoch, as ``(destination, Fact)``."""
        return list(self.last.outbox) if self.last is not None else []


class Outbox:
    """A sink that queues ``@async`` tuples for delivery; ``drain()`` empties it."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, Value, Fact]] = []

    def emit(self, result: Any) -> None:
        self.messages.extend((result.epoch, dest, fact) for dest, fact in result.outbox)

    def drain(self) -> list[tuple[int, Value, Fact]]:
        out, self.messages = self.messages, []
        return out


__all__ = [
    "CompileError",
    "CompiledProgram",
    "EpochResult",
    "IncrementalEngine",
    "InputHandle",
    "Outbox",
    "OutputHandle",
    "compile_program",
]
