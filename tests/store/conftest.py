"""Store fixtures: a real js-ipfs daemon for the session, stores of every kind."""

from __future__ import annotations

import atexit
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from merklog.store import MemoryBlockStore
from merklog.store.ipfs import IPFSBlockStore
from merklog.store.sqlite import SQLiteBlockStore

_DAEMON_PY = Path(__file__).resolve().parents[1] / "ipfs" / "daemon.py"


def _load_daemon_module():
    name = "merklog_tests_ipfs_daemon"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _DAEMON_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ipfs_daemon_module = _load_daemon_module()


def start_or_fail(daemon, what: str = "the js-ipfs test daemon") -> None:
    """Start ``daemon``; fail the test (never skip it) when it cannot start."""
    try:
        daemon.start()
    except ipfs_daemon_module.DaemonError as exc:
        daemon.stop()
        pytest.fail(f"{what} did not start: {exc}")


@pytest.fixture(scope="session")
def ipfs_daemon_handle():
    """The running daemon object (repo path, API URL); fails — never skips — if it cannot start."""
    daemon = ipfs_daemon_module.IPFSDaemon()
    atexit.register(daemon.stop)  # also if the session dies before its finalizers run
    start_or_fail(daemon)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="session")
def ipfs_daemon(ipfs_daemon_handle) -> str:
    """The API multiaddr of a real offline js-ipfs daemon on 127.0.0.1."""
    return ipfs_daemon_handle.api_addr


@pytest.fixture
def ipfs_store(ipfs_daemon):
    # generous bounds: the CI machine may be loaded, and a slow answer must not read as "absent"
    store = IPFSBlockStore(ipfs_daemon, timeout=5, probe_timeout=1.0)
    yield store
    store.close()


@pytest.fixture
def sqlite_store(tmp_path):
    store = SQLiteBlockStore(tmp_path / "blocks.sqlite")
    yield store
    store.close()


@pytest.fixture(params=["memory", "sqlite", pytest.param("ipfs", marks=pytest.mark.ipfs)])
def any_store(request):
    """Each block store kind in turn, fresh (the IPFS one shares the session daemon)."""
    if request.param == "memory":
        return MemoryBlockStore()
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture(scope="session")
def ipfs_car():
    """Run the npm ``ipfs-car`` CLI: ``ipfs_car("blocks", "--verify", path)``."""
    tool = ipfs_daemon_module.IPFS_CAR
    if not tool.exists():
        pytest.fail(f"{tool} missing: run tests/setup.d/20-ipfs.sh (npm ci)")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(tool), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=ipfs_daemon_module.node_env(),
            check=False,
        )

    return run
