"""Fixtures for the node tests: CLI runner on a temp home, and real node subprocesses."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from merklog.node.cli import cli

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


class Cli:
    """Runs ``merklog --home HOME …`` in-process and returns click's Result."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.runner = CliRunner()

    def __call__(self, *args: str, input: str | None = None, ok: bool = True):
        # In a worker thread: no event loop there even when the caller runs one (playwright).
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            result = pool.submit(
                self.runner.invoke, cli, ["--home", str(self.home), *args], input=input
            ).result()
        if ok and result.exit_code != 0:
            raise AssertionError(
                f"merklog {' '.join(args)} failed ({result.exit_code}): {result.output}"
                f"{result.exception!r}"
            )
        return result


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def run(home: Path) -> Cli:
    return Cli(home)


class NodeProc:
    """A ``merklog node run`` subprocess on an ephemeral port."""

    def __init__(
        self, home: Path, *extra: str, env: dict | None = None, options: tuple[str, ...] = ()
    ) -> None:
        self.home = home
        self.extra = extra
        self.options = options  # before the command, e.g. ("-v", "--log-format", "json")
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.url = ""
        #: Everything the node wrote to stderr (read by a thread so the pipe never fills).
        self.stderr_lines: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> NodeProc:
        cmd = [
            PYTHON,
            "-m",
            "merklog.node.cli",
            "--home",
            str(self.home),
            *self.options,
            "node",
            "run",
            "--port",
            "0",
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=self.env
        )
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                code = self.proc.wait()
                raise RuntimeError(f"node exited early with {code}: {self.proc.stderr.read()}")
            self.stderr_lines.append(line)
            found = re.search(r" listening on (http://[0-9.]+:[0-9]+)", line)
            if found:
                self.url = found.group(1)
                break
        else:
            raise RuntimeError("node did not announce its URL")
        stream = self.proc.stderr
        self._reader = threading.Thread(
            target=lambda: self.stderr_lines.extend(iter(stream.readline, "")), daemon=True
        )
        self._reader.start()
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("node never became healthy")

    @property
    def token(self) -> str:
        """The write token (api.token), which also grants reads."""
        import tomllib

        return tomllib.loads((self.home / "config.toml").read_text())["api"]["token"]

    @property
    def read_token(self) -> str:
        """The read-only token (api.read_token)."""
        import tomllib

        return tomllib.loads((self.home / "config.toml").read_text())["api"]["read_token"]

    def request(self, method: str, path: str, body: object = None, token: str | None = "auto"):
        """(status, parsed JSON body) of one request."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token == "auto":
            token = self.token
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw)  # every error answer is a JSON body

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self._reader is not None:
            self._reader.join(10)
            self._reader = None
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None
        return code

    @property
    def stderr_text(self) -> str:
        return "".join(self.stderr_lines)


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts connections and reads what they send but
    never answers (a peer that hangs). Subclasses look at what arrives in :meth:`_read`,
    which runs on its own thread per connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            while conn.recv(1 << 16):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A test server's request handler that logs nothing (``http.server`` writes a line
    per request to stderr, which would land among the test's output)."""

    def log_message(self, *args: object) -> None:
        """Log nothing."""


@contextmanager
def answering(status: int, content_type: str, body: bytes) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 that answers every GET and POST with ``status``,
    ``content_type`` and ``body`` (a peer or node that misbehaves); yields its URL."""

    class Handler(QuietHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def node_factory() -> Iterator:
    procs: list[NodeProc] = []

    def make(home: Path, *extra: str, **kw) -> NodeProc:
        p = NodeProc(home, *extra, **kw)
        procs.append(p)
        return p

    yield make
    for p in procs:
        p.stop(signal.SIGKILL)


def peered_pair(tmp_path: Path, node_factory, *, writer: bool = True) -> tuple:
    """Two running nodes: ``a`` made the dataset, ``b`` joined it from ``a``; each lists
    the other as a peer (``b`` as a writer unless ``writer`` is False). Returns
    ``(a, b, na, nb)``: the two homes' CLIs and their node processes."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    nb = node_factory(b.home).start()
    a("peers", "add", "b", nb.url, *(["--writer"] if writer else []), "--token", nb.read_token)
    b("peers", "add", "a", na.url, "--token", na.read_token)
    return a, b, na, nb


def init_home(home: Path, *args: str) -> None:
    result = Cli(home)("init", *args)
    assert result.exit_code == 0


@pytest.fixture
def _sigchld_default() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def all_pages(node, rel, limit):
    """Every page of ``rel`` (None: all relations) by ``Node.page_facts``: the facts in
    order and the number of pages it took."""
    out, after, pages = [], None, 0
    while True:
        page, after = node.page_facts(rel, after, limit)
        out += page
        pages += 1
        if after is None:
            return out, pages


@pytest.fixture
def low_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_FIXPOINT_ITERATIONS at 1,000 in every evaluator (1,000,000 rounds take s)."""
    from merklog.engine import batch, columnar, errors, incremental

    for module in (batch, columnar, errors, incremental):
        monkeypatch.setattr(module, "MAX_FIXPOINT_ITERATIONS", 1_000)


def as_printed(lines: list[str]) -> list[str]:
    """Fact lines as ``put`` prints them back: as given, but ``-0.0`` as the value ``0.0``
    it is stored as (one value, one rendering)."""
    return [re.sub(r"-0\.0(?![0-9])", "0.0", line) for line in lines]


def reaped(pid: int) -> bool:
    """The process is gone (reaped), or a zombie someone else must wait for (its parent
    is not this test process): nothing of it is left for a test to clean up."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1] != str(os.getpid())
    except FileNotFoundError:
        return True


def damage_block(home: Path, cid: Any) -> None:
    """Flip the last byte of ``cid``'s block in the home's store: the same length, so
    only re-hashing the block against its CID can tell."""
    import sqlite3

    conn = sqlite3.connect(home / "store.sqlite")
    with conn:
        data = conn.execute("SELECT data FROM blocks WHERE cid = ?", (cid.raw,)).fetchone()[0]
        conn.execute(
            "UPDATE blocks SET data = ? WHERE cid = ?",
            (data[:-1] + bytes([data[-1] ^ 1]), cid.raw),
        )
    conn.close()


def put_script(setting: str, extra: str = "") -> str:
    """Python source of a real ``merklog`` process (run as ``python -c SCRIPT N ARGS…``)
    whose ``put`` module has ``setting`` set to the integer ``N``, then runs ``extra``
    (more patches of ``put``), then ``merklog ARGS…``."""
    return (
        "import sys\n"
        "from merklog.node.commands import put\n"
        f"put.{setting} = int(sys.argv[1])\n"
        f"{extra}"
        "from merklog.node.cli import main\n"
        "sys.argv = ['merklog', *sys.argv[2:]]\n"
        "main()\n"
    )


def answered_posts(node: Any, route: str) -> int:
    """The POSTs on ``route`` that ``node`` (a running :class:`NodeProc`) answered 200,
    from its request metrics."""
    _status, text = node.request("GET", "/metrics")
    total = 0
    for line in text.decode().splitlines():
        if line.startswith("merklog_http_requests_total{") and f'route="{route}"' in line:
            if 'method="POST"' in line and 'status="200"' in line:
                total += int(float(line.rsplit(" ", 1)[1]))
    return total

