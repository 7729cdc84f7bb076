"""The ``compact`` Spark job: merged exports → visible facts → signed snapshot.

Inputs are export directories (or ``ops/`` folders) of one or many replicas;
the same delta usually appears in several of them. A delta CID names its
content, so ``(delta_cid, op_index)`` identifies an op exactly and duplicates
are dropped on that key.

Add-wins OR-set, relationally (DESIGN §2)::

    live(ds, F, d)  :- asserts(ds, d, F), !removed(ds, F, d).
    removed(ds, F, d) :- retract(ds, _, F, Observed), d ∈ Observed.
    visible(ds, F)  :- live(ds, F, _).

The snapshot keeps, per visible fact, its *support*: the asserting deltas not
yet removed. That is the whole OR-set state, so a retract arriving after the
snapshot (which lists the asserts it observed) still removes exactly those.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from merklog.replication.identity import Identity
from merklog.store import Link

from .export import GENESIS_FILE
from .manifest import build_manifest, file_link

VALUE_DDL = (
    "struct<`type`:string,`int`:bigint,`float`:double,`str`:string,"
    "`bytes`:binary,`bool`:boolean,`link`:string>"
)
OPS_DDL = (
    "dataset string, delta_cid string, author string, clock bigint, seq bigint, "
    f"parents array<string>, op_index int, op string, relation string, args array<{VALUE_DDL}>, "
    "fact_cid string, observed array<string>, key string"
)


def _input_paths(inputs: list[str | Path]) -> list[str]:
    paths = []
    for item in inputs:
        text = str(item)
        if "://" not in text and (Path(text) / "ops").is_dir():
            text = str(Path(text) / "ops")
        paths.append(text)
    if not paths:
        raise ValueError("compact needs at least one input export directory")
    return paths


def read_ops(spark: Any, inputs: list[str | Path]) -> Any:
    """All op rows of the given exports, duplicates removed."""
    df = spark.read.schema(OPS_DDL).parquet(*_input_paths(inputs))
    return df.dropDuplicates(["delta_cid", "op_index"])


def live_asserts(ops: Any) -> Any:
    """``(dataset, relation, fact_cid, args, delta_cid)`` of every assert no retract observed."""
    from pyspark.sql import functions as F

    asserts = ops.where(F.col("op") == "assert").select(
        "dataset", "relation", "fact_cid", "args", "delta_cid"
    )
    removed = (
        ops.where(F.col("op") == "retract")
        .select("dataset", "fact_cid", F.explode("observed").alias("delta_cid"))
        .distinct()
    )
    return asserts.join(removed, ["dataset", "fact_cid", "delta_cid"], "left_anti")


def snapshot_frame(ops: Any) -> Any:
    """One row per visible fact: dataset, relation, fact_cid, args, sorted support."""
    from pyspark.sql import functions as F

    return (
        live_asserts(ops)
        .groupBy("dataset", "fact_cid")
        .agg(
            F.first("relation").alias("relation"),
            F.first("args").alias("args"),
            F.sort_array(F.collect_set("delta_cid")).alias("support"),
        )
        .select("dataset", "relation", "fact_cid", "args", "support")
    )


def deltas_frame(ops: Any) -> Any:
    """One row per delta: dataset, delta_cid, author, seq, clock, parents."""
    return ops.select("dataset", "delta_cid", "author", "seq", "clock", "parents").dropDuplicates(
        ["delta_cid"]
    )


def heads_of(deltas: Any) -> dict[str, list[str]]:
    """Per dataset, the deltas no other delta names as a parent."""
    from pyspark.sql import functions as F

    named = deltas.select("dataset", F.explode("parents").alias("delta_cid"))
    rows = (
        deltas.join(named, ["dataset", "delta_cid"], "left_anti")
        .select("dataset", "delta_cid")
        .collect()
    )
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["dataset"], []).append(row["delta_cid"])
    return {ds: sorted(h) for ds, h in out.items()}


def stable_deltas(deltas: list[tuple[str, str, int, list[str]]]) -> set[str]:
    """Causally stable deltas: those in the causal past of the latest delta of *every* author.

    ``deltas`` are ``(delta_cid, author, seq, parents)``. Every later delta from
    any author has that author's latest known delta in its past (an author's
    deltas chain through its own heads), so nothing can ever arrive that is
    concurrent with a stable delta: history up to there may be compacted and pruned.
    """
    parents = {cid: ps for cid, _a, _s, ps in deltas}
    latest: dict[str, tuple[int, str]] = {}
    for cid, author, seq, _ps in deltas:
        if author not in latest or seq > latest[author][0]:
            latest[author] = (seq, cid)

    def past(cid: str) -> set[str]:
        seen = {cid}
        stack = [cid]
        while stack:
            for p in parents.get(stack.pop(), ()):
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        return seen

    stable: set[str] | None = None
    for _seq, cid in latest.values():
        stable = past(cid) if stable is None else stable & past(cid)
    return stable or set()


@dataclass
class SnapshotResult:
    dataset: str
    directory: Path
    manifest_cid: Link
    manifest: dict[str, Any]


def _write_parquet(df: Any, path: Path, partitions: int, sort: list[str]) -> None:
    """Write sorted, range-partitioned files (deterministic content for the same data)."""
    if partitions == 1:
        df = df.coalesce(1).sortWithinPartitions(*sort)  # no sampling job for small outputs
    else:
        df = df.repartitionByRange(partitions, *sort).sortWithinPartitions(*sort)
    df.write.mode("overwrite").option("compression", "zstd").parquet(str(path))


def compact(
    spark: Any,
    inputs: list[str | Path],
    out_dir: str | Path,
    identity: Identity,
    prune: bool = False,
    rows_per_file: int = 2_000_000,
) -> list[SnapshotResult]:
    """Compact merged exports into one signed snapshot per dataset under ``out_dir``.

    With ``prune=True`` the snapshot covers only the causally stable prefix of
    the log (see :func:`stable_deltas`); without it, everything in the inputs.
    """
    from pyspark.sql import functions as F

    out = Path(out_dir)
    ops = read_ops(spark, inputs)
    ops = ops.localCheckpoint() if not _is_connect(spark) else ops.cache()
    deltas = deltas_frame(ops)
    if prune:
        by_ds: dict[str, list] = {}
        for r in deltas.select("dataset", "delta_cid", "author", "seq", "parents").collect():
            by_ds.setdefault(r["dataset"], []).append(
                (r["delta_cid"], r["author"], r["seq"], list(r["parents"] or []))
            )
        keep = sorted(set().union(*(stable_deltas(v) for v in by_ds.values())) if by_ds else set())
        keep_df = spark.createDataFrame([(c,) for c in keep], "delta_cid string")
        ops = ops.join(
            F.broadcast(keep_df) if len(keep) < 200_000 else keep_df, "delta_cid", "left_semi"
        )
        deltas = deltas_frame(ops)
    heads = heads_of(deltas)
    results: list[SnapshotResult] = []
    for dataset in sorted(heads):
        ds_ops = ops.where(F.col("dataset") == dataset)
        ds_dir = out / f"dataset={dataset}"
        if ds_dir.exists():
            shutil.rmtree(ds_dir)
        snap = snapshot_frame(ds_ops).drop("dataset")
        stats = snap.agg(
            F.count(F.lit(1)).alias("n"), F.sum(F.size("support")).alias("s")
        ).collect()[0]
        n_facts, n_support = int(stats["n"]), int(stats["s"] or 0)
        ds_deltas = deltas_frame(ds_ops).drop("dataset")
        dstats = ds_deltas.agg(F.count(F.lit(1)).alias("n"), F.max("clock").alias("c")).collect()[0]
        n_deltas, max_clock = int(dstats["n"]), int(dstats["c"] or 0)
        _write_parquet(snap, ds_dir / "facts", max(1, n_facts // rows_per_file + 1), ["fact_cid"])
        _write_parquet(
            ds_deltas, ds_dir / "deltas", max(1, n_deltas // rows_per_file + 1), ["delta_cid"]
        )
        acl = ds_ops.where(F.col("op").isin("grant", "revoke")).select(
            "delta_cid", "author", "clock", "op_index", "op", "key"
        )
        _write_parquet(acl, ds_dir / "acl", 1, ["delta_cid", "op_index"])
        files = []
        genesis = _find_genesis(inputs, dataset)
        if genesis is not None:
            (ds_dir / GENESIS_FILE).write_bytes(genesis)
            files.append(
                {
                    "role": "genesis",
                    "path": GENESIS_FILE,
                    "cid": Link.parse(dataset),
                    "rows": 0,
                    "bytes": len(genesis),
                }
            )
        for role in ("facts", "deltas", "acl"):
            for path in sorted((ds_dir / role).glob("*.parquet")):
                link, size = file_link(path)
                rows = pq.ParquetFile(path).metadata.num_rows
                files.append(
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
            [Link.parse(h) for h in heads[dataset]],
            files,
            deltas=n_deltas,
            max_clock=max_clock,
            facts=n_facts,
            support=n_support,
        )
        (ds_dir / "manifest.cbor").write_bytes(data)
        (ds_dir / "MANIFEST_CID").write_text(str(cid) + "\n")
        results.append(SnapshotResult(dataset, ds_dir, cid, body))
    if not _is_connect(spark):
        ops.unpersist()
    return results


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


def _is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")
