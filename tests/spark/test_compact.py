"""compact's visible set equals the replicas' own OR-set state on generated logs."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from merklog.node.spark.compact import (
    CompactError,
    compact,
    read_ops,
    snapshot_frame,
    stable_deltas,
)
from merklog.node.spark.export import export, export_replica
from merklog.node.spark.gen import Simulation, reference_visible
from merklog.node.spark.manifest import ManifestError, parse_manifest, verify_files
from merklog.node.spark.schema import decode_args
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import Fact, Link, MemoryBlockStore, make_fact

pytestmark = pytest.mark.spark


def _export_views(sim: Simulation, tmp_path) -> list:
    dirs = []
    for i in range(len(sim.peers)):
        d = tmp_path / f"peer{i}"
        export(sim.log_rows(i), [(sim.dataset, f) for f in sim.visible(i)], d)
        dirs.append(d)
    return dirs


def _visible_from(df) -> set[Fact]:
    return {Fact(r["relation"], decode_args(r["args"])) for r in df.collect()}


@pytest.mark.parametrize("seed", [1, 2])
def test_compact_matches_or_set_of_merged_replicas(spark, tmp_path, seed):
    sim = Simulation(peers=3, pool=50, seed=seed).run(250)
    dirs = _export_views(sim, tmp_path)
    # each replica alone: compact == that replica's own incrementally kept state
    for i, d in enumerate(dirs):
        got = _visible_from(snapshot_frame(read_ops(spark, [d])))
        assert got == sim.visible(i)
    # all replicas merged (heavy duplication): == the OR-set of the union of logs
    merged_rows = [r for i in range(3) for r in sim.log_rows(i)]
    expected = reference_visible(merged_rows)
    got = _visible_from(snapshot_frame(read_ops(spark, dirs + dirs[:1])))
    assert got == expected
    sim.sync_all()
    assert expected == sim.visible(0) == sim.visible(2)
    # concurrency actually happened: some fact was both retracted and re-asserted
    assert any(r["op"] == "retract" for r in merged_rows)


def test_snapshot_manifest_is_signed_and_names_its_files(spark, tmp_path):
    sim = Simulation(peers=2, pool=30, seed=7).run(120)
    sim.sync_all()
    dirs = _export_views(sim, tmp_path)
    ident = Identity.from_seed(b"\x05" * 32)
    [res] = compact(spark, dirs, tmp_path / "snap", ident)
    data = (res.directory / "manifest.cbor").read_bytes()
    manifest = parse_manifest(data, res.manifest_cid)
    assert manifest["signer"] == ident.public_key
    assert manifest["dataset"] == sim.dataset
    assert manifest["facts"] == len(sim.visible(0))
    assert manifest["deltas"] == len(sim.deltas)
    assert set(manifest["heads"]) == sim.peers[0].heads
    verify_files(manifest, res.directory)
    facts = pq.read_table(res.directory / "facts").to_pylist()
    assert {Fact(r["relation"], decode_args(r["args"])) for r in facts} == sim.visible(0)
    support = {
        Fact(r["relation"], decode_args(r["args"])): {Link(s) for s in r["support"]} for r in facts
    }
    assert support == sim.peers[0].tags
    # tampering is detected: a flipped signature byte, a changed file
    bad = bytearray(data)
    bad[-1] ^= 1
    with pytest.raises(ManifestError):
        parse_manifest(bytes(bad))
    victim = res.directory / manifest["files"][0]["path"]
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(ManifestError, match="does not hash"):
        verify_files(manifest, res.directory)


def test_stable_prefix_is_causally_closed_and_common_to_all_authors():
    sim = Simulation(peers=3, pool=30, seed=11).run(150)
    sim.sync_all()
    sim.write(0, 2)  # a delta the others have not built on yet
    rows = [(d.cid.raw, d.author, d.seq, [p.raw for p in d.parents]) for d in sim.deltas.values()]
    stable = stable_deltas(rows)
    newest = max(sim.deltas.values(), key=lambda d: d.clock)
    assert newest.cid.raw not in stable
    for cid in stable:  # closed under parents
        assert all(p.raw in stable for p in sim.deltas[Link(cid)].parents)
    assert 0 < len(stable) < len(sim.deltas)


def test_same_inputs_and_key_give_the_same_manifest_cid(spark, tmp_path):
    """Reproducible snapshots: file names, row order and Parquet metadata are pinned, so the
    inputs in another order, under another session shuffle setting, give identical bytes."""
    sim = Simulation(peers=3, pool=40, seed=9).run(200)
    dirs = _export_views(sim, tmp_path)
    key = Identity.from_seed(b"\x06" * 32)
    [first] = compact(spark, dirs, tmp_path / "s1", key, rows_per_partition=150)
    old = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        [second] = compact(spark, dirs[::-1], tmp_path / "s2", key, rows_per_partition=150)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", old)
    assert spark.conf.get("spark.sql.shuffle.partitions") == old  # the job restores it
    facts = [f for f in first.manifest["files"] if f["role"] == "facts"]
    assert len(facts) > 1  # several partitions, so file assignment is exercised too
    assert [f["path"] for f in facts] == [f"facts/part-{i:05d}.parquet" for i in range(len(facts))]
    assert first.manifest == second.manifest
    assert first.manifest_cid == second.manifest_cid
    assert (first.directory / "manifest.cbor").read_bytes() == (
        second.directory / "manifest.cbor"
    ).read_bytes()
    assert not (tmp_path / "s1" / "_compact_staging").exists()


def test_several_datasets_in_one_job_are_split_into_sorted_snapshots(spark, tmp_path):
    """The facts are staged once for all datasets (no partitionBy) and split per dataset while
    re-encoded: each dataset gets its own facts, in files numbered in partition order and
    each sorted by fact_cid."""
    sims = [Simulation(peers=2, pool=40, seed=s).run(150) for s in (21, 22)]
    assert sims[0].dataset != sims[1].dataset
    dirs = []
    for k, sim in enumerate(sims):
        sim.sync_all()
        d = tmp_path / f"ds{k}"
        export(sim.log_rows(0), [(sim.dataset, f) for f in sim.visible(0)], d)
        dirs.append(d)
    key = Identity.from_seed(b"\x07" * 32)
    results = compact(spark, dirs, tmp_path / "snap", key, rows_per_partition=60)
    assert sorted(str(r.dataset) for r in results) == sorted(str(s.dataset) for s in sims)
    for res in results:
        [sim] = [s for s in sims if str(s.dataset) == res.dataset]
        files = sorted((res.directory / "facts").glob("*.parquet"))
        assert len(files) > 1
        assert [f.name for f in files] == [f"part-{i:05d}.parquet" for i in range(len(files))]
        rows = []
        for f in files:
            table = pq.read_table(f)
            assert table.column_names == ["relation", "fact_cid", "args", "support"]
            cids = table.column("fact_cid").to_pylist()
            assert cids == sorted(cids)
            rows.extend(table.to_pylist())
        assert {Fact(r["relation"], decode_args(r["args"])) for r in rows} == sim.visible(0)
        assert res.manifest["facts"] == len(rows)
        assert res.manifest["support"] == sum(len(r["support"]) for r in rows)
        verify_files(res.manifest, res.directory)


def test_arguments_gathered_by_the_driver_give_the_bytes_of_the_in_spark_job(spark, tmp_path):
    """ADR 0122: the narrow Spark job plus relation and arguments gathered by fact CID from
    the inputs' facts lists gives the snapshot the job that carries them gives, byte for
    byte; facts no list holds (an ``ops/`` folder as input, a cut list) come from the
    inputs' assert rows."""
    sim = Simulation(peers=3, pool=40, seed=13).run(200)
    dirs = _export_views(sim, tmp_path)
    key = Identity.from_seed(b"\x08" * 32)
    [wide] = compact(spark, dirs, tmp_path / "wide", key, rows_per_partition=150, gather=False)
    [narrow] = compact(spark, dirs, tmp_path / "narrow", key, rows_per_partition=150)
    assert narrow.manifest_cid == wide.manifest_cid
    facts = pq.read_table(narrow.directory / "facts")
    assert {Fact(r["relation"], decode_args(r["args"])) for r in facts.to_pylist()} == (
        reference_visible([r for i in range(3) for r in sim.log_rows(i)])
    )
    relations = sorted((dirs[0] / "facts").glob("relation=*"))
    assert len(relations) > 1
    shutil.rmtree(relations[0])
    shutil.rmtree(dirs[1] / "facts")
    inputs = [dirs[0], dirs[1], dirs[2] / "ops"]
    [partial] = compact(spark, inputs, tmp_path / "partial", key, rows_per_partition=150)
    assert partial.manifest_cid == wide.manifest_cid
    # an unreadable facts list is left out, not fatal: the assert rows hold the same facts
    for f in (dirs[0] / "facts").rglob("*.parquet"):
        f.write_bytes(b"not parquet")
    [damaged] = compact(spark, dirs, tmp_path / "damaged", key, rows_per_partition=150)
    assert damaged.manifest_cid == wide.manifest_cid
    with pytest.raises(CompactError, match="can read"):
        compact(spark, [tmp_path / "nowhere"], tmp_path / "x", key, gather=True)


