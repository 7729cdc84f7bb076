"""A node whose blocks live on a real js-ipfs daemon: every CLI command on such a home,
sync with a SQLite peer, a daemon that is down or dies mid-write, a tampered block."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import tomllib
from pathlib import Path

import pytest

from merklog.store import Link
from merklog.store.ipfs import IMPORT_CHUNK, IPFSBlockStore

from ..ipfsproxy import ImportProxy
from .conftest import Cli

pytestmark = [
    pytest.mark.ipfs,
    pytest.mark.filterwarnings("ignore:The 'strict' parameter:FutureWarning"),
]


def _url(addr: str) -> str:
    """``/ip4/127.0.0.1/tcp/P/http`` → ``http://127.0.0.1:P`` (init accepts either)."""
    parts = addr.strip("/").split("/")
    return f"http://{parts[1]}:{parts[3]}"


def _ls(run: Cli) -> list[str]:
    return sorted(line.split("\t")[1] for line in run("ls").output.splitlines())


def _cids(run: Cli) -> list[Link]:
    return [Link.parse(line.split("\t")[0]) for line in run("ls").output.splitlines()]


def _on_daemon(addr: str, cids: list[Link]) -> None:
    """Every block is on the daemon, pinned (directly or through a pin-set), verified."""
    remote = IPFSBlockStore(addr, timeout=30)
    try:
        for cid in cids:
            assert remote.get(cid)
            keys = remote.client.pin.ls(str(cid))["Keys"]
            assert [Link.parse(k) for k in keys] == [cid]
    finally:
        remote.close()


