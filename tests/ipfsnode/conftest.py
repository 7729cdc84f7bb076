"""Fixtures for nodes on IPFS: the store area's session daemon, the node area's CLI runner
and node subprocesses, and private daemons (fixed ports, killable) for fault tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.conftest import Cli, NodeProc, node_factory  # noqa: F401 - fixtures
from tests.store.conftest import (  # noqa: F401 - fixtures
    ipfs_daemon,
    ipfs_daemon_handle,
    ipfs_daemon_module,
)

__all__ = ["Cli", "NodeProc"]


@pytest.fixture
def private_daemon(tmp_path_factory) -> Iterator:
    """Make extra js-ipfs daemons (``make(online=…, api_port=…)``), each in its own
    directory, all stopped at the end; ``fail`` (never skip) if one cannot start."""
    made = []

    def make(**kw):
        root = Path(tmp_path_factory.mktemp("ipfsd"))
        daemon = ipfs_daemon_module.IPFSDaemon(root, **kw)
        made.append(daemon)
        try:
            daemon.start()
        except ipfs_daemon_module.DaemonError as exc:
            pytest.fail(f"a js-ipfs test daemon did not start: {exc}")
        return daemon

    yield make
    for daemon in made:
        daemon.stop()
        shutil.rmtree(daemon.root, ignore_errors=True)
