"""Spark's hash partitioning restated in numpy, for files the driver stages as a Spark
job would (ADRs 0136, 0196).

``repartition(col)`` sends a row to partition ``pmod(Murmur3Hash(col, 42), n)``; Spark's
``Murmur3Hash`` is ``Murmur3_x86_32`` over a binary's bytes (``hashUnsafeBytes``) or a
long's two little-endian 32-bit words (``hashLong``). Both are checked against Spark's own
``hash()`` and ``spark_partition_id()`` in the tests.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: The seed of Spark's ``hash()`` and of its hash partitioning.
SPARK_SEED = 42
_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    k1 = _rotl(k1 * _C1, 15) * _C2
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length: int) -> np.ndarray:
    h1 ^= np.uint32(length)
    h1 ^= h1 >> np.uint32(16)
    h1 *= np.uint32(0x85EBCA6B)
    h1 ^= h1 >> np.uint32(13)
    h1 *= np.uint32(0xC2B2AE35)
    h1 ^= h1 >> np.uint32(16)
    return h1


def spark_hash(column: pa.Array, seed: int = SPARK_SEED) -> np.ndarray | None:
    """Spark's ``Murmur3Hash`` (``Murmur3_x86_32.hashUnsafeBytes``) of every value of a
    binary column, as ``int32``; None when a value is null (Spark leaves the seed) or the
    values are not all of one width (not needed: CIDs of one kind are)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    if column.null_count:
        return None
    if column.offset:
        column = pa.concat_arrays([column])
    offsets = np.frombuffer(column.buffers()[1], np.int32, n + 1)
    widths = np.diff(offsets)
    if n and not bool((widths == widths[0]).all()):
        return None
    width = int(widths[0]) if n else 0
    data = column.buffers()[2]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    rows = raw[offsets[0] : offsets[0] + n * width].reshape(n, width)
    with np.errstate(over="ignore"):
        h1 = np.full(n, seed, np.uint32)
        aligned = width - width % 4
        words = np.ascontiguousarray(rows[:, :aligned]).view("<u4").astype(np.uint32)
        for j in range(aligned // 4):
            h1 = _mix(h1, words[:, j])
        for j in range(aligned, width):  # each tail byte, sign-extended, is one more round
            h1 = _mix(h1, rows[:, j].view(np.int8).astype(np.int32).view(np.uint32))
        h1 = _fmix(h1, width)
    return h1.view(np.int32)


def spark_partition(column: pa.Array, partitions: int) -> np.ndarray | None:
    """The partition Spark's ``repartition(col)`` sends each value of a binary column to
    (``pmod(Murmur3Hash(col, 42), partitions)``), or None (see :func:`spark_hash`)."""
    hashes = spark_hash(column)
    if hashes is None:
        return None
    return np.mod(hashes.astype(np.int64), partitions)


def spark_hash_long(values: np.ndarray, seed: int = SPARK_SEED) -> np.ndarray:
    """Spark's ``Murmur3Hash`` of every value of an ``int64`` array (``hashLong``: the low
    32-bit word, then the high one), as ``int32``."""
    words = np.ascontiguousarray(values, dtype="<i8").view("<u4").reshape(-1, 2)
    with np.errstate(over="ignore"):
        h1 = np.full(len(words), seed, np.uint32)
        h1 = _mix(h1, words[:, 0].astype(np.uint32))
        h1 = _mix(h1, words[:, 1].astype(np.uint32))
        h1 = _fmix(h1, 8)
    return h1.view(np.int32)


def long_partition(values: np.ndarray, partitions: int) -> np.ndarray:
    """The partition Spark's ``repartition(col)`` sends each value of a ``bigint`` column
    to (``pmod(Murmur3Hash(col, 42), partitions)``)."""
    return np.mod(spark_hash_long(values).astype(np.int64), partitions)


__all__ = ["SPARK_SEED", "long_partition", "spark_hash", "spark_hash_long", "spark_partition"]
