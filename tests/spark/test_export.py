"""The column-wise replica export equals the replica's own per-op log, value for value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from merklog.node.spark.export import export_replica
from merklog.node.spark.schema import decode_args
from merklog.replication.bulk import fact_count, iter_log_batches
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import (
    CIDMismatch,
    Fact,
    Link,
    MemoryBlockStore,
    SQLiteBlockStore,
    fact_cid,
    make_fact,
)

ROOT = Path(__file__).resolve().parents[2]

# mixed value types that Python's == would merge (1 == 1.0 == True) stay apart
MIXED = [
    make_fact("v", (1,)),
    make_fact("v", (1.0,)),
    make_fact("v", (True,)),
    make_fact("v", ("1",)),
    make_fact("v", (b"\x01",)),
    make_fact("v", (Link.for_dag_cbor(b"\xa0"),)),
    make_fact("v", (-(2**63), 2**63 - 1, -0.5, "", b"")),
    make_fact("edge", (1, 2)),
    make_fact("edge", (2, 3)),
]


def _replica(tmp_path, kind: str) -> Replica:
    ident = Identity.from_seed(b"\x11" * 32)
    if kind == "sqlite":  # the node's layout: block store and replica on one connection
        store = SQLiteBlockStore(tmp_path / "store.db")
        return Replica.create(store.conn, store, ident, "export", writers=[b"\x22" * 32])
    return Replica.create(tmp_path / "r.db", MemoryBlockStore(), ident, "export")


def _reference(replica: Replica) -> list[tuple]:
    """``Replica.iter_log()`` (per-op reads, signatures checked) in the export's shape."""
    return [
        (
            r.delta,
            r.author,
            r.clock,
            r.seq,
            r.index,
            r.op,
            r.relation,
            r.args,
            r.fact,
            list(r.observed) if r.op == "retract" else None,
            r.key,
        )
        for r in replica.iter_log()
    ]


def _exported(directory) -> list[tuple]:
    rows = pq.read_table(directory / "ops").to_pylist()
    hexed = lambda b: b.hex() if b is not None else None  # noqa: E731
    return [
        (
            str(Link(r["delta_cid"])),
            r["author"].hex(),
            r["clock"],
            r["seq"],
            r["op_index"],
            r["op"],
            r["relation"],
            decode_args(r["args"]) if r["args"] is not None else None,
            str(Link(r["fact_cid"])) if r["fact_cid"] is not None else None,
            [str(Link(o)) for o in r["observed"]] if r["observed"] is not None else None,
            hexed(r["key"]),
        )
        for r in rows
    ]


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_export_equals_the_replica_log(tmp_path, kind):
    rep = _replica(tmp_path, kind)
    rep.assert_facts(MIXED)
    rep.retract_facts(MIXED[:2] + [make_fact("edge", (1, 2))])
    rep.assert_facts([make_fact("v", (1,))])  # re-assert after the retract: visible again
    rep.grant(b"\x33" * 32)
    rep.revoke(b"\x33" * 32)
    summary = export_replica(rep, tmp_path / "out")
    got = _exported(tmp_path / "out")
    want = _reference(rep)
    assert got == want
    assert summary["ops"] == len(want) == len(MIXED) + 3 + 1 + 2
    assert {r[5] for r in got} == {"assert", "retract", "grant", "revoke"}
    # visible facts, per relation, typed values intact
    facts = {}
    for rel in ("v", "edge"):
        table = pq.read_table(tmp_path / "out" / "facts" / f"relation={rel}").to_pylist()
        assert len({r["fact_cid"] for r in table}) == len(table)  # each visible fact once
        facts.update({Link(r["fact_cid"]): Fact(rel, decode_args(r["args"])) for r in table})
    assert facts == dict(rep.visible())
    assert summary["facts"] == {"v": 6, "edge": 1}
    assert (tmp_path / "out" / "genesis.cbor").read_bytes() == rep.genesis.data
    # partitioned (spilled) join: the same rows and facts, in another order
    again = export_replica(rep, tmp_path / "parts", partition_ops=4)
    assert again == summary | {"facts": again["facts"]} and again["facts"] == summary["facts"]
    assert sorted(_exported(tmp_path / "parts"), key=repr) == sorted(want, key=repr)
    assert not [p for p in (tmp_path / "parts").iterdir() if p.name.startswith(".export-")]


def test_batches_cover_the_log_in_causal_order(tmp_path):
    rep = _replica(tmp_path, "sqlite")
    for i in range(7):
        rep.assert_facts([make_fact("n", (i,))])
    batches = list(iter_log_batches(rep, batch=3))
    assert [len(b) for b in batches] == [3, 3, 1]
    assert [d.clock for b in batches for d in b] == list(range(1, 8))
    assert [Link(d.cid) for b in batches for d in b] == [d.cid for d in rep.iter_deltas()]


