"""``merklog fsck``: finds corrupted and missing blocks, repairs them from a real peer."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from merklog.node.failures import ExitCode
from merklog.store import Link

from .conftest import Cli, answered_posts


def test_fsck_finds_and_repairs_blocks_from_a_peer(tmp_path: Path, node_factory) -> None:
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    a("put", "edge(1, 2).", "edge(2, 3).", 'name("n", 1.5, true).')
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    b_key = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", b_key)  # lets b read from a
    b("sync", na.url)
    assert "ok:" in b("fsck").output
    lines = [line.split("\t") for line in b("ls").output.splitlines()]
    cids = {fact: Link.parse(cid).raw for cid, fact in lines}
    with sqlite3.connect(b.home / "store.sqlite") as db:  # damage two blocks for real
        (data,) = db.execute(
            "SELECT data FROM blocks WHERE cid = ?", (cids["edge(1, 2)"],)
        ).fetchone()
        db.execute("UPDATE blocks SET data = ? WHERE cid = ?", (b"\x00" + data, cids["edge(1, 2)"]))
        db.execute("DELETE FROM blocks WHERE cid = ?", (cids['name("n", 1.5, true)'],))
    found = b("fsck", ok=False)
    assert found.exit_code == ExitCode.STORE_DAMAGED and "Traceback" not in found.output
    assert "does not hash" in found.output and "missing" in found.output
    repaired = b("fsck", "--repair-from", na.url)
    assert "2 blocks repaired" in repaired.output and "ok:" in repaired.output
    assert sorted(
        fact for _cid, fact in (line.split("\t") for line in b("ls").output.splitlines())
    ) == [
        "edge(1, 2)",
        "edge(2, 3)",
        'name("n", 1.5, true)',
    ]
    assert "ok:" in b("fsck").output


def test_repair_fetches_only_the_damaged_blocks(tmp_path: Path, node_factory) -> None:
    """A repair asks the peer for the damaged blocks by CID: the report and the peer's
    request metrics show those blocks moved, not the peer's whole log."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    source = tmp_path / "facts.dl"
    source.write_text(
        "".join(f'n({i}, {i}.0, "{i}", true, x"{i % 256:02x}").\n' for i in range(3000))
    )
    a("put", "-f", str(source))
    a("put", 'v(1). v(1.0). v(true). v("1"). v(x"01").')  # the last delta: a small one
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    b_key = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", b_key)  # lets b read from a
    b("sync", na.url)
    lines = [line.split("\t") for line in b("ls").output.splitlines()]
    cids = {fact: Link.parse(cid).raw for cid, fact in lines}
    damaged = [cids["v(1)"], cids["v(1.0)"], cids["v(true)"], cids['n(7, 7.0, "7", true, x"07")']]
    with sqlite3.connect(b.home / "store.sqlite") as db:
        sizes = {
            cid: len(db.execute("SELECT data FROM blocks WHERE cid = ?", (cid,)).fetchone()[0])
            for cid in damaged
        }
        (log_bytes,) = db.execute("SELECT sum(length(data)) FROM blocks").fetchone()
        (delta,) = db.execute("SELECT cid FROM repl_delta ORDER BY clock DESC LIMIT 1").fetchone()
        sizes[bytes(delta)] = len(
            db.execute("SELECT data FROM blocks WHERE cid = ?", (delta,)).fetchone()[0]
        )
        (data,) = db.execute("SELECT data FROM blocks WHERE cid = ?", (damaged[0],)).fetchone()
        db.execute("UPDATE blocks SET data = ? WHERE cid = ?", (b"\x00" + data, damaged[0]))
        db.execute("UPDATE blocks SET data = ? WHERE cid = ?", (b"\xa0", damaged[1]))
        db.executemany("DELETE FROM blocks WHERE cid = ?", [(damaged[2],), (damaged[3],)])
        db.execute("DELETE FROM blocks WHERE cid = ?", (delta,))
    found = json.loads(b("fsck", "--json", ok=False).output.splitlines()[0])
    assert not found["ok"] and found["repaired"] == 0
    syncs_before = answered_posts(na, "/v1/datasets/{id}/sync")
    repaired = b("fsck", "--repair-from", na.url, "--json")
    report = json.loads(repaired.output.splitlines()[0])
    assert report["ok"] and report["repaired"] == 5 and report["unavailable"] == 0
    assert report["repaired_bytes"] == sum(sizes.values())
    assert report["requests"] == 1 and not report["from_log"]
    # The HTTP body is the five blocks plus CAR framing: far below the log's size.
    assert report["bytes_received"] < report["repaired_bytes"] + 5 * 64 + 128 < log_bytes // 20
    assert answered_posts(na, "/v1/datasets/{id}/blocks") == 1
    assert answered_posts(na, "/v1/datasets/{id}/sync") == syncs_before
    assert "ok:" in b("fsck").output
    assert b("ls").output == a("ls").output
    text = b("fsck", "--repair-from", na.url)  # nothing to repair: nothing asked
    assert "repaired" not in text.output and answered_posts(na, "/v1/datasets/{id}/blocks") == 1


