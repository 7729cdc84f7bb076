"""ADR 0136: the driver stages the deltas and grants/revokes exactly as Spark's meta job."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from merklog.node.spark.compact import _job_conf, _write_meta, meta_frame, read_ops
from merklog.node.spark.deltameta import stage_meta
from merklog.node.spark.export import export_replica
from merklog.node.spark.sparkhash import spark_hash, spark_partition
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import MemoryBlockStore, make_fact

pytestmark = pytest.mark.spark


def test_hash_and_partition_equal_sparks_for_every_width(spark):
    """``spark_hash`` is Spark's ``hash()`` (Murmur3, seed 42) of binaries of every width
    from 0 to 40 bytes (tails of 1-3 bytes included, bytes >= 0x80 sign-extended), and
    ``spark_partition`` the partition ``repartition`` gives them."""
    from pyspark.sql import functions as F

    values = []
    for width in range(41):
        for i in range(6):
            values.append(
                hashlib.sha256(bytes([width, i])).digest()[:width]
                if width <= 32
                else (hashlib.sha256(bytes([width, i])).digest() * 2)[:width]
            )
    values.append(b"\xff" * 5)
    df = spark.createDataFrame([(v,) for v in values], "b binary")
    got = {r["b"]: r["h"] for r in df.select("b", F.hash("b").alias("h")).collect()}
    for width in range(41):
        column = pa.array([v for v in values if len(v) == width], pa.binary())
        hashes = spark_hash(column)
        assert hashes is not None
        assert [int(h) for h in hashes] == [got[v] for v in column.to_pylist()]
    cids = pa.array([hashlib.sha256(bytes([i])).digest() + bytes(4) for i in range(64)])
    parts = spark_partition(cids, 5)
    placed = (
        spark.createDataFrame([(v,) for v in cids.to_pylist()], "b binary")
        .repartition(5, "b")
        .select("b", F.spark_partition_id().alias("p"))
        .collect()
    )
    assert {r["b"]: r["p"] for r in placed} == dict(
        zip(cids.to_pylist(), parts.tolist(), strict=True)
    )
    # nulls and mixed widths are not partitioned here (the Spark job runs instead)
    assert spark_hash(pa.array([b"a", None])) is None
    assert spark_hash(pa.array([b"a", b"bb"])) is None
    assert np.asarray(spark_hash(pa.array([], pa.binary()))).size == 0


def _staged(root):
    return {
        f.relative_to(root).as_posix(): pq.read_table(f).replace_schema_metadata(None)
        for f in sorted(root.rglob("*.parquet"))
    }


def test_staged_meta_equals_the_spark_jobs_files(spark, tmp_path):
    """Grants (one at op index 0), revokes, several deltas per partition, every row twice:
    the driver stages the same files with the same rows, order and schema as the job."""
    ident = Identity.from_seed(b"\x21" * 32)
    rep = Replica.create(tmp_path / "r.db", MemoryBlockStore(), ident, "meta")
    mixed = [make_fact("v", (1,)), make_fact("v", (1.0,)), make_fact("v", (True,))]
    for i, fact in enumerate(mixed * 3):
        rep.assert_facts([fact, make_fact("edge", (i, i + 1))])
        rep.grant(bytes([0x40 + i]) * 32)
    rep.revoke(b"\x40" * 32)
    rep.retract_facts(mixed[:1])
    export_replica(rep, tmp_path / "e")
    inputs = [tmp_path / "e", tmp_path / "e"]
    files = sorted((tmp_path / "e" / "ops").glob("*.parquet")) * 2
    for parts in (1, 3, 7):
        with_spark = tmp_path / f"spark{parts}"
        settings = {
            "spark.sql.shuffle.partitions": str(parts),
            "spark.sql.adaptive.coalescePartitions.enabled": "false",
        }
        with _job_conf(spark, settings):  # as compact() runs the job
            _write_meta(meta_frame(read_ops(spark, inputs)), with_spark)
        here = tmp_path / f"here{parts}"
        assert stage_meta(files, here, parts)
        theirs = {}
        for name, table in _staged(with_spark).items():
            role_ds, file = name.rsplit("/", 1)
            number = int(file.split("-")[1])
            role = role_ds.split("/")[0].split("=")[1]
            columns = ["delta_cid", "author", "seq", "clock", "parents"]
            if role == "acl":
                columns = ["delta_cid", "author", "clock", "op_index", "op", "key"]
            theirs[f"{role_ds}/part-{number:05d}.parquet"] = table.select(columns)
        ours = _staged(here)
        assert list(ours) == list(theirs)
        for name in ours:
            assert ours[name].schema == theirs[name].schema, name
            assert ours[name].equals(theirs[name]), name


def test_no_ops_stage_nothing_and_unreadable_inputs_go_to_the_spark_job(tmp_path):
    """No ops files: an empty staging folder (no datasets, as the job's empty output); a
    file that is not Parquet or lacks a column: False, so the Spark job reads the inputs
    and reports them."""
    assert stage_meta([], tmp_path / "empty", 3)
    assert (tmp_path / "empty").is_dir() and not list((tmp_path / "empty").rglob("*.parquet"))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    assert not stage_meta([bad], tmp_path / "bad", 3)
    narrow = tmp_path / "narrow.parquet"
    pq.write_table(pa.table({"delta_cid": pa.array([b"x" * 36])}), narrow)
    assert not stage_meta([narrow], tmp_path / "narrow", 3)
