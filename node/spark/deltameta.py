"""A compaction's per-delta rows and grants/revokes, staged by this process (ADR 0136).

The snapshot's ``deltas`` (one row per delta) and ``acl`` (one row per grant/revoke op)
tables come from few input rows - a delta's ``op_index = 0`` row and its grant/revoke
rows - but a Spark job (:func:`.compact.meta_frame`) decodes every requested column of
every op row to find them: at 5M ops ~4.7 s of JVM CPU for ~1,200 deltas. When the
driver reads the inputs anyway (local exports), pyarrow reads those columns in ~1.3 s of
CPU on a thread beside the facts job, and this module stages exactly the files Spark's
job stages: each row in the partition of Spark's ``Murmur3Hash(delta_cid, 42)`` modulo
the partition count (:func:`spark_partition`), one file per (role, dataset, partition),
sorted by ``(delta_cid, op_index)``, duplicates dropped. The snapshot bytes are those of
the Spark job (tested: the manifest CIDs of both paths are equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .sparkhash import spark_partition

#: Columns of the op rows this module reads, which :func:`.compact.meta_frame` selects
#: too (one list, so both paths stage the same columns), and the staged tables' schemas
#: (those of the files Spark's writer stages for it, as pyarrow reads them).
READ_COLUMNS = [
    "dataset",
    "delta_cid",
    "author",
    "seq",
    "clock",
    "parents",
    "op_index",
    "op",
    "key",
]
STAGED_SCHEMAS = {
    "deltas": pa.schema(
        [
            ("delta_cid", pa.binary()),
            ("author", pa.binary()),
            ("seq", pa.int64()),
            ("clock", pa.int64()),
            ("parents", pa.list_(pa.field("element", pa.binary()))),
        ]
    ),
    "acl": pa.schema(
        [
            ("delta_cid", pa.binary()),
            ("author", pa.binary()),
            ("clock", pa.int64()),
            ("op_index", pa.int32()),
            ("op", pa.string()),
            ("key", pa.binary()),
        ]
    ),
}


#: The read columns cast to one schema, whatever writer named a file's list fields.
READ_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("delta_cid", pa.binary()),
        ("author", pa.binary()),
        ("seq", pa.int64()),
        ("clock", pa.int64()),
        ("parents", pa.list_(pa.field("element", pa.binary()))),
        ("op_index", pa.int32()),
        ("op", pa.string()),
        ("key", pa.binary()),
    ]
)


def _meta_rows(files: Sequence[Path]) -> pa.Table:
    """The ``op_index = 0`` and grant/revoke rows of the ops files, their columns only.

    ``dataset`` is read as the dictionary it is stored as and decoded after the filter,
    for the few rows kept: decoding it for every op row (a 59-character string each,
    ~300 MB at 5M ops) made this cost 1.2-3.3 s of CPU at 5M ops, against 0.9-1.1 s."""
    tables = [READ_SCHEMA.empty_table()]
    for f in files:
        ops = pq.read_table(f, columns=READ_COLUMNS, use_threads=False, read_dictionary=["dataset"])
        keep = pc.or_(
            pc.equal(ops.column("op_index"), 0),
            pc.is_in(ops.column("op"), pa.array(["grant", "revoke"])),
        )
        tables.append(ops.filter(keep).cast(READ_SCHEMA))
    return pa.concat_tables(tables).combine_chunks()


def _first_rows(table: pa.Table, keys: list[str]) -> pa.Table:
    """``table`` sorted by ``keys``, one row per distinct key (its copies are equal)."""
    order = [(k, "ascending") for k in keys]
    table = table.sort_by(order)
    if table.num_rows < 2:
        return table
    new = np.zeros(table.num_rows, bool)
    new[0] = True
    for k in keys:
        column = table.column(k).combine_chunks()
        new[1:] |= np.asarray(pc.not_equal(column[1:], column[:-1]).fill_null(True))
    return table.filter(pa.array(new))


def stage_meta(files: Sequence[Path], staging: Path, partitions: int) -> bool:
    """Stage the deltas and grants/revokes of the ops ``files`` as Spark's meta job does,
    under ``staging/role=<role>/dataset=<ds>/part-NNNNN.parquet`` (NNNNN the partition);
    False (nothing written) when the delta CIDs cannot be partitioned here (a null, or CIDs
    of several widths) or an input cannot be read as expected: the Spark job runs then."""
    try:
        rows = _meta_rows(files)
    except (OSError, pa.ArrowException, KeyError):  # the Spark job reads them and says why
        return False
    part = spark_partition(rows.column("delta_cid"), partitions)
    if part is None:
        return False
    rows = rows.append_column("_part", pa.array(part))
    first = pc.equal(rows.column("op_index"), 0)
    acl = pc.is_in(rows.column("op"), pa.array(["grant", "revoke"]))
    staged = {
        "deltas": _first_rows(rows.filter(first), ["_part", "dataset", "delta_cid"]),
        "acl": _first_rows(rows.filter(acl), ["_part", "dataset", "delta_cid", "op_index"]),
    }
    staging.mkdir(parents=True, exist_ok=True)
    for role, table in staged.items():
        if not table.num_rows:
            continue
        schema = STAGED_SCHEMAS[role]
        groups = table.select(["_part", "dataset"]).group_by(["_part", "dataset"]).aggregate([])
        for p, ds in zip(
            groups.column("_part").to_pylist(), groups.column("dataset").to_pylist(), strict=True
        ):
            mask = pc.and_(
                pc.equal(table.column("_part"), p), pc.equal(table.column("dataset"), ds)
            )
            out = table.filter(mask).select(schema.names).cast(schema)
            directory = staging / f"role={role}" / f"dataset={ds}"
            directory.mkdir(parents=True, exist_ok=True)
            pq.write_table(out, directory / f"part-{p:05d}.parquet", compression="none")
    return True


__all__ = ["READ_SCHEMA", "stage_meta"]