def test_corrupted_block_is_detected_not_exported(tmp_path):
    rep = _replica(tmp_path, "sqlite")
    [cid] = rep.assert_facts([make_fact("n", (1,))])
    rep.conn.execute("UPDATE blocks SET data = ? WHERE cid = ?", (b"\xa0", cid.raw))
    with pytest.raises(CIDMismatch):
        export_replica(rep, tmp_path / "out")


def test_export_of_every_op_shape_equals_the_log(tmp_path):
    """Retracts observing two asserts, a delta mixing asserts and retracts (decoded by
    libipld), grants and revokes: the export is still the replica's log row for row."""
    from tests.spark.test_deltacols import replica_with_every_shape

    rep = replica_with_every_shape(tmp_path)
    export_replica(rep, tmp_path / "out")
    assert _exported(tmp_path / "out") == _reference(rep)
    observed = [len(r[9]) for r in _reference(rep) if r[5] == "retract"]
    assert 2 in observed and 1 in observed


def test_corrupted_fact_block_is_detected(tmp_path):
    """A fact block whose bytes were swapped for another valid fact's (same prefix, so the
    fact scan reads it) fails the page's hash check."""
    rep = _replica(tmp_path, "sqlite")
    rep.assert_facts([make_fact("n", (1,)), make_fact("n", (2,))])
    one, two = fact_cid(make_fact("n", (1,))), fact_cid(make_fact("n", (2,)))
    data = rep.blockstore.get(two)
    rep.conn.execute("UPDATE blocks SET data = ? WHERE cid = ?", (data, one.raw))
    with pytest.raises(CIDMismatch, match=str(one)):
        export_replica(rep, tmp_path / "out")


def test_export_command_does_not_import_pandas(tmp_path):
    """pyarrow imports pandas (~0.3 s of CPU) on pa.array, pa.scalar or to_numpy: the
    export builds its arrays from buffers, so an export whose deltas and facts take the
    column-wise paths never pays for it (a mixed delta or a link value may)."""
    script = (
        "import sys\n"
        "from merklog.node.spark.export import export_replica\n"
        "from tests.spark.test_deltacols import replica_with_every_shape\n"
        "from pathlib import Path\n"
        f"rep = replica_with_every_shape(Path({str(tmp_path)!r}), mixed=False)\n"
        "assert 'pandas' not in sys.modules\n"
        f"export_replica(rep, Path({str(tmp_path / 'out')!r}))\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"


def test_an_export_over_an_earlier_one_replaces_its_files(tmp_path):
    """Exporting into the folder of an earlier export left that export's relation
    folders under facts/ (a hive reader of facts/ then read another dataset's facts
    beside this one's) while export.json listed only the new ones."""
    import pyarrow.dataset as pads

    def home(name: str, facts: str) -> Path:
        path = tmp_path / name
        for args in (["init"], ["put", facts]):
            subprocess.run(
                [sys.executable, "-m", "merklog.node.cli", "--home", str(path), *args],
                check=True,
                capture_output=True,
            )
        return path

    first = home("a", "old(1). old(2). other(3).")
    second = home("b", "x(1.0). x(true).")
    out = tmp_path / "export"
    for source in (first, second):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "merklog.node.cli",
                "--home",
                str(source),
                "parquet",
                "export",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
    assert sorted(p.name for p in (out / "facts").iterdir()) == ["relation=x"]
    facts = pads.dataset(out / "facts", partitioning="hive").to_table()
    assert facts.num_rows == 2
    ops = pq.read_table(out / "ops")
    assert set(ops.column("relation").to_pylist()) == {"x"}


def test_an_interrupted_export_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """Ctrl-C during ``parquet export`` over an earlier export deleted that export's ops/
    and truncated its facts while its export.json stayed: compact then refused the folder
    (or, after a prune, could read new ops under an old summary). The export is staged and
    moved into place whole; interrupted, the earlier one is as it was and nothing of the
    new one is left, and a folder it made is removed again."""
    from click.testing import CliRunner

    import merklog.node.spark.export as export_mod
    from merklog.node.cli import cli

    def run(*args: str) -> object:
        return CliRunner().invoke(cli, ["--home", str(tmp_path / "h"), *args])

    assert run("init").exit_code == 0
    assert run("put", "a(1).", "a(1.0).", 'b("1").').exit_code == 0
    out = tmp_path / "export"
    assert run("parquet", "export", str(out)).exit_code == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert run("put", "c(true).").exit_code == 0

    def interrupted(self):
        raise KeyboardInterrupt  # Ctrl-C once every new file is written, before the move

    monkeypatch.setattr(export_mod.FactsWriter, "close", interrupted)
    for target in (out, tmp_path / "new"):
        result = run("parquet", "export", str(target))
        assert result.exit_code == 1 and "interrupted" in result.output, result.output
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()
    assert run("parquet", "export", str(out)).exit_code == 0  # the earlier one replaced
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "facts", "genesis.cbor", "ops"]
    assert "relation=c" in {p.name for p in (out / "facts").iterdir()}


