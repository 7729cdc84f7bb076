"""Real aiohttp servers on 127.0.0.1: sync both ways, concurrent writers, offline peers."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from merklog.replication.auth import AllowList
from merklog.replication.blocks import Retract
from merklog.replication.client import SyncClient
from merklog.replication.errors import PeerError
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.replication.server import SYNC_SERVICE, make_sync_app
from merklog.store import make_fact
from merklog.store.sqlite import SQLiteBlockStore


class Peer:
    """A node-like peer: replicas on a real SQLite file, a sync server on an ephemeral port."""

    def __init__(self, tmp_path, name: str) -> None:
        self.identity = Identity.generate()
        self.db = tmp_path / f"{name}.sqlite"
        self.blocks = SQLiteBlockStore(self.db)
        self.conn = self.blocks.conn
        self.replicas: dict = {}
        self.allow = AllowList()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        self.app = make_sync_app(self.replicas, self.allow)
        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def add(self, replica: Replica) -> Replica:
        self.replicas[replica.dataset] = replica
        return replica

    @property
    def metrics(self):
        return self.app[SYNC_SERVICE].metrics


@pytest.fixture
async def peers(tmp_path):
    made: list[Peer] = []

    async def make(n: int) -> list[Peer]:
        ps = [Peer(tmp_path, f"p{i}") for i in range(n)]
        for p in ps:
            for q in ps:
                if p is not q:
                    p.allow.allow(q.identity.public_key)
            await p.start()
        made.extend(ps)
        return ps

    yield make
    for p in made:
        await p.stop()
        p.blocks.close()


def facts(prefix: str, n: int):
    return [make_fact(prefix, [i, f"v{i}"]) for i in range(n)]


async def test_clone_and_sync_both_ways(peers):
    a, b = await peers(2)
    ra = a.add(Replica.create(a.conn, a.blocks, a.identity, "shared", [b.identity.public_key]))
    ra.assert_facts(facts("p", 50))
    async with SyncClient(b.identity) as client:
        rb, stats = await client.clone(a.url, ra.dataset, b.conn, b.blocks)
        b.add(rb)
        assert rb.visible_facts() == ra.visible_facts()
        assert stats.accepted == 1
        # Both sides write, then one sync call exchanges both ways in two round trips.
        ra.assert_facts(facts("qa", 5))
        rb.assert_facts(facts("qb", 7))
        rb.retract_facts(facts("p", 3))
        stats = await client.sync(a.url, rb)
        assert stats.round_trips == 2
        assert rb.heads() == ra.heads()
        assert rb.visible_facts() == ra.visible_facts()
        assert len(ra.visible_facts()) == 50 - 3 + 5 + 7
        # Nothing left to do: one round trip, no blocks.
        stats = await client.sync(a.url, rb)
        assert stats.round_trips == 1 and stats.block_bytes_received == 0
    assert a.metrics["rejected"] == 0


async def test_three_servers_concurrent_writers(peers):
    ps = await peers(3)
    owner = ps[0]
    root = owner.add(
        Replica.create(
            owner.conn,
            owner.blocks,
            owner.identity,
            "mesh",
            [p.identity.public_key for p in ps[1:]],
        )
    )
    reps = [root]
    for p in ps[1:]:
        async with SyncClient(p.identity) as c:
            r, _ = await c.clone(owner.url, root.dataset, p.conn, p.blocks)
            reps.append(p.add(r))

    async def writer(i: int, rounds: int) -> None:
        async with SyncClient(ps[i].identity) as client:
            for k in range(rounds):
                reps[i].assert_facts(facts(f"w{i}", 3 + k))
                if k % 2:
                    reps[i].write([Retract(make_fact(f"w{i}", [0, "v0"]))])
                target = ps[(i + 1 + k) % 3]
                if target is not ps[i]:
                    await client.sync(target.url, reps[i])
                await asyncio.sleep(0)

    await asyncio.gather(*(writer(i, 6) for i in range(3)))
    # Final full sync round: everyone with everyone.
    for _ in range(2):
        for i, p in enumerate(ps):
            async with SyncClient(p.identity) as client:
                for q in ps:
                    if q is not p:
                        await client.sync(q.url, reps[i])
    assert reps[0].heads() == reps[1].heads() == reps[2].heads()
    assert reps[0].visible_cids() == reps[1].visible_cids() == reps[2].visible_cids()
    assert len(reps[0].visible_cids()) > 0


async def test_offline_peer_reconnects(peers):
    a, b = await peers(2)
    ra = a.add(Replica.create(a.conn, a.blocks, a.identity, "off", [b.identity.public_key]))
    ra.assert_facts(facts("base", 10))
    async with SyncClient(b.identity) as client:
        rb, _ = await client.clone(a.url, ra.dataset, b.conn, b.blocks)
        b.add(rb)
    url_a = a.url
    await a.stop()
    # Offline: local writes are accepted and durable; sync fails cleanly.
    rb.assert_facts(facts("offline", 20))
    async with SyncClient(b.identity, timeout=2) as client:
        with pytest.raises((OSError, PeerError)):
            await client.sync(url_a, rb)
    ra.assert_facts(facts("aside", 4))
    # b restarts from its SQLite file (state survives reopening).
    b.blocks.close()
    b.blocks = SQLiteBlockStore(b.db)
    b.conn = b.blocks.conn
    rb = b.add(Replica.open(b.conn, b.blocks, b.identity, ra.dataset))
    assert len(rb.visible_cids()) == 30
    await a.start()
    async with SyncClient(b.identity) as client:
        stats = await client.sync(a.url, rb)
    assert stats.round_trips == 2
    assert ra.heads() == rb.heads()
    assert ra.visible_cids() == rb.visible_cids()
    assert len(ra.visible_cids()) == 34


async def test_long_divergence_uses_larger_summary_not_per_level_round_trips(peers):
    a, b = await peers(2)
    ra = a.add(Replica.create(a.conn, a.blocks, a.identity, "div", [b.identity.public_key]))
    ra.assert_facts(facts("base", 5))
    async with SyncClient(b.identity) as client:
        rb, _ = await client.clone(a.url, ra.dataset, b.conn, b.blocks)
        for i in range(100):  # 100 local deltas: more than the first 8-delta summary window
            rb.assert_facts([make_fact("local", [i])])
        ra.assert_facts(facts("remote", 3))
        b.conn.execute("DELETE FROM repl_peer")  # forget what a had: no summary sizing hint
        stats = await client.sync(a.url, rb)
    # 409 need_summary (8), again (64), then a 512 window fits, then one push: 4 round
    # trips for 100 unsynced deltas - logarithmic, not one per level.
    assert stats.round_trips == 4
    assert stats.deltas_received == 1 and stats.deltas_pushed == 100
    assert ra.heads() == rb.heads() and ra.visible_cids() == rb.visible_cids()
    assert a.metrics["rejected.need_summary"] == 2
    # Next time the client remembers what the peer had and sizes the summary up front.
    for i in range(70):
        rb.assert_facts([make_fact("again", [i])])
    ra.assert_facts(facts("remote2", 2))
    async with SyncClient(b.identity) as client:
        stats = await client.sync(a.url, rb)
    assert stats.round_trips == 2
    assert a.metrics["rejected.need_summary"] == 2
    assert ra.heads() == rb.heads()


async def test_pruned_deltas_are_a_clean_409(peers):
    a, b = await peers(2)
    ra = a.add(Replica.create(a.conn, a.blocks, a.identity, "pruned", [b.identity.public_key]))
    first = ra.assert_facts(facts("old", 3))
    ra.assert_facts(facts("new", 3))
    a.blocks.delete_many(first)  # as a snapshot prune would
    async with SyncClient(b.identity) as client:
        data = await client.genesis(a.url, ra.dataset)
        rb = Replica.open(b.conn, b.blocks, b.identity, ra.dataset, data)
        with pytest.raises(PeerError) as err:
            await client.pull(a.url, rb)
    assert err.value.code == "pruned" and err.value.status == 409
    assert rb.delta_count() == 0


async def test_a_cancelled_sync_keeps_nothing_of_the_response_it_was_applying(peers):
    """Ctrl-C (or a node stopping) while a large pulled response is being applied: the
    apply stops at the next block and rolls back. Before, the cancellation waited for
    the whole apply to commit (8-14 s for a large sync), so a sync reported as
    interrupted had in fact been applied."""
    a, b = await peers(2)
    ra = a.add(Replica.create(a.conn, a.blocks, a.identity, "big", [b.identity.public_key]))
    async with SyncClient(b.identity) as client:
        rb, _ = await client.clone(a.url, ra.dataset, b.conn, b.blocks)
    b.add(rb)
    ra.assert_facts(facts("big", 40_000))
    heads_before = rb.heads()
    loop = asyncio.get_running_loop()
    applying = asyncio.Event()

    class Watched:
        """``rb``, saying when an apply starts (in the worker thread)."""

        def apply_blocks(self, *args, **kw):
            loop.call_soon_threadsafe(applying.set)
            return rb.apply_blocks(*args, **kw)

        def __getattr__(self, name):
            return getattr(rb, name)

    async with SyncClient(b.identity) as client:
        task = asyncio.ensure_future(client.sync(a.url, Watched()))
        await applying.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert rb.heads() == heads_before
    assert len(rb.visible_facts()) == 0
    async with SyncClient(b.identity) as client:  # the next sync brings all of it
        await client.sync(a.url, rb)
    assert rb.heads() == ra.heads()
    assert rb.visible_facts() == ra.visible_facts()


async def test_progress_moves_while_a_pulled_response_is_applied(peers):
    """The progress callback fired only after each whole response was applied, so a
    large pull's progress line stood still for the seconds its apply took. It now also
    reports every ``progress_deltas`` deltas accepted during the apply, in order, then
    the response's total, with the response's bytes: here 35 deltas in one response,
    every 10."""
    a, b = await peers(2)
    ra = a.add(Replica.create(a.conn, a.blocks, a.identity, "steps", [b.identity.public_key]))
    async with SyncClient(b.identity) as client:
        rb, _ = await client.clone(a.url, ra.dataset, b.conn, b.blocks)
    b.add(rb)
    for i in range(35):
        ra.assert_facts(facts(f"d{i}", 2))  # one delta each
    calls: list[tuple[str, int, int]] = []
    async with SyncClient(
        b.identity, progress=lambda *call: calls.append(call), progress_deltas=10
    ) as client:
        stats = await client.sync(a.url, rb)
    assert stats.accepted == 35 and stats.round_trips == 1
    assert [c[2] for c in calls] == [10, 20, 30, 35], calls
    assert {c[0] for c in calls} == {"pull"}
    assert {c[1] for c in calls} == {stats.bytes_received}, calls
    assert rb.heads() == ra.heads()


async def test_a_damaged_block_cuts_the_answer_off_at_once(peers):
    """A peer whose store turns out damaged part way through an answer (its status and
    headers already sent) closes the connection: the caller hears at once that the
    answer was cut off, instead of waiting out its timeout (30 s) for the rest, and
    nothing of the cut answer is applied."""
    import time

    from merklog.replication.errors import PeerUnreachable

    a, b = await peers(2)
    ra = a.add(Replica.create(a.conn, a.blocks, a.identity, "dmg", [b.identity.public_key]))
    genesis = a.blocks.get(ra.dataset)
    rb = b.add(Replica.open(b.conn, b.blocks, b.identity, ra.dataset, genesis_block=genesis))
    for i in range(3):
        ra.assert_facts([make_fact("v", (i,)), make_fact("v", (float(i),)), make_fact("v", (True,))])
    last = max(ra.heads(), key=lambda cid: cid.raw)
    table = a.blocks.shared_sqlite().blocks_table
    data = bytearray(a.conn.execute(f"SELECT data FROM {table} WHERE cid = ?", (last.raw,)).fetchone()[0])
    data[-3] ^= 1
    a.conn.execute(f"UPDATE {table} SET data = ? WHERE cid = ?", (bytes(data), last.raw))
    a.conn.commit()
    started = time.monotonic()
    async with SyncClient(b.identity, timeout=30) as client:
        with pytest.raises(PeerUnreachable, match="cut its answer off"):
            await asyncio.wait_for(client.pull(a.url, rb), 20)
    assert time.monotonic() - started < 20
    assert rb.heads() == [rb.dataset]
