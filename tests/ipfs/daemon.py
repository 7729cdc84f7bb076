"""Start and stop a real, throwaway js-ipfs 0.66.1 daemon for tests (offline, loopback only).

Importable (``IPFSDaemon``) by any test area, and a small CLI used by ``start.sh``::

    python tests/ipfs/daemon.py start DIR [--api-port N] [--swarm-port N] [--online]
    python tests/ipfs/daemon.py stop DIR    # stops it by the PID recorded in DIR

``start`` prints the API multiaddr and leaves the daemon running. Ports default to
free ones; fixed ports (``--api-port``) let a node's config name the daemon for good,
and a restart on the same DIR keeps its repo (blocks and pins) and ports. ``--online``
starts it with libp2p on (no bootstrap, no mDNS), which pubsub needs. It listens on no
swarm address unless ``--swarm-port`` is given, and with the packages this lockfile
installs that fails: js-ipfs 0.66.1's libp2p hands its TCP and WebSockets transports
multiaddr 11 objects that their newer address filter (mafmt 12 on multiaddr 12) does
not recognise, so no listen address is accepted ("no valid addresses were provided for
transports"). An online daemon is therefore dial-only: its pubsub reaches the clients
of the same daemon, not other daemons.

The npm packages come from ``tests/setup.d/20-ipfs.sh`` (``npm ci`` in this folder).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
JSIPFS = HERE / "node_modules" / ".bin" / "jsipfs"
IPFS_CAR = HERE / "node_modules" / ".bin" / "ipfs-car"
POLYFILL = HERE / "polyfill.cjs"


class DaemonError(RuntimeError):
    """The daemon could not be installed, initialised or started in time."""


def free_port() -> int:
    """An ephemeral TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_env(repo: Path | None = None) -> dict[str, str]:
    """Environment for js-ipfs on Node 20: the Promise.withResolvers polyfill, the repo path."""
    env = dict(os.environ)
    env["NODE_OPTIONS"] = (env.get("NODE_OPTIONS", "") + f" --require {POLYFILL}").strip()
    if repo is not None:
        env["IPFS_PATH"] = str(repo)
    return env


