"""Real replicas: export → compact → snapshot; a fresh peer bootstraps from it and syncs
only what came after; pruning drops covered delta blocks and keeps the CRDT state."""

from __future__ import annotations

import random
from contextlib import asynccontextmanager

import pytest

from merklog.node.spark.bootstrap import (
    export_replica,
    install_snapshot,
    load_snapshot,
    prune_replica,
)
from merklog.node.spark.compact import compact, read_ops, snapshot_frame
from merklog.node.spark.manifest import ManifestError
from merklog.node.spark.schema import decode_args
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import Fact, MemoryBlockStore, make_fact

pytestmark = pytest.mark.spark


def sync(dst: Replica, src: Replica) -> int:
    """One pull: ``dst`` receives every block ``src`` has that ``dst`` lacks; returns deltas."""
    return dst.apply_blocks(src.missing_for(dst.heads(), dst.summary(None))).accepted


def _facts(rng: random.Random, n: int) -> list[Fact]:
    return [make_fact("edge", (rng.randrange(12), rng.randrange(12))) for _ in range(n)]


def _edit(rng: random.Random, rep: Replica, rounds: int) -> None:
    for _ in range(rounds):
        rep.assert_facts(_facts(rng, rng.randint(1, 5)))
        vis = sorted(rep.visible_facts())
        if vis and rng.random() < 0.6:
            rep.retract_facts(rng.sample(vis, min(len(vis), rng.randint(1, 3))))


@asynccontextmanager
async def serving(replica: Replica, *callers: Replica):
    """``replica`` served by a real sync server on 127.0.0.1 to ``callers``; yields its URL."""
    from aiohttp import web

    from merklog.replication import AllowList, make_sync_app

    allow = AllowList({caller.identity.public_key: None for caller in callers})
    runner = web.AppRunner(make_sync_app({replica.dataset: replica}, allow))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
def peers(tmp_path):
    ida, idb, idc = (Identity.from_seed(bytes([i]) * 32) for i in (1, 2, 3))
    a = Replica.create(
        tmp_path / "a.db", MemoryBlockStore(), ida, "shared", writers=[idb.public_key]
    )
    genesis = a.blockstore.get(a.dataset)
    b = Replica.open(tmp_path / "b.db", MemoryBlockStore(), idb, a.dataset, genesis_block=genesis)
    c = Replica.open(tmp_path / "c.db", MemoryBlockStore(), idc, a.dataset, genesis_block=genesis)
    return a, b, c


def test_compact_equals_replication_state(spark, tmp_path, peers):
    a, b, _c = peers
    rng = random.Random(3)
    for _ in range(4):  # concurrent edits, partial syncs
        _edit(rng, a, 6)
        _edit(rng, b, 6)
        sync(a, b)
    export_replica(a, tmp_path / "ea")
    export_replica(b, tmp_path / "eb")
    got = snapshot_frame(read_ops(spark, [tmp_path / "ea", tmp_path / "eb"])).collect()
    merged = {Fact(r["relation"], decode_args(r["args"])) for r in got}
    sync(b, a)
    assert merged == a.visible_facts() == b.visible_facts()


