"""Why a connection to a peer failed, said in plain words (``unreachable_reason``): the
same reason whichever client met the failure (a socket, aiohttp, urllib), from real
failures on 127.0.0.1 and a real name lookup, never a Python repr such as ``<urlopen
error [Errno 111] …>`` or ``Connect call failed ('127.0.0.1', 1)``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import aiohttp
import pytest

from merklog.replication.errors import PeerUnreachable, cannot_reach, unreachable_reason


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("no error")


def _by_socket(host: str, port: int, timeout: float = 5) -> BaseException:
    return _raised(lambda: socket.create_connection((host, port), timeout=timeout).close())


def _by_aiohttp(url: str, timeout: float = 5) -> BaseException:
    async def get() -> None:
        limit = aiohttp.ClientTimeout(total=timeout)
        async with aiohttp.ClientSession(timeout=limit) as session, session.get(url):
            pass

    return _raised(lambda: asyncio.run(get()))


def _by_urllib(url: str, timeout: float = 5) -> BaseException:
    return _raised(lambda: urllib.request.urlopen(url, timeout=timeout).close())


@contextlib.contextmanager
def _server(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that does ``answer(conn)`` with each connection; yields
    its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conns.append(conn)
                answer(conn)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for conn in conns:
            conn.close()


def test_a_refused_connection_is_connection_refused_whichever_client_met_it() -> None:
    port = _closed_port()
    url = f"http://127.0.0.1:{port}"
    raised = [_by_socket("127.0.0.1", port), _by_aiohttp(url), _by_urllib(url)]
    assert isinstance(raised[1], aiohttp.ClientConnectorError), repr(raised[1])
    assert isinstance(raised[2], urllib.error.URLError), repr(raised[2])
    assert [unreachable_reason(exc) for exc in raised] == ["connection refused"] * 3
    assert cannot_reach(url, raised[2], "to join it") == (
        f"cannot reach peer {url} to join it: connection refused"
    )
    error = PeerUnreachable.for_url(url, raised[1])
    assert (error.detail, error.reason) == (
        f"cannot reach peer {url}: connection refused",
        "connection refused",
    )


def test_a_host_that_does_not_resolve_is_a_plain_reason() -> None:
    """``.invalid`` never resolves (RFC 6761): "no such host", or, on a machine with no
    resolver at all, what the lookup said instead, in plain words."""
    host = "nosuchhost.invalid"
    raised = [_by_socket(host, 80), _by_aiohttp(f"http://{host}"), _by_urllib(f"http://{host}")]
    for exc in raised:
        reason = unreachable_reason(exc)
        assert reason in {"no such host", "temporary failure in name resolution", "timed out"}, (
            reason,
            repr(exc),
        )


def test_a_peer_that_accepts_and_never_answers_has_timed_out() -> None:
    with _server(lambda conn: None) as port:
        url = f"http://127.0.0.1:{port}"
        raised = [_by_aiohttp(url, timeout=0.3), _by_urllib(url, timeout=0.3)]
        assert [unreachable_reason(exc) for exc in raised] == ["timed out"] * 2, raised


def test_any_other_failure_is_what_the_system_says() -> None:
    """A connection reset (the server closes with SO_LINGER 0): the OS's words."""

    def reset(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    def talk(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.recv(1) or client.recv(1)

    with _server(reset) as port:
        exc = _raised(lambda: talk(port))
    assert isinstance(exc, ConnectionResetError), repr(exc)
    assert unreachable_reason(exc) == "connection reset by peer"


@pytest.mark.parametrize("text", ["<urlopen", "Errno", "Connect call", "('127.0.0.1'"])
def test_no_reason_quotes_a_python_repr(text: str) -> None:
    port = _closed_port()
    url = f"http://127.0.0.1:{port}"
    for exc in (_by_socket("127.0.0.1", port), _by_aiohttp(url), _by_urllib(url)):
        assert text not in cannot_reach(url, exc)


def test_a_peer_that_resets_mid_request_is_said_in_plain_words() -> None:
    """QA: ``kill -9`` of a peer during a sync said ``peer … failed mid-request: [Errno
    104] Connection reset by peer``. A peer that reads the request and then resets the
    connection (SO_LINGER 0) is now said in the OS's plain words, as the other reasons."""
    from merklog.replication.client import SyncClient

    from .repl_support import new_replicas

    def read_then_reset(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    [replica] = new_replicas(1)

    async def pull(url: str) -> None:
        client = SyncClient(replica.identity, timeout=5)
        try:
            await client.pull(url, replica)
        finally:
            await client.close()

    with _server(read_then_reset) as port:
        url = f"http://127.0.0.1:{port}"
        exc = _raised(lambda: asyncio.run(pull(url)))
    assert isinstance(exc, PeerUnreachable), repr(exc)
    assert "Errno" not in str(exc) and f"peer {url}" in str(exc), str(exc)
    assert str(exc).endswith(("connection reset by peer", "server disconnected")), str(exc)
