"""Backup (``merklog export``) and restore into a fresh home (``merklog restore``)."""

from __future__ import annotations

from pathlib import Path

from .conftest import Cli


def _facts(run: Cli) -> list[str]:
    return sorted(line.split("\t")[1] for line in run("ls").output.splitlines())


def test_export_then_restore_into_a_fresh_home(tmp_path: Path, node_factory) -> None:
    a = Cli(tmp_path / "a")
    a("init")
    a("put", "edge(1, 2).", "edge(2, 3).", 'name("x", 1.0, true, x"00").')
    a("retract", "edge(1, 2).")
    node = node_factory(a.home).start()  # the backup is taken from a running node
    a("put", "edge(3, 4).")
    backup = tmp_path / "backup.car"
    assert "exported" in a("export", str(backup)).output
    node.stop()
    before = _facts(a)
    # Restored with the saved key: same dataset, same facts, and it can write as before.
    b = Cli(tmp_path / "b")
    out = b("restore", str(backup), "--identity", str(a.home / "identity.pem")).output
    assert "restored" in out
    assert _facts(b) == before
    import json

    status_a, status_b = (json.loads(x("status", "--json").output) for x in (a, b))
    assert status_a["dataset"] == status_b["dataset"] and status_a["heads"] == status_b["heads"]
    assert status_a["key"] == status_b["key"]
    b("put", "edge(9, 9).")
    # Without the key: the data comes back, writes need a grant (exit 7 says so).
    c = Cli(tmp_path / "c")
    c("restore", str(backup))
    assert _facts(c) == before
    refused = c("put", "edge(5, 5).", ok=False)
    assert refused.exit_code == 7 and "cannot write yet" in refused.output
    # An initialised home is never overwritten; a broken backup creates nothing.
    again = b("restore", str(backup), ok=False)
    assert again.exit_code == 1 and "already a merklog home" in again.output
    broken = tmp_path / "broken.car"
    broken.write_bytes(backup.read_bytes()[: backup.stat().st_size // 2])
    d = Cli(tmp_path / "d")
    failed = d("restore", str(broken), ok=False)
    assert failed.exit_code != 0 and "Traceback" not in failed.output
    assert not (tmp_path / "d").exists()
