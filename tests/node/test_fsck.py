"""``merklog fsck``: finds corrupted and missing blocks, repairs them from a real peer."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from merklog.node.failures import ExitCode
from merklog.store import Link

from .conftest import Cli


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
