"""Progress through a running node counts real units: ``sync`` streams the node's bytes
and deltas (``POST /v1/sync`` with ``Accept: application/x-ndjson``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from merklog.node.failures import ExitCode
from merklog.node.target import TargetError, open_target

from .conftest import Cli


def test_sync_through_a_running_node_reports_real_bytes_and_deltas(
    tmp_path: Path, node_factory
) -> None:
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    rows = tmp_path / "rows.dl"
    rows.write_text("".join(f'r({i}, {i}.0, "{i}", true).\n' for i in range(30000)))
    a("put", "-f", str(rows))
    a("put", 'v(1). v(1.0). v(true). v("1"). v(x"01").')
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    key = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", key)  # lets b read from a
    node_b = node_factory(b.home).start()
    seen: list[tuple[str, int, int]] = []
    with open_target(b.home) as target:
        stats = target.sync(na.url, lambda *event: seen.append(event))
    pulls = [e for e in seen if e[0] == "pull"]
    assert pulls, seen
    assert pulls[-1] == ("pull", stats["bytes_received"], stats["accepted"])
    assert stats["accepted"] > 1 and stats["bytes_received"] > 2 << 20
    # bytes are reported while the response arrives (every MiB), not only at its end
    assert len(pulls) >= 3 and [e[1] for e in pulls] == sorted(e[1] for e in pulls)
    assert len(Cli(b.home)("ls", "v").output.splitlines()) == 5  # via the running node
    assert node_b.proc is not None and node_b.proc.poll() is None

    # A peer that cannot be reached: the usual answer (502, exit 4), no half stream.
    with open_target(b.home) as target, pytest.raises(TargetError) as failed:
        target.sync("http://127.0.0.1:9", lambda *event: seen.append(event))
    assert failed.value.exit_code == ExitCode.PEER_UNREACHABLE
    assert "127.0.0.1:9" in str(failed.value)
    result = b("sync", "http://127.0.0.1:9", ok=False)
    assert result.exit_code == 4 and "Traceback" not in result.output


def test_reading_a_home_tells_its_progress_in_facts(tmp_path: Path, monkeypatch) -> None:
    """``read_visible`` tells the visible facts read after each batch of blocks: rising
    counts ending at every visible fact (mixed types and a retracted fact counted as
    the read holds them)."""
    from merklog.node import edb, factscan
    from merklog.node.node import Node

    facts = [("e", (i, i + 1)) for i in range(6000)]
    facts += [("v", (1,)), ("v", (1.0,)), ("v", (True,)), ("v", ("1",)), ("v", (b"\x01",))]
    with Node.open(tmp_path / "h") as node:
        node.write(facts)
        node.write([], [("e", (0, 1))])
        monkeypatch.setattr(factscan, "SCAN_BATCH", 1000)  # several batches of blocks
        told: list[tuple[int, int]] = []
        held = edb.read_visible(node.replica, lambda *seen: told.append(seen))
    visible = len(facts) - 1
    assert len(held) == visible
    assert len(told) > 3 and told[-1] == (visible, visible)
    assert [r for r, _ in told] == sorted(r for r, _ in told)
    assert {v for _, v in told} == {visible}


def test_the_load_bar_draws_on_a_terminal_only_for_a_large_read(monkeypatch) -> None:
    """The bar ``node run`` and a stopped home's query show while the stored facts are
    read: drawn on a terminal from the first batch of a read of ``LOAD_BAR_FACTS`` or
    more, with real counts, and closed when the read is done; nothing otherwise."""
    import io

    from rich.console import Console

    from merklog.node import cliutil

    def drawn(total: int, terminal: bool) -> str:
        out = io.StringIO()
        bar = cliutil.LoadBar(Console(file=out, force_terminal=terminal, width=100))
        for read in range(0, total + 1, max(1, total // 4)):
            bar(read, total)
        bar(total, total)
        assert bar._bar is None  # closed by the last call
        return out.getvalue()

    big = cliutil.LOAD_BAR_FACTS
    shown = drawn(big, terminal=True)
    assert "reading stored facts" in shown and f"{big}/{big}" in shown
    assert drawn(big, terminal=False) == ""
    assert drawn(big - 1, terminal=True) == ""


def test_node_run_shows_its_read_of_a_large_home_before_it_listens(tmp_path: Path) -> None:
    """Through a real terminal (a pty), ``merklog node run`` on a home of more than
    ``LOAD_BAR_FACTS`` facts draws the read's bar, then says it listens."""
    import os
    import pty
    import select
    import signal
    import subprocess
    import sys
    import time

    from merklog.node.cliutil import LOAD_BAR_FACTS
    from merklog.node.node import Node

    home = tmp_path / "h"
    with Node.open(home) as node:
        node.write([("e", (i, -i)) for i in range(LOAD_BAR_FACTS + 10)])
    main, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "node", "run", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env={**os.environ, "COLUMNS": "120"},
    )
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"listening on" not in seen and time.monotonic() < deadline:
            if select.select([main], [], [], 1)[0]:
                try:
                    seen += os.read(main, 65536)
                except OSError:
                    break
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        os.close(main)
    text = seen.decode("utf-8", "replace")
    assert "listening on" in text, text
    before = text[: text.index("listening on")]
    assert "reading stored facts" in before and f"/{LOAD_BAR_FACTS + 10}" in before, text


