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


def cid_keys(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The key of every CID of a binary column as ``int64`` (null for nulls and for CIDs
    that are not 36-byte dag-cbor/sha2-256)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.offset:
        column = pa.concat_arrays([column])
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
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.offset:
        column = pa.concat_arrays([column])
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


def digest_words(column: pa.Array) -> np.ndarray | None:
    """The 32 digest bytes of every CID of a binary column (nulls left out) as four
    big-endian 64-bit words per row, the first being the key's bits; None when a CID is
    not 36-byte dag-cbor/sha2-256 (it has no key)."""
    if column.offset:
        column = pa.concat_arrays([column])
    n = len(column)
    if n == 0 or column.null_count == n:
        return np.zeros((0, 4), np.uint64)
    offsets = np.frombuffer(column.buffers()[1], np.int32, n + 1)
    data = np.frombuffer(column.buffers()[2], np.uint8)
    valid = valid_mask(column)
    if not bool((np.diff(offsets)[valid] == WIDTH).all()):
        return None
    at = offsets[:-1][valid]
    prefix = np.ndarray((len(data) - 3,), ">u4", data, strides=(1,))
    if not bool((prefix[at] == _PREFIX).all()):
        return None
    digest = np.ndarray((len(data) - 7,), ">u8", data, strides=(1,))
    return np.stack([digest[at + k] for k in (4, 12, 20, 28)], axis=1).astype(np.uint64)


def words_injective(words: np.ndarray) -> bool:
    """True when rows of :func:`digest_words` that share their first word are the same
    CID: sorted by that word, every run of equal keys holds one digest. Sort-based, no
    hashing of 36-byte values."""
    first = words[:, 0]
    order = np.argsort(first)
    ordered = first[order]
    tie = np.nonzero(ordered[1:] == ordered[:-1])[0]
    return bool((words[order[tie]] == words[order[tie + 1]]).all())


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
    "digest_words",
    "list_keys",
    "with_keys",
    "words_injective",
]
