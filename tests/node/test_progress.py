"""Progress through a running node counts real units: ``sync`` streams the node's bytes
and deltas (``POST /v1/sync`` with ``Accept: application/x-ndjson``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from merklog.node.failures import ExitCode
from merklog.node.target import TargetError, open_target

from .conftest import Cli


def test_sync_through_a_running_node_reports_real_bytes_and_deltas(
    tmp_path: Path, node_factory
) -> None:
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    rows = tmp_path / "rows.dl"
    rows.write_text("".join(f'r({i}, {i}.0, "{i}", true).\n' for i in range(30000)))
    a("put", "-f", str(rows))
    a("put", 'v(1). v(1.0). v(true). v("1"). v(x"01").')
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    key = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", key)  # lets b read from a
    node_b = node_factory(b.home).start()
    seen: list[tuple[str, int, int]] = []
    with open_target(b.home) as target:
        stats = target.sync(na.url, lambda *event: seen.append(event))
    pulls = [e for e in seen if e[0] == "pull"]
    assert pulls, seen
    assert pulls[-1] == ("pull", stats["bytes_received"], stats["accepted"])
    assert stats["accepted"] > 1 and stats["bytes_received"] > 2 << 20
    # bytes are reported while the response arrives (every MiB), not only at its end
    assert len(pulls) >= 3 and [e[1] for e in pulls] == sorted(e[1] for e in pulls)
    assert len(Cli(b.home)("ls", "v").output.splitlines()) == 5  # via the running node
    assert node_b.proc is not None and node_b.proc.poll() is None

    # A peer that cannot be reached: the usual answer (502, exit 4), no half stream.
    with open_target(b.home) as target, pytest.raises(TargetError) as failed:
        target.sync("http://127.0.0.1:9", lambda *event: seen.append(event))
    assert failed.value.exit_code == ExitCode.PEER_UNREACHABLE
    assert "127.0.0.1:9" in str(failed.value)
    result = b("sync", "http://127.0.0.1:9", ok=False)
    assert result.exit_code == 4 and "Traceback" not in result.output
