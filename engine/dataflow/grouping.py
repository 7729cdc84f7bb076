"""Vectorised grouping of a large Z-set batch: per-group weight and value sums in numpy.

The per-tuple path of a grouped aggregate first indexes the batch
(``key -> {row: weight}``, a dict insert per row) and then walks each group. For a
batch of thousands of rows (a bulk load, a large epoch) that per-row Python work
dominates, although ``count`` and ``sum`` need only two numbers per group: the sum
of the weights and the sum of ``value x weight``. :func:`group_sums` computes them
column-wise, in the spirit of the DBSP paper's batches and Feldera's ``dbsp``
crate (batches as columns, consolidation by grouping), with every per-row step a
C loop:

- the key column(s) are read with :func:`operator.itemgetter` and factorised with
  dicts keyed by the *engine-form* values themselves, so value identity is the
  engine's (``1``, ``Float(1.0)``, ``TRUE``, ``"1"`` and ``b"\\x01"`` are five
  groups; no numpy dtype ever decides it);
- weights, and for ``sum`` the values, become ``int64`` arrays only when every
  value is a Python ``int`` (exact type: engine floats are :class:`Float`, bools
  :class:`Bool`) and no partial sum can leave int64; the sums then accumulate
  exactly with ``numpy.add.at``.

Anything else — float, string, bool or skipped values, ints too wide for the
guard — returns ``None`` and the caller takes the per-tuple path, which keeps the
exact :class:`~merklog.engine.arith.ExactSum` semantics for every value type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from .columns import ColumnBatch
from .zset import Row

#: Batches of at least this many rows take the vectorised path (below it the fixed
#: cost of a few numpy calls outweighs the per-row dict work it replaces).
VECTOR_MIN = 256

_INT64_BOUND = 2**63


@dataclass(frozen=True, slots=True)
class GroupSums:
    """One batch reduced per group: ``keys[i]`` (a tuple, the group) has total weight
    ``counts[i]`` and, when values were summed, total ``value x weight`` ``sums[i]``."""

    keys: list[tuple]
    counts: list[int]
    sums: list[int] | None


def _int64(values: Iterable[Any], n: int, checked: bool = False) -> np.ndarray | None:
    """``values`` as int64 if every one is an ``int`` (exact type) inside int64, else None.
    ``checked``: the values are known to be ints (Z-set weights), only the range is."""
    if n and not checked and set(map(type, values)) != {int}:
        return None
    try:
        return np.fromiter(values, dtype=np.int64, count=n)
    except OverflowError:
        return None


def _span(a: np.ndarray) -> int:
    """The largest absolute value in ``a`` (a Python int: no int64 overflow)."""
    return max(abs(int(a.max())), abs(int(a.min()))) if len(a) else 0


class Batch:
    """A Z-set batch read column by column, each piece at most once.

    Aggregates over the same stream share one :class:`Batch` per timestamp through a
    :class:`BatchCache`, so ``count`` and ``sum`` grouped by the same columns read the
    rows and factorise the keys once.
    """

    __slots__ = ("rows", "_weights", "_groups")

    def __init__(self, delta: Mapping[Row, int]) -> None:
        self.rows = list(delta)
        w = _int64(delta.values(), len(self.rows), checked=True)
        self._weights = None if w is None else (w, _span(w))
        self._groups: dict[tuple[int, ...], tuple[list[tuple], np.ndarray]] = {}

    def weights(self) -> tuple[np.ndarray, int] | None:
        """The weights as int64 and their largest absolute value, or None if too wide."""
        return self._weights

    def groups(self, key_cols: Sequence[int]) -> tuple[list[tuple], np.ndarray]:
        """The distinct group keys (first-seen order) and each row's group code.

        Factorising with dicts keyed by engine-form values keeps the engine's value
        identity; every per-row step (column read, dict build, code lookup) runs in C.
        """
        cols = tuple(key_cols)
        hit = self._groups.get(cols)
        if hit is not None:
            return hit
        rows, n = self.rows, len(self.rows)
        if not cols:
            out: tuple[list[tuple], np.ndarray] = ([()], np.zeros(n, dtype=np.intp))
        else:
            col = list(map(itemgetter(*cols), rows))
            uniq = dict.fromkeys(col)
            code_of = dict(zip(uniq, range(len(uniq)), strict=True))
            codes = np.fromiter(map(code_of.__getitem__, col), dtype=np.intp, count=n)
            keys = [(k,) for k in uniq] if len(cols) == 1 else list(uniq)
            out = (keys, codes)
        self._groups[cols] = out
        return out


class BatchCache:
    """The :class:`Batch` of the last delta seen on one stream.

    A stream has one value per timestamp, so the timestamp (with the delta's
    ``id`` and size as guards) says whether a second aggregate sees the batch the
    first one read. The delta itself is not held, so a bulk epoch's dict is freed
    when the circuit drops it; the batch keeps the row list and the int64 columns
    until the next batch arrives.
    """

    __slots__ = ("_batch", "_seen")

    def __init__(self) -> None:
        self._batch: Batch | None = None
        self._seen: tuple[Any, int, int] | None = None

    def get(self, delta: Mapping[Row, int], ts: Any = None) -> Any:
        """The :class:`Batch` (or, for a :class:`ColumnBatch`, the :class:`ColumnReader`)
        of ``delta``, shared with the other aggregates over the stream."""
        seen = (ts, id(delta), len(delta))
        batch = self._batch
        if batch is None or ts is None or seen != self._seen:
            batch = ColumnReader(delta) if isinstance(delta, ColumnBatch) else Batch(delta)
            self._batch = batch
            self._seen = seen
        return batch


def _factorise_column(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct values, each row's code)`` of an int64 column: a ``bincount`` over the
    value range when it is small next to the column, else pyarrow's hash encoding."""
    n = len(col)
    lo, hi = int(col.min()), int(col.max())
    if hi - lo <= 4 * n + 1024:
        off = col - np.int64(lo)  # exact: 0 <= col - lo <= hi - lo
        present = np.bincount(off, minlength=hi - lo + 1) > 0
        remap = np.cumsum(present) - 1
        return np.flatnonzero(present).astype(np.int64) + np.int64(lo), remap[off]
    import pyarrow as pa
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(pa.array(col))
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.intp)
    return enc.dictionary.to_numpy(zero_copy_only=False).astype(np.int64), codes


