"""A peer behind TLS whose certificate this host does not trust (self-signed, a private
CA): every path that talks to it — `init --join`, `peers add`, `sync` on a stopped home
and through a running node — says so on one line and exits 1 (a configuration to fix),
where it said "peer unreachable … CERTIFICATE_VERIFY_FAILED" with exit 4 ("worth
retrying"). SSL_CERT_FILE naming a bundle with the certificate makes each path work.

The peer is a real node behind a real TLS server on 127.0.0.1: an aiohttp reverse proxy
with a self-signed certificate, as a TLS terminator in front of a node would be."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
from aiohttp import web

from merklog.node.failures import ExitCode

from .conftest import Cli
from .test_cli_errors import assert_fails
from .test_deploy_tls import _self_signed

#: Hop-by-hop and framing headers a proxy does not copy.
_SKIP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


class TLSProxy:
    """HTTPS on 127.0.0.1 (a self-signed certificate) in front of ``target`` (http)."""

    def __init__(self, target: str, crt: Path, key: Path) -> None:
        import ssl

        self.target = target
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(str(crt), str(key))
        self.loop = asyncio.new_event_loop()
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIP}
        async with aiohttp.ClientSession() as session:
            async with session.request(
                request.method,
                self.target + request.rel_url.path_qs,
                headers=headers,
                data=await request.read(),
            ) as resp:
                body = await resp.read()
                out = {k: v for k, v in resp.headers.items() if k.lower() not in _SKIP}
                return web.Response(status=resp.status, body=body, headers=out)

    async def _start(self) -> str:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(self.runner, sock, ssl_context=self.ctx)
        await site.start()
        return f"https://127.0.0.1:{sock.getsockname()[1]}"

    def start(self) -> TLSProxy:
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


def _merklog(home: Path, *args: str, ca: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    env["PYTHONWARNINGS"] = "ignore"
    if ca is not None:
        env["SSL_CERT_FILE"] = str(ca)
    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _untrusted(result: subprocess.CompletedProcess, url: str) -> None:
    line = assert_fails(result, ExitCode.FAILED, "not trusted", "SSL_CERT_FILE", url)
    assert "unreachable" not in line, line


def test_an_untrusted_tls_peer_is_a_configuration_error_and_ssl_cert_file_fixes_it(
    tmp_path: Path, node_factory
) -> None:
    crt, key = _self_signed(tmp_path)
    a = Cli(tmp_path / "a")
    a("init")
    a("put", "edge(1, 2).")
    node_a = node_factory(a.home).start()
    proxy = TLSProxy(node_a.url, crt, key).start()
    try:
        url, token = proxy.url, node_a.read_token
        b = tmp_path / "b"
        _untrusted(_merklog(b, "init", "--join", url, "--token", token), url)
        assert not b.exists()  # nothing half-made either
        joined = _merklog(b, "init", "--join", url, "--token", token, ca=crt)
        assert joined.returncode == 0, joined.stderr
        key_b = json.loads(_merklog(b, "status", "--json").stdout)["key"]
        a("peers", "add", "b", "http://127.0.0.1:9", "--key", key_b)  # A lets B sync

        # peers add asks the peer for its key over TLS.
        _untrusted(_merklog(b, "peers", "add", "a", url, "--token", token), url)
        added = _merklog(b, "peers", "add", "a", url, "--token", token, ca=crt)
        assert added.returncode == 0, added.stderr

        # sync on a stopped home (this process's own TLS client)
        _untrusted(_merklog(b, "sync", "a"), url)
        synced = _merklog(b, "sync", "a", ca=crt)
        assert synced.returncode == 0, synced.stderr
        assert "edge(1, 2)" in _merklog(b, "ls").stdout

        # sync through a running node: the node's TLS client, its environment's bundle
        a("put", "edge(2, 3).")
        node_b = node_factory(b, env={"SSL_CERT_FILE": "/nonexistent"}).start()
        through = _merklog(b, "sync", "a", ca=crt)  # the node's trust counts
        _untrusted(through, url)
        # QA: the line told a command that had SSL_CERT_FILE set to set it
        assert f"this sync ran in the node running on this home ({node_b.url}" in (
            through.stderr.replace("\n", " ")
        ), through.stderr
        node_b.stop()
        node_b = node_factory(b, env={"SSL_CERT_FILE": str(crt)}).start()
        synced = _merklog(b, "sync", "a")
        assert synced.returncode == 0, synced.stderr
        assert "edge(2, 3)" in _merklog(b, "ls").stdout
        node_b.stop()
    finally:
        proxy.stop()
