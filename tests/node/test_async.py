"""``@async`` delivery between two real nodes on 127.0.0.1, and epoch state across restarts.

The programs are examples/async-ping/{sender,receiver}.dl.

A's program sends ``ping(@P, X)`` to every peer P it knows; the tuple goes to A's
persisted outbox, is POSTed (signed) to B's ``/v1/inbox`` with retries until B
acknowledges, and becomes input of a later epoch at B, whose ``@next`` rule keeps
it. B starts only after A queued the first message (retries), and B is killed
with SIGKILL and restarted: its ``@next`` state resumes.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

from .conftest import Cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async-ping"
SENDER = (EXAMPLE / "sender.dl").read_text()
FAST = {"MERKLOG_NODE_OUTBOX_INTERVAL": "0.1"}
RECEIVER = (EXAMPLE / "receiver.dl").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def ping_homes(tmp_path: Path) -> tuple[Cli, Cli]:
    """Homes ``a`` (the async-ping sender program loaded) and ``b`` (the receiver's)."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    b("init")
    (tmp_path / "sender.dl").write_text(SENDER)
    (tmp_path / "receiver.dl").write_text(RECEIVER)
    a("load", str(tmp_path / "sender.dl"))
    b("load", str(tmp_path / "receiver.dl"))
    return a, b


def _rows(node, q: str) -> list:
    status, body = node.request("GET", "/v1/query?q=" + q.replace(" ", "%20"))
    assert status == 200, body
    return body["rows"]


def test_async_tuples_reach_the_peer_with_retries_and_survive_restarts(
    tmp_path: Path, node_factory
) -> None:
    a, b = ping_homes(tmp_path)
    port_b = _free_port()
    key_b = json.loads(b("status", "--json").output)["key"]
    na = node_factory(a.home, env=FAST).start()
    a("peers", "add", "b", f"http://127.0.0.1:{port_b}", "--key", key_b)
    key_a = json.loads(a("status", "--json").output)["key"]
    b("peers", "add", "a", na.url, "--key", key_a)

    # B is down: the message waits in A's outbox and delivery attempts fail.
    a("put", 'peer("b").', "want(1).")
    _, st = na.request("GET", "/v1/status")
    assert st["outbox_pending"] == 1
    assert _until(
        lambda: (
            'merklog_async_messages_total{event="failed"}'
            in na.request("GET", "/metrics")[1].decode()
        )
    )

    nb = node_factory(b.home, "--port", str(port_b)).start()
    assert _until(lambda: _rows(nb, "got(P, X)")) == [["b", 1]]
    assert _until(lambda: na.request("GET", "/v1/status")[1]["outbox_pending"] == 0)

    a("put", "want(2).")
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 2)
    assert _rows(nb, "got(P, X)") == [["b", 1], ["b", 2]]
    _, metrics = nb.request("GET", "/metrics")
    assert 'merklog_async_messages_total{event="received"} 2.0' in metrics.decode()

    # kill -9 B: got/2 lives only in B's @next carry-over, which must resume.
    _, before = nb.request("GET", "/v1/status")
    nb.stop(signal.SIGKILL)
    nb = node_factory(b.home, "--port", str(port_b)).start()
    assert _rows(nb, "got(P, X)") == [["b", 1], ["b", 2]]
    _, after = nb.request("GET", "/v1/status")
    assert after["epoch"] > before["epoch"]  # the epoch count resumes, it does not restart

    # Restarting A re-derives ping/2 but does not send it again (nothing new at B).
    na.stop()
    na = node_factory(a.home).start()
    a("put", "want(3).")
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 3)
    time.sleep(0.5)
    _, metrics = nb.request("GET", "/metrics")
    assert 'merklog_async_messages_total{event="received"} 1.0' in metrics.decode()
    assert _rows(nb, "got(P, X)") == [["b", 1], ["b", 2], ["b", 3]]


def test_unknown_async_destination_stays_queued(tmp_path: Path, node_factory) -> None:
    """A destination that names no peer stays queued for ``node.outbox_give_up`` seconds
    (1 h by default: the peer may yet be added) and is said once at WARNING."""
    a = Cli(tmp_path / "a")
    a("init")
    (tmp_path / "s.dl").write_text(SENDER)
    a("load", str(tmp_path / "s.dl"))
    na = node_factory(a.home, env=FAST).start()
    a("put", 'peer("nobody").', "want(1).")
    _, st = na.request("GET", "/v1/status")
    assert st["outbox_pending"] == 1
    assert _until(
        lambda: (
            'merklog_async_messages_total{event="failed"}'
            in na.request("GET", "/metrics")[1].decode()
        )
    )
    assert na.request("GET", "/v1/status")[1]["outbox_pending"] == 1
    # Said once at the default log level (it was INFO only: nothing without -v).
    assert _until(lambda: any("@async delivery failed" in line for line in na.stderr_lines))
    time.sleep(1.0)  # retries meanwhile: not logged again at WARNING
    warned = [line for line in na.stderr_lines if "@async delivery failed" in line]
    assert len(warned) == 1 and "nobody" in warned[0], warned


def test_async_messages_keep_value_identity_across_epochs_and_restarts(
    tmp_path: Path, node_factory
) -> None:
    """``ping("b", 1)``, ``ping("b", 1.0)`` and ``ping("b", true)`` are three messages:
    each arrives although Python's ``1 == 1.0 == True``, and a restart of the sender
    (which reloads its "already sent" set) sends none of them again."""
    a, b = ping_homes(tmp_path)
    nb = node_factory(b.home, env=FAST).start()
    key_b = json.loads(b("status", "--json").output)["key"]
    na = node_factory(a.home, env=FAST).start()
    a("peers", "add", "b", nb.url, "--key", key_b)
    key_a = json.loads(a("status", "--json").output)["key"]
    b("peers", "add", "a", na.url, "--key", key_a)

    a("put", 'peer("b").', "want(1).")
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 1)
    a("put", "want(1.0).")  # a later epoch: the sent set already holds ping("b", 1)
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 2)
    a("put", "want(true).")
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 3)
    typed = {json.dumps(r, sort_keys=True) for r in _rows(nb, "got(P, X)")}
    assert len(typed) == 3
    _, metrics = nb.request("GET", "/metrics")
    assert 'merklog_async_messages_total{event="received"} 3.0' in metrics.decode()

    assert _until(lambda: na.request("GET", "/v1/status")[1]["outbox_pending"] == 0)
    # Restart A: its persisted sent set must still hold all three, so only want(2) goes.
    na.stop()
    na = node_factory(a.home, env=FAST).start()
    a("put", "want(2).")
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 4)
    assert _until(lambda: na.request("GET", "/v1/status")[1]["outbox_pending"] == 0)
    _, metrics = nb.request("GET", "/metrics")
    received = [
        x
        for x in metrics.decode().splitlines()
        if x.startswith('merklog_async_messages_total{event="received')
    ]
    assert 'merklog_async_messages_total{event="received"} 4.0' in metrics.decode(), received
