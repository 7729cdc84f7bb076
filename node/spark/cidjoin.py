"""Look CIDs of Arrow binary columns up in a set of CIDs (:mod:`merklog.node.cidsearch`).

The export joins every op with its fact by fact CID, and keeps the facts whose CID is
visible. ``pyarrow.compute.index_in`` hashes every 36-byte value (~0.5 s of CPU per
million ops); a dag-cbor/sha2-256 CID is already a uniform hash, searched by 64 of its
digest bits and confirmed on all 36 bytes. The answer is ``index_in``'s; CIDs of
another width, or two set members sharing those 64 bits, go to ``index_in``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merklog.node.cidsearch import ROW, WIDTH, CidIndex

from .factcols import valid_mask

_WIDTH = WIDTH


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


def lookup(wanted: pa.Array, cids: pa.Array) -> pa.Array:
    """For each value of ``wanted`` its position in ``cids`` (distinct CIDs) as int64,
    null where absent or null - what ``pc.index_in(wanted, value_set=cids)`` gives."""
    have, want = _fixed_rows(cids), _fixed_rows(wanted)
    if have is None or want is None:
        return pc.index_in(wanted, value_set=cids)
    index = CidIndex(have)
    if not index.usable:
        return pc.index_in(wanted, value_set=cids)
    where, found = index.find(want)
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