class IPFSDaemon:
    """One ``jsipfs daemon`` with its own repo in ``root`` (a temp dir by default).

    Offline unless ``online``; ports are free ones unless given. Starting again on a
    root whose repo exists keeps the repo (and the ports written in its config).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        startup_timeout: float = 90,
        *,
        api_port: int = 0,
        swarm_port: int = 0,
        online: bool = False,
    ):
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="ipfs-"))
        self.repo = self.root / "repo"
        self.log_path = self.root / "daemon.log"
        self.pid_path = self.root / "daemon.pid"
        self.startup_timeout = startup_timeout
        self.api_port = api_port
        self.swarm_port = swarm_port
        self.online = online
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def api_addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.api_port}/http"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}/api/v0"

    def _run(self, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            [str(JSIPFS), *args],
            env=node_env(self.repo),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise DaemonError(
                f"jsipfs {' '.join(args)} failed ({result.returncode}): "
                f"{result.stderr.decode(errors='replace')[-2000:]}"
            )

    def _init_repo(self) -> None:
        """Create the repo with loopback-only addresses (fixed ports where given)."""
        self.api_port = self.api_port or free_port()
        swarm = []
        if self.online and self.swarm_port:  # see the module docstring: fails to listen
            swarm = [f"/ip4/127.0.0.1/tcp/{self.swarm_port}"]
        config = {
            "Addresses": {
                "Swarm": swarm,
                "Announce": [],
                "API": f"/ip4/127.0.0.1/tcp/{self.api_port}",
                "Gateway": f"/ip4/127.0.0.1/tcp/{free_port()}",
                "RPC": f"/ip4/127.0.0.1/tcp/{free_port()}",
                "Delegates": [],
            },
            "Bootstrap": [],
            "Discovery": {"MDNS": {"Enabled": False}, "webRTCStar": {"Enabled": False}},
            "Pubsub": {"Enabled": True, "Router": "gossipsub"},
        }
        config_path = self.root / "init-config.json"
        config_path.write_text(json.dumps(config))
        self._run("init", "--profile", "test", "--emptyRepo", "--defaultConfig", str(config_path))

    def _read_ports(self) -> None:
        """Ports of an existing repo, from its config (a restart keeps them)."""
        config = json.loads((self.repo / "config").read_text())
        self.api_port = int(config["Addresses"]["API"].rsplit("/", 1)[1])
        swarm = config["Addresses"].get("Swarm") or []
        self.swarm_port = int(swarm[0].rsplit("/", 1)[1]) if swarm else 0

    def start(self) -> str:
        """Initialise the repo (unless it exists), start the daemon, wait until its API
        answers; return its multiaddr."""
        if not JSIPFS.exists():
            raise DaemonError(f"{JSIPFS} missing: run tests/setup.d/20-ipfs.sh (npm ci)")
        self.root.mkdir(parents=True, exist_ok=True)
        if (self.repo / "config").exists():
            self._read_ports()
        else:
            self._init_repo()
        recorded = _read_pid(self.pid_path)
        if recorded is not None:
            if _alive(recorded):
                raise DaemonError(f"a daemon already runs on {self.root} (pid {recorded})")
            self._remove_stale()  # it crashed (kill -9): its lock and api file stay
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed in stop()
        self.proc = subprocess.Popen(
            [str(JSIPFS), "daemon", *([] if self.online else ["--offline"])],
            env=node_env(self.repo),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() ends node and any child
        )
        log.close()
        self.pid_path.write_text(str(self.proc.pid))
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DaemonError(f"jsipfs daemon exited ({self.proc.returncode}): {self.log()}")
            if self._answers():
                return self.api_addr
            time.sleep(0.25)
        self.stop()
        raise DaemonError(f"jsipfs daemon not ready after {self.startup_timeout}s: {self.log()}")

    def _answers(self) -> bool:
        try:
            req = urllib.request.Request(self.api_url + "/id", method="POST")
            with urllib.request.urlopen(req, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def call(
        self, endpoint: str, *args: str, data: bytes | None = None, timeout: float = 30
    ) -> bytes:
        """POST to the daemon's HTTP API (``/api/v0/<endpoint>?arg=…``); ``data`` is sent as
        the single multipart file (as ``dag/import`` and ``block/put`` expect)."""
        query = urllib.parse.urlencode([("arg", a) for a in args])
        url = f"{self.api_url}/{endpoint}" + (f"?{query}" if query else "")
        headers = {}
        body = None
        if data is not None:
            boundary = "merklog" + os.urandom(8).hex()
            body = (
                (
                    f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                    f'filename="file"\r\nContent-Type: application/octet-stream\r\n\r\n'
                ).encode()
                + data
                + f"\r\n--{boundary}--\r\n".encode()
            )
            headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill the daemon at once (SIGKILL, no cleanup): a crash, for fault tests."""
        pid = self.proc.pid if self.proc is not None else _read_pid(self.pid_path)
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            self.proc.wait(timeout=30)
            self.proc = None
        self.pid_path.unlink(missing_ok=True)
        self._remove_stale()

    def _remove_stale(self) -> None:
        """Remove the repo's lock and api file a crashed daemon left behind (QA: a start
        after a ``kill -9`` failed with a traceback, the lock "already being held")."""
        for stale in ("repo.lock", "api"):
            path = self.repo / stale
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop the daemon by PID (TERM, then KILL after 10 s) and remove a temp root."""
        pid = self.proc.pid if self.proc is not None else _read_pid(self.pid_path)
        if pid is not None:
            stop_pid(pid)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        self.pid_path.unlink(missing_ok=True)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> IPFSDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def stop_pid(pid: int, grace: float = 10) -> None:
    """TERM the process group led by ``pid``, KILL it if still alive after ``grace`` seconds."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        try:  # reap it if it is our child, so it does not linger as a zombie
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie nobody reaped, as a container's first
    process may leave one, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="daemon.py", description="a throwaway js-ipfs daemon")
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("root", metavar="DIR")
    parser.add_argument("--api-port", type=int, default=0, help="RPC API port (default: free)")
    parser.add_argument(
        "--swarm-port",
        type=int,
        default=0,
        help="libp2p listen port (--online); with the packages tests/ipfs installs, js-ipfs"
        " 0.66.1 cannot listen (see the module docstring), so the daemon fails to start",
    )
    parser.add_argument("--online", action="store_true", help="libp2p on (pubsub), dial-only")
    args = parser.parse_args(argv)
    command, root = args.command, args.root
    daemon = IPFSDaemon(
        root, api_port=args.api_port, swarm_port=args.swarm_port, online=args.online
    )
    if command == "start":
        try:
            addr = daemon.start()
        except DaemonError as exc:  # one line, not a traceback
            print(f"Error: {exc}", file=sys.stderr)
            return 1
        daemon.proc = None  # leave it running; `stop DIR` ends it by its recorded PID
        print(addr)
        return 0
    pid = _read_pid(daemon.pid_path)
    if pid is None:
        print(f"no daemon PID recorded in {root}", file=sys.stderr)
        return 1
    stop_pid(pid)
    daemon.pid_path.unlink(missing_ok=True)
    daemon._remove_stale()  # a daemon that had crashed left them; a stopped one is gone
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
