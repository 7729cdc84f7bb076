"""Start a real ``merklog node run`` for a benchmark and learn its URL.

Shared by the benches that time a running node (ingest, load, shutdown): the node
binds port 0 and prints ``… listening on URL`` on stderr, so parallel benches never
race for a port.
"""

from __future__ import annotations

import subprocess
import threading
from collections import deque
from pathlib import Path


def start_node(cli: list[str], home: Path) -> tuple[subprocess.Popen, str]:
    """``merklog --home HOME node run --port 0`` started with ``cli`` (the command
    prefix), and the URL it listens on once it says so. From then on a daemon thread
    drains its stderr into ``proc.log_tail`` (the last 200 lines), so a node that logs a
    lot never blocks on a full pipe while it is being timed."""
    proc = subprocess.Popen(
        [*cli, "--home", str(home), "node", "run", "--port", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if " listening on " in line:
            tail: deque[str] = deque(maxlen=200)
            proc.log_tail = tail  # type: ignore[attr-defined]
            threading.Thread(target=tail.extend, args=(proc.stderr,), daemon=True).start()
            return proc, line.split(" listening on ")[1].strip()
    raise RuntimeError(f"node failed to start (exit {proc.wait()})")