def test_fresh_peer_bootstraps_from_snapshot_then_syncs_only_newer(spark, tmp_path, peers):
    a, b, c = peers
    rng = random.Random(5)
    for _ in range(3):
        _edit(rng, a, 5)
        _edit(rng, b, 5)
        sync(a, b)
        sync(b, a)
    export_replica(a, tmp_path / "ea")
    export_replica(b, tmp_path / "eb")
    node_key = Identity.from_seed(b"\x09" * 32)
    [res] = compact(spark, [tmp_path / "ea", tmp_path / "eb"], tmp_path / "snap", node_key)
    assert res.manifest["deltas"] == a.delta_count()
    covered = a.delta_count()

    # newer deltas: concurrent edits, including retracts of pre-snapshot asserts
    before = sorted(a.visible_facts())
    a.retract_facts(before[:2])
    b.retract_facts(before[1:4])
    _edit(rng, a, 3)
    _edit(rng, b, 3)
    newer = a.delta_count() + b.delta_count() - 2 * covered

    snap = load_snapshot(res.directory, trusted={node_key.public_key})
    with pytest.raises(ManifestError, match="untrusted"):
        load_snapshot(res.directory, trusted={a.identity.public_key})
    install_snapshot(c, snap)
    assert set(c.heads()) == set(snap.heads)
    got = sync(c, a) + sync(c, b)
    assert got == newer  # only what came after the snapshot travelled
    sync(a, b)
    sync(b, a)
    sync(c, a)
    assert c.visible_facts() == a.visible_facts() == b.visible_facts()
    assert c.heads() == a.heads() == b.heads()
    # C writes on top of the snapshot; A and B accept it from C
    c_key = c.identity.public_key
    a.grant(c_key)
    sync(c, a)
    c.assert_facts([make_fact("edge", (100, 101))])
    assert sync(a, c) == 1 and sync(b, a) >= 1
    assert c.visible_facts() == a.visible_facts() == b.visible_facts()
    assert make_fact("edge", (100, 101)) in b.visible_facts()


def test_prune_keeps_state_and_rejects_unsynced(spark, tmp_path, peers):
    a, b, _c = peers
    rng = random.Random(8)
    _edit(rng, a, 6)
    _edit(rng, b, 6)
    sync(a, b)
    sync(b, a)
    a.assert_facts([make_fact("edge", (50, 51))])  # both writers build on the merged state
    b.assert_facts([make_fact("edge", (60, 61))])
    sync(a, b)
    export_replica(a, tmp_path / "ea")
    [res] = compact(spark, [tmp_path / "ea"], tmp_path / "snap", a.identity, prune=True)
    snap = load_snapshot(res.directory)
    # the stable prefix: everything but the two newest deltas nobody has built on yet
    assert snap.manifest["deltas"] == a.delta_count() - 2
    visible = a.visible_facts()
    stale = Replica.open(
        tmp_path / "s.db",
        MemoryBlockStore(),
        Identity.from_seed(b"\x07" * 32),
        a.dataset,
        genesis_block=a.blockstore.get(a.dataset),
    )
    with pytest.raises(ManifestError, match="sync before pruning"):
        prune_replica(stale, snap)
    dropped = prune_replica(a, snap)
    assert dropped == snap.manifest["deltas"] > 0
    assert a.visible_facts() == visible
    # a retract after pruning still removes the pre-snapshot asserts it observes
    victim = sorted(visible)[0]
    a.retract_facts([victim])
    assert victim not in a.visible_facts()
    sync(b, a)
    assert b.visible_facts() == a.visible_facts()


def test_prune_refuses_deltas_that_are_not_causally_stable_here(spark, tmp_path, peers):
    """``merklog prune`` of a snapshot made without ``--prune`` deleted the newest deltas
    too, which B had not built on: a peer lacking them was cut off for good (409 pruned,
    and import-snapshot refuses a non-empty home). It is refused and nothing is deleted."""
    a, b, _c = peers
    rng = random.Random(8)
    _edit(rng, a, 6)
    _edit(rng, b, 6)
    sync(a, b)
    sync(b, a)
    b.assert_facts([make_fact("edge", (60, 61))])  # B builds on everything so far
    sync(a, b)
    a.assert_facts([make_fact("edge", (50, 51))])  # nobody has built on this one yet
    export_replica(a, tmp_path / "ea")
    [res] = compact(spark, [tmp_path / "ea"], tmp_path / "snap", a.identity)
    snap = load_snapshot(res.directory)
    assert snap.manifest["deltas"] == a.delta_count()
    before = [d.cid for d in a.iter_deltas()]
    with pytest.raises(ManifestError, match=r"^1 of the snapshot's \d+ deltas are not causally"):
        prune_replica(a, snap)
    assert all(a.blockstore.has(cid) for cid in before)
    sync(b, a)  # B builds on it: now every delta is stable, and the same snapshot prunes
    b.assert_facts([make_fact("edge", (70, 71))])
    sync(a, b)
    assert prune_replica(a, snap) == len(before)


