"""The operators of Dialog dataflow spec §2.9, each a small object evaluated once per timestamp.

An operator's ``eval(ts, *inputs)`` receives the values of its input streams at
timestamp ``ts`` and returns its output value at ``ts``. Inputs and outputs are
deltas (Z-sets, indexed Z-sets) or traces. Stateful operators keep their state
between calls; operators placed in a child circuit are told so by :meth:`bind`
and then treat ``ts.iteration`` as the inner time (Dialog dataflow spec §2.5, §2.8.2).

Linear operators are plain functions of the current delta. The non-linear and
bilinear ones (:class:`DistinctTrace`, :class:`JoinTrace`, :class:`Join`,
:class:`Aggregate`) do work proportional to the delta and the trace entries it
touches, never to the size of the whole trace.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from itertools import repeat
from typing import Any

from ..arith import ExactSum, NoBinding
from .lazydelta import SignedRows
from .timestamp import Timestamp
from .trace import NestedTrace, Trace
from .zset import (
    IndexedZSet,
    Row,
    ZSet,
    add_into,
    add_weight,
    distinct,
    filter_zset,
    index_with,
    join_indexed,
    map_zset,
    minus,
    negate,
    plus,
)

Combine = Callable[[Hashable, Row, Row], Row]


class Operator:
    """Base class: an N-ary operation on streams producing one stream."""

    nested = False

    def bind(self, nested: bool) -> None:
        """Called once by the circuit: ``nested`` is True inside a child circuit."""
        self.nested = nested

    def eval(self, ts: Timestamp, *inputs: Any) -> Any:
        raise TypeError(f"{type(self).__name__} does not define eval")

    def next_pending(self) -> int | None:
        """The smallest future iteration at which this operator has output queued."""
        return None

    idle_when_empty = False

    def idle(self) -> bool:
        """True if evaluating on all-empty inputs would output nothing and change no
        state, so the circuit may skip the call (epochs touch few operators)."""
        return self.idle_when_empty

    def end_epoch(self) -> None:
        """Called after a child circuit reached its fixpoint for the epoch."""
        return None

    def __repr__(self) -> str:
        return type(self).__name__


# ------------------------------------------------------------------ linear, stateless


class Map(Operator):
    idle_when_empty = True
    """Transform every row (§2.9.7); weights of colliding rows add up."""

    def __init__(self, fn: Callable[[Row], Row]) -> None:
        self.fn = fn

    def eval(self, ts: Timestamp, a: ZSet) -> ZSet:
        return map_zset(self.fn, a) if a else {}


class FlatMap(Operator):
    idle_when_empty = True
    """Transform every row into zero or more rows (filter and map fused)."""

    def __init__(self, fn: Callable[[Row], Any]) -> None:
        self.fn = fn

    def eval(self, ts: Timestamp, a: ZSet) -> ZSet:
        out: ZSet = {}
        fn, get = self.fn, out.get
        for row, w in a.items():
            for new in fn(row):  # add_weight inlined (see map_zset)
                n = get(new, 0) + w
                if n:
                    out[new] = n
                else:
                    del out[new]
        return out


class Filter(Operator):
    idle_when_empty = True
    """Keep rows satisfying a pure predicate (§2.9.4)."""

    def __init__(self, pred: Callable[[Row], bool]) -> None:
        self.pred = pred

    def eval(self, ts: Timestamp, a: ZSet) -> ZSet:
        return filter_zset(self.pred, a) if a else {}


class IndexWith(Operator):
    idle_when_empty = True
    """Group rows by a key function into an indexed Z-set (§2.9.5)."""

    def __init__(self, key_fn: Callable[[Row], Hashable]) -> None:
        self.key_fn = key_fn

    def eval(self, ts: Timestamp, a: ZSet) -> IndexedZSet:
        return index_with(self.key_fn, a) if a else {}


class Negate(Operator):
    idle_when_empty = True
    """Negate every weight (§2.9.8)."""

    def eval(self, ts: Timestamp, a: ZSet) -> ZSet:
        return negate(a)


class Plus(Operator):
    idle_when_empty = True
    """Sum of any number of Z-sets (§2.9.15)."""

    def eval(self, ts: Timestamp, *inputs: ZSet) -> ZSet:
        nonempty = [z for z in inputs if z]
        if not nonempty:
            return {}
        if len(nonempty) == 1:
            return nonempty[0]
        out = dict(nonempty[0])
        for z in nonempty[1:]:
            add_into(out, z)
        return out


class Minus(Operator):
    idle_when_empty = True
    """``a - b`` (§2.9.14)."""

    def eval(self, ts: Timestamp, a: ZSet, b: ZSet) -> ZSet:
        if not b:
            return a
        return minus(a, b)


class Distinct(Operator):
    idle_when_empty = True
    """Non-incremental distinct (§2.9.3): positive rows with weight 1."""

    def eval(self, ts: Timestamp, a: ZSet) -> ZSet:
        return distinct(a)


class Inspect(Operator):
    """Pass the input through, calling ``callback(ts, value)`` when non-empty (§2.9.6)."""

    def __init__(self, callback: Callable[[Timestamp, Any], object], always: bool = False):
        self.callback = callback
        self.always = always

    def eval(self, ts: Timestamp, a: Any) -> Any:
        if a or self.always:
            self.callback(ts, a)
        return a


class JoinStream(Operator):
    idle_when_empty = True
    """Join two indexed Z-sets of the same timestamp on their keys (§2.9.12)."""

    def __init__(self, combine: Combine) -> None:
        self.combine = combine

    def eval(self, ts: Timestamp, a: IndexedZSet, b: IndexedZSet) -> ZSet:
        if not a or not b:
            return {}
        return join_indexed(a, b, self.combine)


# ------------------------------------------------------------------ delays and traces


class Z1(Operator):
    """Delay a Z-set stream by one timestamp (§2.9.10); starts empty.

    In a child circuit the delay is along iterations and restarts empty each epoch.
    """

    def __init__(self) -> None:
        self.previous: Any = {}

    def eval(self, ts: Timestamp, a: Any) -> Any:
        if self.nested and ts.iteration == 0:
            self.previous = {}
        out, self.previous = self.previous, a
        return out

    def end_epoch(self) -> None:
        self.previous = {}


class TraceAppend(Operator):
    """Append the current indexed delta to a trace at the current timestamp (§2.9.16).

    With one input the operator owns the trace; with two it appends to the given one.
    """

    def __init__(self) -> None:
        self.trace: Trace | NestedTrace | None = None

    def bind(self, nested: bool) -> None:
        super().bind(nested)
        self.trace = NestedTrace() if nested else Trace()

    def eval(
        self, ts: Timestamp, delta: IndexedZSet, trace: Trace | NestedTrace | None = None
    ) -> Trace | NestedTrace:
        target = trace if trace is not None else self.trace
        assert target is not None
        if delta:
            if isinstance(target, NestedTrace):
                target.insert(delta, ts.iteration)
            else:
                target.insert(delta)
        return target


class Z1Trace(Operator):
    """The trace of an indexed delta stream *before* the current timestamp (§2.9.9).

    ``z1trace(delta)`` at ``t`` holds every delta at timestamps earlier than ``t``
    (the integral, delayed by one). Appending is lazy: the previous delta is
    merged when the next timestamp arrives, so each step costs the delta's size.
    """

    def __init__(self) -> None:
        self.trace: Trace | NestedTrace | None = None
        self._pending: tuple[IndexedZSet, int] | None = None

    def bind(self, nested: bool) -> None:
        super().bind(nested)
        self.trace = NestedTrace() if nested else Trace()

    def eval(self, ts: Timestamp, delta: IndexedZSet) -> Trace | NestedTrace:
        trace = self.trace
        assert trace is not None
        if self._pending is not None:
            previous, iteration = self._pending
            if isinstance(trace, NestedTrace):
                trace.insert(previous, iteration)
            else:
                trace.insert(previous)
        self._pending = (delta, ts.iteration) if delta else None
        return trace


class Consolidate(Operator):
    """Merge all deltas of a trace into one Z-set (§2.9.2), dropping zero weights."""

    def eval(self, ts: Timestamp, trace: Trace | NestedTrace) -> ZSet:
        return trace.consolidate()


class JoinTrace(Operator):
    """Join the current indexed delta with a trace (§2.9.13): ``delta ⋈ trace``.

    In a child circuit a trace entry at iteration ``j`` (from an earlier epoch)
    meets the delta at ``(epoch, i)`` at their least upper bound
    ``(epoch, max(i, j))``: when ``j > i`` that output is queued for iteration ``j``.
    ``swap=True`` passes ``(key, trace_row, delta_row)`` to ``combine``.
    """

    def __init__(self, combine: Combine, swap: bool = False) -> None:
        self.combine = combine
        self.swap = swap
        self.pending: dict[int, ZSet] = {}

    def eval(self, ts: Timestamp, delta: IndexedZSet, trace: Trace | NestedTrace) -> ZSet:
        i = ts.iteration
        out = self.pending.pop(i, None) if self.pending else None
        if out is None:
            out = {}
        if delta:
            if isinstance(trace, NestedTrace):
                _join_nested(delta, trace, self.combine, self.swap, i, out, self.pending)
            else:
                _join_flat(delta, trace, self.combine, self.swap, out)
        return out

    def next_pending(self) -> int | None:
        return min(self.pending) if self.pending else None

    def idle(self) -> bool:
        return not self.pending


def _join_flat(delta: IndexedZSet, trace: Trace, combine: Combine, swap: bool, out: ZSet) -> None:
    index = trace.index
    for key, drows in delta.items():
        trows = index.get(key)
        if not trows:
            continue
        for drow, wd in drows.items():
            for trow, wt in trows.items():
                row = combine(key, trow, drow) if swap else combine(key, drow, trow)
                n = out.get(row, 0) + wd * wt
                if n:
                    out[row] = n
                else:
                    del out[row]


def _join_nested(
    delta: IndexedZSet,
    trace: NestedTrace,
    combine: Combine,
    swap: bool,
    i: int,
    out: ZSet,
    pending: dict[int, ZSet],
) -> None:
    index = trace.index
    for key, drows in delta.items():
        trows = index.get(key)
        if not trows:
            continue
        for trow, times in trows.items():
            for j, wt in times.items():
                if j <= i:
                    target = out
                else:
                    target = pending.get(j)
                    if target is None:
                        target = pending[j] = {}
                for drow, wd in drows.items():
                    row = combine(key, trow, drow) if swap else combine(key, drow, trow)
                    n = target.get(row, 0) + wd * wt
                    if n:
                        target[row] = n
                    else:
                        del target[row]


class Join(Operator):
    """Incremental equi-join of two indexed delta streams (bilinear, owns both traces).

    ``δ(a ⋈ b) = δa ⋈ z1trace(b) + trace(a) ⋈ δb`` — two :class:`JoinTrace` steps
    sharing one trace per side instead of keeping a delayed copy.
    """

    def __init__(self, combine: Combine) -> None:
        self.combine = combine
        self.pending: dict[int, ZSet] = {}
        self.left: Trace | NestedTrace = Trace()
        self.right: Trace | NestedTrace = Trace()

    def bind(self, nested: bool) -> None:
        super().bind(nested)
        if nested:
            self.left, self.right = NestedTrace(), NestedTrace()

    def eval(self, ts: Timestamp, da: IndexedZSet, db: IndexedZSet) -> ZSet:
        i = ts.iteration
        out = self.pending.pop(i, None) if self.pending else None
        if out is None:
            out = {}
        combine = self.combine
        left, right = self.left, self.right
        if isinstance(left, NestedTrace):
            assert isinstance(right, NestedTrace)
            if da:
                _join_nested(da, right, combine, False, i, out, self.pending)
                left.insert(da, i)
            if db:
                _join_nested(db, left, combine, True, i, out, self.pending)
                right.insert(db, i)
        else:
            assert isinstance(right, Trace)
            if da:
                _join_flat(da, right, combine, False, out)
                left.insert(da)
            if db:
                _join_flat(db, left, combine, True, out)
                right.insert(db)
        return out

    def next_pending(self) -> int | None:
        return min(self.pending) if self.pending else None

    def idle(self) -> bool:
        return not self.pending


# ------------------------------------------------------------------ distinct


class DistinctTrace(Operator):
    """Incremental distinct (§2.9.11): output deltas of ``distinct(integral(input))``.

    Root circuit: keeps the integrated weight per row; a row is emitted with +1
    when its weight becomes positive and -1 when it stops being positive.
    Child circuit: implements the nested (epoch, iteration) form of DBSP —
    the output delta at ``(e, i)`` is
    ``d(e,i) - d(e,i-1) - d(e-1,i) + d(e-1,i-1)`` with ``d = [integral > 0]``;
    a row touched this epoch is revisited at the next iteration where its
    past-epoch history changes, so retractions through recursion are exact.

    ``defer`` (root circuit only; the incremental engine sets it on the operators whose
    weights are a relation's contents, its *views*): an epoch computes its output from
    the weights without changing them, and :meth:`integrate` adds its input later, so
    a reader of :meth:`integrated` sees the last published epoch while the next one is
    evaluated. An input not integrated yet is integrated before the next evaluation.
    """

    def __init__(self) -> None:
        self.counts: dict[Row, int] = {}  # root: integrated weight per row
        self.past: dict[Row, dict[int, int]] = {}  # nested: compacted past epochs
        self.current: dict[Row, dict[int, int]] = {}  # nested: this epoch's deltas
        self.scheduled: dict[int, set[Row]] = {}
        self.defer = False
        #: Root, ``defer``: the evaluated input :meth:`integrate` adds to ``counts`` (a
        #: copy: a ``SignedRows``' lists, or the dict).
        self._unintegrated: SignedRows | dict[Row, int] | None = None

    def eval(self, ts: Timestamp, delta: ZSet) -> ZSet:
        if self.nested:
            return self._eval_nested(ts.iteration, delta)
        if self.defer:
            return self._eval_deferred(delta)
        if type(delta) is SignedRows and self._apply_signed(delta):
            return delta
        out: ZSet = {}
        counts = self.counts
        for row, w in delta.items():
            old = counts.get(row, 0)
            new = old + w
            if new:
                counts[row] = new
            else:
                del counts[row]
            if old > 0:
                if new <= 0:
                    out[row] = -1
            elif new > 0:
                out[row] = 1
        return out

    def _eval_deferred(self, delta: ZSet) -> ZSet:
        """Root, ``defer``: the output of :meth:`eval` from the weights as they are, the
        input kept for :meth:`integrate`."""
        self.integrate()
        counts = self.counts
        if type(delta) is SignedRows:
            neg, pos = delta.neg, delta.pos
            # every -1 row at weight 1, every +1 row absent: the output is the input
            if counts.keys().isdisjoint(pos) and list(map(counts.get, neg)).count(1) == len(neg):
                self._unintegrated = SignedRows(list(neg), list(pos))
                return delta
        out: ZSet = {}
        for row, w in delta.items():
            old = counts.get(row, 0)
            new = old + w
            if old > 0:
                if new <= 0:
                    out[row] = -1
            elif new > 0:
                out[row] = 1
        self._unintegrated = dict(delta.items())
        return out

    def integrate(self) -> None:
        """Root, ``defer``: add the last evaluated input to the weights (no-op if none)."""
        delta, self._unintegrated = self._unintegrated, None
        if delta is None:
            return
        if type(delta) is SignedRows:
            counts = self.counts
            deque(map(counts.pop, delta.neg), maxlen=0)
            counts.update(dict.fromkeys(delta.pos, 1))
            return
        counts = self.counts
        for row, w in delta.items():
            new = counts.get(row, 0) + w
            if new:
                counts[row] = new
            else:
                del counts[row]

    def _apply_signed(self, delta: SignedRows) -> bool:
        """Root circuit: apply a ``±1`` delta whose every ``-1`` row has weight 1 here and
        every ``+1`` row is absent — then the output is the delta itself — with C-level
        dict operations (no Python loop per row). False, and nothing changed, otherwise
        (the caller takes the general loop)."""
        counts = self.counts
        neg, pos = delta.neg, delta.pos
        if not counts.keys().isdisjoint(pos):
            return False
        if neg:
            old = list(map(counts.pop, neg, repeat(None, len(neg))))
            if old.count(1) != len(neg):  # put back what was taken
                counts.update((r, w) for r, w in zip(neg, old, strict=True) if w is not None)
                return False
        counts.update(dict.fromkeys(pos, 1))
        return True

    def _eval_nested(self, i: int, delta: ZSet) -> ZSet:
        rows = self.scheduled.pop(i, None)
        if rows is None:
            todo = delta.keys()
        else:
            rows.update(delta)
            todo = rows
        out: ZSet = {}
        past, current = self.past, self.current
        for x in todo:
            p = past.get(x)
            p_prev = p_cur = 0
            if p:
                for j, w in p.items():
                    if j < i:
                        p_prev += w
                    elif j == i:
                        p_cur += w
                p_cur += p_prev
            c = current.get(x)
            c_prev = sum(c.values()) if c else 0  # only entries before i exist
            d = delta.get(x, 0)
            c_now = c_prev + d
            if d:
                if c is None:
                    current[x] = {i: d}
                else:
                    c[i] = d
            o = (p_cur + c_now > 0) - (p_prev + c_prev > 0) - (p_cur > 0) + (p_prev > 0)
            if o:
                out[x] = o
            if c_now and p:
                later = [j for j in p if j > i]
                if later:
                    nxt = min(later)
                    bucket = self.scheduled.get(nxt)
                    if bucket is None:
                        self.scheduled[nxt] = {x}
                    else:
                        bucket.add(x)
        return out

    def next_pending(self) -> int | None:
        return min(self.scheduled) if self.scheduled else None

    def idle(self) -> bool:
        return not self.scheduled

    def end_epoch(self) -> None:
        if not self.nested:
            return
        past = self.past
        for x, times in self.current.items():
            p = past.get(x)
            if p is None:
                p = past[x] = {}
            for j, w in times.items():
                n = p.get(j, 0) + w
                if n:
                    p[j] = n
                else:
                    del p[j]
            if not p:
                del past[x]
        self.current = {}
        self.scheduled = {}

    def integrated(self) -> dict[Row, int]:
        """Root circuit only: the integrated input (row -> weight) — the current view."""
        return self.counts


# ------------------------------------------------------------------ aggregation


def _identity(v: Any) -> Any:
    return v


class _Rev:
    """Reverses ordering so a min-heap serves max."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _Rev) -> bool:
        return other.v < self.v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rev) and other.v == self.v

    __hash__ = None  # type: ignore[assignment]


