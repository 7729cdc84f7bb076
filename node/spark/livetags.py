"""A keyed compaction's live tags found without a shuffle, then staged by the driver
exactly as the shuffled job stages them (ADR 0196).

A tag is a fact's ``(fact_key, dataset, delta_key)``: an assert puts one on its fact, a
retract removes those it observed. The shuffled job (:func:`.compact.live_frame`) sends
every assert and every observed tag to the partition of its fact, groups, and keeps the
tags no retract observed. When the retracts observe few tags (at most
:data:`BROADCAST_MAX_TAGS`), :func:`live_tags_frame` finds the same tags in a job of one
stage: each task scans its share of the op rows and drops the asserts whose tag is in
the retracts' tags, which every task holds whole (a broadcast hash table). What it
writes is unordered, and an assert that several inputs carry is there several times.

:func:`stage_partitioned` then writes, on the driver, the files the shuffled job would
have staged: each tag in the partition of Spark's ``Murmur3Hash(fact_key, 42)`` modulo
the partition count (:func:`.sparkhash.long_partition`), one file per partition that
holds tags, sorted by ``(fact_key, dataset, delta_key)``, each tag once. Placement
(:func:`.compact._place_facts`) reads those as it reads Spark's, so the snapshot bytes
and the manifest CID are those of the shuffled job (tested).

When every input row is of one dataset (the usual case: one home's exports), the job
joins on ``(fact_key, delta_key)`` alone and writes no dataset column;
:func:`stage_partitioned` adds its code, 0. Two 8-byte keys instead of three columns: a
smaller broadcast table, cheaper probes and a narrower write (a warm 1M-op job 1.71 ->
1.50 s, medians of four).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .sparkhash import long_partition

#: Retract-observed tags up to which every task holds them all: ~60 bytes each in the
#: driver JVM's broadcast table (120 MB at the limit, within a default 1 GiB heap).
BROADCAST_MAX_TAGS = 2_000_000
#: The staged tags' columns, in the order the shuffled job writes them.
TAG_COLUMNS = ("fact_key", "dataset", "delta_key")
#: The type of the dataset code (:func:`.compact.dataset_column`'s ``smallint``).
DATASET_CODE = pa.int16()


def live_tags_frame(ops: Any, dataset: Any | None) -> Any:
    """The live tags ``(fact_key, dataset, delta_key)`` of keyed op rows, as a map-only job
    (see the module docstring); ``dataset`` is the column expression giving each row's
    dataset as :func:`.compact.live_frame` gives it (a code), or None when all the rows
    are of one dataset: then the tags are ``(fact_key, delta_key)``."""
    from pyspark.sql import functions as F

    coded = [] if dataset is None else [dataset.alias("dataset")]
    keys = [c for c in TAG_COLUMNS if coded or c != "dataset"]
    asserts = ops.where(F.col("op") == "assert").select("fact_key", *coded, "delta_key")
    observed = ops.where(F.col("op") == "retract").select(
        "fact_key", *coded, F.explode("observed_keys").alias("delta_key")
    )
    return asserts.join(F.broadcast(observed), keys, "left_anti").select(*keys)


def stage_partitioned(source: Path, dest: Path, partitions: int) -> int:
    """Stage the tags Spark wrote under ``source`` as ``dest/part-NNNNN.parquet``, one file
    per partition ``NNNNN`` that holds tags (see the module docstring); returns the tags
    kept. ``source`` is removed."""
    files = sorted(source.glob("part-*.parquet"))
    tables = [pq.read_table(f) for f in files]
    dest.mkdir(parents=True, exist_ok=True)
    if not tables or not sum(t.num_rows for t in tables):
        _remove(source)
        return 0
    table = pa.concat_tables(tables)
    if "dataset" not in table.column_names:  # the tags of one dataset: its code is 0
        table = table.append_column(
            pa.field("dataset", DATASET_CODE), pa.array(np.zeros(table.num_rows, np.int16))
        )
    table = table.select(list(TAG_COLUMNS))
    if any(table.column(c).null_count for c in TAG_COLUMNS):
        raise ValueError("keyed tags hold a null key: stage them with the shuffled job")
    fact, dataset, delta = (table.column(c).to_numpy() for c in TAG_COLUMNS)
    part = long_partition(fact, partitions)
    order = np.lexsort((delta, dataset, fact, part))
    part, fact, dataset, delta = part[order], fact[order], dataset[order], delta[order]
    keep = np.ones(len(fact), bool)  # an assert several inputs carry: once
    keep[1:] = (fact[1:] != fact[:-1]) | (dataset[1:] != dataset[:-1]) | (delta[1:] != delta[:-1])
    if not keep.all():
        part, fact, dataset, delta = part[keep], fact[keep], dataset[keep], delta[keep]
    types = [table.schema.field(c).type for c in TAG_COLUMNS]
    bounds = np.searchsorted(part, np.arange(partitions + 1))
    for p in range(partitions):
        lo, hi = int(bounds[p]), int(bounds[p + 1])
        if lo == hi:
            continue
        columns = [
            pa.array(values[lo:hi], type=kind)
            for values, kind in zip((fact, dataset, delta), types, strict=True)
        ]
        pq.write_table(
            pa.Table.from_arrays(columns, names=list(TAG_COLUMNS)),
            dest / f"part-{p:05d}.parquet",
            compression="none",
            use_dictionary=False,
            write_statistics=False,
        )
    _remove(source)
    return len(fact)


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


__all__ = ["BROADCAST_MAX_TAGS", "TAG_COLUMNS", "live_tags_frame", "stage_partitioned"]
