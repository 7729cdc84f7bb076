"""Look CIDs up in a set of CIDs with numpy, by 64 bits of their sha2-256 digest.

The export joins every op with its fact by fact CID, and keeps the facts whose CID is
visible. ``pyarrow.compute.index_in`` hashes every 36-byte value (~0.5 s of CPU per
million ops); but a dag-cbor/sha2-256 CID already *is* a hash: bytes 4-11 (the
digest's first eight) read as a uint64 are uniformly spread, so the set's keys,
sorted, are found by a bucket search - the key's top bits name a bucket of about one
key - and every hit is confirmed on all 36 bytes. The answer is ``index_in``'s; CIDs
of another width, or two set members sharing those 64 bits, go to ``index_in``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .factcols import valid_mask

_WIDTH = 36  # CIDv1, dag-cbor, sha2-256
_ROW = np.dtype((np.void, _WIDTH))


def _fixed_rows(column: pa.Array) -> np.ndarray | None:
    """The values of a binary column as 36-byte void scalars (nulls as zero bytes), or
    None unless every valid value is 36 bytes."""
    if column.offset:
        column = pa.concat_arrays([column])  # a copy that starts at offset 0
    n = len(column)
    if n == 0:
        return np.zeros(0, _ROW)
    _validity, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1)
    valid = valid_mask(column)
    if not bool((np.diff(offsets)[valid] == _WIDTH).all()):
        return None
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    if not column.null_count:
        return data[offsets[0] : offsets[0] + n * _WIDTH].view(_ROW)
    rows = np.zeros((n, _WIDTH), np.uint8)
    at = offsets[:-1][valid]
    rows[valid] = data[at[:, None] + np.arange(_WIDTH)]
    return rows.reshape(-1).view(_ROW)


def _keys(rows: np.ndarray) -> np.ndarray:
    """Digest bytes 0-7 (CID bytes 4-11) of each row as uint64, in byte order."""
    raw = rows.view(np.uint8).reshape(-1, _WIDTH)[:, 4:12]
    return np.ascontiguousarray(raw).view(">u8").ravel().astype(np.uint64)


def _search(sorted_keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``np.searchsorted(sorted_keys, queries)`` for uniformly spread keys: bucket starts
    from the keys' top bits, then a step forward while the bucket's key is smaller
    (about one key per bucket, so a few steps over a shrinking set)."""
    n = len(sorted_keys)
    bits = max(1, min(24, int(n).bit_length()))
    shift = np.uint64(64 - bits)
    starts = np.zeros((1 << bits) + 1, np.int64)
    np.cumsum(
        np.bincount((sorted_keys >> shift).astype(np.int64), minlength=1 << bits), out=starts[1:]
    )
    bucket = (queries >> shift).astype(np.int64)
    pos = starts[bucket]
    end = starts[bucket + 1]
    active = np.nonzero(pos < end)[0]
    while len(active):
        step = sorted_keys[pos[active]] < queries[active]
        active = active[step]
        pos[active] += 1
        active = active[pos[active] < end[active]]
    return pos


def lookup(wanted: pa.Array, cids: pa.Array) -> pa.Array:
    """For each value of ``wanted`` its position in ``cids`` (distinct CIDs) as int64,
    null where absent or null - what ``pc.index_in(wanted, value_set=cids)`` gives."""
    have, want = _fixed_rows(cids), _fixed_rows(wanted)
    if have is None or want is None:
        return pc.index_in(wanted, value_set=cids)
    keys = _keys(have)
    order = np.argsort(keys, kind="stable")  # the export's facts come sorted: ~free
    sorted_keys = keys[order]
    if len(sorted_keys) > 1 and bool((sorted_keys[1:] == sorted_keys[:-1]).any()):
        return pc.index_in(wanted, value_set=cids)
    if len(order):
        at = np.minimum(_search(sorted_keys, _keys(want)), len(order) - 1)
        where = order[at]
        found = have[where] == want
    else:
        where, found = np.zeros(len(want), np.int64), np.zeros(len(want), np.bool_)
    if wanted.null_count:
        found &= valid_mask(wanted)
    return pa.Array.from_buffers(
        pa.int64(),
        len(where),
        [pa.py_buffer(np.packbits(found, bitorder="little")), pa.py_buffer(where.astype(np.int64))],
        null_count=int(len(found) - found.sum()),
    )


def member(values: pa.Array, cids: pa.Array) -> np.ndarray:
    """Which ``values`` are in ``cids``, as a numpy bool array (nulls are not)."""
    return valid_mask(lookup(values, cids))


__all__ = ["lookup", "member"]
