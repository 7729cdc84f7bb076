"""A relation's base facts held as an int64 matrix plus a small overlay of changes.

The incremental engine keeps each input relation's base facts as a set, so an
epoch's inserts and deletes become exact ``±1`` deltas (set semantics). For a
relation loaded in bulk from int64 columns (a node's stored facts, ADR 0070), a
set of a million tuples costs a tuple, a hash and a set slot per row — most of
the initial load. :class:`ArrayBase` keeps the loaded matrix as it is and answers
the set questions the epoch driver asks about a *small* batch of rows:

- which of these rows are present (:meth:`ArrayBase.present`): rows with a
  non-int value (``Float``, ``Bool``, strings, bytes, CIDs), ints outside int64 or
  another length are never in the matrix, so ``1.0``, ``true`` and ``"1"`` never
  match an int ``1`` (value identity, ADR 0001); the rest are looked up in a
  sorted index of 64-bit row hashes and then *compared column by column*, so a
  hash collision can cost time but never change an answer;
- the overlay: rows inserted since (``added``, a set) and matrix rows deleted
  since (``removed``, a set), so a change costs O(k log n), never O(n).

The sorted index is built on the first lookup (one ``numpy.sort`` of n keys); a
bulk load that never meets a later change never pays for it. Distinct rows are
required: :func:`distinct_rows` proves it cheaply (a strictly increasing column)
or removes duplicates through the same index.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from itertools import compress

import numpy as np

Row = tuple

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Up to this many rows are looked up one by one in Python ints, more in one numpy pass.
_FEW = 16
_SEED = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_SHIFT = np.uint64(31)


def row_hashes(matrix: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row of an int64 matrix (column-wise multiply-xorshift)."""
    u = matrix.view(np.uint64)
    h = np.full(matrix.shape[0], _SEED, dtype=np.uint64)
    for j in range(matrix.shape[1]):
        h ^= u[:, j]
        h *= _MIX
        h ^= h >> _SHIFT
    return h


_M64 = 2**64 - 1
_SEED_INT, _MIX_INT, _SHIFT_INT = int(_SEED), int(_MIX), int(_SHIFT)


def row_hash(row: Row) -> int:
    """:func:`row_hashes` of one row of Python ints (the same value, without numpy's
    fixed per-call cost: lookups of a few rows stay in microseconds)."""
    h = _SEED_INT
    for v in row:
        h ^= v & _M64
        h = (h * _MIX_INT) & _M64
        h ^= h >> _SHIFT_INT
    return h


_P61 = np.int64(2**61 - 1)
_XX1 = np.uint64(11400714785074694791)
_XX2 = np.uint64(14029467366897019727)
_XX5 = np.uint64(2870177450012600261)


def tuple_hashes(matrix: np.ndarray) -> np.ndarray:
    """CPython's ``hash(tuple(row))`` of every row of an int64 matrix, as uint64.

    The int hash (``v mod 2**61-1`` with the sign, ``-1`` mapped to ``-2``) and the
    xxHash-style tuple combination of ``Objects/tupleobject.c``, column-wise. With
    it a lookup hashes its rows with the built-in ``hash`` (C speed) instead of a
    Python-level loop; :class:`_Index` checks it against ``hash`` on sample rows
    and falls back to :func:`row_hashes` if an interpreter hashes otherwise."""
    n, k = matrix.shape
    acc = np.full(n, _XX5, dtype=np.uint64)
    for j in range(k):
        v = matrix[:, j]
        if n and -_P61 < v.min() and v.max() < _P61:  # |v| < P: hash(v) is v (-1 -> -2)
            lane = np.where(v == -1, np.int64(-2), v)
        else:
            neg = v < 0
            r = np.where(neg, ((-(v + 1)) % _P61 + 1) % _P61, v % _P61)  # |v| mod P
            lane = np.where(neg, -r, r)
            lane[lane == -1] = -2
        acc += lane.view(np.uint64) * _XX2
        acc = (acc << np.uint64(31)) | (acc >> np.uint64(33))
        acc *= _XX1
    acc += np.uint64(k ^ (2870177450012600261 ^ 3527539))
    acc[acc == np.uint64(2**64 - 1)] = np.uint64(1546275796)
    return acc


