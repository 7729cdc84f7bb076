"""The IPFS daemon a benchmark runs against: the one at ``--ipfs-api``, else a private
js-ipfs daemon started from tests/ipfs (``bash tests/setup.d/20-ipfs.sh`` installs it)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DAEMON_PY = Path(__file__).resolve().parents[1] / "tests" / "ipfs" / "daemon.py"


def _daemon_module():
    spec = importlib.util.spec_from_file_location("merklog_bench_ipfs_daemon", DAEMON_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def ipfs_api(addr: str | None) -> Iterator[str]:
    """Yield an IPFS RPC API multiaddr: ``addr`` as given, or a fresh offline daemon's
    (stopped and removed afterwards)."""
    if addr:
        yield addr
        return
    daemon = _daemon_module().IPFSDaemon()
    try:
        yield daemon.start()
    finally:
        daemon.stop()