class _NoValue:
    """The singleton :attr:`Aggregate.NO_VALUE` (equal only to itself)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_VALUE"


class _Group:
    __slots__ = ("n", "total", "counts", "heap", "value")

    def __init__(self) -> None:
        self.n = 0
        self.value: Any = None  # the result last emitted (None: no row)
        self.total: ExactSum | None = None
        self.counts: dict[Any, int] | None = None
        self.heap: list[Any] | None = None


AGGREGATES = ("count", "sum", "min", "max")


class Aggregate(Operator):
    idle_when_empty = True
    """Incremental grouped aggregate over an indexed Z-set (§2.9.1).

    Input: indexed deltas ``key -> {row: weight}`` (``key`` a tuple: the group).
    Output: deltas of the Z-set ``{key + (result,): 1}`` with one row per
    non-empty group. ``count``/``sum`` keep O(1) state per group (``sum`` is
    :class:`merklog.engine.arith.ExactSum`, the batch evaluator's definition too:
    exact, rounded once, ``int_bits`` wide; a non-empty group whose sum has no
    value — int64 overflow, a non-number — yields the row ``key + (NO_VALUE,)``
    so consumers can tell it from an empty group); ``min``/``max``
    keep the group's value multiset plus a lazily cleaned heap, so retracting the
    current extreme is ``O(log n)`` amortised.
    """

    SKIP: Any = object()
    """Returned by ``value_fn`` when a row has no value (e.g. arithmetic without result):
    the row still counts for ``count`` but contributes nothing to sum/min/max."""

    NO_VALUE: Any = _NoValue()
    """The result of a non-empty group whose ``sum`` has no value (see the class docstring)."""

    def __init__(
        self,
        func: str,
        value_fn: Callable[[Row], Any] | None = None,
        order_key: Callable[[Any], Any] | None = None,
        int_bits: int = 64,
    ) -> None:
        """``order_key`` orders values for min/max (e.g. a total order across types);
        ``int_bits`` is the integer width of ``sum`` (64: no value on overflow, 32: wraps)."""
        if func not in AGGREGATES:
            raise ValueError(f"unknown aggregate {func!r}")
        if func != "count" and value_fn is None:
            raise ValueError(f"{func} needs a value function")
        self.func = func
        self.value_fn = value_fn
        self.order_key = order_key if order_key is not None else _identity
        self.int_bits = int_bits
        self.groups: dict[Hashable, _Group] = {}

    def _result(self, g: _Group) -> Any:
        if g.n <= 0:
            return None
        f = self.func
        if f == "count":
            return g.n
        if f == "sum":
            assert g.total is not None
            try:
                return g.total.result(self.int_bits)
            except NoBinding:
                return self.NO_VALUE
        heap = g.heap
        counts = g.counts
        assert heap is not None and counts is not None
        if not counts:
            return None
        if f == "min":
            while counts.get(heap[0][1], 0) <= 0:
                heapq.heappop(heap)
            return heap[0][1]
        while counts.get(heap[0].v[1], 0) <= 0:
            heapq.heappop(heap)
        return heap[0].v[1]

    def eval(self, ts: Timestamp, delta: IndexedZSet) -> ZSet:
        out: ZSet = {}
        func, value_fn, groups = self.func, self.value_fn, self.groups
        skip = self.SKIP
        order_key = self.order_key
        for key, rows in delta.items():
            g = groups.get(key)
            if g is None:
                g = groups[key] = _Group()
                if func in ("min", "max"):
                    g.counts, g.heap = {}, []
                elif func == "sum":
                    g.total = ExactSum()
            old = g.value
            if func == "count":
                g.n += sum(rows.values())
            elif func == "sum":
                weights = list(rows.values())
                g.n += sum(weights)
                values = list(map(value_fn, rows))  # type: ignore[arg-type]
                g.total.add_many(values, weights, skip)  # type: ignore[union-attr]
            for row, w in rows.items() if func in ("min", "max") else ():
                g.n += w
                assert value_fn is not None
                v = value_fn(row)
                if v is skip:
                    continue
                counts = g.counts
                assert counts is not None and g.heap is not None
                c = counts.get(v, 0) + w
                if c > 0:
                    if v not in counts or counts[v] <= 0:
                        entry = (order_key(v), v)
                        heapq.heappush(g.heap, entry if func == "min" else _Rev(entry))
                    counts[v] = c
                else:
                    counts.pop(v, None)
            new = g.value = self._result(g)
            if g.n <= 0:
                del groups[key]
            if old != new or type(old) is not type(new):
                if old is not None:
                    add_weight(out, (*key, old), -1)
                if new is not None:
                    add_weight(out, (*key, new), 1)
        return out


def aggregate(func: str, indexed: Mapping[Hashable, Mapping[Row, int]], value_fn=None) -> ZSet:
    """Non-incremental aggregate of a whole indexed Z-set (the §2.9.1 example)."""
    return Aggregate(func, value_fn).eval(Timestamp(0), {k: dict(v) for k, v in indexed.items()})


__all__ = [
    "AGGREGATES",
    "Aggregate",
    "Combine",
    "Consolidate",
    "Distinct",
    "DistinctTrace",
    "Filter",
    "FlatMap",
    "IndexWith",
    "Inspect",
    "Join",
    "JoinStream",
    "JoinTrace",
    "Map",
    "Minus",
    "Negate",
    "Operator",
    "Plus",
    "TraceAppend",
    "Z1",
    "Z1Trace",
    "aggregate",
    "negate",
    "plus",
]