def _signed_row_hash(row: Row) -> int:
    """:func:`row_hash` as a signed 64-bit int (the range of the built-in ``hash``)."""
    h = row_hash(row)
    return h - 2**64 if h >= 2**63 else h


#: Rows :class:`_Index` hashes with both ``hash`` and :func:`tuple_hashes` to check they
#: agree (edges of the int hash: ``-1``, the modulus, int64's bounds).
_PROBES = np.array(
    [[0, -1, 1], [-2, 2**61 - 1, 2**61], [-(2**61) + 1, -(2**61), 2**63 - 1],
     [-(2**63), -(2**63) + 1, 2**62], [7, -(2**62), 12345678901234]],
    dtype=np.int64,
)  # fmt: skip


def _builtin_hash_matches(matrix: np.ndarray) -> bool:
    for m in (_PROBES[:, : matrix.shape[1]], matrix[:64]):
        want = np.array([hash(r) for r in map(tuple, m.tolist())], dtype=np.int64)
        if not (tuple_hashes(m) == want.view(np.uint64)).all():
            return False
    return True


def _strictly_increasing_column(matrix: np.ndarray) -> bool:
    """True if some column strictly increases (then the rows are distinct)."""
    if matrix.shape[0] < 2:
        return True
    for j in range(matrix.shape[1]):
        col = matrix[:, j]
        if bool((col[1:] > col[:-1]).all()):
            return True
    return False


