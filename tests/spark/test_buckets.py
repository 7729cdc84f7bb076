"""ADR 0141: an export's ops files bucketed by ``fact_key`` as Spark buckets a table, and
the compaction's facts job over them without a shuffle, giving the snapshot of the
shuffled job byte for byte."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from merklog.node.spark.buckets import (
    bucket_file,
    bucket_order,
    ops_buckets,
    spark_hash_long,
)
from merklog.node.spark.compact import bucketed_ops, compact, live_frame
from merklog.node.spark.export import export_replica
from merklog.node.spark.schema import decode_args
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import Fact, MemoryBlockStore, make_fact

pytestmark = pytest.mark.spark

ROWS = 8  # op rows per bucket in these tests: several buckets from a small log


def test_hash_and_bucket_of_longs_equal_sparks(spark):
    """``spark_hash_long`` is Spark's ``hash()`` of a ``bigint`` (extremes, negatives, a
    null - the seed), on a sliced array too, and ``bucket_order`` puts each row in the
    partition ``repartition(n, col)`` gives it."""
    from pyspark.sql import functions as F

    rng = np.random.default_rng(7)
    values = [0, 1, -1, 2**63 - 1, -(2**63), 2**32, -(2**32), 42, None]
    values += [int(v) for v in rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64)]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i int, k bigint")
    got = {r["i"]: r["h"] for r in df.select("i", F.hash("k").alias("h")).collect()}
    column = pa.array(values, pa.int64())
    assert spark_hash_long(column).tolist() == [got[i] for i in range(len(values))]
    assert spark_hash_long(column.slice(5)).tolist() == [got[i] for i in range(5, len(values))]
    assert spark_hash_long(pa.array([], pa.int64())).size == 0
    for n in (1, 3, 7):
        placed = df.repartition(n, "k").select("i", F.spark_partition_id().alias("p")).collect()
        order, counts = bucket_order(column, n)
        bucket = np.repeat(np.arange(n), counts)[np.argsort(order, kind="stable")]
        assert {r["i"]: r["p"] for r in placed} == dict(enumerate(bucket.tolist()))


def _replica(tmp_path) -> Replica:
    """A log with mixed-type facts (``1``, ``1.0``, ``true``, ``"1"``, ``x"01"``),
    retracts, re-asserts, grants and a revoke."""
    ident = Identity.from_seed(b"\x12" * 32)
    rep = Replica.create(tmp_path / "r.db", MemoryBlockStore(), ident, "buckets")
    mixed = [make_fact("v", (1,)), make_fact("v", (1.0,)), make_fact("v", (True,))]
    mixed += [make_fact("v", ("1",)), make_fact("v", (b"\x01",))]
    for i in range(12):
        rep.assert_facts([make_fact("edge", (i, i + 1)), mixed[i % 5]])
        if i % 4 == 3:
            rep.grant(bytes([0x40 + i]) * 32)
    rep.retract_facts(mixed[:2] + [make_fact("edge", (0, 1))])
    rep.assert_facts(mixed[:1])  # re-asserted after its retract
    rep.revoke(bytes([0x43]) * 32)
    return rep


def test_bucketed_export_compacts_without_a_shuffle_to_the_shuffled_snapshot(
    spark, tmp_path, monkeypatch
):
    """The export writes one file per bucket, each row in the bucket of its ``fact_key``,
    and records the layout; the facts job over it has no exchange and gives the manifest
    CID of the shuffled job (layout switched off, layout not recorded, files named
    otherwise, the in-Spark path), with the replica's visible facts."""
    from pyspark.sql import functions as F

    rep = _replica(tmp_path)
    e = tmp_path / "e"
    summary = export_replica(rep, e, rows_per_bucket=ROWS)
    n = summary["ops_buckets"]["count"]
    assert n == -(-summary["ops"] // ROWS) and n >= 4
    assert ops_buckets(e) == n
    assert json.loads((e / "export.json").read_text())["ops_buckets"] == summary["ops_buckets"]
    files = sorted((e / "ops").glob("*.parquet"))
    assert {f.name for f in files} <= {bucket_file(b) for b in range(n)} and len(files) > 1
    for f in files:
        b = int(f.name.split("_")[1].split(".")[0])
        keys = spark.read.parquet(str(f)).select(F.pmod(F.hash("fact_key"), F.lit(n)).alias("b"))
        assert {r["b"] for r in keys.collect()} == {b}
    assert sum(pq.ParquetFile(f).metadata.num_rows for f in files) == summary["ops"]

    ops = bucketed_ops(spark, [e], n)
    assert ops is not None
    plan = live_frame(ops, None, "fact_key", True, True)._jdf.queryExecution().executedPlan()
    assert "Exchange" not in plan.toString() and "Bucketed: true" in plan.toString()
    assert bucketed_ops(spark, [e], n + 1) is None  # another partition count: the shuffle
    assert bucketed_ops(spark, [e, e], n) is None  # several inputs: the shuffle

    key = Identity.from_seed(b"\x09" * 32)
    seen = []
    real = live_frame
    import merklog.node.spark.compact as mod

    monkeypatch.setattr(mod, "live_frame", lambda *a: seen.append(a[4]) or real(*a))
    [bucketed] = compact(spark, [e], tmp_path / "bucketed", key, rows_per_partition=ROWS)
    assert seen == [True]
    monkeypatch.setenv("MERKLOG_SPARK_BUCKETS", "0")
    [shuffled] = compact(spark, [e], tmp_path / "shuffled", key, rows_per_partition=ROWS)
    monkeypatch.delenv("MERKLOG_SPARK_BUCKETS")
    assert seen == [True, False]
    assert shuffled.manifest_cid == bucketed.manifest_cid

    unrecorded = tmp_path / "unrecorded"  # an export without the layout in export.json
    shutil.copytree(e, unrecorded)
    summary_file = unrecorded / "export.json"
    plain = {k: v for k, v in json.loads(summary_file.read_text()).items() if k != "ops_buckets"}
    summary_file.write_text(json.dumps(plain))
    assert ops_buckets(unrecorded) is None
    [other] = compact(spark, [unrecorded], tmp_path / "s2", key, rows_per_partition=ROWS)
    misnamed = tmp_path / "misnamed"  # the layout recorded, a file not named by its bucket
    shutil.copytree(e, misnamed)
    first = sorted((misnamed / "ops").glob("*.parquet"))[0]
    first.rename(first.with_name("part-00000.parquet"))
    assert ops_buckets(misnamed) is None
    [renamed] = compact(spark, [misnamed], tmp_path / "s3", key, rows_per_partition=ROWS)
    [wide] = compact(spark, [e], tmp_path / "wide", key, rows_per_partition=ROWS, gather=False)
    assert seen == [True, False, False, False]
    assert other.manifest_cid == renamed.manifest_cid == wide.manifest_cid == bucketed.manifest_cid

    facts = pq.read_table(bucketed.directory / "facts").to_pylist()
    assert {Fact(r["relation"], decode_args(r["args"])) for r in facts} == set(rep.visible_facts())


def test_collision_rerun_over_a_bucketed_export_gives_the_same_snapshot(
    spark, tmp_path, monkeypatch
):
    """Keys that turn out to collide send the job once more over the CIDs: on a bucketed
    export that job reads the buckets too (no shuffle) and gives the same snapshot."""
    import merklog.node.spark.compact as mod
    import merklog.node.spark.factargs as fa

    rep = _replica(tmp_path)
    e = tmp_path / "e"
    export_replica(rep, e, rows_per_bucket=ROWS)
    key = Identity.from_seed(b"\x09" * 32)
    [keyed] = compact(spark, [e], tmp_path / "keyed", key, rows_per_partition=ROWS)
    seen = []
    real = live_frame
    monkeypatch.setattr(mod, "live_frame", lambda *a: seen.append(a[3:]) or real(*a))
    monkeypatch.setattr(fa, "injective", lambda cids, keys: False)  # a 64-bit collision
    [by_cid] = compact(spark, [e], tmp_path / "by_cid", key, rows_per_partition=ROWS)
    assert seen == [(True, True), (False, True)]
    assert by_cid.manifest_cid == keyed.manifest_cid


def test_empty_export_records_no_buckets(tmp_path):
    """An empty log gives the one empty ops file as before and no bucket layout."""
    ident = Identity.from_seed(b"\x13" * 32)
    rep = Replica.create(tmp_path / "r.db", MemoryBlockStore(), ident, "empty")
    summary = export_replica(rep, tmp_path / "e", rows_per_bucket=ROWS)
    assert "ops_buckets" not in summary and ops_buckets(tmp_path / "e") is None
    assert [f.name for f in (tmp_path / "e" / "ops").iterdir()] == ["part-00000.parquet"]


def test_export_command_buckets_only_when_asked(tmp_path):
    """``merklog parquet export`` writes the unbucketed layout by default (the export's
    speed, ADR 0141) and the bucketed one with ``--buckets``; the rows are the same."""
    from click.testing import CliRunner

    from merklog.node.cli import cli

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    home = tmp_path / "home"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "v(1).", "v(1.0).", "v(true).", 'v("1").', 'v(x"01").')
    run("--home", str(home), "retract", "v(1.0).")
    run("--home", str(home), "parquet", "export", str(tmp_path / "plain"))
    out = run("--home", str(home), "parquet", "export", "--buckets", str(tmp_path / "bucketed"))
    assert json.loads(out.strip().splitlines()[-1])["ops_buckets"]["count"] == 1
    assert ops_buckets(tmp_path / "plain") is None
    assert ops_buckets(tmp_path / "bucketed") == 1
    assert [f.name for f in (tmp_path / "bucketed" / "ops").iterdir()] == [bucket_file(0)]

    def rows(d):
        return sorted(map(str, pq.read_table(d / "ops").to_pylist()))

    assert rows(tmp_path / "plain") == rows(tmp_path / "bucketed")
