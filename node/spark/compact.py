"""The ``compact`` Spark job: merged exports → visible facts → signed snapshot.

Inputs are export directories (or ``ops/`` folders) of one or many replicas;
the same delta usually appears in several of them. A delta CID names its
content, so duplicates of an op are exact copies and set semantics absorb them.

Add-wins OR-set, relationally (docs/crdt.md)::

    live(ds, F, d)  :- asserts(ds, d, F), !removed(ds, F, d).
    removed(ds, F, d) :- retract(ds, _, F, Observed), d ∈ Observed.
    visible(ds, F)  :- live(ds, F, _).

Everything about one fact - its asserting deltas and the deltas its retracts
observed - lives in the rows with its ``(fact_cid, dataset)``, so the whole
computation is one ``groupBy(fact_cid, dataset)``: ``collect_list`` of the
asserting delta CIDs, ``collect_list`` of the observed lists, and
``array_except`` of the two (a set) is the fact's *support* (the asserting deltas
not yet removed). A fact is visible iff its support is not empty. Duplicated
input rows need no ``dropDuplicates``: ``array_except`` absorbs them.

The snapshot keeps, per visible fact, its support: that is the whole OR-set
state, so a retract arriving after the snapshot (which lists the asserts it
observed) still removes exactly those.

Reproducible output: the same inputs and signing key give the same manifest
CID. The number of output files is a function of the input row count only,
rows reach files by Spark's Murmur3 hash of the key (not by sampled ranges),
each file is sorted by its key, adaptive partition coalescing is off for the
job, and the files are re-encoded by pyarrow with pinned settings as
``part-00000.parquet``… in partition order (see :func:`_place` for what Spark's
own writer leaves to chance). See docs/spark.md and ADR 0046.
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from merklog.replication.identity import Identity
from merklog.store import Link

from ..errors import NodeInputError
from .deltameta import READ_COLUMNS, stage_meta
from .export import GENESIS_FILE
from .factargs import FactArgs, InputReader, KeyCheck, keyed_inputs, ops_files, read_inputs
from .inputs import input_rows, op_paths
from .livetags import BROADCAST_MAX_TAGS, TAG_COLUMNS, live_tags_frame, stage_partitioned
from .manifest import build_manifest, file_link
from .outfolder import foreign
from .schema import ARGS_TYPE

VALUE_DDL = (
    "struct<`type`:string,`int`:bigint,`float`:double,`str`:string,"
    "`bytes`:binary,`bool`:boolean,`link`:string>"
)
OPS_DDL = (
    "dataset string, delta_cid binary, author binary, clock bigint, seq bigint, "
    f"parents array<binary>, op_index int, op string, relation string, args array<{VALUE_DDL}>, "
    "fact_cid binary, observed array<binary>, key binary, "
    "fact_key bigint, delta_key bigint, observed_keys array<bigint>"
)


def ops_schema() -> Any:
    """:data:`OPS_DDL` as a pyspark ``StructType``, built here rather than parsed: a DDL
    string goes through Spark's SQL parser, whose first use in a fresh JVM costs ~0.2-0.3 s
    of CPU (ANTLR's grammar set-up) that nothing else in a compaction needs (ADR 0129)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    def fields(spec: list[tuple[str, Any]]) -> StructType:
        return StructType([StructField(name, typ, True) for name, typ in spec])

    value = fields(
        [
            ("type", StringType()),
            ("int", LongType()),
            ("float", DoubleType()),
            ("str", StringType()),
            ("bytes", BinaryType()),
            ("bool", BooleanType()),
            ("link", StringType()),
        ]
    )
    return fields(
        [
            ("dataset", StringType()),
            ("delta_cid", BinaryType()),
            ("author", BinaryType()),
            ("clock", LongType()),
            ("seq", LongType()),
            ("parents", ArrayType(BinaryType())),
            ("op_index", IntegerType()),
            ("op", StringType()),
            ("relation", StringType()),
            ("args", ArrayType(value)),
            ("fact_cid", BinaryType()),
            ("observed", ArrayType(BinaryType())),
            ("key", BinaryType()),
            ("fact_key", LongType()),
            ("delta_key", LongType()),
            ("observed_keys", ArrayType(LongType())),
        ]
    )


#: Input op rows per output partition (and file): the file count depends on the input only.
ROWS_PER_PARTITION = 262_144
#: Staged facts files placed side by side (the driver's share of a compaction: gathering
#: arguments and re-encoding, ~6 s of CPU at 5M ops, while the deltas job runs).
PLACE_THREADS = 2
#: The facts job's shuffle and sort key (fact_cid first: see :func:`snapshot_frame`).
FACT_KEY = ("fact_cid", "dataset")
#: The facts jobs shuffle by fact CID alone: a fact's rows of every dataset meet in one
#: partition, which the ``(fact_cid, dataset)`` aggregate needs, and the key does not
#: depend on how the dataset travels (its name, or a code: :func:`live_frame`).
SHUFFLE_KEY = "fact_cid"
_STAGING = "_compact_staging"


class CompactError(NodeInputError):
    """The inputs or the output directory cannot be used (a clear message, no traceback;
    a ``merklog.Error`` like every error the package raises, and a ``ValueError``)."""


class NothingToCompact(CompactError):
    """The inputs hold no delta (the export of a fresh home, or of one whose deltas were
    all pruned): a snapshot is of a dataset, and they name none."""

    def __init__(self) -> None:
        super().__init__(
            "the inputs hold no deltas (the export of a fresh home, or of one whose deltas"
            " were all pruned): there is nothing to compact"
        )


class SnapshotFolderTaken(CompactError):
    """A ``dataset=<cid>/`` entry under ``--out`` that writing a snapshot would replace
    holds what no compact wrote (a user's own files)."""


#: What compact writes in a ``dataset=<cid>/`` folder: these files, and these folders of
#: ``part-NNNNN.parquet`` files (:func:`_place`, :func:`_place_facts`, :func:`_snapshot`).
_SNAPSHOT_FILES = frozenset({"manifest.cbor", "MANIFEST_CID", GENESIS_FILE})
_SNAPSHOT_ROLES = frozenset({"facts", "deltas", "acl"})
_PART_FILE = re.compile(r"part-\d{5,}\.parquet")


def _require_dataset_cid(ds: str) -> None:
    """Refuse (:class:`CompactError`) a dataset value of the inputs that is not a CID in
    its own text: it names the ``dataset=<ds>/`` folder a snapshot replaces, and a
    crafted export's value (``x/../..``) must not name another place to delete."""
    try:
        ok = str(Link.parse(ds)) == ds
    except ValueError:
        ok = False
    if not ok:
        raise CompactError(
            f"the inputs name a dataset {ds[:80]!r} that is not a CID: they are no merklog"
            " export (nothing was written)"
        )


def refuse_foreign_snapshot_folders(out: Path, datasets: Iterable[str] | None = None) -> None:
    """Refuse (:class:`SnapshotFolderTaken`) when ``out/dataset=<ds>/`` exists for a
    dataset of ``datasets`` (None: any ``dataset=*`` entry, when the inputs' datasets are
    unknown) and is not a snapshot folder a compact wrote: writing a dataset's snapshot
    replaces its folder whole, and deleted a user's own files in it."""
    if datasets is None:
        paths = sorted(out.glob("dataset=*"))
    else:
        for ds in datasets:
            _require_dataset_cid(ds)  # before it names a folder to replace
        paths = [out / f"dataset={ds}" for ds in sorted(datasets)]
    for path in paths:
        what = foreign(path, _compact_wrote)
        if what is None:
            continue
        raise SnapshotFolderTaken(
            f"{path} is a {what} that no compact wrote, and the snapshot of its dataset would"
            " replace it: give --out a folder of its own (nothing was written)"
        )


def _compact_wrote(path: Path) -> bool:
    """Whether the folder ``path`` holds only what compact writes in a snapshot folder
    (all of it, or the part a compaction interrupted while placing its files left), or
    nothing: replacing it loses nothing."""
    for entry in path.iterdir():
        if entry.is_symlink():
            return False
        if entry.name in _SNAPSHOT_FILES and entry.is_file():
            continue
        if entry.name in _SNAPSHOT_ROLES and entry.is_dir() and _only_part_files(entry):
            continue
        return False
    return True


def _only_part_files(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but the ``part-NNNNN.parquet`` files compact writes."""
    return all(
        f.is_file() and not f.is_symlink() and _PART_FILE.fullmatch(f.name)
        for f in folder.iterdir()
    )


#: What compact says of a partial export: why it refuses it, and the way out.
_PARTIAL_FOR_COMPACT = (
    "a snapshot of it would lack facts while claiming the home's heads; compact exports"
    " made before pruning, or keep the snapshot made then"
)
#: What analyze says of one (it reads the ops too, and would miss those facts).
PARTIAL_FOR_ANALYZE = (
    "analyze would miss the facts of those deltas; analyze an export made before pruning"
)


def refuse_partial_exports(inputs: list[str | Path], why: str = _PARTIAL_FOR_COMPACT) -> None:
    """Refuse (:class:`CompactError`) a local input whose ``export.json`` says deltas were
    missing from it (the export of a pruned home, or of one bootstrapped from a snapshot):
    its ops do not account for its visible facts, and a snapshot of them would claim the
    home's heads while lacking facts, so peers bootstrapped from it never converge;
    ``analyze`` over them would miss facts (``why`` says which)."""
    import json

    for item in inputs:
        text = str(item)
        if "://" in text or text.startswith("file:"):
            continue
        path = Path(text)
        missing = 0
        for summary in (path / "export.json", path.parent / "export.json"):
            if summary.is_file() and (path.name == "ops" or summary.parent == path):
                try:
                    missing = int(json.loads(summary.read_text()).get("missing_deltas", 0))
                except (ValueError, OSError, AttributeError, TypeError):
                    continue
        # Each ops file says it too: a part file, or an ops/ folder copied without its
        # export.json, of a partial export is refused as the export itself is.
        missing = missing or _missing_in_files(path)
        if missing:
            raise CompactError(
                f"{item} is the export of a home that no longer holds {missing}"
                " of its deltas (pruned, or covered by the snapshot it was"
                " bootstrapped from): its ops do not account for all its facts, and"
                f" {why}"
            )


def _missing_in_files(path: Path) -> int:
    """The deltas the ops files under ``path`` (a file, an export or its ``ops/``) say
    their export lacks (their Parquet metadata, ``MISSING_DELTAS_KEY``); 0 when none say
    so (an export made before the key existed says nothing)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .export import MISSING_DELTAS_KEY

    if path.is_dir() and (path / "ops").is_dir():
        path = path / "ops"
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet")) if path.is_dir() else []
    for f in files:
        try:
            meta = pq.read_schema(f).metadata or {}
        except (OSError, pa.ArrowException):
            continue  # not Parquet: input_rows names it
        try:
            missing = int(meta.get(MISSING_DELTAS_KEY, b"0"))
        except ValueError:
            continue
        if missing:
            return missing
    return 0


def _input_paths(inputs: list[str | Path]) -> list[str]:
    paths = op_paths(inputs)
    if not paths:
        raise CompactError("compact needs at least one input export directory")
    return paths


def read_ops(spark: Any, inputs: list[str | Path]) -> Any:
    """All op rows of the given exports (duplicates included: consumers aggregate as sets)."""
    return spark.read.schema(ops_schema()).parquet(*_input_paths(inputs))


def snapshot_frame(ops: Any, shuffle: str = SHUFFLE_KEY) -> Any:
    """One row per visible fact: dataset, relation, fact_cid, args, support (sorted, binary).

    The tag rows are shuffled by ``fact_cid`` (:data:`SHUFFLE_KEY`) and sorted by
    ``(fact_cid, dataset)`` *before* the aggregate, so it sees each fact's rows together: no partial
    aggregate runs on the unshuffled input (where nearly every key is distinct, so it
    only costs) and the sort aggregate needs no sort of its own (ADR 0055). The key
    starts with ``fact_cid``, not ``dataset``: Spark sorts on an 8-byte prefix of the
    first key, and a dataset's rows all share theirs, which left every comparison to
    the full rows (ADR 0114). ``collect_list`` and ``array_except`` (whose result is
    a set) replace ``collect_set``, and ``sort_array`` the lambda comparator of
    ``array_sort``. Retract rows drop their relation and arguments before the shuffle
    (an assert of the same fact carries them, and a fact without one is not visible).
    The output is ordered by ``(fact_cid, dataset)`` within each partition."""
    from pyspark.sql import functions as F

    is_assert = F.col("op") == "assert"
    extra = [] if shuffle == "fact_cid" else [shuffle]  # see live_frame
    tags = (
        ops.where(F.col("op").isin("assert", "retract"))
        .select(
            *extra,
            "fact_cid",
            "dataset",
            F.when(is_assert, F.col("relation")).alias("relation"),
            F.when(is_assert, F.col("args")).alias("args"),
            F.when(is_assert, F.col("delta_cid")).alias("asserted"),
            F.when(~is_assert, F.col("observed")).alias("observed"),
        )
        .repartition(F.col(shuffle))
        .sortWithinPartitions(*extra, *FACT_KEY)
    )
    return (
        tags.groupBy(*extra, *FACT_KEY)
        .agg(
            F.first("relation", ignorenulls=True).alias("relation"),
            F.first("args", ignorenulls=True).alias("args"),
            F.collect_list("asserted").alias("asserted"),
            F.collect_list("observed").alias("observed"),
        )
        .select(
            "dataset",
            "relation",
            "fact_cid",
            "args",
            F.sort_array(F.array_except("asserted", F.flatten("observed"))).alias("support"),
        )
        .where(F.size("support") > 0)
    )


#: At most this many datasets are coded as small integers in the facts job (a CASE per row).
MAX_CODED_DATASETS = 256


def dataset_column(datasets: list[str] | None) -> Any:
    """The op rows' dataset as the facts jobs carry it: with ``datasets`` (sorted, all the
    input's datasets) its index in that list as ``smallint``, which sorts as the name
    does; else the name."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ShortType

    dataset = F.col("dataset")
    if not datasets:
        return dataset
    coded = F.when(dataset == datasets[0], F.lit(0))
    for i, name in enumerate(datasets[1:], 1):
        coded = coded.when(dataset == name, F.lit(i))
    return coded.cast(ShortType())  # a type, not "smallint": no SQL parser (ADR 0129)


def live_frame(
    ops: Any, datasets: list[str] | None = None, shuffle: str = SHUFFLE_KEY, keyed: bool = False
) -> Any:
    """The live tags: one row ``(fact_cid, dataset, delta_cid)`` per assert of a fact that
    no retract observed, ordered by those columns within each partition.

    The narrow form of :func:`snapshot_frame`, for when this process adds each fact's
    relation and arguments by fact CID (:mod:`.factargs`) and groups a fact's live tags
    into its support list while re-encoding (ADR 0122). One scan: an assert tags its fact
    with its delta (kind 0), a retract with each delta it observed (kind 1, one
    ``explode`` for both); after the shuffle by ``fact_cid`` (:data:`SHUFFLE_KEY`) a tag
    is live iff its greatest kind is 0. That aggregate is a hash aggregate over
    fixed-width buffers (no ``collect_list`` objects, no ``array_except``), and no typed
    values travel through the shuffle or the writer. With ``datasets`` (sorted, all the
    input's datasets) the dataset travels as its index in that list (``smallint``), which
    sorts as the name does: :func:`_place_facts` names it again.

    ``keyed`` (the inputs' 64-bit CID keys checked injective: ADR 0131) runs the same job
    on ``fact_key``, ``delta_key`` and ``observed_keys`` instead of the CIDs, giving rows
    ``(fact_key, dataset, delta_key)`` in the same order; ``shuffle`` is the column the
    rows are partitioned by (``fact_key`` whenever every input carries the keys, so that
    every path puts the same facts in the same files)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ByteType

    is_assert = F.col("op") == "assert"
    dataset = dataset_column(datasets)
    fact, delta, observed = (
        ("fact_key", "delta_key", "observed_keys")
        if keyed
        else ("fact_cid", "delta_cid", "observed")
    )
    # grouping by the shuffle column too keeps the rows where the shuffle put them (a key
    # Spark does not know to be a function of the CID would need a shuffle of its own)
    extra = [] if shuffle == fact else [shuffle]
    rows = (
        ops.where(F.col("op").isin("assert", "retract"))
        .select(
            *extra,
            fact,
            dataset.alias("dataset"),
            F.explode(F.when(is_assert, F.array(delta)).otherwise(F.col(observed))).alias(delta),
            F.when(is_assert, F.lit(0)).otherwise(F.lit(1)).cast(ByteType()).alias("kind"),
        )
        .repartition(F.col(shuffle))
    )
    return (
        rows.groupBy(*extra, fact, "dataset", delta)
        .agg(F.max("kind").alias("kind"))
        .where(F.col("kind") == 0)
        .select(fact, "dataset", delta)
    )


def deltas_frame(ops: Any) -> Any:
    """One row per delta: dataset, delta_cid, author, seq, clock, parents.

    Every delta has exactly one row with ``op_index`` 0 (its first op, or the
    ``none`` row of a delta without ops) and the per-delta columns are equal on
    all its rows, so only those rows are deduplicated: the aggregate sees one row
    per delta and input copy instead of one per op."""
    from pyspark.sql import functions as F

    return (
        ops.where(F.col("op_index") == 0)
        .select("dataset", "delta_cid", "author", "seq", "clock", "parents")
        .dropDuplicates(["delta_cid"])
    )


def acl_frame(ops: Any) -> Any:
    """One row per grant/revoke op: dataset, delta_cid, author, clock, op_index, op, key."""
    from pyspark.sql import functions as F

    return (
        ops.where(F.col("op").isin("grant", "revoke"))
        .select("dataset", "delta_cid", "author", "clock", "op_index", "op", "key")
        .dropDuplicates(["delta_cid", "op_index"])
    )


#: The columns of each staged per-delta table (:func:`meta_frame` carries their union).
META_COLUMNS = {
    "deltas": ["delta_cid", "author", "seq", "clock", "parents"],
    "acl": ["delta_cid", "author", "clock", "op_index", "op", "key"],
}


def meta_frame(ops: Any) -> Any:
    """:func:`deltas_frame` and :func:`acl_frame` in one scan and one shuffle, told apart
    by a ``role`` column (``deltas`` or ``acl``; a grant that is its delta's first op
    gives a row of each). Deduplicated by ``(role, delta_cid, op_index)`` after a shuffle
    by ``delta_cid`` alone, which is :func:`deltas_frame`'s partitioning, so the deltas
    land in the same files."""
    from pyspark.sql import functions as F

    is_acl = F.col("op").isin("grant", "revoke")
    roles = F.array_compact(
        F.array(
            F.when(F.col("op_index") == 0, F.lit("deltas")),
            F.when(is_acl, F.lit("acl")),
        )
    )
    return (
        ops.where((F.col("op_index") == 0) | is_acl)
        .select(F.explode(roles).alias("role"), *READ_COLUMNS)
        .repartition("delta_cid")
        .dropDuplicates(["role", "delta_cid", "op_index"])
    )


def heads_of(deltas: pa.Table) -> list[bytes]:
    """The deltas no other delta of the table names as a parent (sorted raw CIDs)."""
    named = pc.list_flatten(deltas.column("parents")).chunks
    value_set = pa.concat_arrays(named) if named else pa.array([], pa.binary())
    cids = deltas.column("delta_cid")
    mask = pc.invert(pc.is_in(cids, value_set=value_set))
    return sorted(set(cids.filter(mask).to_pylist()))


def stable_deltas(deltas: list[tuple[bytes, bytes, int, list[bytes]]]) -> set[bytes]:
    """Causally stable deltas: those in the causal past of the latest delta of *every* author.

    ``deltas`` are ``(delta_cid, author, seq, parents)``. Every later delta from
    any author has that author's latest known delta in its past (an author's
    deltas chain through its own heads), so nothing can ever arrive that is
    concurrent with a stable delta: history up to there may be compacted and pruned.
    """
    parents = {cid: ps for cid, _a, _s, ps in deltas}
    latest: dict[bytes, tuple[int, bytes]] = {}
    for cid, author, seq, _ps in deltas:
        if author not in latest or seq > latest[author][0]:
            latest[author] = (seq, cid)

    def past(cid: bytes) -> set[bytes]:
        seen = {cid}
        stack = [cid]
        while stack:
            for p in parents.get(stack.pop(), ()):
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        return seen

    stable: set[bytes] | None = None
    for _seq, cid in latest.values():
        stable = past(cid) if stable is None else stable & past(cid)
    return stable or set()


@dataclass
class SnapshotResult:
    dataset: str
    directory: Path
    manifest_cid: Link
    manifest: dict[str, Any]


@contextmanager
def _job_conf(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """Session settings for the duration of one job, restored afterwards."""
    old = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


#: Spark's Parquet writer settings for staged files, which only this process reads back
#: once (and re-encodes: :func:`_place`): uncompressed, and none of the dictionary
#: attempts, statistics and page checksums that serve later readers of a file. Measured on
#: the 1M-op facts job in a warm session: ~0.15-0.2 s less JVM CPU (ADR 0129).
STAGED_PARQUET: dict[str, str] = {
    "compression": "none",
    "parquet.enable.dictionary": "false",
    "parquet.column.statistics.enabled": "false",
    "parquet.size.statistics.enabled": "false",
    "parquet.page.write-checksum.enabled": "false",
}


def _staged(df: Any) -> Any:
    """``df.write`` for a staged file: overwrite, :data:`STAGED_PARQUET`."""
    return df.write.mode("overwrite").options(**STAGED_PARQUET)


def _write(df: Any, path: Path, sort: list[str]) -> None:
    """Stage ``df`` partitioned by dataset, each task's file sorted by ``sort``; uncompressed,
    as :func:`_place` re-encodes every file anyway."""
    _staged(df.sortWithinPartitions("dataset", *sort)).partitionBy("dataset").parquet(str(path))


def _write_facts(df: Any, path: Path, sort: tuple[str, ...] = FACT_KEY) -> None:
    """Stage the facts as one uncompressed file per shuffle partition, in the aggregate's
    ``(fact_cid, dataset)`` order: no ``partitionBy("dataset")``, whose required
    dataset-first order would sort every partition again (on a useless prefix);
    :func:`_place_facts` splits the files by dataset instead."""
    _staged(df.sortWithinPartitions(*sort)).parquet(str(path))


def _write_tags(df: Any, path: Path) -> None:
    """Stage :func:`.livetags.live_tags_frame` as Spark writes it (unordered, uncompressed):
    :func:`.livetags.stage_partitioned` orders and partitions it."""
    _staged(df).parquet(str(path))


def _write_meta(df: Any, path: Path) -> None:
    """Stage :func:`meta_frame` partitioned by role and dataset, each file sorted by
    ``(delta_cid, op_index)``; uncompressed, as :func:`_place` re-encodes every file."""
    _staged(df.sortWithinPartitions("role", "dataset", "delta_cid", "op_index")).partitionBy(
        "role", "dataset"
    ).parquet(str(path))


def _staged_files(staging: Path, role: str, job: str | None = None) -> dict[str, list[Path]]:
    """``dataset → files`` Spark wrote under ``staging/role/dataset=<ds>/``, in partition
    order; with ``job``, under ``staging/job/role=<role>/dataset=<ds>/`` (none when the
    job wrote no rows of that role)."""
    written = staging / (job or role)
    if not written.is_dir():
        raise CompactError(
            f"Spark wrote its output where this process cannot see it ({written} is missing):"
            " with --remote or a cluster, --out must be a directory both sides share"
        )
    root = written / f"role={role}" if job else written
    out: dict[str, list[Path]] = {}
    for d in sorted(root.glob("dataset=*")):
        out[d.name.split("=", 1)[1]] = sorted(d.glob("part-*.parquet"))
    return out


#: How snapshot files are encoded (pinned: part of the reproducibility guarantee).
SNAPSHOT_PARQUET: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "row_group_size": 1 << 20,
    "write_statistics": True,
}
#: How snapshot facts files are encoded (pinned too): zstd level 1 and min/max statistics
#: on ``relation`` and ``fact_cid`` only (the columns a reader selects by; the file is
#: sorted by ``fact_cid``). Level 3 and statistics on the argument and support lists gave
#: files of the same size for ~25 % more of the driver's encoding CPU (ADR 0135).
SNAPSHOT_FACTS_PARQUET: dict[str, Any] = {
    **SNAPSHOT_PARQUET,
    "compression_level": 1,
    "write_statistics": ["relation", "fact_cid"],
}


def _place(files: list[Path], dest: Path, role: str) -> None:
    """Re-encode a role's staged files (its :data:`META_COLUMNS`) as
    ``dest/part-NNNNN.parquet`` with pyarrow; the grants and revokes (few) as one file
    sorted by ``(delta_cid, op_index)``, however many partitions held them.

    Spark's Parquet writer (parquet-mr) is not byte-reproducible: it names files with
    a job UUID and lists each column chunk's encodings from a hash set whose order
    changes from JVM to JVM. The rows are (partition and order are deterministic), so
    rewriting them with pinned pyarrow settings and no writer metadata gives the same
    bytes for the same rows whatever ran the job."""
    dest.mkdir(parents=True, exist_ok=True)
    tables = [pq.read_table(f, columns=META_COLUMNS[role]) for f in files]
    if role == "acl" and len(tables) > 1:
        order = [("delta_cid", "ascending"), ("op_index", "ascending")]
        tables = [pa.concat_tables(tables).sort_by(order)]
    for i, table in enumerate(tables):
        table = table.replace_schema_metadata(None)
        pq.write_table(table, dest / f"part-{i:05d}.parquet", **SNAPSHOT_PARQUET)
    for f in files:
        f.unlink()


#: The snapshot's facts files (pinned: the same whether Spark or the driver added the
#: relation and arguments; the list and nullability shapes are those Spark's writer gives).
SNAPSHOT_FACTS_SCHEMA = pa.schema(
    [
        ("relation", pa.string()),
        ("fact_cid", pa.binary()),
        ("args", pa.list_(pa.field("element", ARGS_TYPE.value_type))),
        pa.field("support", pa.list_(pa.field("element", pa.binary(), False)), False),
    ]
)


def _supports(tags: pa.Table, fact: str = "fact_cid") -> pa.Table:
    """Live tag rows ``fact, dataset, delta_cid`` sorted by those columns (a staged
    :func:`live_frame` file) as one row per fact with its sorted ``support`` list."""
    n = tags.num_rows
    cids = tags.column(fact).combine_chunks()
    datasets = tags.column("dataset").combine_chunks()
    if n:
        new = pc.or_(pc.not_equal(cids[1:], cids[:-1]), pc.not_equal(datasets[1:], datasets[:-1]))
        starts = np.concatenate([[0], np.nonzero(np.asarray(new))[0] + 1])
    else:
        starts = np.zeros(0, np.int64)
    offsets = pa.array(np.append(starts, n).astype(np.int32))
    at = pa.array(starts)
    return pa.table(
        {
            "dataset": datasets.take(at),
            fact: cids.take(at),
            "support": pa.ListArray.from_arrays(offsets, tags.column("delta_cid").combine_chunks()),
        }
    )


def _facts_table(
    part: pa.Table, fact_args: FactArgs | None, keys: KeyCheck | None = None
) -> pa.Table:
    """A staged slice as SNAPSHOT_FACTS_SCHEMA rows. A slice of live tags (the job was
    :func:`live_frame`) is grouped into supports and gets its facts' relation and
    arguments from ``fact_args``; keyed tags (ADR 0131) get their CIDs back from the
    keys (``keys`` for the deltas, ``fact_args`` for the facts)."""
    if "fact_key" in part.column_names:
        if fact_args is None or keys is None:
            raise CompactError("staged keyed tags need the inputs' facts and delta keys")
        deltas = keys.delta_cid(part.column("delta_key").combine_chunks())
        tags = pa.table(
            {
                "fact_key": part.column("fact_key"),
                "dataset": part.column("dataset"),
                "delta_cid": deltas,
            }
        )
        grouped = _supports(tags, "fact_key")
        cids, relation, args = fact_args.gather_keys(
            np.asarray(grouped.column("fact_key").combine_chunks())
        )
        columns = [relation, cids, args, grouped.column("support")]
        return pa.Table.from_arrays(
            [c.cast(f.type) for c, f in zip(columns, SNAPSHOT_FACTS_SCHEMA, strict=True)],
            schema=SNAPSHOT_FACTS_SCHEMA,
        )
    if "support" not in part.column_names:
        part = _supports(part)
    cids = part.column("fact_cid").combine_chunks()
    if "args" in part.column_names:
        relation, args = part.column("relation"), part.column("args")
    else:
        if fact_args is None:
            raise CompactError("staged live tags need the inputs' facts")
        relation, args = fact_args.gather(cids)
    columns = [relation, cids, args, part.column("support")]
    return pa.Table.from_arrays(
        [c.cast(f.type) for c, f in zip(columns, SNAPSHOT_FACTS_SCHEMA, strict=True)],
        schema=SNAPSHOT_FACTS_SCHEMA,
    )


def _place_facts(
    staging: Path,
    out: Path,
    datasets: list[str] | None = None,
    fact_args: FactArgs | None = None,
    codes: list[str] | None = None,
    keys: KeyCheck | None = None,
) -> dict[str, int]:
    """Split the staged facts files by dataset and re-encode each dataset's rows as
    ``out/dataset=<ds>/facts/part-NNNNN.parquet`` (pinned settings, as :func:`_place`),
    in partition order, one file per partition that holds rows of it. A staged file is
    sorted by ``(fact_cid, dataset)``, so each dataset's slice is sorted by fact_cid.
    Staged live tags are grouped into supports and get their facts' relation and
    arguments from ``fact_args``; their dataset codes are indexes into ``codes``. Only
    ``datasets`` (default: every dataset the files hold). Returns ``dataset → support
    tags``."""
    root = staging / "facts"
    if not root.is_dir():
        raise CompactError(
            f"Spark wrote its output where this process cannot see it ({root} is missing):"
            " with --remote or a cluster, --out must be a directory both sides share"
        )
    placed: dict[str, int] = {}
    support: dict[str, int] = {}
    for ds in datasets or ():
        placed[ds] = support[ds] = 0
        (out / f"dataset={ds}" / "facts").mkdir(parents=True, exist_ok=True)
    name_of = pa.array(codes, pa.string()) if codes is not None else None

    def names_in(column: pa.ChunkedArray) -> pa.Array:
        column = column.combine_chunks()
        return name_of.take(column) if name_of is not None else column

    # which datasets each file holds (its dataset column alone), so that the parts are
    # numbered in file order before the files are placed side by side
    plan: list[tuple[Path, int, list[tuple[str, int]]]] = []
    for f in sorted(root.glob("part-*.parquet")):
        names = sorted(pc.unique(names_in(pq.read_table(f, columns=["dataset"])[0])).to_pylist())
        jobs = []
        for ds in names:
            if datasets is not None and ds not in placed:
                continue
            if ds not in placed:
                placed[ds] = support[ds] = 0
                (out / f"dataset={ds}" / "facts").mkdir(parents=True, exist_ok=True)
            jobs.append((ds, placed[ds]))
            placed[ds] += 1
        plan.append((f, len(names), jobs))

    def place(item: tuple[Path, int, list[tuple[str, int]]]) -> dict[str, int]:
        f, n_names, jobs = item
        counts: dict[str, int] = {}
        if jobs:
            table = pq.read_table(f).replace_schema_metadata(None)
            column = names_in(table.column("dataset"))
            for ds, number in jobs:
                part = table if n_names == 1 else table.filter(pc.equal(column, ds))
                part = _facts_table(part, fact_args, keys)
                dest = out / f"dataset={ds}" / "facts" / f"part-{number:05d}.parquet"
                pq.write_table(part, dest, **SNAPSHOT_FACTS_PARQUET)
                counts[ds] = int(pc.sum(pc.list_value_length(part.column("support"))).as_py() or 0)
        f.unlink()
        return counts

    # pyarrow and numpy release the GIL for the reading, gathering and encoding (ADR 0131)
    with ThreadPoolExecutor(PLACE_THREADS, thread_name_prefix="merklog-place") as pool:
        for counts in pool.map(place, plan):
            for ds, n in counts.items():
                support[ds] += n
    return support


def _read(files: list[Path], columns: list[str]) -> pa.Table:
    tables = [pq.read_table(f, columns=columns) for f in files]
    if not tables:
        return pa.table({c: pa.array([], pa.binary()) for c in columns})
    return pa.concat_tables(tables)


def compact(
    spark: Any,
    inputs: list[str | Path],
    out_dir: str | Path,
    identity: Identity,
    prune: bool = False,
    rows_per_partition: int = ROWS_PER_PARTITION,
    gather: bool | None = None,
    reader: InputReader | None = None,
) -> list[SnapshotResult]:
    """Compact merged exports into one signed snapshot per dataset under ``out_dir``.

    With ``prune=True`` the snapshot covers only the causally stable prefix of
    the log (see :func:`stable_deltas`); without it, everything in the inputs.
    The Spark jobs are the writes themselves (deltas, facts, grants/revokes);
    heads, counts and clocks are read from the written files' footers and columns.

    ``gather`` (default: whenever this process can read every input) has the Spark job
    aggregate narrow rows and this process add each visible fact's relation and
    arguments by fact CID from the inputs (:mod:`.factargs`, ADR 0122); ``False`` keeps
    them in the Spark job, as inputs only the cluster can read need. Both give the same
    bytes. ``reader`` (:func:`.factargs.read_inputs` of the same inputs, started before
    the session) is used for that and closed; without it the reading starts here.
    """
    from pyspark.sql import functions as F

    out = Path(out_dir)
    if gather is False and reader is not None:
        reader.close()
        reader = None
    elif reader is None and gather is not False:
        reader = read_inputs(inputs)
    if gather and reader is None:
        raise CompactError("gathering fact arguments needs inputs this process can read")
    refuse_partial_exports(inputs)
    n_in = input_rows(inputs)
    if n_in == 0:
        raise NothingToCompact()
    parts = max(1, math.ceil((n_in if n_in is not None else 0) / rows_per_partition))
    staging, staging_lock = _claim_staging(out)
    settings = {
        "spark.sql.shuffle.partitions": str(parts),
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
    }
    placed = staging / "placed"
    # one thread stages the deltas and grants while the facts job runs, one places the facts
    pool = ThreadPoolExecutor(2, thread_name_prefix="merklog-compact")
    try:
        codes = None
        if reader is not None and len(reader.datasets()) <= MAX_CODED_DATASETS:
            codes = reader.datasets()
        # every input carries the CIDs' 64-bit keys: every path partitions by fact_key, and
        # the job aggregates keys instead of CIDs when they are injective (ADR 0131)
        # The job does not wait for the reader's key check, which runs beside it: keys that
        # turn out not to name the CIDs one to one (never seen: two CIDs sharing 64 digest
        # bits) send the job once more over the CIDs, with the same partitioning.
        shuffle = "fact_key" if keyed_inputs(inputs) else SHUFFLE_KEY
        keyed = reader is not None and shuffle == "fact_key"
        keys: KeyCheck | None = None

        # the retracts observe few tags: the keyed job finds the live ones without a shuffle
        # and this process stages them as the shuffled job would (ADR 0196)
        observed = reader.observed() if keyed and reader is not None else None
        broadcast = codes is not None and observed is not None and observed <= BROADCAST_MAX_TAGS

        # the facts are placed on a thread while the deltas are staged (pyarrow releases the GIL)
        def place_facts() -> dict[str, int]:
            if (staging / "tags").is_dir():
                stage_partitioned(staging / "tags", staging / "facts", parts)
            args = reader.facts() if reader is not None else None
            try:
                return _place_facts(staging, placed, None, args, codes, keys)
            except LookupError as exc:  # an input changed under the job
                raise CompactError(str(exc)) from None

        with _job_conf(spark, settings):
            ops = read_ops(spark, inputs)
            # the per-delta rows are few: read by this process beside the facts job (ADR 0136)
            local_meta = None
            if reader is not None and not prune:
                files = [f for path in reader.paths for f in ops_files(path)]
                local_meta = pool.submit(stage_meta, files, staging / "meta", parts)
            if prune:
                _write(deltas_frame(ops), staging / "deltas", ["delta_cid"])
                deltas_files = _staged_files(staging, "deltas")
                unstable = _unstable(deltas_files)
                if unstable:
                    drop = spark.createDataFrame([(c,) for c in unstable], "delta_cid binary")
                    ops = ops.join(F.broadcast(drop), "delta_cid", "left_anti")
                    _write(deltas_frame(ops), staging / "pruned", ["delta_cid"])
                    deltas_files = _staged_files(staging, "pruned")
            if reader is not None:
                if keyed:
                    if broadcast:
                        one = len(codes) == 1  # one dataset: the tags need no code of it
                        frame = live_tags_frame(ops, None if one else dataset_column(codes))
                        _write_tags(frame, staging / "tags")
                    else:
                        live = live_frame(ops, codes, shuffle, True)
                        _write_facts(live, staging / "facts", TAG_COLUMNS)
                    if reader.keys().usable:
                        keys = reader.keys()
                    else:
                        shutil.rmtree(staging / "tags", ignore_errors=True)
                        shutil.rmtree(staging / "facts", ignore_errors=True)
                        keyed = False
                if not keyed:
                    by_cid = (*FACT_KEY, "delta_cid")
                    _write_facts(live_frame(ops, codes, shuffle), staging / "facts", by_cid)
            else:
                _write_facts(snapshot_frame(ops, shuffle), staging / "facts")
            placing = pool.submit(place_facts)
            if prune:
                with _job_conf(spark, {"spark.sql.shuffle.partitions": "1"}):
                    _write(acl_frame(ops), staging / "acl", ["delta_cid", "op_index"])
                acl_files = _staged_files(staging, "acl")
            else:
                if local_meta is None or not local_meta.result():
                    # after the facts job, which warms up the scan and the writer
                    shutil.rmtree(staging / "meta", ignore_errors=True)
                    _write_meta(meta_frame(ops), staging / "meta")
                deltas_files = _staged_files(staging, "deltas", "meta")
                acl_files = _staged_files(staging, "acl", "meta")
        datasets = sorted(ds for ds in deltas_files if deltas_files[ds])
        if not datasets and not prune:  # inputs only Spark can read (URLs) held no delta
            raise NothingToCompact()
        support = placing.result()
        refuse_foreign_snapshot_folders(out, datasets)  # the CLI checked before the JVM too
        for ds in datasets:
            shutil.rmtree(out / f"dataset={ds}", ignore_errors=True)
            if (placed / f"dataset={ds}").is_dir():
                (placed / f"dataset={ds}").rename(out / f"dataset={ds}")
            else:
                (out / f"dataset={ds}" / "facts").mkdir(parents=True)
        results = [
            _snapshot(
                out,
                ds,
                deltas_files[ds],
                support.get(ds, 0),
                acl_files.get(ds, []),
                identity,
                inputs,
            )
            for ds in datasets
        ]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if reader is not None:
            reader.close()
        shutil.rmtree(staging, ignore_errors=True)
        os.close(staging_lock)
        try:
            (out / _STAGING).rmdir()
        except OSError:
            pass
    return results


def _claim_staging(out: Path) -> tuple[Path, int]:
    """A fresh staging directory under ``out/_compact_staging`` and an open descriptor
    holding a lock on it for this compaction's life. What compactions that were killed
    (``kill -9``: no cleanup ran) left there is removed first: a directory whose lock
    nobody holds. One that another compaction still holds is left alone."""
    root = out / _STAGING
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        _remove_if_abandoned(old)
    staging = root / uuid.uuid4().hex
    staging.mkdir()
    fd = os.open(staging / _STAGING_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return staging, fd


#: The file in a staging directory whose flock says a compaction still uses it.
_STAGING_LOCK = ".lock"
#: Seconds after which a staging directory without a lock file (one being created right
#: now has none for a moment) counts as abandoned.
_UNLOCKED_STAGING_AGE = 600.0


def remove_abandoned_staging(out: Path) -> None:
    """Remove what compactions that failed or were interrupted left in ``out``'s staging
    folder, once their JVMs have ended (a task of an abandoned job could re-create a
    staging folder, without its lock, after the compaction removed it): every staging
    directory no compaction holds. One that another compaction holds is left alone."""
    root = out / _STAGING
    if not root.is_dir():
        return
    for old in root.iterdir():
        _remove_if_abandoned(old, unlocked_age=0.0)
    with suppress(OSError):
        root.rmdir()


def _remove_if_abandoned(old: Path, unlocked_age: float = _UNLOCKED_STAGING_AGE) -> None:
    try:
        fd = os.open(old / _STAGING_LOCK, os.O_RDWR)
    except FileNotFoundError:
        with suppress(OSError):
            if time.time() - old.stat().st_mtime >= unlocked_age:
                shutil.rmtree(old, ignore_errors=True)
        return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another compaction's, in progress
    finally:
        os.close(fd)
    shutil.rmtree(old, ignore_errors=True)


def _unstable(deltas_files: dict[str, list[Path]]) -> list[bytes]:
    """Deltas outside the causally stable prefix of their dataset (usually a few)."""
    unstable: list[bytes] = []
    for files in deltas_files.values():
        t = _read(files, ["delta_cid", "author", "seq", "parents"]).to_pydict()
        rows = list(zip(t["delta_cid"], t["author"], t["seq"], t["parents"], strict=True))
        keep = stable_deltas(rows)
        unstable.extend(c for c in t["delta_cid"] if c not in keep)
    return sorted(unstable)


def _snapshot(
    out: Path,
    dataset: str,
    deltas: list[Path],
    n_support: int,
    acl: list[Path],
    identity: Identity,
    inputs: list[str | Path],
) -> SnapshotResult:
    """Place one dataset's staged deltas and grants, then build and sign its manifest
    (its facts are already placed: :func:`_place_facts`)."""
    ds_dir = out / f"dataset={dataset}"
    delta_table = _read(deltas, ["delta_cid", "parents", "clock"])
    heads = heads_of(delta_table)
    max_clock = int(pc.max(delta_table.column("clock")).as_py() or 0)
    for role, files in (("deltas", deltas), ("acl", acl)):
        _place(files, ds_dir / role, role)
    entries = []
    genesis = _find_genesis(inputs, dataset)
    if genesis is not None:
        (ds_dir / GENESIS_FILE).write_bytes(genesis)
        entries.append(
            {
                "role": "genesis",
                "path": GENESIS_FILE,
                "cid": Link.parse(dataset),
                "rows": 0,
                "bytes": len(genesis),
            }
        )
    counts = {"facts": 0, "deltas": 0, "acl": 0}
    for role in counts:
        for path in sorted((ds_dir / role).glob("*.parquet")):
            link, size = file_link(path)
            rows = pq.ParquetFile(path).metadata.num_rows
            counts[role] += rows
            entries.append(
                {
                    "role": role,
                    "path": path.relative_to(ds_dir).as_posix(),
                    "cid": link,
                    "rows": rows,
                    "bytes": size,
                }
            )
    cid, data, body = build_manifest(
        identity,
        Link.parse(dataset),
        [Link(h) for h in heads],
        entries,
        deltas=counts["deltas"],
        max_clock=max_clock,
        facts=counts["facts"],
        support=n_support,
    )
    (ds_dir / "manifest.cbor").write_bytes(data)
    (ds_dir / "MANIFEST_CID").write_text(str(cid) + "\n")
    return SnapshotResult(dataset, ds_dir, cid, body)


def _find_genesis(inputs: list[str | Path], dataset: str) -> bytes | None:
    """The genesis block of ``dataset`` from any input export that carries it (verified)."""
    want = Link.parse(dataset)
    for item in inputs:
        path = Path(str(item))
        for candidate in (path / GENESIS_FILE, path.parent / GENESIS_FILE):
            if candidate.is_file():
                data = candidate.read_bytes()
                if want.verifies(data):
                    return data
    return None
