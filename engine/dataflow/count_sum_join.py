"""``count``/``sum`` aggregates over one stream joined to bindings that are their groups.

``stats(G, C, S) :- grp(G), C := count : sale(_, G, _), S := sum A : sale(_, G, A).``
compiled as ADR 0091 does costs, per changed group, a fold in each
:class:`~merklog.engine.dataflow.GroupAggregate` (a dict entry and an
:class:`~merklog.engine.arith.ExactSum` each), a value tuple in the join's table
and a Python loop over the group's bindings. When every aggregate of the run is a
``count`` or a ``sum`` of a plain column over the *same* stream, grouped by the
same columns, and the bindings are exactly the group keys (``grp(G)`` binds
``G``, the group), one operator does all of it (ADR 0104):

- each group key is mapped once to an integer id (a dict keyed by the engine-form
  values, so ``1``, ``1.0``, ``true``, ``"1"`` and ``x"01"`` are five groups);
- the state is columnar: the group's row count, its binding weight and one exact
  int64 total per ``sum``, in numpy arrays indexed by the id. A ``sum`` whose group
  has seen a value that is not an ``int`` (a ``Float``, a ``Bool``, a string), or
  whose total left int64, keeps an :class:`~merklog.engine.arith.ExactSum` for that
  group instead, until the group is simple again (the batch evaluator's
  definition: exact, rounded once, no value outside int64, wrapping at 32 bits in
  the Soufflé dialect);
- a large epoch (``vector_min`` rows or more) is folded with a handful of numpy
  operations: the batch's per-group totals (:func:`~.grouping.group_totals`),
  gathered old state, new state, one comparison per column, and the changed
  groups' rows built by C-level ``zip``/``map``. Smaller epochs, and batches
  whose values are not all exact ints, take a per-group Python path over the same
  state;
- the output is ``key + old values`` with the old binding weight negated and
  ``key + new values`` with the new weight, for the groups whose values changed
  (``δB`` alone emits ``key + values`` with the weight change), as a
  :class:`~.lazydelta.SignedRows` when every weight is ±1.

A group without rows has the defaults (``count`` and ``sum`` are 0), a group
whose ``sum`` has no value (it left int64, or summed a non-number) joins nothing:
the semantics of :class:`~merklog.engine.incremental.MultiAggregateJoin`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress
from operator import itemgetter
from typing import Any

import numpy as np

from ..arith import INT64_MAX as _INT64_MAX
from ..arith import INT64_MIN as _INT64_MIN
from ..arith import ExactSum, NoBinding
from .columns import ColumnBatch
from .group_aggregate import _tuple_key
from .grouping import _INT64_BOUND, BatchCache, _span, group_totals
from .lazydelta import SignedRows
from .operators import Operator
from .timestamp import Timestamp
from .zset import Row, ZSet

#: Epochs with at least this many changed rows (aggregated rows plus bindings) take
#: the numpy path; below it the fixed cost of its numpy calls outweighs the
#: per-group Python it replaces.
VECTOR_ROWS = 48

_tuple_add = tuple.__add__


def _unique(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.unique(a, return_inverse=True)`` by one sort (``numpy.unique`` imports
    ``numpy.ma`` on its first call: milliseconds a first epoch need not pay)."""
    order = np.argsort(a, kind="stable")
    ordered = a[order]
    first = np.empty(len(a), dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    inverse = np.empty(len(a), dtype=np.intp)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


def _wrap32(a: np.ndarray) -> np.ndarray:
    """int64 totals wrapped two's complement to int32 (the Soufflé dialect's ``sum``)."""
    return ((a + np.int64(2**31)) & np.int64(0xFFFFFFFF)) - np.int64(2**31)


def _merge(acc: ExactSum, part: int | ExactSum) -> None:
    """``acc += part`` (an int total or another accumulator), exactly."""
    if type(part) is int:
        acc.itotal += part
        return
    assert isinstance(part, ExactSum)
    acc.itotal += part.itotal
    acc.ftotal += part.ftotal
    acc.nfloat += part.nfloat
    acc.nother += part.nother


class CountSumJoin(Operator):
    """``B ⋈ (count/sum of S grouped by key)`` where every binding row *is* its key.

    Inputs: the bindings' delta, then the aggregated stream's delta. ``funcs``:
    each aggregate's function (``"count"`` or ``"sum"``), in the order their values
    extend the binding; ``value_cols``: the summed column of each (None for
    ``count``); ``key_cols``: the group columns of the aggregated stream.
    ``vectorised`` and ``per_group`` count the epochs each path took, ``columnar``
    the vectorised ones read straight from a :class:`~.columns.ColumnBatch`'s columns
    (tests check each runs).
    """

    idle_when_empty = True

    def __init__(
        self,
        funcs: Sequence[str],
        key_cols: Sequence[int],
        value_cols: Sequence[int | None],
        int_bits: int = 64,
        cache: BatchCache | None = None,
        vector_rows: int = VECTOR_ROWS,
    ) -> None:
        if any(f not in ("count", "sum") for f in funcs):
            raise ValueError("CountSumJoin folds count and sum only")
        self.funcs = tuple(funcs)
        self.key_cols = tuple(key_cols)
        self.key_fn = _tuple_key(self.key_cols)
        #: For each value position: -1 for ``count``, else the index of its sum.
        self._slot: list[int] = []
        self.sum_cols: list[int] = []
        for f, c in zip(funcs, value_cols, strict=True):
            if f == "sum":
                if c is None:
                    raise ValueError("a sum needs its value column")
                self._slot.append(len(self.sum_cols))
                self.sum_cols.append(c)
            else:
                self._slot.append(-1)
        self.int_bits = int_bits
        self.cache = cache if cache is not None else BatchCache()
        self.vector_rows = vector_rows
        self.defaults = (0,) * len(self.funcs)
        self._single = len(self.key_cols) == 1
        self._gid: dict[Any, int] = {}
        self._keys: list[tuple | None] = []  # id -> key tuple
        self._ikeys: list[Any] = []  # id -> id key (see _new_id)
        self._free: list[int] = []
        self._n = np.zeros(16, dtype=np.int64)  # rows per group (the count)
        self._bw = np.zeros(16, dtype=np.int64)  # the binding's weight
        self._s = [np.zeros(16, dtype=np.int64) for _ in self.sum_cols]
        #: Per sum: group id -> exact accumulator, for groups an int64 total cannot hold.
        self._exact: list[dict[int, ExactSum]] = [{} for _ in self.sum_cols]
        self.vectorised = 0
        self.per_group = 0
        self.columnar = 0  # of the vectorised epochs, those read from a ColumnBatch
        #: Groups a vectorised epoch handed to the per-group path (an exact accumulator,
        #: an int64 overflow of the total).
        self.slow_groups = 0

    def bind(self, nested: bool) -> None:
        if nested:
            raise ValueError("CountSumJoin runs in the root circuit only")
        super().bind(nested)

    # -- group ids
    # A group's id is found by its key tuple, or by the key's only value when there is
    # one group column (an int hashes faster than a 1-tuple, and the batch's column is
    # read without building the tuples).
    def _new_id(self, ikey: Any) -> int:
        return self._new_ids([ikey])[0]

    def _new_ids(self, ikeys: Sequence[Any]) -> list[int]:
        """Fresh ids for new id keys (freed ids first), the state arrays grown once."""
        free, ids = self._free, []
        while free and len(ids) < len(ikeys):
            ids.append(free.pop())
        start = len(self._keys)
        more = len(ikeys) - len(ids)
        if more:
            ids += range(start, start + more)
            self._keys += [None] * more
            self._ikeys += [None] * more
            if start + more > len(self._n):
                cap = 1 << (start + more - 1).bit_length()
                self._n = self._grown(self._n, cap)
                self._bw = self._grown(self._bw, cap)
                self._s = [self._grown(s, cap) for s in self._s]
        single = self._single
        for g, ikey in zip(ids, ikeys, strict=True):
            self._keys[g] = (ikey,) if single else ikey
            self._ikeys[g] = ikey
            self._gid[ikey] = g
        return ids

    @staticmethod
    def _grown(a: np.ndarray, cap: int) -> np.ndarray:
        out = np.zeros(cap, dtype=a.dtype)
        out[: len(a)] = a
        return out

    def _ids(self, ikeys: Sequence[Any]) -> list[int]:
        """The id of each id key (key tuple, or its value with one group column), new keys
        given fresh ids."""
        ids = list(map(self._gid.get, ikeys))
        if None in ids:
            at = [i for i, g in enumerate(ids) if g is None]
            new = list(dict.fromkeys(ikeys[i] for i in at))  # a key may repeat
            self._new_ids(new)
            get = self._gid.__getitem__
            for i in at:
                ids[i] = get(ikeys[i])
        return ids

    def _drop(self, g: int) -> None:
        """Forget an empty group without bindings (its id is reused)."""
        del self._gid[self._ikeys[g]]
        self._keys[g] = self._ikeys[g] = None
        self._n[g] = self._bw[g] = 0
        for s, exact in zip(self._s, self._exact, strict=True):
            s[g] = 0
            exact.pop(g, None)
        self._free.append(g)

    # -- evaluation
    def eval(self, ts: Timestamp, bindings: ZSet, source: ZSet) -> ZSet:  # type: ignore[override]
        neg: list[Row] = []
        pos: list[Row] = []
        extra: dict[Row, int] = {}
        large = len(source) + len(bindings) >= self.vector_rows
        if (large or isinstance(source, ColumnBatch)) and self._vector(
            ts, bindings, source, neg, pos, extra
        ):
            self.vectorised += 1
        else:
            self._per_group(bindings, source, neg, pos, extra)
            self.per_group += 1
        if extra:
            out = dict.fromkeys(neg, -1)
            out.update(dict.fromkeys(pos, 1))
            out.update(extra)
            return out
        return SignedRows(neg, pos)

    # -- the per-group path
    def _values(self, g: int) -> tuple | None:
        """Group ``g``'s aggregate values (None: a sum without value blocks the join)."""
        n = int(self._n[g])
        if n <= 0:
            return self.defaults
        out = []
        for slot in self._slot:
            if slot < 0:
                out.append(n)
                continue
            e = self._exact[slot].get(g)
            if e is None:
                v = int(self._s[slot][g])
                if self.int_bits == 32:
                    v = ((v + 2**31) & 0xFFFFFFFF) - 2**31
                out.append(v)
                continue
            try:
                out.append(e.result(self.int_bits))
            except NoBinding:
                return None
        return tuple(out)

    def _fold(self, g: int, dn: int, parts: Sequence[int | ExactSum]) -> None:
        """Add a batch's totals for group ``g`` (row count ``dn``, per sum an int total or
        an :class:`ExactSum`) to its state, exactly."""
        n = int(self._n[g]) + dn
        if n <= 0:  # no rows left: nothing to sum
            self._n[g] = 0
            for j, s in enumerate(self._s):
                s[g] = 0
                self._exact[j].pop(g, None)
            return
        self._n[g] = n
        for j, part in enumerate(parts):
            s, exact = self._s[j], self._exact[j]
            e = exact.get(g)
            if e is None:
                if type(part) is int:
                    total = int(s[g]) + part
                    if _INT64_MIN <= total <= _INT64_MAX:
                        s[g] = total
                        continue
                    e = ExactSum()
                    e.itotal = total
                else:
                    e = ExactSum()
                    e.itotal = int(s[g])
                    _merge(e, part)
                exact[g] = e
                s[g] = 0
                continue
            _merge(e, part)
            if not (e.nfloat or e.ftotal or e.nother) and _INT64_MIN <= e.itotal <= _INT64_MAX:
                s[g] = e.itotal  # simple again: back to the int64 column
                del exact[g]

    def _touch(
        self,
        key: tuple,
        dn: int,
        parts: Sequence[int | ExactSum],
        dbw: int,
        neg: list[Row],
        pos: list[Row],
        extra: dict[Row, int],
    ) -> None:
        """Apply one group's changes and emit its rows."""
        ikey = key[0] if self._single else key
        g = self._gid.get(ikey)
        if g is None:
            g = self._new_id(ikey)
        old, old_bw = self._values(g), int(self._bw[g])
        if dn or any(parts):
            self._fold(g, dn, parts)
        new_bw = old_bw + dbw
        if dbw:
            self._bw[g] = new_bw
        new = self._values(g)
        if old == new and (old is None or tuple(map(type, old)) == tuple(map(type, new))):  # type: ignore[arg-type]
            d = new_bw - old_bw
            if d and new is not None:
                _put(key + new, d, neg, pos, extra)
        else:
            if old_bw and old is not None:
                _put(key + old, -old_bw, neg, pos, extra)
            if new_bw and new is not None:
                _put(key + new, new_bw, neg, pos, extra)
        if not new_bw and not self._n[g]:
            self._drop(g)

    def _per_group(
        self,
        bindings: Mapping[Row, int],
        source: Mapping[Row, int],
        neg: list[Row],
        pos: list[Row],
        extra: dict[Row, int],
    ) -> None:
        key_fn, cols = self.key_fn, self.sum_cols
        acc: dict[tuple, list] = {}
        for r, w in source.items():
            k = key_fn(r)
            e = acc.get(k)
            if e is None:
                e = acc[k] = [0] * (1 + len(cols))
            e[0] += w
            for j, c in enumerate(cols, 1):
                v, t = r[c], e[j]
                if type(v) is int and type(t) is int:
                    e[j] = t + v * w
                    continue
                if type(t) is int:
                    x = ExactSum()
                    x.itotal = t
                    e[j] = t = x
                t.add(v, w)
        zero = [0] * len(cols)
        for k, e in acc.items():
            self._touch(k, e[0], e[1:], bindings.get(k, 0), neg, pos, extra)
        for k, w in bindings.items():
            if k not in acc:
                self._touch(k, 0, zero, w, neg, pos, extra)

    # -- the numpy path
    def _source_totals(
        self, ts: Timestamp, source: Mapping[Row, int]
    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None:
        """The source batch per group: (distinct group ids, row counts, per sum the total
        of ``value x weight``), int64 and exact; None when a summed value is not an
        ``int`` or a total could leave int64."""
        if isinstance(source, ColumnBatch):
            tot = group_totals(source, self.key_cols, self.sum_cols, self.cache, ts)
            if tot is None:
                return None
            self.columnar += 1
            ikeys = list(map(itemgetter(0), tot.keys)) if self._single else tot.keys
            return np.array(self._ids(ikeys), dtype=np.intp), tot.counts, tot.sums
        rows = list(source)
        n = len(rows)
        weights = set(source.values())
        if len(weights) == 1:
            w: Any = weights.pop()
            wspan = abs(w)
        else:
            w = np.fromiter(source.values(), dtype=np.int64, count=n)
            wspan = _span(w)
        if wspan * n >= _INT64_BOUND:
            return None
        values = []
        for c in self.sum_cols:
            col = list(map(itemgetter(c), rows))
            if set(map(type, col)) != {int}:
                return None
            try:
                v = np.fromiter(col, dtype=np.int64, count=n)
            except OverflowError:
                return None
            # Every partial sum of value x weight stays below n * |v| * |w| < 2**63.
            if _span(v) * wspan * n >= _INT64_BOUND:
                return None
            values.append(v * w)
        if self._single:
            ikeys = list(map(itemgetter(self.key_cols[0]), rows))
        else:
            ikeys = list(map(self.key_fn, rows))
        gids = np.fromiter(self._ids(ikeys), dtype=np.intp, count=n)
        cap = len(self._keys)
        if cap <= 4 * n + 64:  # add into id-indexed arrays: no sort
            seen = np.zeros(cap, dtype=bool)
            seen[gids] = True
            touched = np.flatnonzero(seen)
            where = gids
            size = cap
        else:
            touched, where = _unique(gids)
            size = len(touched)
        if type(w) is int:
            dn = np.bincount(where, minlength=size).astype(np.int64)
            if w != 1:
                dn *= w
        else:
            dn = np.zeros(size, dtype=np.int64)
            np.add.at(dn, where, w)
        ds = []
        for v in values:
            acc = np.zeros(size, dtype=np.int64)
            np.add.at(acc, where, v)
            ds.append(acc)
        if size != len(touched):
            dn = dn[touched]
            ds = [d[touched] for d in ds]
        return touched, dn, ds

    def _vector(
        self,
        ts: Timestamp,
        bindings: Mapping[Row, int],
        source: Mapping[Row, int],
        neg: list[Row],
        pos: list[Row],
        extra: dict[Row, int],
    ) -> bool:
        """Fold a large epoch with numpy (False, and nothing changed, when the batch does
        not fit exact int64 arithmetic: the caller takes the per-group path)."""
        nsum = len(self.sum_cols)
        if source:
            totals = self._source_totals(ts, source)
            if totals is None:
                return False
            ids_s, dn, ds = totals
        else:
            ids_s, dn, ds = (
                np.zeros(0, np.intp),
                np.zeros(0, np.int64),
                [np.zeros(0, np.int64)] * nsum,
            )
        if bindings:
            brows = list(bindings)
            ikeys = list(map(itemgetter(0), brows)) if self._single else brows
            bdw = np.fromiter(bindings.values(), dtype=np.int64, count=len(brows))
            ids_b = np.array(self._ids(ikeys), dtype=np.intp)
            touched = _unique(np.concatenate([ids_s, ids_b]))[0]
            at_s = np.searchsorted(touched, ids_s)
            dn_t = np.zeros(len(touched), np.int64)
            dn_t[at_s] = dn
            ds_t = []
            for d in ds:
                x = np.zeros(len(touched), np.int64)
                x[at_s] = d
                ds_t.append(x)
            dbw_t = np.zeros(len(touched), np.int64)
            dbw_t[np.searchsorted(touched, ids_b)] = bdw
        else:
            touched, dn_t, ds_t, dbw_t = ids_s, dn, ds, None
        old_n, old_bw = self._n[touched], self._bw[touched]
        new_n = old_n + dn_t
        new_bw = old_bw if dbw_t is None else old_bw + dbw_t
        old_s = [s[touched] for s in self._s]
        new_s = [o + d for o, d in zip(old_s, ds_t, strict=True)]
        # Groups the columns cannot fold: an exact accumulator, an int64 overflow of the
        # total, fewer rows than none (only ever from invalid input; reset as per group).
        slow = new_n < 0
        for o, d, x in zip(old_s, ds_t, new_s, strict=True):
            slow |= ((o ^ x) & (d ^ x)) < 0
        for exact in self._exact:
            if exact:
                slow |= np.isin(touched, np.fromiter(exact, np.intp, len(exact)))
        any_slow = bool(slow.any())
        if any_slow:
            fast = ~slow
            ft = touched[fast]
            self._n[ft] = new_n[fast]
            self._bw[ft] = new_bw[fast]
            for s, x in zip(self._s, new_s, strict=True):
                s[ft] = x[fast]
        else:
            fast = None
            self._n[touched] = new_n
            if dbw_t is not None:
                self._bw[touched] = new_bw
            for s, x in zip(self._s, new_s, strict=True):
                s[touched] = x
        if self.int_bits == 32:
            old_s = [_wrap32(x) for x in old_s]
            new_s = [_wrap32(x) for x in new_s]
        old_cols = [old_n if slot < 0 else old_s[slot] for slot in self._slot]
        new_cols = [new_n if slot < 0 else new_s[slot] for slot in self._slot]
        changed = old_cols[0] != new_cols[0]
        for o, x in zip(old_cols[1:], new_cols[1:], strict=True):
            changed |= o != x
        if fast is not None:
            changed &= fast
        tlist = touched.tolist()
        self._emit(tlist, old_cols, changed & (old_bw != 0), -old_bw, neg, pos, extra)
        self._emit(tlist, new_cols, changed & (new_bw != 0), new_bw, neg, pos, extra)
        if dbw_t is not None:
            same = ~changed & (dbw_t != 0)
            if fast is not None:
                same &= fast
            self._emit(tlist, new_cols, same, dbw_t, neg, pos, extra)
        if any_slow:
            zero = np.zeros(len(touched), np.int64)
            dbw_l = (dbw_t if dbw_t is not None else zero).tolist()
            dn_l = dn_t.tolist()
            ds_l = [d.tolist() for d in ds_t]
            self.slow_groups += int(slow.sum())
            for i in np.flatnonzero(slow).tolist():
                parts = [d[i] for d in ds_l]
                key = self._keys[tlist[i]]
                assert key is not None
                self._touch(key, dn_l[i], parts, dbw_l[i], neg, pos, extra)
        empty = (new_n == 0) & (new_bw == 0)
        if fast is not None:
            empty &= fast
        if empty.any():
            for g in touched[empty].tolist():
                self._drop(g)
        return True

    def _emit(
        self,
        ids: list[int],
        cols: list[np.ndarray],
        mask: np.ndarray,
        weights: np.ndarray,
        neg: list[Row],
        pos: list[Row],
        extra: dict[Row, int],
    ) -> None:
        """``key + values`` of the masked groups with their weights: into ``pos``/``neg``
        when ±1 (C-level ``zip``/``map``), else into ``extra``."""
        if not mask.any():
            return
        sel = list(compress(ids, mask.tolist()))
        values = [c[mask].tolist() for c in cols]
        if self._single:
            rows = list(zip(map(self._ikeys.__getitem__, sel), *values, strict=True))
        else:
            keys = map(self._keys.__getitem__, sel)
            rows = list(map(_tuple_add, keys, zip(*values, strict=True)))  # type: ignore[arg-type]
        w = weights[mask]
        if (w == 1).all():
            pos += rows
        elif (w == -1).all():
            neg += rows
        else:
            for r, x in zip(rows, w.tolist(), strict=True):
                _put(r, x, neg, pos, extra)


def _put(row: Row, w: int, neg: list[Row], pos: list[Row], extra: dict[Row, int]) -> None:
    if w == 1:
        pos.append(row)
    elif w == -1:
        neg.append(row)
    else:
        extra[row] = w


__all__ = ["VECTOR_ROWS", "CountSumJoin"]
