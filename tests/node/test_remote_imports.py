"""A command that reaches a running node is a small HTTP client: it loads neither the
node's own modules (the engine, the replica, numpy) nor the HTTP server stack, which
doubled its start-up time (``merklog query`` through a node took ~0.35 s, ~0.15 s
without them). Real ``merklog`` processes against a real node on 127.0.0.1; each
process reports the modules it loaded when it exits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Cli

# Runs ``merklog ARGS…`` and, at exit, prints the names of the loaded modules on stderr.
SCRIPT = (
    "import atexit, json, sys\n"
    "atexit.register(lambda: print('MODULES ' + json.dumps(sorted(sys.modules)),"
    " file=sys.stderr))\n"
    "from merklog.node.cli import main\n"
    "sys.argv = ['merklog', *sys.argv[1:]]\n"
    "main()\n"
)
# What only a home opened in this process, or a server, needs.
HEAVY = (
    "aiohttp",
    "numpy",
    "pyarrow",
    "cryptography",
    "merklog.node.node",
    "merklog.node.edb",
    "merklog.node.bulkput",
    "merklog.replication.replica",
    "merklog.engine.incremental",
)


def _loaded(home: Path, *args: str) -> tuple[int, str, set[str]]:
    """``merklog --home HOME ARGS…`` in a process of its own: its exit status, what it
    said on stderr, and the modules it had loaded when it exited."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.splitlines()
    [listed] = [x for x in lines if x.startswith("MODULES ")]
    said = "\n".join(x for x in lines if x != listed)
    return done.returncode, said, set(json.loads(listed.removeprefix("MODULES ")))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)


@pytest.mark.parametrize(
    "args",
    [
        ("put", "v(1).", 'v("1").', "v(1.0)."),
        ("query", "v(X)"),
        ("status",),
        ("ls",),
    ],
    ids=["put", "query", "status", "ls"],
)
def test_a_command_through_a_running_node_loads_no_node_module(
    tmp_path: Path, node_factory, args: tuple[str, ...]
) -> None:
    home = tmp_path / "home"
    Cli(home)("init")
    node_factory(home).start()
    Cli(home)("put", "v(2).")  # through the node: there is a v/1 to query
    status, said, modules = _loaded(home, *args)
    assert status == 0, said
    assert _heavy(modules) == []


def test_the_same_command_on_a_stopped_home_opens_it_here(tmp_path: Path) -> None:
    """The check above can fail: without a node the command opens the home in its own
    process and loads what the node is made of."""
    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", "v(2).")
    status, said, modules = _loaded(home, "query", "v(X)")
    assert status == 0, said
    assert {"merklog.node.node", "numpy"} <= set(_heavy(modules))