def test_every_command_works_on_an_ipfs_home(tmp_path: Path, ipfs_daemon: str) -> None:
    run = Cli(tmp_path / "a")
    out = run("init", "--store", "ipfs", "--ipfs-api", _url(ipfs_daemon)).output
    assert "initialised" in out
    cfg = tomllib.loads((run.home / "config.toml").read_text())
    assert cfg["store"]["backend"] == "ipfs"
    assert cfg["store"]["ipfs_api"] == _url(ipfs_daemon)
    dataset = Link.parse(cfg["dataset"]["id"])
    run("put", "v(1).", "v(1.0).", "v(true).", 'v("1").', 'v(x"01").', "edge(1, 2).")
    facts = tmp_path / "facts.dl"
    facts.write_text("edge(2, 3).\nedge(3, 4).\n")
    run("put", "-f", str(facts))
    run("retract", "edge(3, 4).")
    assert _ls(run) == sorted(
        ["v(1)", "v(1.0)", "v(true)", 'v("1")', 'v(x"01")', "edge(1, 2)", "edge(2, 3)"]
    )
    status = json.loads(run("status", "--json").output)
    _on_daemon(ipfs_daemon, [dataset, *_cids(run), *map(Link.parse, status["heads"])])

    prog = tmp_path / "path.dl"
    prog.write_text("path(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n")
    assert "loaded" in run("load", str(prog)).output
    assert json.loads(run("query", "--json", "path(1, X)").output)["rows"] == [[2], [3]]
    assert json.loads(run("query", "--json", "edge(1, X)").output)["rows"] == [[2]]

    car = tmp_path / "a.car"
    assert "exported" in run("export", str(car)).output
    other = Cli(tmp_path / "b")
    other("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon)
    join_cfg = tomllib.loads((other.home / "config.toml").read_text())
    assert join_cfg["store"]["backend"] == "ipfs"
    # A CAR of another dataset is refused as a whole; this home is unchanged.
    refused = other("import", str(car), ok=False)
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert _ls(other) == []
    assert "duplicates" in run("import", str(car)).output

    parquet = tmp_path / "pq"
    summary = json.loads(run("parquet", "export", str(parquet)).output.strip().splitlines()[-1])
    assert summary
    assert any(parquet.rglob("*.parquet"))


def test_ipfs_home_syncs_with_a_sqlite_peer(tmp_path: Path, ipfs_daemon: str, node_factory):
    a, b = Cli(tmp_path / "ipfs-home"), Cli(tmp_path / "sqlite-home")
    a("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon)
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    nb = node_factory(b.home).start()
    a("peers", "add", "b", nb.url, "--writer", "--token", nb.read_token)
    b("peers", "add", "a", na.url, "--token", na.read_token)
    a("put", "edge(1, 2).", 'name(1, "1").')
    b("sync", "a")  # pulls the grant and a's facts from the IPFS-backed node
    b("put", "edge(7, 8).", "flag(1.0).")
    b("sync", "a")  # pushes b's facts into the IPFS-backed node
    assert _ls(a) == _ls(b) == sorted(["edge(1, 2)", 'name(1, "1")', "edge(7, 8)", "flag(1.0)"])
    _on_daemon(ipfs_daemon, _cids(a))  # the pushed facts reached the daemon, pinned


def test_init_on_a_daemon_that_is_down_creates_nothing(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = Cli(tmp_path / "home")
    result = run("init", "--store", "ipfs", "--ipfs-api", f"http://127.0.0.1:{port}", ok=False)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert f"127.0.0.1/tcp/{port}" in result.output
    # what to do, not "IPFS version failed at …: daemon not reachable"
    assert f"the IPFS daemon at /ip4/127.0.0.1/tcp/{port}/http is not reachable (" in result.output
    assert "start it, or set store.ipfs_api to where it listens" in result.output
    assert not (tmp_path / "home" / "config.toml").exists()
    bad = run("init", "--store", "ipfs", "--ipfs-api", "localhost:5001", ok=False)
    assert bad.exit_code != 0 and "not an IPFS API address" in bad.output


@pytest.mark.timeout(900)  # a daemon start on a shared, loaded machine
def test_daemon_dying_mid_write_applies_nothing_and_the_retry_succeeds(
    tmp_path: Path, fault_daemon
) -> None:
    daemon = fault_daemon  # not the session daemon: killed and restarted here
    proxy = ImportProxy(daemon.api_port, daemon.kill)
    try:
        run = Cli(tmp_path / "home")
        run("init", "--store", "ipfs", "--ipfs-api", f"http://127.0.0.1:{proxy.port}")
        run("put", "before(1).")
        facts = tmp_path / "facts.dl"
        # More blocks than one dag/import CAR holds (IMPORT_CHUNK): the write that dies
        # and the retry each ship several CARs (js-ipfs stores only ~500 blocks/s).
        n = IMPORT_CHUNK + 176
        facts.write_text("".join(f'big({i}, "{i}", {i}.5).\n' for i in range(n)))
        proxy.armed = True
        result = run("put", "-f", str(facts), ok=False)
        assert proxy.met.wait(60)  # the daemon died during this write
        assert result.exit_code != 0
        assert "Traceback" not in result.output
        assert "IPFS" in result.output and f"tcp/{proxy.port}" in result.output
        # While it is down every command says so (no hang, no traceback).
        down = run("ls", ok=False)
        assert down.exit_code != 0 and "IPFS" in down.output
        daemon.start()  # same repo, same port
        assert _ls(run) == ["before(1)"]  # nothing of the failed write is visible
        assert json.loads(run("status", "--json").output)["facts"] == 1
        run("put", "-f", str(facts))
        listed = _ls(run)
        assert len(listed) == n + 1 and f'big({n - 1}, "{n - 1}", {n - 1}.5)' in listed
        _on_daemon(daemon.api_addr, _cids(run)[:5])  # pin/ls walks every pin-set: a sample
    finally:
        proxy.close()


def test_tampered_block_on_the_daemon_is_rejected_by_cid(
    tmp_path: Path, ipfs_daemon_handle
) -> None:
    """A home that reads a block from the daemon (here one its cache lost) refuses bytes
    that do not hash to the CID and shows none of them. (``get`` of a block only the
    daemon holds is not served at all: the daemon may hold other homes' blocks.)"""
    a = Cli(tmp_path / "a")
    a("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon_handle.api_addr)
    a("put", 'secret("original").')
    (cid,) = _cids(a)
    key = base64.b32encode(cid.raw[2:]).decode().rstrip("=")
    # the daemon may answer the write before its block file is on disk (a loaded machine)
    deadline = time.monotonic() + 30
    while not (found := list((ipfs_daemon_handle.repo / "blocks").glob(f"*/{key}.data"))):
        assert time.monotonic() < deadline, f"no block file {key}.data on the daemon"
        time.sleep(0.1)
    (path,) = found
    good = path.read_bytes()
    from merklog.store import encode_fact, make_fact

    path.write_bytes(encode_fact(make_fact("secret", ["forged"]))[1])
    _block_row(a.home, cid, None)  # the cache lost it: the next read asks the daemon
    try:
        result = a("ls", ok=False)
        assert result.exit_code != 0
        assert "CID mismatch" in result.output and "Traceback" not in result.output
        assert "forged" not in result.output
    finally:
        path.write_bytes(good)
    assert "original" in a("ls").output


@pytest.mark.timeout(900)  # a daemon start on a shared, loaded machine
def test_running_node_answers_503_while_its_daemon_is_down(
    tmp_path: Path, fault_daemon, node_factory
) -> None:
    import shutil

    daemon = fault_daemon
    run = Cli(tmp_path / "home")
    run("init", "--store", "ipfs", "--ipfs-api", daemon.api_addr)
    run("put", "a(1).")
    # a copy of the home writes b(1): its CAR holds a delta the home lacks
    shutil.copytree(run.home, tmp_path / "copy")
    copy = Cli(tmp_path / "copy")
    copy("put", "b(1).")
    car = tmp_path / "copy.car"
    copy("export", str(car))
    node = node_factory(run.home).start()
    daemon.kill()
    status, body = node.request("POST", "/v1/facts", {"assert": "a(2)."})
    assert status == 503 and body["error"] == "store unavailable"
    assert "IPFS" in body["detail"] and f"tcp/{daemon.api_port}" in body["detail"]
    refused = run("put", "a(3).", ok=False)  # the CLI goes through the running node
    assert refused.exit_code == 4 and "Traceback" not in refused.output
    # QA: an import said 400 "rejected" (exit 2, bad input) for the daemon being down
    import urllib.error
    import urllib.request

    posted = urllib.request.Request(node.url + "/v1/import", car.read_bytes(), method="POST")
    posted.add_header("Authorization", f"Bearer {node.token}")
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(posted, timeout=120)
    body = json.loads(answer.value.read())
    assert answer.value.code == 503 and body["error"] == "store unavailable", body
    refused = run("import", str(car), ok=False)
    assert refused.exit_code == 4, refused.output
    daemon.start()
    run("put", "a(2).")
    run("import", str(car))
    assert _ls(run) == ["a(1)", "a(2)", "b(1)"]


def _block_row(home: Path, cid: Link, data: bytes | None) -> None:
    """Delete (``data=None``) or overwrite the home's cached block ``cid`` (SQLite cache)."""
    import sqlite3

    with sqlite3.connect(home / "store.sqlite") as conn:
        if data is None:
            conn.execute("DELETE FROM blocks WHERE cid = ?", (cid.raw,))
        else:
            conn.execute("UPDATE blocks SET data = ? WHERE cid = ?", (data, cid.raw))
    conn.close()


def _cached(home: Path, cid: Link) -> bytes | None:
    import sqlite3

    with sqlite3.connect(home / "store.sqlite") as conn:
        row = conn.execute("SELECT data FROM blocks WHERE cid = ?", (cid.raw,)).fetchone()
    conn.close()
    return None if row is None else bytes(row[0])


def _lose_on_daemon(addr: str, cid: Link) -> None:
    """Make the daemon lose a fact block: unpin the pin-set block that pins it (a
    pinned block is not removed by ``block/rm``), then remove it."""
    remote = IPFSBlockStore(addr, timeout=30)
    try:
        keys = remote.client.pin.ls(str(cid))["Keys"]
        (kind,) = [v["Type"] for k, v in keys.items() if Link.parse(k) == cid]
        root = kind.removeprefix("indirect through ").strip()
        remote.client.pin.rm(root)
        remote.delete_many([cid])
        assert not remote.has(cid)
    finally:
        remote.close()


def test_fsck_checks_and_repairs_an_ipfs_home(tmp_path: Path, ipfs_daemon: str, node_factory):
    """``fsck`` said "SQLite stores only" on an IPFS home, while the error a damaged
    block gives there points to ``fsck --repair-from``. It now checks the home's cache
    and indexes, puts a block its cache lost or holds corrupted back from the home's own
    daemon, repairs a block both lost from a peer (a SQLite home restored from this
    one's backup), and imports every block into the daemon again."""
    import os

    run = Cli(tmp_path / "a")
    run("init", "--store", "ipfs", "--ipfs-api", _url(ipfs_daemon))
    token = os.urandom(4).hex()  # blocks (and pin-set blocks) of this test alone
    run("put", *(f'v("{token}", {v}).' for v in ("1", "1.0", "true", '"1"', 'x"01"')))
    assert "ok:" in run("fsck").output
    backup = tmp_path / "a.car"
    run("export", str(backup))
    peer = Cli(tmp_path / "peer")
    peer("restore", str(backup))
    key = json.loads(run("status", "--json").output)["key"]
    peer("peers", "add", "a", "http://127.0.0.1:9", "--key", key)  # may sync with it
    served = node_factory(peer.home).start()

    victim, other = [Link.parse(line.split("\t")[0]) for line in run("ls").output.splitlines()][:2]
    good = _cached(run.home, victim)
    assert good is not None
    # The cache lost a block and holds another corrupted; the daemon has both: fsck puts
    # them back without a peer (it asked for one).
    _block_row(run.home, victim, None)
    _block_row(run.home, other, b"\x00" + good)
    fixed = json.loads(run("fsck", "--json").output)
    assert fixed["ok"] and fixed["refilled"] == 2 and fixed["repaired"] == 0, fixed
    assert _cached(run.home, victim) == good and "ok:" in run("fsck").output
    _block_row(run.home, victim, None)
    line = run("fsck").output
    assert line.startswith("ok: ") and "1 block put back from the home's IPFS daemon" in line
    # Lost by both: a peer is needed.
    _block_row(run.home, victim, None)
    _lose_on_daemon(ipfs_daemon, victim)
    found = run("fsck", "--json", ok=False)
    assert found.exit_code == 5 and str(victim) in found.output, found.output
    assert json.loads(found.output.splitlines()[0])["refilled"] == 0
    fixed = json.loads(run("fsck", "--json", "--repair-from", served.url).output)
    assert fixed["ok"] and fixed["repaired"] == 1, fixed
    assert fixed["repinned"] == fixed["blocks"], fixed  # every block into the daemon again
    assert "ok:" in run("fsck").output
    _on_daemon(ipfs_daemon, _cids(run))


def test_joining_a_dataset_the_daemon_cannot_find_says_so(tmp_path: Path, ipfs_daemon: str):
    """``init --store ipfs --join <id>`` of a dataset no connected peer has said the home
    was damaged and pointed to fsck (exit 5), naming a home it had removed. It is "not
    found" (exit 3) naming the daemon, and nothing is created."""
    from merklog.store import fact_cid, make_fact

    home = tmp_path / "w"
    unknown = str(fact_cid(make_fact("never", ("stored",))))
    result = Cli(home)(
        "--set", "store.ipfs_timeout=3", "init", "--store", "ipfs",
        "--ipfs-api", _url(ipfs_daemon), "--join", unknown, ok=False,
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert f"found no dataset {unknown}" in result.output and "fsck" not in result.output
    assert not home.exists()


def test_init_never_moves_an_initialised_homes_blocks(
    tmp_path: Path, ipfs_daemon: str, monkeypatch
) -> None:
    """``init --ipfs-api URL`` on a SQLite home said "already initialised" (exit 0) and
    saved ``backend = "ipfs"``: its facts were then looked for on a daemon that never had
    them. ``--set store.backend=…`` switched either way, and ``--ipfs-api`` re-pointed an
    IPFS home at another daemon. Only ``--store sqlite`` refused. Every such ask is now
    refused (exit 2, one line, config.toml untouched); the same daemon spelled another
    way is no switch."""
    url = _url(ipfs_daemon)
    with socket.socket() as sock:  # a port no daemon listens on: the refusal asks nobody
        sock.bind(("127.0.0.1", 0))
        elsewhere = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def refused(run: Cli, *args: str, env: dict[str, str] | None = None) -> str:
        config = (run.home / "config.toml").read_bytes()
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        try:
            result = run(*args, ok=False)
        finally:
            for name in env or {}:
                monkeypatch.delenv(name)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
        assert (run.home / "config.toml").read_bytes() == config
        return result.output

    s = Cli(tmp_path / "s")
    s("init")
    s("put", "kept(1).", "kept(1.0).")
    for args in [
        ("init", "--ipfs-api", url),
        ("init", "--store", "ipfs", "--ipfs-api", url),
        ("--set", "store.backend=ipfs", "--set", f"store.ipfs_api={url}", "init"),
    ]:
        out = refused(s, *args)
        assert "already keeps its blocks in sqlite" in out and "restore" in out
    out = refused(s, "init", env={"MERKLOG_STORE_BACKEND": "ipfs", "MERKLOG_STORE_IPFS_API": url})
    assert "already keeps its blocks in sqlite" in out
    assert _ls(s) == ["kept(1)", "kept(1.0)"]

    i = Cli(tmp_path / "i")
    i("init", "--store", "ipfs", "--ipfs-api", url)
    i("put", "kept(true).")
    for args in [("init", "--store", "sqlite"), ("--set", "store.backend=sqlite", "init")]:
        assert "already keeps its blocks in ipfs" in refused(i, *args)
    for args in [
        ("init", "--ipfs-api", elsewhere),
        ("--set", f"store.ipfs_api={elsewhere}", "init"),
    ]:
        out = refused(i, *args)
        assert f"does not re-point it to {elsewhere}" in out and "fsck --repair-from" in out
    assert "already initialised" in i("init", "--ipfs-api", ipfs_daemon).output  # same daemon
    assert _ls(i) == ["kept(true)"]
    # QA: any other command took them for itself, and wrote its blocks around the
    # home's store (MERKLOG_STORE_BACKEND=sqlite put: nothing reached the daemon)
    for home, args, env, said in [
        (i, ("--set", "store.backend=sqlite", "put", "e(1)."), None, "in ipfs; a command"),
        (i, ("put", "e(1)."), {"MERKLOG_STORE_BACKEND": "sqlite"}, "in ipfs; a command"),
        (i, ("--set", f"store.ipfs_api={elsewhere}", "put", "e(1)."), None, "re-point it"),
        (s, ("--set", "store.backend=ipfs", "put", "e(1)."), None, "in sqlite; a command"),
    ]:
        assert said in refused(home, *args, env=env)
    assert _ls(i) == ["kept(true)"] and _ls(s) == ["kept(1)", "kept(1.0)"]


def test_a_malformed_multiaddr_is_bad_input(tmp_path: Path, ipfs_daemon: str) -> None:
    """``init --ipfs-api /garbage`` and a config.toml whose ``ipfs_api`` holds port 99999
    or ``/udp/`` said "cannot reach the IPFS API at …: Unsupported Multiaddr pattern",
    exit 1, where a malformed URL is exit 2. Both are now bad input, one line, exit 2,
    and init creates nothing."""
    for addr in ("/garbage", "/ip4/127.0.0.1/tcp/99999/http"):
        result = Cli(tmp_path / "new")("init", "--ipfs-api", addr, ok=False)
        assert result.exit_code == 2, result.output
        assert result.output.startswith(f"Error: not an IPFS API address: {addr!r}")
        assert result.output.count("\n") == 1 and "Unsupported" not in result.output
        assert not (tmp_path / "new").exists()
    # QA: user:password@ was stored in config.toml in plain text and never sent
    secret = ipfs_daemon.replace("/ip4/127.0.0.1/tcp/", "http://alice:s3cret@127.0.0.1:")
    secret = secret.removesuffix("/http")
    result = Cli(tmp_path / "new")("init", "--store", "ipfs", "--ipfs-api", secret, ok=False)
    assert result.exit_code == 2 and "takes no user:password@" in result.output, result.output
    assert not (tmp_path / "new").exists()
    run = Cli(tmp_path / "home")
    run("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon)
    config = run.home / "config.toml"
    good = config.read_text()
    for addr in ("/ip4/127.0.0.1/tcp/99999/http", "/ip4/127.0.0.1/udp/5001/http"):
        config.write_text(good.replace(f'ipfs_api = "{ipfs_daemon}"', f'ipfs_api = "{addr}"'))
        assert addr in config.read_text()
        for args in (("ls",), ("status",), ("fsck",)):
            result = run(*args, ok=False)
            assert result.exit_code == 2, (args, result.output)
            assert "not an IPFS API address" in result.output and addr in result.output
            assert result.output.count("\n") == 1


def _on_a_terminal(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``merklog ARGS`` with its standard error on a pseudo-terminal (where progress
    bars draw); (exit status, standard output, everything drawn on the terminal)."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "merklog.node.cli", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "160", **(env or {})},
    )
    os.close(slave)
    drawn = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    out = proc.stdout.read().decode() if proc.stdout else ""
    proc.wait(timeout=600)
    return proc.returncode, out, drawn.decode(errors="replace")


def test_fsck_repair_counts_the_blocks_it_imports_into_the_daemon(
    tmp_path: Path, ipfs_daemon: str
) -> None:
    """``fsck --repair-from`` on an IPFS home imports every block into the daemon again
    (~11 s for 14,000 blocks), and its progress line sat at ``repair: 0 blocks, 0 bytes``
    all that time; the summary said "1 blocks". The line now counts the blocks and bytes
    going into the daemon, and counts read "1 block", "2 blocks"."""
    import re

    run = Cli(tmp_path / "a")
    run("init", "--store", "ipfs", "--ipfs-api", _url(ipfs_daemon))
    facts = tmp_path / "facts.dl"
    # More blocks than fsck imports per step (1,000): the line counts up more than once.
    n = 1200
    facts.write_text("".join(f'r({i}, "{i}", {i}.5).\n' for i in range(n)))
    run("put", "-f", str(facts))
    code, out, drawn = _on_a_terminal(
        ["--home", str(run.home), "fsck", "--repair-from", "http://127.0.0.1:9"]
    )
    assert code == 0, (out, drawn)
    summary = re.fullmatch(
        r"ok: (\d+) blocks, \d+ deltas checked, (\d+) blocks imported into the IPFS daemon again\n",
        out,
    )
    assert summary and summary.group(1) == summary.group(2) and int(summary.group(1)) > n
    counted = [int(n) for n in re.findall(r"into the IPFS daemon again: (\d+) blocks", drawn)]
    assert counted and max(counted) > 0 and counted == sorted(counted), drawn[-2000:]


def test_joining_a_fact_or_delta_id_is_bad_input(tmp_path: Path, ipfs_daemon: str) -> None:
    """``init --join <a fact's CID>`` on an IPFS store said "Error: a genesis block is a
    map {kind: 'dataset', …}" (exit 1). Such a CID is bad input: exit 2, one line saying
    what it names, and nothing is created."""
    run = Cli(tmp_path / "a")
    run("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon)
    run("put", "joined(1).")
    fact = _cids(run)[0]
    delta = json.loads(run("status", "--json").output)["heads"][0]
    for cid, kind in ((str(fact), "a fact"), (delta, "a delta")):
        home = tmp_path / f"j-{kind[2:]}"
        result = Cli(home)(
            "init", "--store", "ipfs", "--ipfs-api", ipfs_daemon, "--join", cid, ok=False
        )
        assert result.exit_code == 2, result.output
        assert result.output.startswith(
            f"Error: {cid} is not a dataset id: it names {kind}, not a genesis block"
        ), result.output
        assert result.output.count("\n") == 1 and "map {kind" not in result.output
        assert not home.exists()


def _timed_get(url: str, token: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET; HTTP errors are answers too."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.timeout(900)  # a daemon start on a shared, loaded machine
def test_a_write_waiting_for_a_stopped_daemon_stalls_no_read(
    tmp_path: Path, fault_daemon, node_factory
) -> None:
    """While a write through the node waited for its daemon (stopped with SIGSTOP: it
    accepts the request and never answers), every other request waited too: /healthz,
    /openapi.json, a 401, /v1/status, /v1/query, /v1/facts, /v1/export and a peer's sync.
    The write held the store's lock for its whole wait, the pubsub announcer read heads
    on the event loop, and the epoch waited to save while holding what queries need.
    Now they all answer while the write still waits (the write can only end by its
    ``store.ipfs_timeout``), the write then fails with exit 4 and nothing of it is
    stored."""
    import os
    import signal
    import subprocess
    import sys
    import time

    daemon = fault_daemon
    stopped = threading.Event()

    def stop_daemon() -> None:
        os.killpg(daemon.proc.pid, signal.SIGSTOP)
        stopped.set()

    proxy = ImportProxy(daemon.api_port, stop_daemon)
    put = None
    try:
        a = Cli(tmp_path / "a")
        a(
            # The write ends only by its timeout: long enough for the reads below on a
            # loaded machine (they take a few seconds), short enough not to idle long.
            "--set", "store.ipfs_timeout=12", "--set", "node.epoch_interval=0.2",
            "--set", "sync.ipfs_interval=0.5",
            "init", "--store", "ipfs",
            "--ipfs-api", f"http://127.0.0.1:{proxy.port}",
        )  # fmt: skip
        node = node_factory(a.home).start()  # heads published every 0.5 s
        a("put", "pre(1).", 'pre("1").')
        b = Cli(tmp_path / "b")  # a SQLite peer that syncs with the node meanwhile
        b("init", "--join", node.url, "--token", node.read_token)
        b_key = json.loads(b("status", "--json").output)["key"]
        a("peers", "add", "b", "http://127.0.0.1:9", "--key", b_key)
        assert b("sync", node.url).exit_code == 0
        before = a("status", "--json").output

        proxy.armed = True
        put = subprocess.Popen(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(a.home), "put", "stall(1)."],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert stopped.wait(60)  # the write's blocks reached the daemon, which is stopped
        # Epochs (every 0.2 s) and the heads announcer (every 0.5 s) come by meanwhile.
        time.sleep(1.5)

        token = node.token
        answers = {
            "healthz": _timed_get(node.url + "/healthz"),
            "openapi": _timed_get(node.url + "/openapi.json"),
            "unauthenticated": _timed_get(node.url + "/v1/status"),
            "status": _timed_get(node.url + "/v1/status", token),
            "query": _timed_get(node.url + "/v1/query?q=pre(X)", token),
            "facts": _timed_get(node.url + "/v1/facts", token),
            "export": _timed_get(node.url + "/v1/export", token),
        }
        synced = b("sync", node.url)  # the peer routes: heads, sync, blocks
        # Every answer came while the write still waits for the daemon.
        assert put.poll() is None, put.communicate()
        assert {k: v[0] for k, v in answers.items()} == {
            "healthz": 200, "openapi": 200, "unauthenticated": 401, "status": 200,
            "query": 200, "facts": 200, "export": 200,
        }  # fmt: skip
        assert len(json.loads(answers["query"][1])["rows"]) == 2
        assert "stall" not in answers["facts"][1].decode()
        assert synced.exit_code == 0 and "Traceback" not in synced.output

        out, _ = put.communicate(timeout=120)
        assert put.returncode == 4, out
        assert out.count("\n") == 1 and "IPFS" in out and "Traceback" not in out
        os.killpg(daemon.proc.pid, signal.SIGCONT)
        # Nothing of the failed write is stored, and the next write works.
        assert _ls(a) == ['pre("1")', "pre(1)"]
        assert json.loads(a("status", "--json").output)["heads"] == json.loads(before)["heads"]
        a("put", "after(1).")
        assert _ls(a) == ["after(1)", 'pre("1")', "pre(1)"]
    finally:
        if put is not None and put.poll() is None:
            put.kill()
        os.killpg(daemon.proc.pid, signal.SIGCONT)
        proxy.close()


def test_a_home_merklog_open_makes_with_ipfs_settings_is_an_ipfs_home(
    tmp_path: Path, ipfs_daemon: str
) -> None:
    """``merklog.open(home, settings={"store.backend": "ipfs", …})`` made a SQLite home and
    wrote the app's facts to IPFS for that session only: the home's config.toml said
    sqlite, and the CLI read an empty SQLite store. It is an IPFS home now, as init makes
    one, and the CLI sees the app's facts."""
    import merklog

    home = tmp_path / "app"
    settings = {"store.backend": "ipfs", "store.ipfs_api": _url(ipfs_daemon)}
    with merklog.open(home, settings=settings) as node:
        node.assert_("k", 1)
        node.assert_("k", 1.0)
    cfg = tomllib.loads((home / "config.toml").read_text())
    assert cfg["store"]["backend"] == "ipfs"
    assert cfg["store"]["ipfs_api"] == _url(ipfs_daemon)
    assert _ls(Cli(home)) == ["k(1)", "k(1.0)"]


def test_a_block_the_home_does_not_hold_is_not_found_at_once(
    tmp_path: Path, ipfs_daemon: str, node_factory
) -> None:
    """QA: ``merklog get`` of an unknown CID on an IPFS home, and ``GET /v1/blocks/CID``,
    waited the daemon's whole request timeout (30 s) for a block it lacks, and twelve
    such reads held the node's threads while a write waited 56 s. A block neither the
    cache nor the daemon holds is asked for within the existence probe's bound (here
    with a 600 s request timeout, which the old read waited out)."""
    import subprocess
    import sys

    home = tmp_path / "i"
    run = Cli(home)
    run("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon)
    (cid,) = [line.split("\t")[0] for line in run("put", "kept(1).").output.splitlines()]
    unknown = str(Link.for_dag_cbor(b"\xa1ashere-nowhere"))
    slow = ["--set", "store.ipfs_timeout=600"]
    base = [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *slow]
    done = subprocess.run([*base, "get", unknown], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    held = subprocess.run([*base, "get", cid], capture_output=True, text=True, timeout=120)
    assert held.returncode == 0 and "kept(1)" in held.stdout, held.stderr
    node = node_factory(home, env={"MERKLOG_STORE_IPFS_TIMEOUT": "600"}).start()
    status, body = node.request("GET", f"/v1/blocks/{unknown}")
    assert status == 404, body
    status, body = node.request("GET", f"/v1/blocks/{cid}")
    assert status == 200 and body["fact"] == "kept(1)", body


def test_announced_heads_that_cannot_be_fetched_are_a_warning_once(
    tmp_path: Path, ipfs_daemon: str, caplog
) -> None:
    """QA: a home whose peers' announced heads could never be fetched (their blocks were
    not on the daemon) logged it at INFO only: at the default level it looked healthy
    while it stayed behind. The first failure of a streak is a WARNING, the repeats INFO."""
    import asyncio
    import logging

    import merklog
    from merklog.node.ipfs_sync import IPFSHeadSync
    from merklog.replication.identity import Identity
    from merklog.replication.pubsub import make_announcement

    home = tmp_path / "i"
    Cli(home)("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon)
    writer = Identity.generate()
    missing = Link.for_dag_cbor(b"\xa1ashere-nowhere")

    async def main() -> list[int]:
        settings = {"store.ipfs_timeout": 1.0, "sync.ipfs_interval": 0.0}
        async with merklog.open(home, settings=settings) as node:
            node.grant(writer.public_key.hex())
            heads = IPFSHeadSync(node)
            announced = make_announcement(writer, node.dataset, [missing])
            with caplog.at_level(logging.INFO, logger="merklog.node.ipfs_sync"):
                for _ in range(2):
                    assert await heads.on_announcement(announced) is False
            return [
                r.levelno for r in caplog.records if "fetching heads announced" in r.getMessage()
            ]

    assert asyncio.run(main()) == [logging.WARNING, logging.INFO]


def test_another_homes_blocks_on_the_shared_daemon_are_not_served(
    tmp_path: Path, ipfs_daemon: str, node_factory
) -> None:
    """QA: an IPFS home's ``GET /v1/blocks/CID`` and ``merklog get`` served any block its
    daemon held: another dataset's fact, from a home sharing the daemon, to anyone with
    this home's read token (a SQLite home answers 404). Only the home's own blocks (its
    cache) are served now. And opening a home shipped its genesis to the daemon again,
    so every read command (``status``, ``ls``) waited on a dag/import: it ships nothing
    now (the proxy sees no import for a read)."""
    a, other = Cli(tmp_path / "a"), Cli(tmp_path / "other")
    a("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon)
    a("put", "mine(1).")
    other("init", "--store", "ipfs", "--ipfs-api", ipfs_daemon)
    (secret,) = [
        line.split("\t")[0] for line in other("put", 'secret("x", 42).').output.splitlines()
    ]
    refused = a("get", secret, ok=False)
    assert refused.exit_code == 3 and "secret" not in refused.output
    port = int(ipfs_daemon.strip("/").split("/")[3])
    imports: list[int] = []
    proxy = ImportProxy(port, lambda: imports.append(1))
    proxy.armed = True
    config = a.home / "config.toml"
    kept = config.read_text()
    try:
        # the home's daemon, through the proxy (as the QA pointed it at a slow proxy)
        lines = [
            f'ipfs_api = "http://127.0.0.1:{proxy.port}"' if ln.startswith("ipfs_api =") else ln
            for ln in kept.splitlines()
        ]
        config.write_text("\n".join(lines) + "\n")
        for args in (("status",), ("ls",), ("query", "mine(X)")):
            a(*args)
        assert imports == [] and not proxy.met.is_set()
    finally:
        config.write_text(kept)
        proxy.close()
    node = node_factory(a.home).start()
    status, _body = node.request("GET", f"/v1/blocks/{secret}", token=node.read_token)
    assert status == 404


def test_node_run_init_takes_the_set_options(tmp_path: Path, ipfs_daemon: str) -> None:
    """QA: ``merklog --set store.backend=ipfs --set store.ipfs_api=… node run --init``
    made a SQLite home (the init ignored --set), then refused to run it as an IPFS one,
    and every later run refused again. The init takes the command's settings, as
    ``merklog --set … init`` does."""
    import subprocess
    import sys

    home = tmp_path / "n"
    cmd = [sys.executable, "-m", "merklog.node.cli", "--home", str(home)]
    cmd += ["--set", "store.backend=ipfs", "--set", f"store.ipfs_api={ipfs_daemon}"]
    proc = subprocess.Popen(
        [*cmd, "node", "run", "--init", "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if " listening on " in line:
                break
        else:
            raise AssertionError(f"node run --init failed (exit {proc.wait()})")
    finally:
        proc.terminate()
        proc.wait(30)
    config = tomllib.loads((home / "config.toml").read_text())
    assert config["store"]["backend"] == "ipfs", config
    assert Cli(home)("status").exit_code == 0


def test_an_http_server_that_is_no_ipfs_api_is_bad_input(tmp_path: Path) -> None:
    """QA: ``init --ipfs-api`` naming the daemon's gateway port (an HTTP server without
    /api/v0) said urllib3's "HTTPError: 404 Client Error … http+ip4://…", exit 4 (worth
    retrying). It is bad input, exit 2, saying what the address is, and nothing is made."""
    import http.server

    class NoAPI(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server name
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            """Quiet: the test reads the CLI's line, not the server's request log."""

    server = http.server.HTTPServer(("127.0.0.1", 0), NoAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = Cli(tmp_path / "gw")("init", "--store", "ipfs", "--ipfs-api", url, ok=False)
    finally:
        server.shutdown()
    assert result.exit_code == 2, result.output
    assert "answers HTTP but is no IPFS RPC API (HTTP 404" in result.output
    assert "http+ip4" not in result.output and not (tmp_path / "gw").exists()