class ColumnReader:
    """Group codes of a :class:`ColumnBatch`, per tuple of key columns, computed once.

    Keys leave as tuples of Python ints, the engine form of ints: an int64 column
    only ever holds real ints (ADR 0090), so no float or bool can meet them here."""

    __slots__ = ("batch", "_groups")

    def __init__(self, batch: ColumnBatch) -> None:
        self.batch = batch
        self._groups: dict[tuple[int, ...], tuple[list[tuple], np.ndarray] | None] = {}

    def groups(self, key_cols: Sequence[int]) -> tuple[list[tuple], np.ndarray] | None:
        """The distinct group keys and each row's group code (None if the combined code
        of several key columns would not fit int64: the caller reads rows instead)."""
        cols = tuple(key_cols)
        if cols in self._groups:
            return self._groups[cols]
        n = len(self.batch)
        out: tuple[list[tuple], np.ndarray] | None
        if not cols or not n:
            out = ([()] if n else [], np.zeros(n, dtype=np.intp))
        else:
            parts = [_factorise_column(self.batch.column(c)) for c in cols]
            if len(parts) == 1:
                uniq, codes = parts[0]
                out = ([(v,) for v in uniq.tolist()], codes)
            else:
                size = 1
                for uniq, _codes in parts:
                    size *= len(uniq)
                if size >= 2**62:
                    out = None
                else:
                    combined = np.zeros(n, dtype=np.int64)
                    for uniq, codes in parts:
                        combined *= len(uniq)
                        combined += codes
                    ucomb, codes = _factorise_column(combined)
                    decoded = []
                    rest = ucomb
                    for uniq, _codes in reversed(parts):
                        decoded.append(uniq[rest % len(uniq)].tolist())
                        rest = rest // len(uniq)
                    keys = list(zip(*reversed(decoded), strict=True))
                    out = (keys, codes)
        self._groups[cols] = out
        return out


def _column_groups(
    delta: ColumnBatch, key_cols: Sequence[int], cache: BatchCache | None, ts: Any
) -> tuple[list[tuple], np.ndarray, int, int, np.ndarray] | None:
    """The groups of a :class:`ColumnBatch` read from its columns: the keys, each row's
    group code, the row count, the batch's one weight and each group's total weight.
    None when the key columns cannot be grouped column-wise."""
    reader = cache.get(delta, ts) if cache is not None else ColumnReader(delta)
    grouped = reader.groups(key_cols)
    if grouped is None:
        return None
    keys, codes = grouped
    n, w = len(delta), delta.weight
    return keys, codes, n, w, np.bincount(codes, minlength=len(keys)).astype(np.int64) * w


def column_group_sums(
    delta: ColumnBatch,
    key_cols: Sequence[int],
    value_col: int | None = None,
    cache: BatchCache | None = None,
    ts: Any = None,
) -> GroupSums | None:
    """:func:`group_sums` of a :class:`ColumnBatch`, read straight from its columns (the
    batch's weight is the same for every row). None if a sum could leave int64."""
    grouped = _column_groups(delta, key_cols, cache, ts)
    if grouped is None:
        return None
    keys, codes, n, w, counts = grouped
    sums = None
    if value_col is not None:
        v = delta.column(value_col)
        if _span(v) * abs(w) * max(n, 1) >= _INT64_BOUND:
            return None
        acc = np.zeros(len(keys), dtype=np.int64)
        np.add.at(acc, codes, v)
        sums = (acc * w).tolist()
    return GroupSums(keys, counts.tolist(), sums)