def _facts_of(directory: Path) -> dict[str, set[tuple]]:
    out: dict[str, set[tuple]] = {}
    for rel_dir in sorted((directory / "facts").iterdir()):
        rows = pq.read_table(rel_dir).to_pylist()
        out[rel_dir.name] = {
            (r["dataset"], r["fact_cid"], repr(decode_args(r["args"]))) for r in rows
        }
        assert len(out[rel_dir.name]) == len(rows)  # each visible fact once
    return out


def _mixed_replica(tmp_path: Path) -> Replica:
    """MIXED, forty edges (so every share of a split holds some), retracts (one of a fact
    asserted again), a grant and a revoke (ops without a fact: the first share's)."""
    rep = _replica(tmp_path, "sqlite")
    rep.assert_facts(MIXED + [make_fact("edge", (i, i * 2)) for i in range(10, 50)])
    rep.retract_facts(MIXED[:2] + [make_fact("edge", (1, 2)), make_fact("edge", (11, 22))])
    rep.assert_facts([make_fact("v", (1,))])
    rep.grant(b"\x33" * 32)
    rep.revoke(b"\x33" * 32)
    return rep


@pytest.mark.parametrize("workers", [2, 3])
def test_worker_processes_export_what_one_process_exports(tmp_path, workers):
    """An export shared by worker processes (each the facts of one CID range, the deltas
    read once by the exporting process) has the summary, ops and facts of a one-process
    export, and every worker wrote its part: also with the join spilled to partitions."""
    rep = _mixed_replica(tmp_path)
    one = export_replica(rep, tmp_path / "one", workers=1)
    want = _reference(rep)
    assert sorted(_exported(tmp_path / "one"), key=repr) == sorted(want, key=repr)
    for name, partition_ops in (("many", 2_000_000), ("spilled", 7)):
        many = export_replica(rep, tmp_path / name, workers=workers, partition_ops=partition_ops)
        assert many == one
        assert sorted(_exported(tmp_path / name), key=repr) == sorted(want, key=repr)
        assert _facts_of(tmp_path / name) == _facts_of(tmp_path / "one")
        parts = sorted(p.name for p in (tmp_path / name / "ops").iterdir())
        assert parts == [f"part-{w * 10_000:05d}.parquet" for w in range(workers)]
        for rel in ("relation=edge", "relation=v"):
            assert len(list((tmp_path / name / "facts" / rel).iterdir())) == workers
        assert not [p for p in (tmp_path / name).iterdir() if p.name.startswith(".export-")]
    # a store no other process can open is exported by this one alone
    (tmp_path / "m").mkdir()
    memory = _replica(tmp_path / "m", "memory")
    memory.assert_facts(MIXED)
    export_replica(memory, tmp_path / "mem", workers=workers)
    assert sorted(_exported(tmp_path / "mem"), key=repr) == sorted(_reference(memory), key=repr)
    assert [p.name for p in (tmp_path / "mem" / "ops").iterdir()] == ["part-00000.parquet"]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_an_export_tells_each_stage_from_every_process(tmp_path, workers):
    """The progress of an export comes by stage and adds up, also from worker processes
    (relayed from their pipes): every op decoded from the deltas once, every fact block
    read once, every op row written once; each share tells its op rows (one partition
    each here), so the written rows come from every process."""
    import threading

    rep = _mixed_replica(tmp_path)
    heard: list[tuple[str, int, str]] = []
    summary = export_replica(
        rep,
        tmp_path / "out",
        workers=workers,
        progress=lambda stage, n: heard.append((stage, n, threading.current_thread().name)),
    )
    total = {
        stage: sum(n for s, n, _t in heard if s == stage) for stage in ("deltas", "facts", "ops")
    }
    assert summary["ops"] > 0
    assert total == {"deltas": summary["ops"], "facts": fact_count(rep), "ops": summary["ops"]}
    assert {s for s, _n, _t in heard} == {"deltas", "facts", "ops"}
    writes = [t for s, _n, t in heard if s == "ops"]
    assert len(writes) == workers  # one op write told per process
    # a worker's progress reaches this process on a relay thread, not the main one
    assert len(set(writes)) == workers