def test_fsck_counts_one_thing_in_the_singular(tmp_path: Path, node_factory) -> None:
    """A home missing one block said "1 problems remain", and its repair "1 blocks
    repaired": counts of one now read in the singular, others in the plural."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    a("put", "one(1).", "one(1.0).")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    b_key = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", b_key)  # lets b read from a
    b("sync", na.url)
    cid = Link.parse(b("ls", "one").output.splitlines()[0].split("\t")[0])
    with sqlite3.connect(b.home / "store.sqlite") as db:
        db.execute("DELETE FROM blocks WHERE cid = ?", (cid.raw,))
    found = b("fsck", ok=False)
    assert found.exit_code == ExitCode.STORE_DAMAGED
    assert f"problem: block {cid} is missing\n" in found.output
    assert "Error: 1 problem remains; run `merklog fsck --repair-from URL`" in found.output
    repaired = b("fsck", "--repair-from", na.url).output
    assert ", 1 block repaired from " in repaired and " in 1 request)" in repaired, repaired
    assert repaired.startswith("ok: ") and " blocks, 2 deltas checked, " in repaired, repaired


def test_repair_from_a_silent_peer_gives_up_after_sync_timeout(tmp_path: Path) -> None:
    """QA: ``fsck --repair-from`` built its sync client with the 60 s default, so
    ``--set sync.timeout=3`` against a peer that accepts and never answers still waited
    61 s. It waits ``sync.timeout`` per request, as ``sync`` does, and says the peer did
    not answer (exit 4, worth retrying)."""
    import socket
    import subprocess
    import sys
    import time

    a = Cli(tmp_path / "a")
    a("init")
    a("put", "edge(1, 2).", "edge(2, 3).")
    cid = Link.parse(a("ls").output.splitlines()[0].split("\t")[0])
    with sqlite3.connect(a.home / "store.sqlite") as db:
        db.execute("DELETE FROM blocks WHERE cid = ?", (cid.raw,))
    with socket.socket() as silent:  # connections complete in its backlog, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(a.home)]
            + ["--set", "sync.timeout=2", "fsck", "--repair-from", url],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        took = time.monotonic() - started
    assert took < 20, (took, done.stderr)  # not the 60 s default
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == ExitCode.PEER_UNREACHABLE, (done.returncode, done.stderr)
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("Error:")]
    assert url in line and "did not answer within 2" in line, line


def test_a_missing_genesis_block_is_store_damage_that_fsck_repairs(
    tmp_path: Path, node_factory
) -> None:
    """With its genesis block deleted, every command said "genesis block of dataset … is
    not known" and exit 1, as if the home followed another dataset; a corrupted one
    already said exit 5 and pointed at fsck. Both are store damage now, and fsck
    --repair-from fetches the block again."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    a("put", "edge(1, 2).")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    b_key = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", b_key)  # lets b read from a
    b("sync", na.url)
    dataset = json.loads(b("status", "--json").output)["dataset"]
    with sqlite3.connect(b.home / "store.sqlite") as db:
        db.execute("DELETE FROM blocks WHERE cid = ?", (Link.parse(dataset).raw,))
    for args in (("status",), ("ls",), ("query", "edge(X, Y)"), ("put", "edge(5, 6).")):
        failed = b(*args, ok=False)
        assert failed.exit_code == ExitCode.STORE_DAMAGED, (args, failed.output)
        assert "is damaged" in failed.output and "fsck --repair-from" in failed.output
        assert dataset in failed.output and "Traceback" not in failed.output
    assert b("fsck", ok=False).exit_code == ExitCode.STORE_DAMAGED
    assert "1 block repaired" in b("fsck", "--repair-from", na.url).output
    assert b("ls").output.split("\t")[1].strip() == "edge(1, 2)"


