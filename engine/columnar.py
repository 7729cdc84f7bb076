"""Set-at-a-time execution of a stratum over int64 column arrays (numpy).

Used by :mod:`merklog.engine.batch` for strata whose relations are large and
hold only integers (the shape of analytics and graph workloads). A binding set
is a dict ``var -> int64 array`` (all the same length); a selection is a
vectorised join that probes a sorted index of the relation (``searchsorted``
on packed keys, built once per relation version), negation is a vectorised
anti-join, aggregation groups packed keys with ``np.unique``/``reduceat``, and
semi-naive deduplication keeps one packed int64 key per derived tuple.

Values are in engine form (:mod:`merklog.engine.values`). Only real ints
(``type(v) is int``, inside int64) are stored as themselves in int64 columns;
strings, bytes, CIDs, floats and bools are dictionary-encoded as ids keyed by
their engine value (so ``1``, ``1.0`` and ``true`` get three different codes
and joins keep them apart). Encoded values keep identity only: a stratum holding
them may use ``==``/``!=`` and ``count`` only, and none of its comparisons at
all once floats are encoded (``1 == 1.0`` holds numerically, but their codes
differ).

Anything outside that shape (CID selections, arithmetic, out-of-range values,
nullary relations) raises :class:`Ineligible` before the stratum's results are
committed, and the caller falls back to the tuple-at-a-time path, so both paths
always give the same relations (the tests compare them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from merklog.store import Link

from . import ast, interrupt, planner
from .errors import MAX_FIXPOINT_ITERATIONS, EngineError, IterationLimitError
from .values import Bool, Float, to_engine

#: Strata whose input relations hold fewer tuples than this run tuple at a time
#: (unless an input is already columnar).
AUTO_THRESHOLD = 1_000

I64 = np.int64
I64_BYTES = 8


class Ineligible(EngineError):
    """The stratum is outside what the columnar executor handles (the batch evaluator
    falls back to tuple at a time; raised to the caller only when columnar is forced)."""

    code = "columnar_ineligible"
    default_hint = "use backend auto or tuple"


# ----------------------------------------------------------------------------- relations


def rel_columns(rel: Any) -> list[np.ndarray]:
    """The int64 columns of an integer-only relation (a :class:`~merklog.engine.batch.Rel`,
    duck-typed: ``cols``, ``decoder``, ``tuples``), cached on it."""
    if rel.cols is not None and rel.decoder is None:
        return rel.cols
    objects, _low = scan_values(rel.tuples)
    if objects:
        raise Ineligible("non-integer value")
    cols = encode_rows(rel.tuples, None)
    rel.cols = cols
    return cols


_ENCODABLE = (str, bytes, Link, Float, Bool)
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def scan_values(tuples: set, encodable: tuple = _ENCODABLE) -> tuple[set, int | None]:
    """Check a tuple set is columnar-shaped: (its non-integer encodable values, least int).

    ``encodable`` narrows what may be encoded, so a stratum that could not use a
    float (say) gives up at the first one instead of scanning the whole relation."""
    if not tuples:
        raise Ineligible("empty relation of unknown arity")
    arity = len(next(iter(tuples)))
    if arity == 0:
        raise Ineligible("nullary relation")
    objects: set = set()
    low: int | None = None
    high: int | None = None
    for t in tuples:
        if len(t) != arity:
            raise Ineligible("ragged relation")
        for v in t:
            kind = type(v)
            if kind is int:
                if low is None or v < low:
                    low = v
                if high is None or v > high:
                    high = v
            elif kind in encodable:
                objects.add(v)
            else:
                raise Ineligible(f"{kind.__name__} value")
    if low is not None and (low < _INT64_MIN or high > _INT64_MAX):  # type: ignore[operator]
        raise Ineligible("integer outside int64")
    return objects, low


def encode_rows(tuples: set, ids: dict | None) -> list[np.ndarray]:
    """Tuples as int64 columns, non-integers replaced by their ``ids``."""
    arity = len(next(iter(tuples)))
    if ids:
        get = ids.get
        rows = [tuple(get(v, v) if type(v) is not int else v for v in t) for t in tuples]
    else:
        rows = list(tuples)
    arr = np.array(rows, dtype=I64)
    return [np.ascontiguousarray(arr[:, j]) for j in range(arity)]


class Encoder:
    """Dictionary encoding of a stratum's strings, bytes and CIDs as int64 ids.

    Ids are allocated just below the smallest integer of the stratum, so they
    never collide with an integer and keep the value range (hence packed keys)
    compact. Only equality survives encoding, so strata holding such values may
    compare with ``==``/``!=`` only and aggregate with ``count`` only.
    """

    def __init__(self, objects: set, int_lo: int) -> None:
        self.base = int_lo - 1
        self.values: list = []
        self.ids: dict = {}
        #: Some encoded value is a float: comparisons would compare codes, not numbers.
        self.has_float = False
        self.extend(objects)

    def extend(self, objects: Iterable) -> None:
        """Give ids to values not seen yet (existing ids never change)."""
        new = [v for v in objects if v not in self.ids]
        if any(type(v) is Float for v in new):
            self.has_float = True
        if self.base - len(self.values) - len(new) < -(2**63):
            raise Ineligible("no room for value ids below the integers")
        for v in new:
            self.ids[v] = self.base - len(self.values)
            self.values.append(v)

    @property
    def low(self) -> int:
        return self.base - len(self.values) + 1

    def const(self, value: Any) -> int:
        if type(value) is int:
            return value
        got = self.ids.get(value) if type(value) in _ENCODABLE else None
        if got is None:
            raise Ineligible("constant outside the encoding")
        return got

    def decoder(self) -> tuple[int, list] | None:
        return (self.base, self.values) if self.values else None


def decode_columns(cols: list[np.ndarray], decoder: tuple[int, list] | None) -> set:
    """Tuples of (possibly encoded) int64 columns.

    Decoded :data:`DECODE_CHUNK` rows at a time, with an interrupt check between two
    chunks (:func:`~.interrupt.check`): four million rows of a query's cross product
    take seconds to become tuples, which its client leaving or the memory budget
    stops."""
    if not cols:
        return set()
    table = None
    if decoder is not None:
        table = np.empty(len(decoder[1]), dtype=object)
        table[:] = decoder[1]
    n = len(cols[0])
    if n <= DECODE_CHUNK:
        return set(zip(*_decoded(cols, decoder, table), strict=True))
    out: set = set()
    for start in range(0, n, DECODE_CHUNK):
        interrupt.check()
        part = [c[start : start + DECODE_CHUNK] for c in cols]
        out.update(zip(*_decoded(part, decoder, table), strict=True))
    return out


#: Rows decoded between two interrupt checks (:func:`decode_columns`).
DECODE_CHUNK = 1 << 18


def _decoded(
    cols: list[np.ndarray], decoder: tuple[int, list] | None, table: np.ndarray | None
) -> list[list]:
    """Each column as a list of engine values (``table``: ``decoder``'s values as an
    object array)."""
    if decoder is None or table is None:
        return [c.tolist() for c in cols]
    base = decoder[0]
    lists = []
    for c in cols:
        mask = c <= base
        if not mask.any():
            lists.append(c.tolist())
            continue
        out = c.astype(object)
        out[mask] = table[base - c[mask]]
        lists.append(out.tolist())
    return lists


def column_mask(
    cols: list[np.ndarray], consts: Mapping[int, Any], decoder: tuple[int, list] | None
) -> np.ndarray | None:
    """The rows of (possibly encoded, see :func:`decode_columns`) int64 columns whose
    column ``c`` holds the engine value ``consts[c]``, as a boolean mask; None when no
    row can (a value the columns cannot hold). Identity as :func:`~.values.row_holds`
    has it: an int matches only an int entry, any other value only its own code."""
    base, values = decoder if decoder is not None else (None, [])
    mask = np.ones(len(cols[0]) if cols else 0, dtype=bool)
    for c, v in consts.items():
        if type(v) is int:
            if not -(2**63) <= v < 2**63 or (base is not None and v <= base):
                return None  # ints are themselves; a code is never an int
            mask &= cols[c] == v
            continue
        codes = [base - i for i, x in enumerate(values) if type(x) is type(v) and x == v]
        if not codes:
            return None
        mask &= np.isin(cols[c], np.array(codes, dtype=I64))
    return mask


class Packer:
    """Injective packing of int64 rows into one int64 key (when the value range allows)."""

    __slots__ = ("lows", "bits", "shifts")

    def __init__(self, lows: list[int], highs: list[int]) -> None:
        self.lows = lows
        self.bits = [max(1, int(h - lo).bit_length()) for lo, h in zip(lows, highs, strict=True)]
        total = sum(self.bits)
        if total > 62:
            raise Ineligible("key too wide to pack")
        shifts, acc = [], 0
        for b in reversed(self.bits):
            shifts.append(acc)
            acc += b
        self.shifts = list(reversed(shifts))

    @classmethod
    def for_columns(cls, cols: list[np.ndarray]) -> Packer:
        if not cols or len(cols[0]) == 0:
            return cls([0] * len(cols), [1] * len(cols))
        return cls([int(c.min()) for c in cols], [int(c.max()) for c in cols])

    def in_range(self, cols: list[np.ndarray]) -> np.ndarray | None:
        """Mask of rows inside the packable range (None when every row is)."""
        mask = None
        for c, lo, b in zip(cols, self.lows, self.bits, strict=True):
            hi = lo + (1 << b) - 1
            if len(c) and (int(c.min()) < lo or int(c.max()) > hi):
                m = (c >= lo) & (c <= hi)
                mask = m if mask is None else mask & m
        return mask

    def pack(self, cols: list[np.ndarray]) -> np.ndarray:
        key = np.zeros(len(cols[0]) if cols else 0, dtype=I64)
        for c, lo, s in zip(cols, self.lows, self.shifts, strict=True):
            key |= (c - lo) << s
        return key

    def unpack(self, keys: np.ndarray) -> list[np.ndarray]:
        out = []
        for lo, b, s in zip(self.lows, self.bits, self.shifts, strict=True):
            out.append(((keys >> s) & ((1 << b) - 1)) + lo)
        return out


#: Key domains up to this many slots get direct-addressed (CSR / bitmap) structures.
DENSE_SLOTS = 1 << 24


class SortedIndex:
    """Rows of a relation grouped by packed key on some positions.

    Small key domains use a CSR offsets array (probe = two array lookups); larger
    ones a sorted key array probed with ``searchsorted``.
    """

    def __init__(
        self,
        cols: list[np.ndarray],
        positions: tuple[int, ...],
        trusted: tuple[int, int] | None = None,
    ) -> None:
        keycols = [cols[p] for p in positions]
        # With a trusted range every probe value is known to lie inside it (the
        # stratum has no arithmetic or aggregates): no per-probe range check.
        self.trusted = False
        if trusted is not None:
            try:
                k = len(positions)
                self.packer = Packer([trusted[0]] * k, [trusted[1]] * k)
                self.trusted = True
            except Ineligible:
                pass
        if not self.trusted:
            self.packer = Packer.for_columns(keycols)
        keys = self.packer.pack(keycols)
        span = 1 << sum(self.packer.bits)
        self.dense = span <= max(DENSE_SLOTS, 8 * len(keys))
        self._perm: np.ndarray | None = None
        self._unsorted = keys
        if self.dense:
            counts = np.bincount(keys, minlength=span)
            self.offsets = np.zeros(span + 1, dtype=I64)
            np.cumsum(counts, out=self.offsets[1:])
        else:
            self.keys = keys[self.perm]

    @property
    def perm(self) -> np.ndarray:
        """Row numbers in key order (built on first use: membership tests never need it)."""
        if self._perm is None:
            self._perm = np.argsort(self._unsorted, kind="stable")
        return self._perm

    def _ranges(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.dense:
            return self.offsets[keys], self.offsets[keys + 1]
        return np.searchsorted(self.keys, keys, "left"), np.searchsorted(self.keys, keys, "right")

    def probe(self, probe_cols: list[np.ndarray]) -> tuple[np.ndarray | None, np.ndarray]:
        """(probe row, relation row) index pairs of every match (probe rows None: all, in order)."""
        n = len(probe_cols[0])
        mask = None if self.trusted else self.packer.in_range(probe_cols)
        rows = None
        if mask is not None:
            rows = np.flatnonzero(mask)
            probe_cols = [c[mask] for c in probe_cols]
        lo, hi = self._ranges(self.packer.pack(probe_cols))
        counts = hi - lo
        total = int(counts.sum())
        if total == 0:
            return np.empty(0, I64), np.empty(0, I64)
        if total == len(counts) and int(counts.max()) == 1:  # every probe row matches once
            return (None if rows is None else rows), self.perm[lo]
        # left, starts, their offsets and right: four int64 arrays of the output's length
        interrupt.allocating(total * 4 * I64_BYTES)
        left = np.repeat(np.arange(n, dtype=I64) if rows is None else rows, counts)
        ends = np.cumsum(counts)
        starts = np.repeat(lo - ends + counts, counts)
        right = self.perm[starts + np.arange(total, dtype=I64)]
        return left, right

    def contains(self, probe_cols: list[np.ndarray]) -> np.ndarray:
        """Mask: does each probe row have a match?"""
        n = len(probe_cols[0])
        mask = None if self.trusted else self.packer.in_range(probe_cols)
        if mask is not None:
            found = np.zeros(n, dtype=bool)
            sub = [c[mask] for c in probe_cols]
            lo, hi = self._ranges(self.packer.pack(sub))
            found[mask] = hi > lo
            return found
        lo, hi = self._ranges(self.packer.pack(probe_cols))
        return hi > lo


class ColRel:
    """A relation being evaluated: columns plus cached sorted indexes."""

    def __init__(self, cols: list[np.ndarray], trusted: tuple[int, int] | None = None) -> None:
        self.cols = cols
        self.trusted = trusted
        self._indexes: dict[tuple[int, ...], SortedIndex] = {}

    def __len__(self) -> int:
        return len(self.cols[0]) if self.cols else 0

    def index(self, positions: tuple[int, ...]) -> SortedIndex:
        idx = self._indexes.get(positions)
        if idx is None:
            idx = self._indexes[positions] = SortedIndex(self.cols, positions, self.trusted)
        return idx


# ----------------------------------------------------------------------------- bindings


class Bindings:
    """A set of variable bindings: ``n`` rows, one int64 array per bound variable."""

    __slots__ = ("cols", "n")

    def __init__(self, cols: dict[str, np.ndarray], n: int) -> None:
        self.cols = cols
        self.n = n

    def take(self, idx: np.ndarray) -> Bindings:
        return Bindings({k: v[idx] for k, v in self.cols.items()}, len(idx))


def _const(value: Any) -> int:
    if type(value) is not int:
        raise Ineligible("non-integer constant")
    return value


def _term_array(term: ast.Term, b: Bindings, const: Any = _const) -> np.ndarray:
    if isinstance(term, ast.Var):
        return b.cols[term.name]
    if isinstance(term, ast.Const):
        return np.full(b.n, const(to_engine(term.value)), dtype=I64)
    raise Ineligible("arithmetic")


_CMP = {
    "==": np.equal,
    "!=": np.not_equal,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


class Executor:
    """Runs ordered rule bodies over bindings, reading ``full``/``delta`` ColRels."""

    def __init__(
        self, full: dict[str, ColRel], delta: dict[str, ColRel], const: Any = _const
    ) -> None:
        self.full = full
        self.delta = delta
        self.const = const

    def rel(self, name: str, use_delta: bool) -> ColRel | None:
        return (self.delta if use_delta else self.full).get(name)

    def run(self, plan: planner.Plan) -> Bindings:
        """The bindings of ``plan`` (:mod:`merklog.engine.planner`), step by step."""
        b = Bindings({}, 1)
        for ps in plan.steps:
            if b.n == 0:
                return b
            if isinstance(ps, planner.Scan):
                b = self.positive(b, ps.lit, ps.delta)
            elif isinstance(ps, planner.Exists):
                b = self.exists(b, ps)
            elif isinstance(ps, planner.Negate):
                b = self.negated(b, ps.lit)
            elif isinstance(ps, planner.Filter | planner.Assign):
                b = self.comparison(b, ps.lit)
            else:
                b = self.aggregate(b, ps)
        return b

    def exists(self, b: Bindings, ps: planner.Exists) -> Bindings:
        """A guard: ``b`` unchanged when the atom has a matching row, else no bindings."""
        rel = self.rel(ps.atom.rel, ps.delta)
        found = False
        if rel is not None and len(rel):
            keep = np.ones(len(rel), dtype=bool)
            first: dict[str, int] = {}
            for i, arg in enumerate(ps.atom.args):
                if isinstance(arg, ast.Const):
                    keep &= rel.cols[i] == self.const(arg.value)
                elif isinstance(arg, ast.Var):
                    if arg.name in first:
                        keep &= rel.cols[i] == rel.cols[first[arg.name]]
                    else:
                        first[arg.name] = i
            found = bool(keep.any())
        return b if found else b.take(np.empty(0, I64))

    def positive(self, b: Bindings, lit: ast.Positive, use_delta: bool) -> Bindings:
        if lit.cid is not None:
            raise Ineligible("CID selection")
        atom = lit.atom
        rel = self.rel(atom.rel, use_delta)
        if rel is None or len(rel) == 0:
            return Bindings({k: v[:0] for k, v in b.cols.items()}, 0)
        key_pos: list[int] = []
        key_cols: list[np.ndarray] = []
        binds: list[tuple[int, str]] = []
        checks: list[tuple[int, int]] = []
        seen: dict[str, int] = {}
        for i, arg in enumerate(atom.args):
            if isinstance(arg, ast.Var) and arg.name not in b.cols:
                if arg.name in seen:
                    checks.append((i, seen[arg.name]))
                else:
                    seen[arg.name] = i
                    binds.append((i, arg.name))
            else:
                key_pos.append(i)
                key_cols.append(_term_array(arg, b, self.const))
        if not key_pos and b.n == 1 and not b.cols:
            # First literal of a body: the bindings are the relation's columns.
            cols = rel.cols
            if checks:
                keep = np.ones(len(rel), dtype=bool)
                for i, j in checks:
                    keep &= cols[i] == cols[j]
                sel = np.flatnonzero(keep)
                return Bindings({name: cols[i][sel] for i, name in binds}, len(sel))
            return Bindings({name: cols[i] for i, name in binds}, len(rel))
        if key_pos:
            left, right = rel.index(tuple(key_pos)).probe(key_cols)
        else:
            m = len(rel)
            interrupt.allocating(b.n * m * 2 * I64_BYTES)  # a cross product: checked first
            left = np.repeat(np.arange(b.n, dtype=I64), m)
            right = np.tile(np.arange(m, dtype=I64), b.n)
        if checks:
            keep = np.ones(len(right), dtype=bool)
            for i, j in checks:
                keep &= rel.cols[i][right] == rel.cols[j][right]
            if left is None:
                left = np.arange(b.n, dtype=I64)
            left, right = left[keep], right[keep]
        if left is None:
            out = Bindings(dict(b.cols), b.n)
        else:
            interrupt.allocating(len(left) * (len(b.cols) + len(binds)) * I64_BYTES)
            out = b.take(left) if b.cols else Bindings({}, len(left))
        for i, name in binds:
            out.cols[name] = rel.cols[i][right]
        return out

    def negated(self, b: Bindings, lit: ast.Negated) -> Bindings:
        atom = lit.atom
        rel = self.full.get(atom.rel)
        if rel is None or len(rel) == 0:
            return b
        key_pos, key_cols = [], []
        for i, arg in enumerate(atom.args):
            if isinstance(arg, ast.Var) and arg.name not in b.cols:
                if not arg.anonymous:
                    raise Ineligible("unbound variable under negation")
                continue
            key_pos.append(i)
            key_cols.append(_term_array(arg, b, self.const))
        if not key_pos:
            return Bindings({k: v[:0] for k, v in b.cols.items()}, 0)
        found = rel.index(tuple(key_pos)).contains(key_cols)
        return b.take(np.flatnonzero(~found))

    def comparison(self, b: Bindings, lit: ast.Comparison) -> Bindings:
        lnames = {v.name for v in ast.term_vars(lit.left)}
        rnames = {v.name for v in ast.term_vars(lit.right)}
        bound = set(b.cols)
        if lnames <= bound and rnames <= bound:
            mask = _CMP[lit.op](
                _term_array(lit.left, b, self.const), _term_array(lit.right, b, self.const)
            )
            return b.take(np.flatnonzero(mask))
        var, other = (lit.left, lit.right) if rnames <= bound else (lit.right, lit.left)
        assert isinstance(var, ast.Var)
        cols = dict(b.cols)
        cols[var.name] = _term_array(other, b, self.const)
        return Bindings(cols, b.n)

    def aggregate(self, b: Bindings, ps: planner.Aggregate) -> Bindings:
        agg = ps.lit
        groups = list(ps.groups)
        if ps.inner_free is None:
            raise Ineligible("correlated aggregate (its groups are only constrained inside it)")
        inner = self.run(ps.inner_free)
        body_vars = sorted({v.name for lit in agg.body for v in ast.literal_vars(lit)})
        if inner.n and not body_vars:
            inner = Bindings({}, 1)  # a ground body: one distinct (empty) binding when it holds
        elif inner.n and not _bindings_distinct(agg.body):
            cols = unique_rows([inner.cols[v] for v in body_vars])
            inner = Bindings(dict(zip(body_vars, cols, strict=True)), len(cols[0]))
        if agg.arg is not None:
            values = _term_array(agg.arg, inner, self.const) if inner.n else np.empty(0, I64)
        func = agg.func
        if not groups:
            if func == "count":
                result = inner.n
            elif func == "sum":
                result = _exact_sum(values)
            elif inner.n == 0:
                return b.take(np.empty(0, I64))
            else:
                result = int(values.min() if func == "min" else values.max())
            return _bind_result(b, agg.result.name, np.full(b.n, result, dtype=I64))
        if inner.n == 0:
            if func in ("min", "max"):
                return b.take(np.empty(0, I64))
            return _bind_result(b, agg.result.name, np.zeros(b.n, dtype=I64))
        # Group the distinct body bindings by the grouping variables.
        gcols = [inner.cols[g] for g in groups]
        packer = Packer.for_columns(gcols)
        gkeys = packer.pack(gcols)
        span = 1 << sum(packer.bits)
        if span <= DENSE_SLOTS and func in ("count", "sum"):
            # Direct addressing: one bincount per aggregate, results read by key.
            counts = np.bincount(gkeys, minlength=span)
            if func == "count":
                res = counts.astype(I64)
            else:
                _check_sum_range(values)
                big = len(values) and max(abs(int(values.min())), abs(int(values.max())))
                if big * len(values) < 2**53:  # float64 sums of such integers are exact
                    res = np.bincount(gkeys, weights=values, minlength=span).astype(I64)
                else:
                    res = np.zeros(span, dtype=I64)
                    np.add.at(res, gkeys, values)
            outer = [b.cols[g] for g in groups]
            mask = packer.in_range(outer)
            out = np.zeros(b.n, dtype=I64)
            if mask is None:
                out = res[packer.pack(outer)]
            else:
                out[mask] = res[packer.pack([c[mask] for c in outer])]
            return _bind_result(b, agg.result.name, out)
        order = np.argsort(gkeys, kind="stable")
        sk = gkeys[order]
        starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
        ukeys = sk[starts]
        if func == "count":
            res = np.diff(np.r_[starts, len(sk)]).astype(I64)
        else:
            sv = values[order]
            if func == "sum":
                _check_sum_range(sv)
                res = np.add.reduceat(sv, starts)
            elif func == "min":
                res = np.minimum.reduceat(sv, starts)
            else:
                res = np.maximum.reduceat(sv, starts)
        outer = [b.cols[g] for g in groups]
        mask = packer.in_range(outer)
        idx = np.arange(b.n)
        found = np.zeros(b.n, dtype=bool)
        pos_all = np.zeros(b.n, dtype=I64)
        if mask is not None:
            idx = idx[mask]
            outer = [c[mask] for c in outer]
        okeys = packer.pack(outer)
        pos = np.minimum(np.searchsorted(ukeys, okeys), len(ukeys) - 1)
        found[idx] = ukeys[pos] == okeys
        pos_all[idx] = pos
        out = np.where(found, res[pos_all], 0)
        if func in ("min", "max"):
            keep = np.flatnonzero(found)
            return _bind_result(b.take(keep), agg.result.name, out[keep])
        return _bind_result(b, agg.result.name, out.astype(I64))


def _bindings_distinct(body: tuple[ast.BodyLiteral, ...]) -> bool:
    """One atom of distinct variables: its bindings are its (already distinct) tuples."""
    if len(body) != 1 or not isinstance(body[0], ast.Positive):
        return False
    args = body[0].atom.args
    names = [a.name for a in args if isinstance(a, ast.Var)]
    return len(names) == len(args) and len(set(names)) == len(names)


def _bind_result(b: Bindings, name: str, values: np.ndarray) -> Bindings:
    if name in b.cols:
        return b.take(np.flatnonzero(b.cols[name] == values))
    cols = dict(b.cols)
    cols[name] = values
    return Bindings(cols, b.n)


def _check_sum_range(values: np.ndarray) -> None:
    if len(values) and max(abs(int(values.min())), abs(int(values.max()))) * len(values) >= 2**62:
        raise Ineligible("sum may overflow")


def _exact_sum(values: np.ndarray) -> int:
    _check_sum_range(values)
    return int(values.sum()) if len(values) else 0


# ----------------------------------------------------------------------------- strata


def _head_columns(rule: ast.Rule, b: Bindings, const: Any = _const) -> list[np.ndarray]:
    return [_term_array(a, b, const) for a in rule.head.args]


def _eligible_rules(rules: Iterable[ast.Rule]) -> None:
    for rule in rules:
        if not rule.head.args:
            raise Ineligible("nullary head")
        for arg in rule.head.args:
            if not isinstance(arg, ast.Var | ast.Const):
                raise Ineligible("arithmetic in head")
        for lit in rule.body:
            for inner in lit.body if isinstance(lit, ast.Aggregate) else (lit,):
                if isinstance(inner, ast.Positive) and (inner.cid is not None or inner.atom.rest):
                    raise Ineligible("CID selection or rest pattern")
                if isinstance(inner, ast.Negated) and inner.atom.rest:
                    raise Ineligible("rest pattern")
                if isinstance(inner, ast.Aggregate):
                    raise Ineligible("nested aggregate")


def _check_equality_only(rules: Iterable[ast.Rule], floats: bool) -> None:
    """Encoded values keep identity only: no ordering comparisons, only count
    aggregates; with floats encoded, no comparisons at all (``1 == 1.0`` is
    numeric, their codes differ)."""
    for rule in rules:
        for lit in rule.body:
            inner = lit.body if isinstance(lit, ast.Aggregate) else ()
            if isinstance(lit, ast.Aggregate) and lit.func != "count":
                raise Ineligible("sum/min/max over a stratum with non-integer values")
            for c in (lit, *inner):
                if isinstance(c, ast.Comparison) and (floats or c.op not in ("==", "!=")):
                    raise Ineligible("comparison over encoded values")


def _encodable_for(rules: Iterable[ast.Rule]) -> tuple:
    """The value types the stratum could still evaluate once encoded (see
    :func:`_check_equality_only`): none with sum/min/max or ordering comparisons,
    no floats with any comparison."""
    comparisons = False
    for rule in rules:
        for lit in rule.body:
            if isinstance(lit, ast.Aggregate) and lit.func != "count":
                return ()
            for c in (lit, *(lit.body if isinstance(lit, ast.Aggregate) else ())):
                if isinstance(c, ast.Comparison):
                    if c.op not in ("==", "!="):
                        return ()
                    comparisons = True
    if comparisons:
        return tuple(t for t in _ENCODABLE if t is not Float)
    return _ENCODABLE


def _rels_read(rules: Iterable[ast.Rule]) -> set[str]:
    return {atom.rel for r in rules for lit in r.body for atom, _p in ast.body_atoms(lit)}


class _Dedup:
    """The set of tuples of a relation derived so far, as packed int64 keys.

    Small key domains use a bitmap (direct addressing); larger ones a few sorted
    runs of keys (membership by ``searchsorted``; runs merge LSM-style).
    """

    def __init__(self, packer: Packer, existing: list[np.ndarray] | None) -> None:
        self.packer = packer
        span = 1 << sum(packer.bits)
        self.bitmap = np.zeros(span, dtype=bool) if span <= DENSE_SLOTS * 4 else None
        self.stamp = np.zeros(span, dtype=np.int32) if self.bitmap is not None else None
        self.runs: list[np.ndarray] = []
        if existing is not None and len(existing[0]):
            keys = packer.pack(existing)
            if self.bitmap is not None:
                self.bitmap[keys] = True
            else:
                self._add_run(_sorted_unique(keys))

    def fresh(self, cols: list[np.ndarray], trusted: bool = False) -> list[np.ndarray] | None:
        if not trusted and self.packer.in_range(cols) is not None:
            raise Ineligible("derived value outside the packed range")
        keys = self.packer.pack(cols)
        if self.bitmap is not None:
            keys = keys[~self.bitmap[keys]]
            if len(keys) == 0:
                return None
            # One representative per key: the last writer of each stamp slot wins.
            pos = np.arange(len(keys), dtype=np.int32)
            self.stamp[keys] = pos
            keys = keys[self.stamp[keys] == pos]
            self.bitmap[keys] = True
            return self.packer.unpack(keys)
        keys = _sorted_unique(keys)
        for run in self.runs:
            pos = np.minimum(np.searchsorted(run, keys), len(run) - 1)
            keys = keys[run[pos] != keys]
            if len(keys) == 0:
                return None
        self._add_run(keys)
        return self.packer.unpack(keys)

    def _add_run(self, keys: np.ndarray) -> None:
        """Sorted runs of geometrically decreasing size: O(log n) runs, amortised merges."""
        if len(keys) == 0:
            return
        runs = self.runs
        runs.append(keys)
        while len(runs) > 1 and 2 * len(runs[-1]) >= len(runs[-2]):
            last = runs.pop()
            runs[-1] = np.sort(np.concatenate([runs[-1], last]), kind="stable")


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    keys = np.sort(keys)
    if len(keys) > 1:
        keys = keys[np.r_[True, keys[1:] != keys[:-1]]]
    return keys


def distinct_columns(cols: list[np.ndarray]) -> list[np.ndarray]:
    """Rows of user-given columns made a set (cheap when some column is already a key)."""
    if not cols or len(cols[0]) <= 1:
        return cols
    for c in cols:
        if bool((c[1:] > c[:-1]).all()):
            return cols  # strictly increasing (ids, row numbers): a key, found in one pass
    for c in cols:
        lo, hi = int(c.min()), int(c.max())
        if hi - lo < DENSE_SLOTS * 4 and int(np.bincount(c - lo).max()) <= 1:
            return cols  # this column alone tells every row apart
    try:
        packer = Packer.for_columns(cols)
    except Ineligible:
        return unique_rows(cols)
    keys = packer.pack(cols)
    _u, first = np.unique(keys, return_index=True)
    if len(first) == len(keys):
        return cols
    first.sort()
    return [c[first] for c in cols]


def unique_rows(cols: list[np.ndarray]) -> list[np.ndarray]:
    """Distinct rows of int64 columns (lexsort, no value-range limits)."""
    if not cols or len(cols[0]) <= 1:
        return cols
    order = np.lexsort(cols[::-1])
    cols = [c[order] for c in cols]
    diff = np.zeros(len(order), dtype=bool)
    diff[0] = True
    for c in cols:
        diff[1:] |= c[1:] != c[:-1]
    sel = np.flatnonzero(diff)
    return [c[sel] for c in cols]


class _Full(dict):
    """Full relations of a stratum; a growing head relation is concatenated only when read."""

    def __init__(
        self,
        base: dict[str, ColRel],
        chunks: dict[str, list[list[np.ndarray]]],
        trusted: tuple[int, int] | None,
    ) -> None:
        super().__init__(base)
        self.chunks = chunks
        self.trusted = trusted
        self.dirty: set[str] = set()

    def get(self, name: str, default: Any = None) -> Any:
        if name in self.dirty:
            parts = self.chunks[name]
            cols = [np.concatenate([p[j] for p in parts]) for j in range(len(parts[0]))]
            self.chunks[name] = [cols]
            self[name] = ColRel(cols, self.trusted)
            self.dirty.discard(name)
        return super().get(name, default)


def _concat(parts: list[list[np.ndarray]], arity: int) -> list[np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return [np.concatenate([p[j] for p in parts]) for j in range(arity)]


def try_columnar(
    rules: list[ast.Rule], ctx: Any, int_bits: int, semi_naive: bool, backend: str
) -> dict[str, tuple[list[np.ndarray], tuple[int, list] | None]] | None:
    """Evaluate the stratum set-at-a-time over ``ctx.full`` (a batch ``Context``);
    returns each head relation's ``(columns, decoder)``, or None when not eligible."""
    heads = {r.head.rel for r in rules}
    reads = _rels_read(rules)
    try:
        _eligible_rules(rules)
        if int_bits != 64 and any(
            isinstance(lit, ast.Aggregate) and lit.func == "sum" for r in rules for lit in r.body
        ):
            raise Ineligible("int32 sums wrap: the tuple path implements that")
        if backend == "auto":
            present = [ctx.full[r] for r in reads | heads if r in ctx.full]
            size = sum(len(r) for r in present)
            if size < AUTO_THRESHOLD and not any(r.cols is not None for r in present):
                return None
        base: dict[str, ColRel] = {}
        lows, highs = [], []
        agg_reads = {
            atom.rel
            for r in rules
            for lit in r.body
            if isinstance(lit, ast.Aggregate)
            for atom, _pol in ast.body_atoms(lit)
        }
        tuple_rels: dict[str, set] = {}
        objects: set = set()
        encodable = _encodable_for(rules)
        int_lows: list[int] = []
        shared = ctx.encoder  # one encoding per evaluation: encoded results chain across strata
        encoded_input = False
        for name in reads | heads:
            rel = ctx.full.get(name)
            if rel is None or len(rel) == 0:
                continue
            if name in heads or name in agg_reads:
                rel.make_distinct()  # counted or deduplicated against: must be a set
            if rel.cols is not None and rel.decoder is None:
                base[name] = rel.cols  # type: ignore[assignment]
                continue
            if (
                rel.cols is not None
                and shared is not None
                and rel.decoder is not None
                and rel.decoder[1] is shared.values
            ):
                base[name] = rel.cols  # type: ignore[assignment]
                encoded_input = True
                continue
            found, int_lo = scan_values(rel.tuples, encodable)
            if int_lo is not None:
                int_lows.append(int_lo)
            if found:
                objects |= found
                tuple_rels[name] = rel.tuples
            else:
                rel.cols = encode_rows(rel.tuples, None)
                base[name] = rel.cols  # type: ignore[assignment]
        const_values = []
        for r in rules:
            consts = [a for a in r.head.args if isinstance(a, ast.Const)]
            for lit in r.body:
                for atom, _pol in ast.body_atoms(lit):
                    consts.extend(a for a in atom.args if isinstance(a, ast.Const))
                inner = lit.body if isinstance(lit, ast.Aggregate) else (lit,)
                for c in inner:
                    if isinstance(c, ast.Comparison):
                        consts.extend(t for t in (c.left, c.right) if isinstance(t, ast.Const))
            const_values.extend(to_engine(a.value) for a in consts)
        for v in const_values:
            if type(v) is int:
                int_lows.append(v)
            elif type(v) in _ENCODABLE:
                objects.add(v)
            else:
                raise Ineligible(f"{type(v).__name__} constant")
        const: Any = _const
        encoder = None
        if objects or encoded_input:
            floats = any(type(v) is Float for v in objects)
            _check_equality_only(rules, floats or (shared is not None and shared.has_float))
            for name, cols in base.items():
                if name not in tuple_rels and (ctx.full[name].decoder is None):
                    int_lows.extend(int(c.min()) for c in cols)  # type: ignore[union-attr]
            if shared is None:
                # Counts are >= 0: ids stay below 0 as well as below every integer.
                shared = ctx.encoder = Encoder(set(), min([0, *int_lows]))
            elif int_lows and min(int_lows) <= shared.base:
                raise Ineligible("integers below the value ids of an earlier stratum")
            shared.extend(objects)
            encoder = shared
            const = encoder.const
            for name, tuples in tuple_rels.items():
                base[name] = encode_rows(tuples, encoder.ids)  # type: ignore[assignment]
        has_aggregates = any(isinstance(lit, ast.Aggregate) for r in rules for lit in r.body)
        recursive_any = any(
            isinstance(lit, ast.Positive) and lit.atom.rel in heads for r in rules for lit in r.body
        )
        if recursive_any or not has_aggregates:  # the value range is needed
            for cols in base.values():
                for c in cols:  # type: ignore[union-attr]
                    lows.append(int(c.min()))
                    highs.append(int(c.max()))
        for v in const_values:
            lows.append(const(v))
            highs.append(const(v))
        lo, hi = (min(lows), max(highs)) if lows else (0, 1)
        # Without aggregates (and arithmetic, already excluded) every value a binding
        # can hold comes from a relation or a constant, so lies in [lo, hi].
        trusted = None if has_aggregates else (lo, hi)
        base = {name: ColRel(cols, trusted) for name, cols in base.items()}  # type: ignore[misc]
        arities = {r.head.rel: len(r.head.args) for r in rules}
        for rel, arity in arities.items():
            if rel in base and len(base[rel].cols) != arity:
                raise Ineligible("arity mismatch")
        chunks: dict[str, list[list[np.ndarray]]] = {
            rel: ([base[rel].cols] if rel in base else []) for rel in heads
        }
        full = _Full(base, chunks, trusted)
        delta: dict[str, ColRel] = {}
        ex = Executor(full, delta, const)
        compiled = []
        for r in rules:
            variants = []
            for i, lit in enumerate(r.body):
                if isinstance(lit, ast.Positive) and lit.atom.rel in heads:
                    variants.append((planner.plan_rule(r, delta=i), lit))
            compiled.append((r, planner.plan_rule(r), variants))

        def derive(rule: ast.Rule, plan: planner.Plan, delta_lit: Any, out: dict) -> None:
            b = ex.run(plan)
            if b.n:
                out.setdefault(rule.head.rel, []).append(_head_columns(rule, b, const))

        pending: dict[str, list[list[np.ndarray]]] = {}
        for rule, order, _variants in compiled:
            derive(rule, order, None, pending)
        recursive = [c for c in compiled if c[2]]
        if not recursive:
            for rel, parts in pending.items():
                chunks[rel] = [unique_rows(_concat(chunks[rel] + parts, arities[rel]))]
        else:
            dedup = {
                rel: _Dedup(Packer([lo] * a, [hi] * a), base[rel].cols if rel in base else None)
                for rel, a in arities.items()
            }
            rounds = 0
            bounded = any(rule.computes_values for rule, *_ in recursive)
            deriving = ", ".join(sorted({rule.head.rel for rule, *_ in recursive}))
            while True:
                rounds += 1
                interrupt.check(rounds, deriving)
                if bounded and rounds > MAX_FIXPOINT_ITERATIONS:
                    raise IterationLimitError.after([rule for rule, *_ in recursive])
                new_delta: dict[str, ColRel] = {}
                for rel, parts in pending.items():
                    fresh = dedup[rel].fresh(_concat(parts, arities[rel]), trusted is not None)
                    if fresh is not None:
                        new_delta[rel] = ColRel(fresh, trusted)
                        chunks[rel].append(fresh)
                        full.dirty.add(rel)
                if not new_delta:
                    break
                delta.clear()
                delta.update(new_delta)
                pending = {}
                for rule, order, variants in recursive:
                    if semi_naive:
                        for vorder, lit in variants:
                            if lit.atom.rel in delta:
                                derive(rule, vorder, lit, pending)
                    else:
                        derive(rule, order, None, pending)
    except Ineligible:
        if backend == "columnar":
            raise
        return None
    decoder = encoder.decoder() if encoder is not None else None
    return {rel: (_concat(chunks[rel], arities[rel]), decoder) for rel in heads if chunks[rel]}