def test_deltas_and_grants_come_from_one_job_and_grants_sit_in_one_sorted_file(spark, tmp_path):
    """The per-delta rows and the grants/revokes are one Spark job (``meta_frame``): each
    delta once, each grant/revoke op once, the grants in one file sorted by delta and op
    index however many partitions held them; mixed-type facts keep their values."""
    ident = Identity.from_seed(b"\x11" * 32)
    rep = Replica.create(tmp_path / "r.db", MemoryBlockStore(), ident, "acl")
    mixed = [make_fact("v", (1,)), make_fact("v", (1.0,)), make_fact("v", (True,))]
    mixed += [make_fact("v", ("1",)), make_fact("v", (b"\x01",))]
    for i, fact in enumerate(mixed):
        rep.assert_facts([fact, make_fact("edge", (i, i + 1))])
        rep.grant(bytes([0x30 + i]) * 32)
    rep.revoke(b"\x30" * 32)
    rep.retract_facts(mixed[:1])
    export_replica(rep, tmp_path / "e")
    ops = pq.read_table(tmp_path / "e" / "ops").to_pylist()
    grants = sorted(
        (r["delta_cid"], r["op_index"], r["op"], r["key"])
        for r in ops
        if r["op"] in ("grant", "revoke")
    )
    assert {g[2] for g in grants} == {"grant", "revoke"}
    assert any(g[1] == 0 for g in grants)  # a grant that is its delta's first op
    key = Identity.from_seed(b"\x09" * 32)
    inputs = [tmp_path / "e", tmp_path / "e"]  # every row twice
    [res] = compact(spark, inputs, tmp_path / "snap", key, rows_per_partition=4)
    acl = sorted((res.directory / "acl").glob("*.parquet"))
    assert [f.name for f in acl] == ["part-00000.parquet"]
    got = pq.read_table(acl[0]).to_pylist()
    assert [(r["delta_cid"], r["op_index"], r["op"], r["key"]) for r in got] == grants
    deltas = pq.read_table(res.directory / "deltas").column("delta_cid").to_pylist()
    assert sorted(deltas) == sorted({r["delta_cid"] for r in ops})
    assert res.manifest["deltas"] == len(deltas) == rep.delta_count()
    facts = pq.read_table(res.directory / "facts").to_pylist()
    assert {Fact(r["relation"], decode_args(r["args"])) for r in facts} == set(rep.visible_facts())
    [wide] = compact(spark, inputs, tmp_path / "wide", key, rows_per_partition=4, gather=False)
    assert wide.manifest_cid == res.manifest_cid


