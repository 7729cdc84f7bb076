"""An epoch that changes nothing writes nothing (ADR 0206).

An idle ``merklog node run`` rewrote its ``node_epoch`` row every ``node.epoch_interval``
(1 s), the epoch number its only change: a WAL page and an fsync a second, forever
(~16 KiB/s: 1.4 GB and 86,400 syncs a day on a laptop). Such an epoch is no new epoch
now: the number stays the last epoch's and nothing is written, while an epoch that
changes something is numbered and saved as before, and survives a restart.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import merklog

#: Facts carried only by ``@next``: an idle epoch derives them again, unchanged.
MEMORY = "mem(X)@next :- mem(X).\nmem(X) :- ev(X).\n"
#: Seconds to wait for epochs that are due every few milliseconds.
WAIT = 30.0


async def _epochs_run(node: merklog.Node, n: int) -> None:
    """Wait until the epoch loop has run ``n`` more epochs (numbered or not)."""
    registry = node.metrics.registry
    start = registry.get_sample_value("merklog_epochs_total")
    async with asyncio.timeout(WAIT):
        while registry.get_sample_value("merklog_epochs_total") < start + n:
            await asyncio.sleep(0.01)


class _Store:
    """What another process sees of a home's store: SQLite's data version (it changes
    when another connection commits) and the WAL file's size."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.conn = sqlite3.connect(f"file:{home / 'store.sqlite'}?mode=ro", uri=True)

    def now(self) -> tuple[int, int]:
        version = self.conn.execute("PRAGMA data_version").fetchone()[0]
        return version, (self.home / "store.sqlite-wal").stat().st_size


def test_an_idle_node_writes_nothing_and_a_change_is_saved_as_before(tmp_path: Path) -> None:
    home = tmp_path / "h"

    async def main() -> int:
        settings = {"node.epoch_interval": 0.005}
        async with merklog.open(home, settings=settings) as node:
            node.load_program(MEMORY, "mem.dl")
            await node.write_async(node.coerce_facts(["ev(1)."]), [])
            await node.settled()
            node.retract("ev", 1)  # mem(1) now lives on through @next alone
            await node.settled()
            await _epochs_run(node, 2)  # the saves of those epochs are done
            store = _Store(home)
            before, epoch = store.now(), node.epoch
            await _epochs_run(node, 20)
            assert store.now() == before, "an idle node wrote to its store"
            assert node.epoch == epoch  # no new epoch: nothing changed
            assert node.query("mem(X)").rows == [(1,)]
            assert node.status()["epoch"] == epoch

            await node.write_async(node.coerce_facts(["ev(2)."]), [])
            await node.settled()
            assert node.epoch == epoch + 1
            await _epochs_run(node, 2)
            assert store.now()[0] != before[0], "the epoch of a write was not saved"
            after = store.now()
            await _epochs_run(node, 20)
            assert store.now() == after and node.epoch == epoch + 1
            return node.epoch

    saved = asyncio.run(main())
    with merklog.open(home) as node:
        assert node.epoch == saved  # the epoch count resumes where it was
        assert node.query("mem(X)").rows == [(1,), (2,)]


def test_a_ticking_node_still_numbers_and_saves_every_epoch(tmp_path: Path) -> None:
    """``tick(N)`` changes every epoch: each one is numbered and saved, so the clock goes
    on after a restart without repeating itself."""
    home = tmp_path / "h"

    async def main() -> int:
        settings = {"node.epoch_interval": 0.005, "node.tick": True}
        async with merklog.open(home, settings=settings) as node:
            await _epochs_run(node, 2)
            store = _Store(home)
            before, epoch = store.now(), node.epoch
            # One more than 10: the epoch read above may be published but not counted yet.
            await _epochs_run(node, 11)
            assert node.epoch >= epoch + 10
            await _epochs_run(node, 2)
            assert store.now()[0] != before[0]
            return node.epoch

    last = asyncio.run(main())
    with merklog.open(home) as node:
        assert node.epoch >= last  # every epoch was saved, up to the stop


def test_an_idle_pair_syncing_every_round_writes_nothing(tmp_path: Path) -> None:
    """Two nodes that sync every 50 ms and have nothing new for each other: each round
    rewrote the peer's heads (``repl_peer``) on both sides, ~32 KB of WAL per 5 s per
    node with the checklist example's ``sync.interval = 5`` (QA). Heads already recorded
    are not written again; a write still syncs, and then both stores change."""
    import json
    import subprocess
    import sys
    import tomllib

    origin, device = tmp_path / "origin", tmp_path / "device"

    def merklog_cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", *args], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def synced(node: merklog.Node, rounds: int) -> None:
        """Wait until ``node`` has synced with its peer ``rounds`` more times."""

        def last() -> float | None:
            return next(iter(node.status()["peers"]), {}).get("last_success")

        seen, count = last(), 0
        async with asyncio.timeout(WAIT):
            while count < rounds:
                await asyncio.sleep(0.01)
                now = last()
                if now != seen and now is not None:
                    seen, count = now, count + 1

    async def main() -> None:
        async with merklog.open(origin) as node:
            async with merklog.serve(node) as url:
                node.assert_("item", 1, "milk")
                await node.settled()
                read = tomllib.loads((origin / "config.toml").read_text())["api"]["read_token"]
                await asyncio.to_thread(
                    merklog_cli, "--home", str(device), "init", "--join", url, "--token", read
                )
                shown = await asyncio.to_thread(
                    merklog_cli, "--home", str(device), "status", "--json"
                )
                await asyncio.to_thread(
                    merklog_cli, "--home", str(origin), "peers", "add", "device",
                    "http://127.0.0.1:9", "--key", json.loads(shown)["key"],
                )  # fmt: skip
                async with merklog.open(device, settings={"sync.interval": 0.05}) as other:
                    await synced(other, 3)  # the first pull is done and recorded
                    assert other.query("item(I, T)").rows == [(1, "milk")]
                    stores = [_Store(origin), _Store(device)]
                    before = [store.now() for store in stores]
                    await synced(other, 10)
                    assert [store.now() for store in stores] == before, "an idle sync wrote"
                    node.assert_("item", 2, "eggs")
                    await node.settled()
                    await synced(other, 3)
                    assert other.query("item(2, T)").rows == [("eggs",)]
                    assert [store.now()[0] for store in stores] != [v for v, _ in before]

    asyncio.run(main())