def test_fsck_finds_a_fact_block_no_peer_accepts(tmp_path: Path) -> None:
    """A fact block that hashes right but holds what no receiver takes (``z(null)``:
    before 2854f44, ``write_async`` stored a hand-made ``Fact("z", (None,))`` unchecked,
    through the replica's own write path, as here) was "ok" to fsck while every read
    of the home and every sync of the dataset failed on it. fsck now names it and what
    to do, exit STORE_DAMAGED, and no traceback."""
    import merklog
    from merklog.store import Fact, encode_facts

    a = Cli(tmp_path / "a")
    a("init")
    a("put", "edge(1, 2).")
    with merklog.open(a.home) as node:
        bad = [Fact("z", (None,))]
        node.replica.write_asserts(bad, encode_facts(bad))
    found = a("fsck", ok=False)
    assert found.exit_code == ExitCode.STORE_DAMAGED and "Traceback" not in found.output
    assert "holds what no peer accepts" in found.output and "restore a backup" in found.output


def test_tables_that_lost_rows_fail_fsck_and_export_and_no_repair_is_offered(
    tmp_path: Path,
) -> None:
    """QA, on real store files damaged with sqlite3: a lost ``repl_fact`` row hid a fact
    from query and ls while fsck said "ok"; a lost ``repl_delta`` row let ``export``
    write, exit 0, a CAR that ``restore`` refuses; and for such damage fsck advised
    ``--repair-from``, which cannot repair it. Now fsck and export exit 5 naming it, no
    CAR is written, and the advice is to restore a backup or join a peer."""

    def damaged(name: str, sql: str) -> Cli:
        """A home of three writes, then ``sql`` run on its store file."""
        home = Cli(tmp_path / name)
        home("init")
        for i in range(3):
            home("put", f"e({i}).")
        with sqlite3.connect(home.home / "store.sqlite") as db:
            db.execute(sql)
        return home

    a = damaged("a", "DELETE FROM repl_fact WHERE id = (SELECT max(id) FROM repl_fact)")
    found = a("fsck", ok=False)
    assert found.exit_code == ExitCode.STORE_DAMAGED, found.output
    assert "repl_fact lost" in found.output and "no peer can repair this" in found.output
    assert "--repair-from URL" not in found.output

    b = damaged("b", "DELETE FROM repl_delta WHERE seq = 2")
    car = tmp_path / "b.car"
    refused = b("export", str(car), ok=False)
    assert refused.exit_code == ExitCode.STORE_DAMAGED and "Traceback" not in refused.output
    assert (
        "could not be restored" in refused.output and "is not an accepted delta" in refused.output
    )
    assert not car.exists()
    checked = b("fsck", ok=False)
    assert "is not an accepted delta" in checked.output and "restore a backup" in checked.output