def test_dataset_names_travel_uncoded_above_the_code_limit(spark, tmp_path, monkeypatch):
    """``live_frame`` carries the dataset as a small code up to MAX_CODED_DATASETS datasets
    and as its name above: both give the same snapshots."""
    import merklog.node.spark.compact as compact_module

    sims = [Simulation(peers=2, pool=30, seed=s).run(100) for s in (31, 32)]
    dirs = []
    for k, sim in enumerate(sims):
        d = tmp_path / f"ds{k}"
        export(sim.log_rows(0), [(sim.dataset, f) for f in sim.visible(0)], d)
        dirs.append(d)
    key = Identity.from_seed(b"\x0a" * 32)
    coded = compact(spark, dirs, tmp_path / "coded", key, rows_per_partition=40)
    monkeypatch.setattr(compact_module, "MAX_CODED_DATASETS", 1)
    named = compact(spark, dirs, tmp_path / "named", key, rows_per_partition=40)
    assert len(coded) == 2
    assert {r.dataset: r.manifest_cid for r in coded} == {r.dataset: r.manifest_cid for r in named}


def test_the_ops_schema_built_in_python_is_the_ddl(spark):
    """ADR 0129: the input schema is built as a StructType (no SQL parser in a fresh JVM),
    and is exactly the documented DDL."""
    from merklog.node.spark.compact import OPS_DDL, ops_schema

    assert spark.createDataFrame([], OPS_DDL).schema == ops_schema()


