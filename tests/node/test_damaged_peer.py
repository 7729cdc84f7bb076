"""A peer whose store turns out damaged while it answers: the caller hears at once, in one
line, instead of waiting out its sync timeout and calling the peer unreachable; the
serving node logs what is damaged and how to repair it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from merklog.store import Link

from .conftest import Cli, damage_block


def test_a_sync_from_a_peer_with_a_damaged_block_fails_at_once(
    tmp_path: Path, node_factory
) -> None:
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    key = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", key)  # lets b read from a
    a("put", "v(1). v(1.0). v(true).")
    a("put", 'v("1"). v(x"01").')
    na.stop()
    head = Link.parse(json.loads(a("status", "--json").output)["heads"][0])
    damage_block(a.home, head)
    na = node_factory(a.home).start()
    started = time.monotonic()
    result = b("--set", "sync.timeout=30", "sync", na.url, ok=False)
    took = time.monotonic() - started
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "cut its answer off" in result.output, result.output
    assert took < 20, took  # not the 30 s timeout
    assert "did not answer within" not in result.output
    # the CAR backup through the running node: cut off at once, and said where to look
    exported = a("export", str(tmp_path / "backup.car"), ok=False)
    assert exported.exit_code != 0 and "Traceback" not in exported.output
    assert "the node stopped it, and its log says why" in exported.output, exported.output
    assert not (tmp_path / "backup.car").exists()
    na.stop()
    log = "".join(na.stderr_lines)
    assert "damaged" in log and "fsck" in log, log
