"""Start a real ``merklog node run`` for a benchmark and learn its URL.

Shared by the benches that time a running node (ingest, load, shutdown): the node
binds port 0 and prints ``… listening on URL`` on stderr, so parallel benches never
race for a port.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def start_node(cli: list[str], home: Path) -> tuple[subprocess.Popen, str]:
    """``merklog --home HOME node run --port 0`` started with ``cli`` (the command
    prefix), and the URL it listens on once it says so. Its stderr stays a pipe: the
    caller drains it (or reads the node's log lines) from there on."""
    proc = subprocess.Popen(
        [*cli, "--home", str(home), "node", "run", "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if " listening on " in line:
            return proc, line.split(" listening on ")[1].strip()
    raise RuntimeError(f"node failed to start (exit {proc.wait()})")