def test_keyed_job_gives_the_bytes_of_the_cid_job_and_keyless_exports_the_same_facts(
    spark, tmp_path, monkeypatch
):
    """ADR 0131: the job over the CIDs' 64-bit keys gives the snapshot that the same job
    over the CIDs gives (keys that collide send it there), byte for byte; exports without
    the key columns (written before them) give the same facts, supports and heads.
    ADR 0196: so does the keyed job without a shuffle (retracts' tags broadcast, the tags
    partitioned and sorted by this process), over three overlapping exports whose
    asserts repeat, in partitions of 150 rows; above its limit the shuffled keyed job runs."""
    import merklog.node.spark.compact as mod
    import merklog.node.spark.factargs as fa
    from merklog.node.spark.cidkeys import KEY_COLUMNS

    sim = Simulation(peers=3, pool=40, seed=17).run(240)
    dirs = _export_views(sim, tmp_path)
    key = Identity.from_seed(b"\x09" * 32)
    assert fa.keyed_inputs(dirs) and fa.KeyCheck(dirs).usable
    assert 0 < fa.observed_tags(dirs) <= mod.BROADCAST_MAX_TAGS
    seen = []
    live, tags = mod.live_frame, mod.live_tags_frame
    monkeypatch.setattr(mod, "live_frame", lambda *a: seen.append(len(a) > 3 and a[3]) or live(*a))
    monkeypatch.setattr(mod, "live_tags_frame", lambda *a: seen.append("tags") or tags(*a))
    [keyed] = compact(spark, dirs, tmp_path / "keyed", key, rows_per_partition=150)
    monkeypatch.setattr(mod, "BROADCAST_MAX_TAGS", fa.observed_tags(dirs) - 1)
    [shuffled] = compact(spark, dirs, tmp_path / "shuffled", key, rows_per_partition=150)
    monkeypatch.setattr(fa, "injective", lambda cids, keys: False)  # a 64-bit collision
    assert not fa.KeyCheck(dirs).usable
    [by_cid] = compact(spark, dirs, tmp_path / "by_cid", key, rows_per_partition=150)
    # the keyed job without a shuffle, the shuffled one, then once more over the CIDs
    assert seen == ["tags", True, True, False]
    assert by_cid.manifest_cid == keyed.manifest_cid == shuffled.manifest_cid
    assert len(list((keyed.directory / "facts").glob("*.parquet"))) > 2
    monkeypatch.undo()
    old = []
    for d in dirs:
        o = tmp_path / f"old-{d.name}"
        shutil.copytree(d, o)
        for f in (o / "ops").glob("*.parquet"):
            t = pq.read_table(f)
            pq.write_table(t.drop_columns(KEY_COLUMNS), f)
        old.append(o)
    assert not fa.keyed_inputs(old) and not fa.keyed_inputs([*dirs[:2], old[2]])
    [keyless] = compact(spark, old, tmp_path / "keyless", key, rows_per_partition=150)

    def content(res):
        rows = pq.read_table(res.directory / "facts").to_pylist()
        return sorted((r["fact_cid"], r["relation"], str(r["args"]), r["support"]) for r in rows)

    assert content(keyless) == content(keyed) and content(keyed)
    assert keyless.manifest["heads"] == keyed.manifest["heads"]
    assert keyless.manifest["facts"] == keyed.manifest["facts"]
    facts = pq.read_table(keyed.directory / "facts").to_pylist()
    assert {Fact(r["relation"], decode_args(r["args"])) for r in facts} == reference_visible(
        [r for i in range(3) for r in sim.log_rows(i)]
    )


def test_a_killed_compactions_staging_is_removed_by_the_next_one(spark, tmp_path):
    """``kill -9`` of a compaction left ``OUT/_compact_staging/<id>`` (11 MB in one case),
    and later compactions into OUT never removed it. The next compaction removes what
    no live compaction holds, and leaves one that another compaction still holds."""
    import fcntl
    import os
    import subprocess
    import sys

    sim = Simulation(peers=2, pool=30, seed=7).run(60)
    sim.sync_all()
    dirs = _export_views(sim, tmp_path)
    out = tmp_path / "snap"
    root = out / "_compact_staging"
    # A compaction that was killed: its staging directory, its lock file held by nobody.
    dead = root / "dead"
    (dead / "facts").mkdir(parents=True)
    (dead / "facts" / "part-0.parquet").write_bytes(b"x" * 1000)
    (dead / ".lock").touch()
    # One still running: another process holds its lock.
    live = root / "live"
    live.mkdir()
    (live / ".lock").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(live / '.lock')!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        compact(spark, dirs, out, Identity.from_seed(b"\x05" * 32))
        assert not dead.exists()
        assert live.exists() and sorted(p.name for p in root.iterdir()) == ["live"]
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    fd = os.open(live / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the holder is gone: free
    os.close(fd)