def test_a_corrupted_block_in_a_workers_share_is_its_cid_mismatch_here(tmp_path):
    """A worker process's error is raised in the exporting process with its own type and
    message, and nothing of the export is left."""
    from merklog.node.spark.export import shares_of

    rep = _mixed_replica(tmp_path)
    second = shares_of(2)[1]
    victim, donor = [
        f
        for f in [make_fact("edge", (i, i * 2)) for i in range(10, 50)]
        if fact_cid(f).raw >= second.lo
    ][:2]
    data = rep.blockstore.get(fact_cid(donor))
    rep.conn.execute("UPDATE blocks SET data = ? WHERE cid = ?", (data, fact_cid(victim).raw))
    with pytest.raises(CIDMismatch, match=str(fact_cid(victim))):
        export_replica(rep, tmp_path / "out", workers=2)
    assert not (tmp_path / "out").exists()


def test_a_worker_process_that_dies_is_one_store_error(tmp_path, monkeypatch):
    from merklog.store import StoreError

    rep = _mixed_replica(tmp_path)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # a worker that ends at once, mute
    with pytest.raises(
        StoreError, match=r"^export worker 1 ended without a result \(exit status 1\)$"
    ):
        export_replica(rep, tmp_path / "out", workers=2)
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))  # none to start
    with pytest.raises(
        StoreError,
        match=r"^cannot start export worker 1: No such file or directory \(MERKLOG_EXPORT_WORKERS=1 exports",
    ):
        export_replica(rep, tmp_path / "out", workers=3)
    assert not (tmp_path / "out").exists()


def test_the_export_command_takes_its_worker_count_from_the_environment(tmp_path):
    """``MERKLOG_EXPORT_WORKERS`` sets the processes of ``parquet export`` (the
    automatic choice shares only logs of 200,000 ops or more); a wrong value is one line."""
    import os

    home = tmp_path / "h"

    def merklog(*args: str, workers: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, MERKLOG_EXPORT_WORKERS=workers)
        cmd = [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env)

    assert merklog("init", workers="").returncode == 0
    edges = " ".join(f"edge({i}, {i + 1})." for i in range(60))
    assert merklog("put", f'{edges} v(1). v(1.0). v(true). v("1").', workers="").returncode == 0
    one = merklog("parquet", "export", str(tmp_path / "one"), workers="1")
    two = merklog("parquet", "export", str(tmp_path / "two"), workers="2")
    assert one.returncode == two.returncode == 0, two.stderr
    assert json.loads(two.stdout) == json.loads(one.stdout)
    assert json.loads(one.stdout)["facts"] == {"edge": 60, "v": 4}
    assert sorted(p.name for p in (tmp_path / "two" / "ops").iterdir()) == [
        "part-00000.parquet",
        "part-10000.parquet",
    ]
    assert _facts_of(tmp_path / "two") == _facts_of(tmp_path / "one")
    bad = merklog("parquet", "export", str(tmp_path / "bad"), workers="many")
    assert bad.returncode == 1
    assert bad.stderr.splitlines() == [
        "Error: MERKLOG_EXPORT_WORKERS must be a whole number from 1 to 64, not 'many'"
    ]
    assert not (tmp_path / "bad").exists()


def test_an_export_missing_a_part_file_is_refused_before_the_jvm(tmp_path):
    """QA: an export with one ops part file lost (a copy cut short) was compacted, exit 0,
    into a signed snapshot lacking about half the facts; homes bootstrapped from it never
    got them back (their heads matched), and analyze counted half. ``compact`` and
    ``analyze`` now check the files against ``export.json`` first: one line naming the
    export, exit 2, nothing written, and no JVM started. The same for a missing ``ops/``
    folder. (A lost facts list is no loss: its facts come from their assert rows.)"""
    import os
    import shutil

    home = tmp_path / "h"

    def merklog(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, MERKLOG_EXPORT_WORKERS="2")
        cmd = [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env)

    assert merklog("init").returncode == 0
    assert merklog("put", " ".join(f"n({i})." for i in range(300))).returncode == 0
    whole = tmp_path / "whole"
    assert merklog("parquet", "export", str(whole)).returncode == 0
    program = tmp_path / "count.dl"
    program.write_text("c(N) :- N := count : n(_).\n")
    for name, lose in (
        ("no-ops-part", lambda d: (d / "ops" / "part-00000.parquet").unlink()),
        ("no-ops", lambda d: shutil.rmtree(d / "ops")),
    ):
        broken = tmp_path / name
        shutil.copytree(whole, broken)
        lose(broken)
        for args in (
            ("compact", str(broken), "--out", str(tmp_path / f"snap-{name}")),
            (
                "analyze",
                str(program),
                "--input",
                str(broken),
                "--out",
                str(tmp_path / f"an-{name}"),
            ),
        ):
            done = merklog(*args)
            assert done.returncode == 2, (name, args[0], done.stderr)
            [line] = done.stderr.splitlines()
            assert str(broken) in line and "export the home again" in line, line
            assert not (tmp_path / f"snap-{name}").exists()
            assert not (tmp_path / f"an-{name}").exists()
