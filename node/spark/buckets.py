"""Ops files bucketed by ``fact_key`` the way Spark buckets a table (ADR 0141).

A compaction's facts job groups the op rows of each fact (:func:`.compact.live_frame`),
so Spark hash-partitions them by ``fact_key`` first: a shuffle of every tag row. An
export that already wrote its op rows hash-partitioned by the same function - Spark's
``pmod(Murmur3Hash(fact_key, 42), n)``, one file per bucket named with Spark's bucket id
(``part-00000_NNNNN.parquet``) - lets the job declare the scan bucketed (a
``HadoopFsRelation`` with a ``BucketSpec``, no catalog table and no SQL parser) and
aggregate with no exchange, on as many tasks as there are buckets. The rows of bucket
*b* are exactly those the shuffle sends to partition *b*, so the staged files and the
snapshot are the same bytes on either path (tested).

``n`` is a function of the op count only (:data:`ROWS_PER_BUCKET`, the compaction's
rows per partition), so a compaction of that one export has as many partitions as the
export has buckets. The layout is recorded in ``export.json`` (``ops_buckets``) and
checked against the file names before it is used; anything else (several exports, a
layout that does not match, exports written before it) is compacted with the shuffle.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from .deltameta import SPARK_SEED, _mix

#: Op rows per bucket of an export, and per partition of a compaction's facts job.
ROWS_PER_BUCKET = 262_144
#: The hash an export's ``ops_buckets`` names: Spark's Murmur3 (x86_32) with seed 42.
BUCKET_HASH = "spark-murmur3-42"
#: The bucketing column.
BUCKET_COLUMN = "fact_key"
_NAME = re.compile(r"part-\d{5}_(\d{5})\.parquet")


def bucket_count(n_ops: int, rows_per_bucket: int = ROWS_PER_BUCKET) -> int:
    """Buckets for ``n_ops`` op rows: the partitions a compaction of them would use."""
    return max(1, math.ceil(n_ops / rows_per_bucket))


def bucket_file(bucket: int) -> str:
    """The name of a bucket's ops file: Spark reads the bucket id after the last ``_``."""
    return f"part-00000_{bucket:05d}.parquet"


def spark_hash_long(keys: pa.Array) -> np.ndarray:
    """Spark's ``Murmur3Hash(col, 42)`` of every value of an ``int64`` column, as
    ``int32`` (``Murmur3_x86_32.hashLong``: the low and the high word, then the
    finalisation for 8 bytes); a null hashes to the seed, as in Spark."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.int32)
    # the data buffer as it is (a value under a null is arbitrary: its hash is replaced)
    values = np.frombuffer(keys.buffers()[1], np.uint64, n, keys.offset * 8)
    valid = np.ones(n, bool)
    if keys.null_count:
        bits = np.frombuffer(keys.buffers()[0], np.uint8)
        valid = np.unpackbits(bits, bitorder="little", count=keys.offset + n)[keys.offset :]
        valid = valid.astype(bool)
    with np.errstate(over="ignore"):
        h1 = np.full(n, SPARK_SEED, np.uint32)
        h1 = _mix(h1, (values & np.uint64(0xFFFFFFFF)).astype(np.uint32))
        h1 = _mix(h1, (values >> np.uint64(32)).astype(np.uint32))
        h1 ^= np.uint32(8)
        h1 ^= h1 >> np.uint32(16)
        h1 *= np.uint32(0x85EBCA6B)
        h1 ^= h1 >> np.uint32(13)
        h1 *= np.uint32(0xC2B2AE35)
        h1 ^= h1 >> np.uint32(16)
    out = h1.view(np.int32)
    if not valid.all():
        out = np.where(valid, out, np.int32(SPARK_SEED))
    return out


def bucket_order(keys: pa.Array, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """The row order that groups rows by bucket (stable: a bucket keeps the rows' order)
    and each bucket's row count."""
    ids = np.mod(spark_hash_long(keys).astype(np.int64), buckets)
    return np.argsort(ids, kind="stable"), np.bincount(ids, minlength=buckets)


def layout(buckets: int) -> dict[str, object]:
    """The ``ops_buckets`` entry of ``export.json`` for ``buckets`` buckets."""
    return {"column": BUCKET_COLUMN, "hash": BUCKET_HASH, "count": buckets}


def ops_buckets(export_dir: Path) -> int | None:
    """The number of buckets of an export's ops files, when its ``export.json`` records
    the layout and every ops file is named with a distinct bucket id below it; None
    otherwise (the export is read without it)."""
    try:
        spec = json.loads((export_dir / "export.json").read_text())["ops_buckets"]
        if spec != layout(int(spec["count"])):
            return None
        count = int(spec["count"])
        names = [
            p.name for p in (export_dir / "ops").iterdir() if not p.name.startswith((".", "_"))
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ids = []
    for name in names:
        match = _NAME.fullmatch(name)
        if match is None:
            return None
        ids.append(int(match.group(1)))
    if not ids or len(set(ids)) != len(ids) or max(ids) >= count:
        return None
    return count