class _Index:
    """Sorted keys ``(hash high bits) | row index`` of a matrix (one sort, no argsort),
    a directory of ~16-key buckets by the top bits, and a filter of the hashes.

    A lookup hashes its rows (the built-in ``hash`` when it equals
    :func:`tuple_hashes`), drops the rows whose filter bit is clear — about 94% of
    absent rows — and looks the rest
    up in their bucket, comparing candidate rows column by column."""

    __slots__ = (
        "keys", "low", "high", "starts", "shift", "bits", "filter", "fmask", "hash_one"
    )  # fmt: skip

    def __init__(self, matrix: np.ndarray) -> None:
        n = matrix.shape[0]
        builtin = _builtin_hash_matches(matrix)
        #: ``row -> signed 64-bit hash`` equal to the matrix hashes (as int64).
        self.hash_one = hash if builtin else _signed_row_hash
        hashes = tuple_hashes(matrix) if builtin else row_hashes(matrix)
        bits = max(1, (n - 1).bit_length())
        self.low = np.uint64((1 << bits) - 1)
        self.high = ~self.low
        keys = hashes & self.high
        keys |= np.arange(n, dtype=np.uint64)
        keys.sort()
        self.keys = keys
        # A directory of ~16-key buckets by the top hash bits: a lookup reads its bucket
        # (one or two cache lines) instead of binary-searching n keys (a cache miss per
        # level once the index outgrows the CPU caches).
        dbits = min(max(0, (n // 16).bit_length()), 64 - bits)
        self.shift = np.uint64(64 - dbits)
        if dbits:
            top = (keys >> self.shift).astype(np.intp)
            counts = np.bincount(top, minlength=1 << dbits)
            self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        else:
            self.starts = np.array([0, n], dtype=np.int64)
        # The filter: 16 bits per row, set at each row's low hash bits (~6% of absent
        # rows pass); built as bytes and packed (no ufunc.at).
        m = 1 << max(6, (16 * n - 1).bit_length())
        self.fmask = m - 1
        flags = np.zeros(m, dtype=bool)
        flags[(hashes & np.uint64(m - 1)).astype(np.intp)] = True
        self.bits = np.packbits(flags, bitorder="little")
        del flags
        self.filter = self.bits.tobytes()  # scalar reads from Python: no numpy call

    def maybe(self, h: int) -> bool:
        """Could a row with (unsigned) hash ``h`` be in the matrix? (False: surely not.)"""
        i = h & self.fmask
        return bool(self.filter[i >> 3] >> (i & 7) & 1)

    def maybe_many(self, hashes: np.ndarray) -> np.ndarray:
        """:meth:`maybe` of many unsigned hashes at once (a bool array)."""
        slot = (hashes & np.uint64(self.fmask)).astype(np.intp)
        return ((self.bits[slot >> 3] >> (slot & 7).astype(np.uint8)) & 1).astype(bool)

    def _positions(self, q: np.ndarray) -> np.ndarray:
        """``numpy.searchsorted(keys, q)`` through the bucket directory."""
        keys, starts = self.keys, self.starts
        b = (q >> self.shift).astype(np.intp) if len(starts) > 2 else np.zeros(len(q), np.intp)
        lo, hi = starts[b], starts[b + 1]
        width = int((hi - lo).max()) if len(q) else 0
        if width > 256:
            return np.searchsorted(keys, q)
        if not width:
            return lo
        idx = lo[:, None] + np.arange(width)
        inside = idx < hi[:, None]
        cand = keys[np.minimum(idx, len(keys) - 1)]
        return lo + ((cand < q[:, None]) & inside).sum(axis=1)

    def find(self, matrix: np.ndarray, queries: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """For each query row (with its unsigned hash), its row index in ``matrix``, or -1."""
        keys, low, high = self.keys, self.low, self.high
        q = hashes & high
        pos = self._positions(q)
        n = len(keys)
        out = np.full(len(queries), -1, dtype=np.int64)
        if not n:
            return out
        cand = keys[np.minimum(pos, n - 1)]
        same = ((cand & high) == q) & (pos < n)
        r = (cand & low).astype(np.int64)
        eq = same & (matrix[r] == queries).all(axis=1)
        out[eq] = r[eq]
        # A first candidate with the same high bits but another row: a hash collision;
        # scan the run of equal high bits after it (rare; exact either way).
        for i in np.flatnonzero(same & ~eq).tolist():
            j = int(pos[i]) + 1
            while j < n and (int(keys[j]) & int(high)) == int(q[i]):
                c = int(keys[j]) & int(low)
                if np.array_equal(matrix[c], queries[i]):
                    out[i] = c
                    break
                j += 1
        return out

    def find_one(self, matrix: np.ndarray, row: Row, h: int) -> bool:
        """Is ``row`` (Python ints of the matrix's arity, inside int64; unsigned hash
        ``h``) a matrix row?"""
        keys = self.keys
        high, low = int(self.high), int(self.low)
        q = h & high
        starts = self.starts
        b = q >> int(self.shift) if len(starts) > 2 else 0
        j, n = int(starts[b]), len(keys)
        want = list(row)
        while j < n:
            key = int(keys[j])
            kh = key & high
            if kh > q:
                return False
            if kh == q and matrix[key & low].tolist() == want:
                return True
            j += 1
        return False

    def duplicates(self, matrix: np.ndarray) -> np.ndarray:
        """Row indices that repeat an earlier-indexed equal row."""
        keys, high, low = self.keys, self.high, self.low
        hk = keys & high
        same = np.flatnonzero(hk[1:] == hk[:-1])
        if not len(same):
            return np.empty(0, dtype=np.int64)
        runs: dict[int, list[int]] = {}
        for s in same.tolist():
            for j in (s, s + 1):
                runs.setdefault(int(hk[j]), []).append(int(keys[j] & low))
        dup: list[int] = []
        for members in runs.values():
            seen: dict[Row, int] = {}
            for r in sorted(set(members)):
                row = tuple(matrix[r].tolist())
                if row in seen:
                    dup.append(r)
                else:
                    seen[row] = r
        return np.array(sorted(dup), dtype=np.int64)


def distinct_rows(matrix: np.ndarray) -> np.ndarray:
    """``matrix`` without repeated rows (first occurrence kept; the same array when
    its rows are already distinct, which a strictly increasing column proves in O(n))."""
    return _distinct(matrix)[0]


def _distinct(matrix: np.ndarray) -> tuple[np.ndarray, _Index | None]:
    """:func:`distinct_rows`, and the index the duplicate check built when it is valid
    for the result (the matrix had no repeated rows), so nobody builds it twice."""
    if _strictly_increasing_column(matrix):
        return matrix, None
    index = _Index(matrix)
    dup = index.duplicates(matrix)
    if not len(dup):
        return matrix, index
    keep = np.ones(matrix.shape[0], dtype=bool)
    keep[dup] = False
    return matrix[keep], None


def _as_int_row(row: Row, arity: int) -> bool:
    """Could ``row`` (engine form) be a row of an int64 matrix of ``arity`` columns?"""
    if len(row) != arity:
        return False
    for v in row:
        if type(v) is not int or not _INT64_MIN <= v <= _INT64_MAX:
            return False
    return True


class ArrayBase(Set):
    """A set of engine-form rows: the distinct rows of an int64 matrix, plus ``added``,
    minus ``removed`` (see the module docstring). Read as a :class:`~collections.abc.Set`;
    changed only through :meth:`add_new` and :meth:`remove_present`."""

    __slots__ = ("matrix", "added", "removed", "_index")

    def __init__(self, matrix: np.ndarray) -> None:
        """``matrix``: n x arity int64 with distinct rows (see :func:`distinct_rows`)."""
        self.matrix = matrix
        self.added: set[Row] = set()
        self.removed: set[Row] = set()
        self._index: _Index | None = None

    @classmethod
    def of_distinct_rows(cls, matrix: np.ndarray) -> ArrayBase:
        """The base of ``matrix``'s distinct rows (:func:`distinct_rows`), keeping the hash
        index the duplicate check built: a node's stored facts are distinct but in CID
        order, so the check builds the index the first lookup would build again."""
        distinct, index = _distinct(matrix)
        base = cls(distinct)
        base._index = index
        return base

    def _in_matrix(self, rows: list[Row]) -> list[bool]:
        """Whether each row (engine form) is a row of the matrix."""
        matrix = self.matrix
        arity = matrix.shape[1]
        out = [False] * len(rows)
        if not rows or not matrix.shape[0]:
            return out
        if self._index is None:
            self._index = _Index(matrix)
        index = self._index
        hash_one = index.hash_one
        if hash_one is not hash:  # the fallback hash reads ints only
            pos = [i for i, r in enumerate(rows) if _as_int_row(r, arity)]
            sub = [rows[i] for i in pos]
        else:
            pos, sub = range(len(rows)), rows
        if len(sub) <= _FEW:
            for i, r in zip(pos, sub, strict=True):
                h = hash_one(r) & _M64
                if index.maybe(h) and _as_int_row(r, arity):
                    out[i] = index.find_one(matrix, r, h)
            return out
        hashes = np.fromiter(map(hash_one, sub), np.int64, len(sub)).view(np.uint64)
        hits = [j for j in np.flatnonzero(index.maybe_many(hashes)).tolist()
                if _as_int_row(sub[j], arity)]  # fmt: skip
        if not hits:
            return out
        queries = np.array([sub[j] for j in hits], dtype=np.int64).reshape(len(hits), arity)
        found = index.find(matrix, queries, hashes[hits])
        for j, f in zip(hits, found.tolist(), strict=True):
            out[pos[j]] = f >= 0
        return out

    def present(self, rows: Iterable[Row]) -> set[Row]:
        """The given rows that are in the set."""
        rows = rows if isinstance(rows, set | frozenset) else set(rows)
        added, removed = self.added, self.removed
        out = rows & added if added else set()
        rest = list(rows - added - removed if added or removed else rows)
        out.update(compress(rest, self._in_matrix(rest)))
        return out

    def add_new(self, rows: Iterable[Row]) -> None:
        """Add rows known to be absent."""
        rows = rows if isinstance(rows, set | frozenset) else set(rows)
        removed = self.removed
        back = rows & removed if removed else ()
        if back:
            removed -= back
            self.added |= rows - back
        else:
            self.added |= rows

    def remove_present(self, rows: Iterable[Row]) -> None:
        """Remove rows known to be present."""
        rows = rows if isinstance(rows, set | frozenset) else set(rows)
        added = self.added
        undone = rows & added if added else ()
        if undone:
            added -= undone
            self.removed |= rows - undone
        else:
            self.removed |= rows

    def folded(self) -> np.ndarray | None:
        """The set as one int64 matrix with distinct rows (the matrix itself while the
        overlay is empty; else a new one: matrix rows not removed, then the added rows),
        or None when an added row is not a row of int64 values of the matrix's arity
        (``1.0``, ``true``, ``"1"``: such a row never enters an int64 column). O(n) numpy
        work plus O(k) for the overlay: for handing the whole relation on, columnar."""
        added, removed, matrix = self.added, self.removed, self.matrix
        if not added and not removed:
            return matrix
        arity = matrix.shape[1]
        if not all(_as_int_row(r, arity) for r in added):
            return None
        kept = matrix
        if removed:
            gone = list(removed)  # matrix rows (remove_present's contract): all found
            keep = np.ones(matrix.shape[0], dtype=bool)
            keep[self._positions(gone)] = False
            kept = matrix[keep]
        if not added:
            return kept
        extra = np.array(list(added), dtype=np.int64).reshape(len(added), arity)
        return np.concatenate([kept, extra])

    def _positions(self, rows: list[Row]) -> np.ndarray:
        """Row indices in the matrix of ``rows`` (int rows of the matrix's arity; -1 for
        a row that is not there)."""
        if self._index is None:
            self._index = _Index(self.matrix)
        index = self._index
        queries = np.array(rows, dtype=np.int64).reshape(len(rows), self.matrix.shape[1])
        if index.hash_one is hash:
            hashes = np.fromiter(map(hash, rows), np.int64, len(rows)).view(np.uint64)
        else:
            hashes = row_hashes(queries)
        return index.find(self.matrix, queries, hashes)

    def to_set(self) -> set[Row]:
        """Every row as a new set of tuples (O(n): for whole-relation reads)."""
        out = set(map(tuple, self.matrix.tolist()))
        out -= self.removed
        out |= self.added
        return out

    # -- Set
    @classmethod
    def _from_iterable(cls, it: Iterable[Row]) -> set[Row]:
        """Results of the :class:`~collections.abc.Set` operators are plain sets."""
        return set(it)

    def __contains__(self, row: object) -> bool:
        if not isinstance(row, tuple):
            return False
        return bool(self.present([row]))

    def matching(self, consts: dict[int, object]) -> list[Row]:
        """The rows whose column ``c`` holds ``consts[c]`` for every ``c`` (engine
        values, compared by identity: an int column never holds ``1.0`` or ``true``).
        One numpy pass over the matrix's constrained columns instead of a tuple per row:
        a point query reads what it answers."""
        arity = self.matrix.shape[1]
        if any(not 0 <= c < arity for c in consts):
            return []
        wanted = [
            row
            for row in self.added
            if all(type(row[c]) is type(v) and row[c] == v for c, v in consts.items())
        ]
        if not all(type(v) is int and _INT64_MIN <= v <= _INT64_MAX for v in consts.values()):
            return wanted  # a float, bool, string, bytes, CID or huge int: never in int64
        mask = np.ones(self.matrix.shape[0], dtype=bool)
        for c, v in consts.items():
            mask &= self.matrix[:, c] == v
        removed = self.removed
        found = map(tuple, self.matrix[mask].tolist())
        return [r for r in found if r not in removed] + wanted

    def __iter__(self) -> Iterator[Row]:
        removed = self.removed
        for r in map(tuple, self.matrix.tolist()):
            if r not in removed:
                yield r
        yield from self.added

    def __len__(self) -> int:
        return int(self.matrix.shape[0]) - len(self.removed) + len(self.added)

    def __repr__(self) -> str:
        return f"ArrayBase({self.matrix.shape[0]} rows, +{len(self.added)}, -{len(self.removed)})"


__all__ = ["ArrayBase", "distinct_rows", "row_hashes"]
