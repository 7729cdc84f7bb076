"""64-bit keys of CIDs, written beside the CID columns of the exported ops (ADR 0131).

A dag-cbor/sha2-256 CIDv1 is 36 bytes: the constant prefix ``01 71 12 20`` and a
SHA-256 digest. Its *key* is digest bytes 0-7 (CID bytes 4-11) read as a big-endian
unsigned integer with the top bit flipped, stored as a signed ``int64``: signed order
of the keys is then byte order of the CIDs, as long as no two CIDs share the key.
Other CIDs (another width or prefix) have no key (null).

Spark's compaction job groups and sorts 8-byte keys instead of 36-byte binaries, which
makes its shuffle rows a third as wide and every hash and comparison a machine word;
the driver maps the keys back to CIDs. Whether the keys of a compaction's inputs are
injective is checked there (:func:`injective`), never assumed: a job whose keys are not
falls back to the CIDs themselves.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .factcols import valid_mask

#: The ops columns holding the keys of ``fact_cid``, ``delta_cid`` and ``observed``.
KEY_FIELDS = [
    pa.field("fact_key", pa.int64()),
    pa.field("delta_key", pa.int64()),
    pa.field("observed_keys", pa.list_(pa.int64())),
]
KEY_COLUMNS = [f.name for f in KEY_FIELDS]
PREFIX = bytes.fromhex("01711220")
WIDTH = 36
_FLIP = np.uint64(1 << 63)
_PREFIX = int.from_bytes(PREFIX, "big")


def _unsliced(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``column`` as one array whose buffers start at its first row (offset 0), so its
    buffers can be read as numpy views."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return pa.concat_arrays([column]) if column.offset else column


def cid_keys(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The key of every CID of a binary column as ``int64`` (null for nulls and for CIDs
    that are not 36-byte dag-cbor/sha2-256)."""
    column = _unsliced(column)
    n = len(column)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return pa.Array.from_buffers(pa.int64(), 0, [None, pa.py_buffer(empty)])
    offsets = np.frombuffer(column.buffers()[1], np.int32, n + 1)
    data_buf = column.buffers()[2]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    ok = valid_mask(column) & (np.diff(offsets) == WIDTH)
    keys = np.zeros(n, np.uint64)
    if len(data) >= WIDTH and ok.any():
        # every window of 4 and of 8 bytes of the data as a big-endian integer (a view with
        # a stride of one byte, no copy): one gather per row instead of a 12-byte fancy index
        prefix = np.ndarray((len(data) - 3,), ">u4", data, strides=(1,))
        digest = np.ndarray((len(data) - 7,), ">u8", data, strides=(1,))
        at = starts[ok]
        good = prefix[at] == _PREFIX
        ok[np.nonzero(ok)[0][~good]] = False
        keys[ok] = digest[at[good] + 4] ^ _FLIP
    return pa.Array.from_buffers(
        pa.int64(),
        n,
        [pa.py_buffer(np.packbits(ok, bitorder="little")), pa.py_buffer(keys.view(np.int64))],
        null_count=int(n - ok.sum()),
    )


def list_keys(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The keys of a ``list<binary>`` column, list for list (a null list stays null)."""
    column = _unsliced(column)
    n = len(column)
    if n == 0:
        return pa.ListArray.from_arrays(_int32([0]), cid_keys(column.values))
    # from buffers, not from Python values: a pa.scalar or pa.array of Python ints imports
    # pandas (ADR 0117), which the export never needs
    offsets = np.frombuffer(column.buffers()[1], np.int32, n + 1)
    values = cid_keys(column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))
    rebased = _int32(offsets - offsets[0])
    return pa.ListArray.from_arrays(rebased, values, mask=column.is_null())


def _int32(values: np.ndarray | list[int]) -> pa.Array:
    data = np.ascontiguousarray(values, np.int32)
    return pa.Array.from_buffers(pa.int32(), len(data), [None, pa.py_buffer(data)])


def with_keys(table: pa.Table) -> pa.Table:
    """``table`` (ops rows) with the :data:`KEY_COLUMNS` of its CID columns appended."""
    keys = [
        cid_keys(table.column("fact_cid")),
        cid_keys(table.column("delta_cid")),
        list_keys(table.column("observed")),
    ]
    for field, array in zip(KEY_FIELDS, keys, strict=True):
        table = table.append_column(field, array)
    return table


def keys_name_cids(column: pa.Array) -> bool:
    """True when every CID of a binary column (nulls aside) has a key and no two distinct
    CIDs share one. The rows are sorted by their key's 64 bits, and within every run of
    equal keys the other 24 digest bytes are compared, read in place from the column's
    data (no hashing of 36-byte values, no copy of the column)."""
    if column.offset:
        column = pa.concat_arrays([column])
    n = len(column)
    if n == 0 or column.null_count == n:
        return True
    offsets = np.frombuffer(column.buffers()[1], np.int32, n + 1)
    data = np.frombuffer(column.buffers()[2], np.uint8)
    valid = valid_mask(column)
    if not bool((np.diff(offsets)[valid] == WIDTH).all()):
        return False
    at = offsets[:-1][valid]
    prefix = np.ndarray((len(data) - 3,), ">u4", data, strides=(1,))
    if not bool((prefix[at] == _PREFIX).all()):
        return False
    words = np.ndarray((len(data) - 7,), ">u8", data, strides=(1,))
    first = words[at + 4]
    order = np.argsort(first)
    ordered = first[order]
    tie = np.nonzero(ordered[1:] == ordered[:-1])[0]
    a, b = at[order[tie]] + 12, at[order[tie + 1]] + 12
    rest = np.ndarray((len(data) - 23,), np.dtype((np.void, 24)), data, strides=(1,))
    return bool((rest[a] == rest[b]).all())


def injective(cids: pa.Array, keys: pa.Array) -> bool:
    """True when ``keys`` (``cid_keys(cids)``) name the CIDs one to one: every CID has a
    key, and there are as many distinct keys as distinct CIDs."""
    if cids.null_count != keys.null_count:
        return False
    return pc.count_distinct(cids).as_py() == pc.count_distinct(keys).as_py()


__all__ = [
    "KEY_COLUMNS",
    "KEY_FIELDS",
    "cid_keys",
    "injective",
    "keys_name_cids",
    "list_keys",
    "with_keys",
]
