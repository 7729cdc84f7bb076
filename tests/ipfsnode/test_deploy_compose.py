"""deploy/compose.yaml's three peers sync: each peer's start command, as the file ships it,
runs as a local process (no Docker here) — host names and port 7420 mapped to 127.0.0.1
and free ports, /data to a temporary home, the ipfs service to the test's js-ipfs daemon,
MERKLOG_SYNC_INTERVAL at 3 s — and a fact put on peer-a must reach peer-b and peer-c
through the peers' HTTP sync.

The peers used to never sync: peer-a never added b or c to its [peers] and b never added
c, so every sync was refused (HTTP 403 "peer … is not allowed to sync")."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = [
    pytest.mark.ipfs,
    pytest.mark.filterwarnings("ignore:The 'strict' parameter:FutureWarning"),
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PEERS = ("peer-a", "peer-b", "peer-c")
#: How long the peers get to start, find each other and sync (generous: a loaded machine).
PATIENCE = 240.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dockerfile_start() -> list[str]:
    """The image's ENTRYPOINT + CMD (what a service without its own runs)."""
    text = (DEPLOY / "Dockerfile").read_text()
    entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))
    cmd = yaml.safe_load(re.search(r"^CMD (.+)$", text, re.M).group(1))
    return [*entry, *cmd]


def _start_argv(service: dict) -> list[str]:
    """The argv a service's container runs (entrypoint + command, the image's if unset)."""
    image = _dockerfile_start()
    entry = service.get("entrypoint")
    command = service.get("command")
    if entry is None:
        entry = image[:3]  # tini -- merklog
        if command is None:
            command = image[3:]
    return [*entry, *(command or [])]


def _localise(argv: list[str], ports: dict[str, int], home: Path, shim: Path) -> list[str]:
    """The argv for this machine: tini dropped (it only forwards signals and reaps), the
    peers' host names and port 7420 mapped to 127.0.0.1 and each peer's own port, /data
    to ``home``, ``merklog`` to the worktree's CLI."""
    assert argv[:2] == ["/usr/bin/tini", "--"], argv
    argv = argv[2:]
    out = []
    for arg in argv:
        for name, port in ports.items():
            arg = arg.replace(f"http://{name}:7420", f"http://127.0.0.1:{port}")
        arg = arg.replace("/data/", f"{home}/")
        out.append(arg)
    own = ports[home.name]
    text = " ".join(out)
    assert "--host 0.0.0.0 --port 7420" in text, text
    out = [a.replace("--host 0.0.0.0 --port 7420", f"--host 127.0.0.1 --port {own}") for a in out]
    if out[0] == "merklog":  # the image's own CMD: no shell
        out = [str(shim), *out[1:]]
        out = [a if a != "0.0.0.0" else "127.0.0.1" for a in out]
        out = [str(own) if a == "7420" else a for a in out]
    return out


def _env(service: dict, token: str, ipfs_api: str, home: Path, shim_dir: Path) -> dict:
    env = {k: str(v) for k, v in service["environment"].items()}
    for key, value in env.items():
        env[key] = re.sub(r"\$\{MERKLOG_READ_TOKEN[^}]*\}", token, value)
    assert env["MERKLOG_STORE_IPFS_API"] == "http://ipfs:5001"
    env["MERKLOG_STORE_IPFS_API"] = ipfs_api
    env["MERKLOG_SYNC_INTERVAL"] = "3"
    # The compose file's kubo keeps pubsub off (its default), so heads announced through
    # IPFS never arrive there and only the peers' HTTP sync moves facts; the test daemon
    # has pubsub on: IPFS head sync off here, as it is in effect under compose.
    env["MERKLOG_SYNC_IPFS_INTERVAL"] = "0"
    env["MERKLOG_HOME"] = str(home)  # the image's ENV MERKLOG_HOME=/data
    return {
        **os.environ,
        **env,
        "PATH": f"{shim_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def _healthy(port: int, proc: subprocess.Popen, log: Path) -> None:
    """Wait for /healthz (compose's depends_on: service_healthy)."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"peer exited with {proc.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"peer on port {port} never became healthy: {log.read_text()}")


def _exec(env: dict, *args: str) -> subprocess.CompletedProcess:
    """``docker compose exec PEER merklog ARGS``: the CLI with the service's environment."""
    return subprocess.run(
        ["merklog", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _peers(env: dict) -> dict[str, str]:
    """``{url: key}`` of ``merklog peers list``."""
    done = _exec(env, "peers", "list")
    assert done.returncode == 0, done.stderr
    return {line.split("\t")[1]: line.split("\t")[2] for line in done.stdout.splitlines()}


def _ls(env: dict) -> list[str]:
    out = _exec(env, "ls").stdout
    return [line.split("\t")[1] for line in out.splitlines() if "\t" in line]


def test_compose_peers_sync_a_fact_from_peer_a_to_peer_c(tmp_path: Path, ipfs_daemon: str) -> None:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    parts = ipfs_daemon.strip("/").split("/")
    ipfs_api = f"http://{parts[1]}:{parts[3]}"
    token = secrets.token_urlsafe(18)
    ports = {name: _free_port() for name in PEERS}
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    shim = shim_dir / "merklog"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m merklog.node.cli "$@"\n')
    shim.chmod(0o755)
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    envs = {
        name: _env(services[name], token, ipfs_api, tmp_path / name, shim_dir) for name in PEERS
    }

    def start(name: str) -> None:
        home = tmp_path / name
        home.mkdir(mode=0o700)  # the image's /data volume exists, empty
        argv = _localise(_start_argv(services[name]), ports, home, shim)
        logs[name] = tmp_path / f"{name}.log"
        with logs[name].open("w") as log:
            # Its own session: the start command's background `peers add` loop stays in
            # this process group, which the test ends as a whole.
            procs[name] = subprocess.Popen(
                argv,
                env=envs[name],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    try:
        start("peer-a")  # b and c depend on peer-a being healthy
        _healthy(ports["peer-a"], procs["peer-a"], logs["peer-a"])
        start("peer-b")
        start("peer-c")
        for name in ("peer-b", "peer-c"):
            _healthy(ports[name], procs[name], logs[name])
        put = _exec(envs["peer-a"], "put", "edge(1, 2).")
        assert put.returncode == 0 and "edge(1, 2)" in put.stdout, put.stderr
        # Every peer comes to list the other two with their keys (a full mesh), and the
        # fact reaches peer-b and peer-c.
        wanted = {
            name: {f"http://127.0.0.1:{ports[o]}" for o in PEERS if o != name} for name in PEERS
        }
        deadline = time.monotonic() + PATIENCE
        seen: dict[str, object] = {}
        while time.monotonic() < deadline:
            seen = {name: _ls(envs[name]) for name in ("peer-b", "peer-c")}
            seen.update({f"{name} peers": _peers(envs[name]) for name in PEERS})
            if all("edge(1, 2)" in seen[name] for name in ("peer-b", "peer-c")) and all(
                wanted[name] <= set(seen[f"{name} peers"]) for name in PEERS
            ):
                break
            time.sleep(2)
        else:
            pytest.fail(
                f"the peers did not sync edge(1, 2) in a full mesh: {seen}\n"
                + "\n".join(f"--- {n}\n{logs[n].read_text()[-3000:]}" for n in PEERS)
            )
        for name in PEERS:
            keys = seen[f"{name} peers"]
            assert all(re.fullmatch(r"[0-9a-f]{64}", keys[url]) for url in wanted[name]), keys
        text = "".join(log.read_text() for log in logs.values())
        assert "Traceback" not in text
    finally:
        for proc in procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