async def test_bootstrapped_peer_pulls_only_newer_deltas_over_http(spark, tmp_path, peers):
    """The same, through the real sync protocol: an aiohttp server on 127.0.0.1 serving A."""
    from merklog.replication import SyncClient

    a, b, c = peers
    rng = random.Random(13)
    _edit(rng, a, 5)
    _edit(rng, b, 5)
    sync(a, b)
    export_replica(a, tmp_path / "ea")
    [res] = compact(spark, [tmp_path / "ea"], tmp_path / "snap", a.identity)
    covered = a.delta_count()
    before = sorted(a.visible_facts())
    a.retract_facts(before[:2])  # newer deltas, retracting pre-snapshot asserts
    _edit(rng, a, 2)
    install_snapshot(c, load_snapshot(res.directory, trusted={a.identity.public_key}))

    async with serving(a, c) as url, SyncClient(c.identity) as client:
        stats = await client.sync(url, c)
    assert stats.deltas_received == a.delta_count() - covered > 0
    assert c.visible_facts() == a.visible_facts()
    assert c.heads() == a.heads()


def test_compact_prune_with_nothing_stable_says_so(spark, tmp_path, peers):
    """With two writers' concurrent deltas nothing is causally stable: ``compact --prune``
    wrote no snapshot, printed nothing and exited 0."""
    from click.testing import CliRunner

    from merklog.node.cli import cli

    a, b, _c = peers
    a.assert_facts([make_fact("edge", (1, 2))])
    b.assert_facts([make_fact("edge", (3, 4))])
    sync(a, b)  # A holds both; neither author's latest delta has the other's in its past
    export_replica(a, tmp_path / "ea")
    home = str(tmp_path / "home")
    assert CliRunner().invoke(cli, ["--home", home, "init"]).exit_code == 0
    done = CliRunner().invoke(
        cli,
        ["--home", home, "compact", str(tmp_path / "ea"), "--out", str(tmp_path / "s"), "--prune"],
    )
    assert done.exit_code == 1, done.output
    assert "no delta is causally stable yet" in done.output


async def test_a_peer_bootstrapped_from_a_merged_snapshot_syncs_with_one_that_lacks_some(
    spark, tmp_path, peers
):
    """C bootstraps from the snapshot of A's and B's merged exports; A lacks B's last
    deltas, which C holds only as the snapshot's metadata. C's sync with A (pull, then
    push) succeeds: it pushes what it can and holds back those deltas and C's own new
    one built on them (A would refuse it for an unknown parent), instead of failing with
    "block not found" as if C's store were damaged. Once A has B's deltas, C's push
    sends its own."""
    from merklog.replication import SyncClient

    a, b, c = peers
    rng = random.Random(21)
    _edit(rng, a, 4)
    sync(b, a)
    _edit(rng, b, 3)  # A does not have these
    export_replica(a, tmp_path / "ea")
    export_replica(b, tmp_path / "eb")
    [res] = compact(spark, [tmp_path / "ea", tmp_path / "eb"], tmp_path / "snap", a.identity)
    install_snapshot(c, load_snapshot(res.directory, trusted={a.identity.public_key}))
    lacking = b.delta_count() - a.delta_count()
    assert lacking > 0
    a.grant(c.identity.public_key)
    sync(c, a)  # C learns of the grant (pull only)
    c.assert_facts([make_fact("mine", (1,)), make_fact("mine", (1.0,)), make_fact("mine", (True,))])

    async with serving(a, c, b) as url:
        async with SyncClient(c.identity) as client:
            stats = await client.sync(url, c)
        assert stats.held_back == lacking + 1 and stats.deltas_pushed == 0
        assert not [f for f in a.visible_facts() if f.rel == "mine"]
        async with SyncClient(b.identity) as client:  # A gets B's deltas from B
            await client.sync(url, b)
        async with SyncClient(c.identity) as client:
            again = await client.sync(url, c)
    assert again.held_back == 0 and again.deltas_pushed == 1
    assert a.visible_facts() == c.visible_facts()
    assert len([f for f in a.visible_facts() if f.rel == "mine"]) == 3