def test_a_streamed_sync_says_it_is_working_while_it_applies(tmp_path: Path, monkeypatch) -> None:
    """QA: ``merklog sync`` through a running node of a 2.2M-fact peer: progress lines for
    27 s, then none for the 66 s the node applied what it pulled; the CLI gave up after
    60 s without a line (exit 4), and its leaving cancelled the sync, every retry alike.
    The node now writes ``{"working": …}`` after ``SYNC_KEEPALIVE`` seconds without a line
    and the CLI's client reads past it to the result. The peer's sync is stood in for
    (one pull line, then a long silent apply); the keep-alive is shortened."""
    import asyncio
    import threading

    import merklog
    from merklog.node import handlers
    from merklog.node.client import NodeClient

    monkeypatch.setattr(handlers, "SYNC_KEEPALIVE", 0.6)

    async def slow_sync(self, url, progress=None, timeout=None):
        progress("pull", 1 << 20, 3)
        await asyncio.sleep(2.5)  # the apply: nothing to report
        return {"peer": url, "accepted": 3, "bytes_received": 1 << 20}

    monkeypatch.setattr(merklog.Node, "sync", slow_sync)
    seen: list = []
    lines: list[bytes] = []

    async def main() -> dict:
        async with merklog.open(tmp_path / "h") as node, merklog.serve(node) as url:
            token = node.config.get("api.token")
            import aiohttp

            async with aiohttp.ClientSession() as session:
                async with session.post(
                    url + "/v1/sync",
                    json={"url": "http://127.0.0.1:9"},
                    headers={"Authorization": f"Bearer {token}", "Accept": handlers.NDJSON},
                ) as resp:
                    async for raw in resp.content:
                        lines.append(raw)
            result: dict = {}

            def cli() -> None:  # the CLI's client, reads with a socket timeout of 1.5 s
                client = NodeClient(url, token, timeout=1.5)
                result.update(client.sync("http://127.0.0.1:9", lambda *e: seen.append(e)))

            thread = threading.Thread(target=cli)
            thread.start()
            await asyncio.to_thread(thread.join, 30)
            return result

    result = asyncio.run(main())
    events = [json.loads(raw) for raw in lines]
    assert events[0] == {"progress": {"direction": "pull", "bytes": 1 << 20, "deltas": 3}}
    assert any("working" in e for e in events[1:-1]), events
    assert events[-1]["result"]["accepted"] == 3
    assert result["accepted"] == 3 and seen == [("pull", 1 << 20, 3)]
