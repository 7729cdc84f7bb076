"""``@async`` delivery between real nodes when a destination misbehaves (ADR 0176).

A peer that accepts TCP but never answers, destinations that name no peer, peers that
refuse, messages that do not fit the receiver's declarations or are addressed to another
node, and what the two nodes keep of delivered and consumed messages.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sqlite3
from pathlib import Path

from merklog.replication.auth import sign_headers
from merklog.replication.identity import Identity
from merklog.replication.messages import encode_message
from merklog.store import make_fact
from merklog.store.car import iter_car

from .conftest import Cli, SilentServer
from .test_async import FAST, RECEIVER, SENDER, _rows, _until, ping_homes
from .test_async_loads import async_pair


class Blackhole(SilentServer):
    """A TCP server on 127.0.0.1 that accepts connections, reads each request's head and
    never answers; records the body digest each request was signed for."""

    def __init__(self) -> None:
        self.digests: list[str] = []
        super().__init__()

    def _read(self, conn: socket.socket) -> None:
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
        except OSError:
            return
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"x-merklog-digest:"):
                self.digests.append(line.split(b":", 1)[1].strip().decode())


def _metric(node, event: str) -> float:
    text = node.request("GET", "/metrics")[1].decode()
    for line in text.splitlines():
        if line.startswith(f'merklog_async_messages_total{{event="{event}"}}'):
            return float(line.split()[-1])
    return 0.0


def _status(node) -> dict:
    return node.request("GET", "/v1/status")[1]


def test_a_peer_that_never_answers_delays_no_other_peer(tmp_path: Path, node_factory) -> None:
    """Messages to a healthy peer queued after those to a peer that accepts but never
    answers arrive at once: each destination is delivered to on its own. They waited
    for every batch to the silent peer to time out (``sync.timeout`` each)."""
    hole = Blackhole()
    try:
        a, b, na, nb = async_pair(tmp_path, node_factory, env={"MERKLOG_SYNC_TIMEOUT": "600"})
        a("put", f'peer("{hole.url}").', "want(1).")  # queued first
        assert _until(lambda: hole.digests)  # its delivery is under way and will hang
        a("put", 'peer("b").')
        assert _until(lambda: _rows(nb, "got(P, X)")) == [["b", 1]]
        assert _status(na)["outbox_pending"] == 1  # the one to the silent peer
    finally:
        hole.close()


def test_a_silent_peer_backs_off_as_a_whole_and_says_it_timed_out(
    tmp_path: Path, node_factory
) -> None:
    """A silent destination with two batches due is tried one batch per attempt (its
    second batch backs off with the first, not waited for once more), the failure is
    counted, and the log says it timed out (it said ``TimeoutError: ``)."""
    hole = Blackhole()
    try:
        a = Cli(tmp_path / "a")
        a("init")
        (tmp_path / "sender.dl").write_text(SENDER)
        a("load", str(tmp_path / "sender.dl"))
        na = node_factory(a.home, env={**FAST, "MERKLOG_SYNC_TIMEOUT": "0.5"}).start()
        wants = [f"want({i})." for i in range(300)]  # 300 messages: 2 batches of <= 256
        a("put", f'peer("{hole.url}").', *wants)
        assert _until(lambda: len(hole.digests) >= 3)
        assert len(set(hole.digests)) == 1, "only the first batch is ever posted"
        assert _until(lambda: _metric(na, "failed") >= 300)
        assert _status(na)["outbox_pending"] == 300
        assert _until(lambda: "timed out after 0.5 s" in na.stderr_text), na.stderr_text
    finally:
        hole.close()


def test_undeliverable_messages_are_dropped_and_shown(tmp_path: Path, node_factory) -> None:
    """A destination that names no peer (``peer(5)``, ``peer("nosuch")``) and a peer that
    refuses (403: it does not list this node) were retried forever. Refused for
    ``node.outbox_give_up`` seconds (0 here), they are dropped: counted, logged once,
    shown by ``status``, not retried."""
    a, b = ping_homes(tmp_path)
    nb = node_factory(b.home, env=FAST).start()  # lists no peer: refuses A (403)
    na = node_factory(a.home, env={**FAST, "MERKLOG_NODE_OUTBOX_GIVE_UP": "0"}).start()
    key_b = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", nb.url, "--key", key_b)
    a("put", "peer(5).", 'peer("nosuch").', 'peer("b").', "want(1).")
    assert _until(lambda: _metric(na, "dropped") == 3)
    assert _status(na)["outbox_pending"] == 0
    assert _status(na)["outbox_dropped"] == 3
    dropped = [line for line in na.stderr_lines if "dropped" in line]
    assert len(dropped) == 3, dropped  # one line per destination
    assert any("HTTP 403" in line for line in dropped), dropped
    assert "outbox     0 @async messages pending, 3 dropped" in a("status").output
    assert _rows(nb, "got(P, X)") == []


def test_delivered_and_consumed_messages_are_not_kept(tmp_path: Path, node_factory) -> None:
    """The sender deletes a delivered message; the receiver keeps only the CID of a
    consumed one (for dedup) for ``node.async_keep`` seconds, then deletes it. Both
    tables only grew."""
    a, b, na, nb = async_pair(tmp_path, node_factory)
    a("put", 'peer("b").', "want(1).", "want(2).")
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 2)
    assert _until(lambda: _status(na)["outbox_pending"] == 0)
    with sqlite3.connect(a.home / "store.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM repl_outbox").fetchone() == (0,)
    with sqlite3.connect(b.home / "store.sqlite") as conn:
        rows = conn.execute("SELECT consumed, length(data) FROM repl_inbox").fetchall()
    assert rows == [(1, 0), (1, 0)]
    port = nb.url.rsplit(":", 1)[1]
    nb.stop()
    nb = node_factory(b.home, "--port", port, env={**FAST, "MERKLOG_NODE_ASYNC_KEEP": "0"}).start()

    def inbox_rows() -> int:
        with sqlite3.connect(b.home / "store.sqlite") as conn:
            return conn.execute("SELECT count(*) FROM repl_inbox").fetchone()[0]

    assert _until(lambda: inbox_rows() == 0)
    assert _rows(nb, "got(P, X)") == [["b", 1], ["b", 2]]  # the @next state is kept


def test_messages_that_do_not_fit_the_receivers_declarations_are_refused(
    tmp_path: Path, node_factory
) -> None:
    """With ``.decl ping(p: str, x: int).`` on the receiver, ``ping("b", "str")`` was used
    as an event although a local put of it is refused."""
    a, b, na, nb = async_pair(tmp_path, node_factory)
    (tmp_path / "typed.dl").write_text(".decl ping(p: str, x: int).\n" + RECEIVER)
    b("load", str(tmp_path / "typed.dl"))
    a("put", 'peer("b").', 'want("str").', "want(1.5).", "want(1).")
    assert _until(lambda: _rows(nb, "got(P, X)")) == [["b", 1]]
    assert _until(lambda: _metric(nb, "refused") == 2)
    assert _metric(nb, "received") == 3
    assert _until(lambda: "does not fit" in nb.stderr_text)
    assert 'ping("b", "str")' in nb.stderr_text
    assert b("put", 'ping("b", "str").', ok=False).exit_code != 0  # as a put is refused


def test_a_message_addressed_to_another_node_is_refused(tmp_path: Path, node_factory) -> None:
    """A listed peer could deliver a message whose ``to`` names another node's key."""
    b = Cli(tmp_path / "b")
    b("init")
    (tmp_path / "receiver.dl").write_text(RECEIVER)
    b("load", str(tmp_path / "receiver.dl"))
    nb = node_factory(b.home, env=FAST).start()
    sender, other = Identity.generate(), Identity.generate()
    b("peers", "add", "x", "http://127.0.0.1:1", "--key", sender.public_key.hex())
    key_b = json.loads(b("status", "--json").output)["key"]

    def post(to: str, n: int) -> tuple[int, dict]:
        fact = make_fact("ping", ["b", n])
        block = encode_message(sender.public_key, to, fact, bytes([n]) * 12)
        body = b"".join(iter_car([], [block]))
        headers = sign_headers(sender, "POST", "/v1/inbox", hashlib.sha256(body).hexdigest())
        import urllib.request

        req = urllib.request.Request(nb.url + "/v1/inbox", data=body, method="POST")
        for k, v in {**headers, "Content-Type": "application/vnd.ipld.car"}.items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = post(other.public_key.hex(), 1)
    assert status == 403 and body["error"] == "wrong_recipient", body
    assert post(key_b, 2) == (200, {"accepted": 1, "duplicates": 0})
    assert post("b", 3)[0] == 200  # a peer name the sender had no key for
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 2)
    assert _rows(nb, "got(P, X)") == [["b", 2], ["b", 3]]


def test_an_oversized_message_is_counted_as_dropped_not_queued(
    tmp_path: Path, node_factory
) -> None:
    """The ``queued`` metric counted a message over the size limit, which is not queued;
    text ``status`` showed no outbox line."""
    a = Cli(tmp_path / "a")
    a("init")
    (tmp_path / "sender.dl").write_text(SENDER)
    a("load", str(tmp_path / "sender.dl"))
    na = node_factory(a.home, env=FAST).start()
    a("put", 'peer("http://127.0.0.1:1").', f'want("{"x" * 70_000}").', "want(1).")
    assert _until(lambda: _metric(na, "dropped") == 1)
    assert _metric(na, "queued") == 1
    assert _status(na)["outbox_pending"] == 1  # nothing listens there: retried
    assert "outbox     1 @async messages pending\n" in a("status").output
