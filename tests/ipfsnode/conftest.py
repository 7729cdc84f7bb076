"""Fixtures for nodes on IPFS: the store area's session daemon, the node area's CLI runner
and node subprocesses, private daemons (fixed ports, killable), and one killable daemon
a module's fault tests share."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.conftest import Cli, NodeProc, node_factory  # noqa: F401 - fixtures
from tests.store.conftest import (  # noqa: F401 - fixtures
    ipfs_daemon,
    ipfs_daemon_handle,
    ipfs_daemon_module,
    start_or_fail,
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


@pytest.fixture(scope="module")
def _module_fault_daemon(tmp_path_factory) -> Iterator:
    """The daemon behind ``fault_daemon``: started once per module (and worker)."""
    daemon = ipfs_daemon_module.IPFSDaemon(Path(tmp_path_factory.mktemp("ipfsd-faults")))
    start_or_fail(daemon, "the module's js-ipfs fault daemon")
    yield daemon
    # Killed, not stopped: its repo is thrown away, and after the stalled-write test
    # a graceful stop took 2-4 s.
    daemon.kill()
    shutil.rmtree(daemon.root, ignore_errors=True)


@pytest.fixture
def fault_daemon(_module_fault_daemon):
    """A js-ipfs daemon of this module's own (repo and API port of its own, not the
    session daemon) that a fault test may kill, stop and restart, running and answering
    when the test starts.

    Each fault test writes through a home of its own and checks only that home's
    blocks, so they need no fresh daemon: sharing one (per module and xdist worker)
    saves a repo init and a daemon start, ~10 s each on a loaded machine. A daemon an
    earlier test left stopped or dead is woken or restarted here.
    """
    daemon = _module_fault_daemon
    if daemon.proc is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.proc.pid, signal.SIGCONT)
    if daemon.proc is None or daemon.proc.poll() is not None or not daemon._answers():
        daemon.kill()
        try:
            daemon.start()  # same repo, same port
        except ipfs_daemon_module.DaemonError as exc:
            pytest.fail(f"the module's js-ipfs fault daemon did not start again: {exc}")
    return daemon