def _weighted_rows(
    delta: Mapping[Row, int], cache: BatchCache | None, ts: Any
) -> tuple[Batch, int, np.ndarray, int] | None:
    """The batch of ``delta`` with its rows, row count, int64 weights and their largest
    magnitude; None when the weights alone could leave int64 (exact arithmetic then)."""
    batch = cache.get(delta, ts) if cache is not None else Batch(delta)
    n = len(batch.rows)
    weighted = batch.weights()
    if weighted is None:
        return None
    w, wspan = weighted
    if wspan * n >= _INT64_BOUND:
        return None
    return batch, n, w, wspan


def group_sums(
    delta: Mapping[Row, int],
    key_cols: Sequence[int],
    value_fn: Callable[[Row], Any] | None = None,
    cache: BatchCache | None = None,
    ts: Any = None,
) -> GroupSums | None:
    """Per-group total weight (and total ``value_fn(row) x weight``) of a Z-set batch.

    Returns None when the batch does not fit exact int64 arithmetic (see the module
    docstring); the caller then aggregates tuple by tuple. ``cache`` and ``ts`` (the
    stream's timestamp) let aggregates over one stream share the batch's reading.
    """
    read = _weighted_rows(delta, cache, ts)
    if read is None:
        return None
    batch, n, w, wspan = read
    keys, codes = batch.groups(key_cols)
    counts = np.zeros(len(keys), dtype=np.int64)
    np.add.at(counts, codes, w)
    sums = None
    if value_fn is not None:
        v = _int64(list(map(value_fn, batch.rows)), n)
        if v is None:
            return None
        # Every partial sum of value x weight stays below n * |v| * |w| < 2**63.
        if _span(v) * wspan * n >= _INT64_BOUND:
            return None
        acc = np.zeros(len(keys), dtype=np.int64)
        np.add.at(acc, codes, v * w)
        sums = acc.tolist()
    return GroupSums(keys, counts.tolist(), sums)


@dataclass(frozen=True, slots=True)
class GroupTotals:
    """A batch reduced per group as int64 arrays: ``keys[i]`` (a tuple) has total weight
    ``counts[i]`` and, per summed column ``j``, total ``value x weight`` ``sums[j][i]``."""

    keys: list[tuple]
    counts: np.ndarray
    sums: list[np.ndarray]


def group_totals(
    delta: Mapping[Row, int],
    key_cols: Sequence[int],
    value_cols: Sequence[int],
    cache: BatchCache | None = None,
    ts: Any = None,
) -> GroupTotals | None:
    """Per-group total weight and total ``row[c] x weight`` for each column ``c`` of
    ``value_cols``, as int64 arrays: :func:`column_group_sums` / :func:`group_sums`
    for several summed columns at once, the keys factorised once. None when a summed
    value is not an ``int`` (exact type) or a total could leave int64: the caller
    then aggregates row by row in exact arithmetic."""
    if isinstance(delta, ColumnBatch):
        grouped = _column_groups(delta, key_cols, cache, ts)
        if grouped is None:
            return None
        keys, codes, n, w, counts = grouped
        sums = []
        for c in value_cols:
            v = delta.column(c)
            if _span(v) * abs(w) * max(n, 1) >= _INT64_BOUND:
                return None
            acc = np.zeros(len(keys), dtype=np.int64)
            np.add.at(acc, codes, v)
            sums.append(acc * w)
        return GroupTotals(keys, counts, sums)
    read = _weighted_rows(delta, cache, ts)
    if read is None:
        return None
    batch, n, w, wspan = read
    values = []
    for c in value_cols:
        v = _int64(list(map(itemgetter(c), batch.rows)), n)
        # Every partial sum of value x weight stays below n * |v| * |w| < 2**63.
        if v is None or _span(v) * wspan * n >= _INT64_BOUND:
            return None
        values.append(v)
    keys, codes = batch.groups(key_cols)
    counts = np.zeros(len(keys), dtype=np.int64)
    np.add.at(counts, codes, w)
    sums = []
    for v in values:
        acc = np.zeros(len(keys), dtype=np.int64)
        np.add.at(acc, codes, v * w)
        sums.append(acc)
    return GroupTotals(keys, counts, sums)


__all__ = [
    "VECTOR_MIN",
    "Batch",
    "BatchCache",
    "ColumnReader",
    "GroupSums",
    "GroupTotals",
    "column_group_sums",
    "group_sums",
    "group_totals",
]
