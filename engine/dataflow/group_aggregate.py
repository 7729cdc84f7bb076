"""A grouped aggregate over a flat Z-set: ``IndexWith`` fused into :class:`Aggregate`.

Small batches are indexed and aggregated tuple by tuple exactly as
:class:`~merklog.engine.dataflow.Aggregate` does. A batch of at least
``vector_min`` rows for ``count``/``sum`` is reduced per group in numpy first
(:func:`~merklog.engine.dataflow.grouping.group_sums`), so the Python work is
per *group*, not per row; batches that do not fit exact int64 arithmetic (float,
string, bool or skipped values, very wide ints) take the per-tuple path. Both paths
update the same per-group state, so they can alternate from epoch to epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from ..arith import INT64_MAX as _INT64_MAX
from ..arith import INT64_MIN as _INT64_MIN
from ..arith import ExactSum
from .columns import ColumnBatch
from .grouping import VECTOR_MIN, BatchCache, GroupSums, column_group_sums, group_sums
from .lazydelta import LazyDelta
from .operators import Aggregate, _Group
from .timestamp import Timestamp
from .zset import Row, ZSet, index_with


def _tuple_key(key_cols: Sequence[int]) -> Callable[[Row], tuple]:
    """``row -> tuple of the key columns`` (a C-level itemgetter where one exists)."""
    if not key_cols:
        return lambda r: ()
    if len(key_cols) == 1:
        i = key_cols[0]
        return lambda r: (r[i],)
    return itemgetter(*key_cols)


class GroupAggregate(Aggregate):
    """Incremental ``count``/``sum``/``min``/``max`` of a flat Z-set grouped by columns.

    Input: Z-set deltas of binding rows; ``key_cols`` are the grouping columns.
    Output: as :class:`Aggregate`, deltas of ``{key + (result,): 1}``.
    ``cache``: shared by the aggregates over one stream, so a batch is read once.
    ``columnar``, ``vectorised`` and ``per_tuple`` count the batches each path took
    (tests check each is exercised): a :class:`ColumnBatch` is grouped straight from
    its int64 columns (ADR 0090), a large tuple batch through ``group_sums``.
    """

    def __init__(
        self,
        func: str,
        key_cols: Sequence[int],
        value_fn: Callable[[Row], Any] | None = None,
        order_key: Callable[[Any], Any] | None = None,
        int_bits: int = 64,
        vector_min: int = VECTOR_MIN,
        cache: BatchCache | None = None,
        value_col: int | None = None,
    ) -> None:
        super().__init__(func, value_fn, order_key=order_key, int_bits=int_bits)
        self.key_cols = tuple(key_cols)
        self.key_fn = _tuple_key(self.key_cols)
        self.vector_min = vector_min
        self.cache = cache if cache is not None else BatchCache()
        #: The column ``value_fn`` reads when it is a plain column (a :class:`ColumnBatch`
        #: is then summed straight from that column).
        self.value_col = value_col
        self.vectorised = 0
        self.per_tuple = 0
        self.columnar = 0
        #: ``(output, {group: (old, new)})`` of the last batch folded by :meth:`_apply`
        #: (None after a general-path batch): a consumer that receives exactly that
        #: output object may read the group changes instead of re-deriving them.
        self.last: tuple[ZSet, dict[tuple, tuple[Any, Any]]] | None = None

    def eval(self, ts: Timestamp, delta: ZSet) -> ZSet:  # type: ignore[override]
        self.last = None
        if self.func in ("count", "sum"):
            if isinstance(delta, ColumnBatch) and (
                self.func == "count" or self.value_col is not None
            ):
                col = self.value_col if self.func == "sum" else None
                sums = column_group_sums(delta, self.key_cols, col, self.cache, ts)
                if sums is not None:
                    self.columnar += 1
                    return self._apply(sums)
            if len(delta) >= self.vector_min:
                value_fn = self.value_fn if self.func == "sum" else None
                sums = group_sums(delta, self.key_cols, value_fn, self.cache, ts)
                if sums is not None:
                    self.vectorised += 1
                    return self._apply(sums)
            else:
                sums = self._row_sums(delta)
                if sums is not None:
                    self.per_tuple += 1
                    return self._apply(sums)
        self.per_tuple += 1
        return super().eval(ts, index_with(self.key_fn, delta))

    def _row_sums(self, delta: ZSet) -> GroupSums | None:
        """:class:`GroupSums` of a small batch, row by row in exact Python ints (None if
        a summed value is not an ``int``: the general path handles every other type)."""
        key_fn = self.key_fn
        if self.func == "count":
            counts: dict[tuple, int] = {}
            get = counts.get
            for r, w in delta.items():
                k = key_fn(r)
                counts[k] = get(k, 0) + w
            return GroupSums(list(counts), list(counts.values()), None)
        value_fn = self.value_fn
        assert value_fn is not None
        acc: dict[tuple, list[int]] = {}
        for r, w in delta.items():
            v = value_fn(r)
            if type(v) is not int:
                return None
            k = key_fn(r)
            e = acc.get(k)
            if e is None:
                acc[k] = [w, v * w]
            else:
                e[0] += w
                e[1] += v * w
        totals = list(acc.values())
        return GroupSums(list(acc), [t[0] for t in totals], [t[1] for t in totals])

    def _apply(self, batch: GroupSums) -> ZSet:
        """Fold per-group totals into the group state; emit the changed results.

        The output is a :class:`ChangedGroups` (built into rows only if a consumer
        reads them: an :class:`~merklog.engine.incremental.AggregateJoin` reads the
        ``group -> (old, new)`` changes instead)."""
        changes: dict[tuple, tuple[Any, Any]] = {}
        groups = self.groups
        get = groups.get
        if self.func == "count":
            for key, dn in zip(batch.keys, batch.counts, strict=True):
                if not dn:
                    continue
                g = get(key)
                if g is None:
                    g = groups[key] = _Group()
                old = g.value
                n = g.n = g.n + dn
                if n > 0:
                    g.value = n
                    changes[key] = (old, n)
                else:
                    del groups[key]
                    g.value = None
                    if old is not None:
                        changes[key] = (old, None)
        else:
            result, no_value, wide = self._result, self.NO_VALUE, self.int_bits != 64
            sums = batch.sums if batch.sums is not None else [0] * len(batch.keys)
            for key, dn, ds in zip(batch.keys, batch.counts, sums, strict=True):
                if not dn and not ds:
                    continue
                g = get(key)
                if g is None:
                    g = groups[key] = _Group()
                    g.total = ExactSum()
                old = g.value
                n = g.n = g.n + dn
                t = g.total
                if ds:
                    t.itotal += ds  # type: ignore[union-attr]
                if n <= 0:
                    new = None
                    del groups[key]
                elif wide or t.nother or t.nfloat:  # type: ignore[union-attr]
                    new = result(g)
                else:  # an int sum: the value unless it leaves int64 (ExactSum.result)
                    total = t.itotal  # type: ignore[union-attr]
                    new = total if _INT64_MIN <= total <= _INT64_MAX else no_value
                g.value = new
                if old is new or (old == new and type(old) is type(new)):
                    continue
                changes[key] = (old, new)
        out = ChangedGroups(changes)
        self.last = (out, changes)
        return out  # type: ignore[return-value]


class ChangedGroups(LazyDelta):
    """The output Z-set of a batch: ``(*group, old): -1`` and ``(*group, new): +1`` per
    changed group, built from ``group -> (old, new)`` on first read (keys are distinct
    within a batch and old differs from new, so no two entries collide)."""

    __slots__ = ("changes", "_rows")

    def __init__(self, changes: dict[tuple, tuple[Any, Any]]) -> None:
        self.changes = changes
        self._rows: dict[tuple, int] | None = None

    def rows(self) -> dict[tuple, int]:
        d = self._rows
        if d is None:
            d = self._rows = {}
            for key, (old, new) in self.changes.items():
                if old is not None:
                    d[(*key, old)] = -1
                if new is not None:
                    d[(*key, new)] = 1
        return d

    def __bool__(self) -> bool:
        return bool(self.changes)  # a change has an old or a new row

    def __repr__(self) -> str:
        return f"ChangedGroups({self.rows()!r})"


__all__ = ["ChangedGroups", "GroupAggregate"]
