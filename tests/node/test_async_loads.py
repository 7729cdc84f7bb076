"""Loading a program on running ``@async`` nodes keeps their epoch state (ADR 0175).

The programs are examples/async-ping/{sender,receiver}.dl on two real nodes. A load of
the same program (``merklog load``, ``node run --program``) wiped the receiver's
``@next`` tuples (``got/2`` went from 2 rows to 0) and made the sender queue every
``ping`` again under fresh CIDs, which the receiver took as new messages.
"""

from __future__ import annotations

import json
from pathlib import Path

from .test_async import FAST, RECEIVER, _rows, _until, ping_homes


def _received(node) -> float:
    text = node.request("GET", "/metrics")[1].decode()
    for line in text.splitlines():
        if line.startswith('merklog_async_messages_total{event="received"}'):
            return float(line.split()[-1])
    return 0.0


def async_pair(tmp_path: Path, node_factory, env: dict | None = None) -> tuple:
    """Sender ``a`` and receiver ``b`` running with the async-ping programs, each listing
    the other in ``[peers]``; returns ``(a, b, na, nb)``."""
    a, b = ping_homes(tmp_path)
    nb = node_factory(b.home, env={**FAST, **(env or {})}).start()
    na = node_factory(a.home, env={**FAST, **(env or {})}).start()
    key_b = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", nb.url, "--key", key_b)
    key_a = json.loads(a("status", "--json").output)["key"]
    b("peers", "add", "a", na.url, "--key", key_a)
    return a, b, na, nb


def test_loading_the_same_programs_keeps_next_state_and_sends_nothing_again(
    tmp_path: Path, node_factory
) -> None:
    a, b, na, nb = async_pair(tmp_path, node_factory)
    a("put", 'peer("b").', "want(1).", "want(2).")
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 2)

    b("load", str(tmp_path / "receiver.dl"))  # through the running node
    assert _rows(nb, "got(P, X)") == [["b", 1], ["b", 2]]
    a("load", str(tmp_path / "sender.dl"))
    a("put", "want(3).")  # queued after anything the load queued: it arrives last
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 3)
    assert _until(lambda: na.request("GET", "/v1/status")[1]["outbox_pending"] == 0)
    assert _received(nb) == 3  # ping("b", 1) and ping("b", 2) were not sent again

    # A restart with --program of the stored programs: the same.
    port_b = nb.url.rsplit(":", 1)[1]
    nb.stop()
    nb = node_factory(
        b.home, "--port", port_b, "--program", str(tmp_path / "receiver.dl"), env=FAST
    ).start()
    assert _rows(nb, "got(P, X)") == [["b", 1], ["b", 2], ["b", 3]]
    na.stop()
    na = node_factory(a.home, "--program", str(tmp_path / "sender.dl"), env=FAST).start()
    a("put", "want(4).")
    assert _until(lambda: len(_rows(nb, "got(P, X)")) == 4)
    assert _until(lambda: na.request("GET", "/v1/status")[1]["outbox_pending"] == 0)
    assert _received(nb) == 1  # a fresh process: want(4) only

    # A changed program that still has got/2 keeps its tuples and derives from them.
    (tmp_path / "more.dl").write_text(RECEIVER + "seen(X) :- got(_, X).\n")
    b("load", str(tmp_path / "more.dl"))
    assert _rows(nb, "got(P, X)") == [["b", 1], ["b", 2], ["b", 3], ["b", 4]]
    assert _rows(nb, "seen(X)") == [[1], [2], [3], [4]]
