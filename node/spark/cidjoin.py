"""Look CIDs of Arrow binary columns up in a set of CIDs (:mod:`merklog.node.cidsearch`).

The export joins every op with its fact by fact CID, and keeps the facts whose CID is
visible. ``pyarrow.compute.index_in`` hashes every 36-byte value (~0.5 s of CPU per
million ops); a dag-cbor/sha2-256 CID is already a uniform hash, searched by 64 of its
digest bits and confirmed on all 36 bytes. The answer is ``index_in``'s; CIDs of
another width, or two set members sharing those 64 bits, go to ``index_in``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merklog.node.cidsearch import ROW, WIDTH, CidIndex, keys

from .factcols import valid_mask

_WIDTH = WIDTH
#: Width of the bounds :func:`shares` compares as integers: a CID's 4-byte head and its
#: first digest byte.
BOUND_WIDTH = 5


def _fixed_rows(column: pa.Array) -> np.ndarray | None:
    """The values of a binary column as 36-byte void scalars (nulls as zero bytes), or
    None unless every valid value is 36 bytes."""
    if column.offset:
        column = pa.concat_arrays([column])  # a copy that starts at offset 0
    n = len(column)
    if n == 0:
        return np.zeros(0, ROW)
    _validity, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1)
    valid = valid_mask(column)
    if not bool((np.diff(offsets)[valid] == _WIDTH).all()):
        return None
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    if not column.null_count:
        return data[offsets[0] : offsets[0] + n * _WIDTH].view(ROW)
    rows = np.zeros((n, _WIDTH), np.uint8)
    at = offsets[:-1][valid]
    rows[valid] = data[at[:, None] + np.arange(_WIDTH)]
    return rows.reshape(-1).view(ROW)


class CidTable:
    """Distinct CIDs prepared once for many :meth:`lookup` calls (the index is built here,
    not per call)."""

    def __init__(self, cids: pa.Array) -> None:
        self.cids = cids
        have = _fixed_rows(cids)
        self.index = CidIndex(have) if have is not None else None
        if self.index is not None and not self.index.usable:
            self.index = None

    def lookup(self, wanted: pa.Array) -> pa.Array:
        """For each value of ``wanted`` its position among the CIDs as int64, null where
        absent or null - what ``pc.index_in(wanted, value_set=cids)`` gives."""
        want = _fixed_rows(wanted) if self.index is not None else None
        if self.index is None or want is None:
            return pc.index_in(wanted, value_set=self.cids)
        where, found = self.index.find(want)  # its bucket table is built once
        if wanted.null_count:
            found &= valid_mask(wanted)
        return pa.Array.from_buffers(
            pa.int64(),
            len(where),
            [
                pa.py_buffer(np.packbits(found, bitorder="little")),
                pa.py_buffer(where.astype(np.int64)),
            ],
            null_count=int(len(found) - found.sum()),
        )


def lookup(wanted: pa.Array, cids: pa.Array) -> pa.Array:
    """For each value of ``wanted`` its position in ``cids`` (distinct CIDs) as int64,
    null where absent or null - what ``pc.index_in(wanted, value_set=cids)`` gives."""
    return CidTable(cids).lookup(wanted)


def member(values: pa.Array, cids: pa.Array) -> np.ndarray:
    """Which ``values`` are in ``cids``, as a numpy bool array (nulls are not)."""
    return valid_mask(lookup(values, cids))


def shares(column: pa.Array, bounds: Sequence[bytes]) -> np.ndarray:
    """For each value of a binary column, how many of the sorted ``bounds`` are bytewise
    at most it (``bisect_right``): the share of a CID range split at ``bounds`` it falls
    in, 0 for null. Bounds of :data:`BOUND_WIDTH` bytes compare with the first bytes of
    36-byte CIDs as integers, no Python per value."""
    rows = _fixed_rows(column) if all(len(b) == BOUND_WIDTH for b in bounds) else None
    if rows is None:
        return np.array(
            [0 if v is None else bisect_right(bounds, v) for v in column.to_pylist()], np.int64
        )
    head = rows.view(np.uint8).reshape(-1, _WIDTH)[:, :BOUND_WIDTH].astype(np.uint64)
    key = head @ (np.uint64(256) ** np.arange(BOUND_WIDTH - 1, -1, -1, dtype=np.uint64))
    limits = np.array([int.from_bytes(b, "big") for b in bounds], np.uint64)
    return np.searchsorted(limits, key, side="right").astype(np.int64)


def first_of_each(column: pa.Array) -> np.ndarray | None:
    """Ascending positions of one row per distinct value of a binary column (its first),
    or None when the values are distinct already. CIDs are grouped by 64 digest bits,
    confirmed on all 36 bytes; other widths, nulls or two CIDs sharing those bits go to
    Arrow's hash group-by."""
    rows = _fixed_rows(column) if not column.null_count else None
    if rows is None:
        return _first_of_each_hashed(column)
    key = keys(rows)
    order = np.argsort(key, kind="stable")
    sorted_keys = key[order]
    same_key = sorted_keys[1:] == sorted_keys[:-1]
    if not same_key.any():
        return None
    sorted_rows = rows[order]
    repeat = same_key & (sorted_rows[1:] == sorted_rows[:-1])
    if (same_key & ~repeat).any():  # two CIDs share the bits: equal rows may not be adjacent
        return _first_of_each_hashed(column)
    keep = np.ones(len(order), np.bool_)
    keep[1:] = ~repeat
    return np.sort(order[keep])


def _first_of_each_hashed(column: pa.Array) -> np.ndarray | None:
    at = pa.table({"v": column, "i": pa.array(np.arange(len(column)))})
    first = at.group_by("v", use_threads=False).aggregate([("i", "min")]).column("i_min")
    if len(first) == len(column):
        return None
    return np.sort(first.to_numpy())


__all__ = ["BOUND_WIDTH", "CidTable", "first_of_each", "lookup", "member", "shares"]
