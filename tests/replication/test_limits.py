"""No poison pills: whatever a replica writes, every peer accepts (docs/adr/0020).

Writes go through the real write path (``Replica.write_many`` on a real SQLite
file) close to every limit in :mod:`merklog.replication.limits`; a real peer
(aiohttp on 127.0.0.1, its own SQLite file) must accept all of it by sync. Shapes
older writers produced (oversized facts, retracts with more than 1024 observed
asserts) are built block by block and must sync again too.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merklog.replication import limits
from merklog.replication.auth import AllowList
from merklog.replication.blocks import Assert, Retract, build_delta
from merklog.replication.client import SyncClient
from merklog.replication.errors import PeerUnreachable, TooLarge
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.replication.server import Limits, make_sync_app
from merklog.store import Fact, encode_fact, make_fact
from merklog.store.sqlite import SQLiteBlockStore

OWNER = Identity.from_seed(b"\x01" * 32)
OLD = Identity.from_seed(b"\x02" * 32)  # a writer running a version before the limits
PEER = Identity.from_seed(b"\x03" * 32)


class Home:
    """A replica on its own SQLite file."""

    def __init__(self, path, identity: Identity, dataset=None) -> None:
        self.store = SQLiteBlockStore(path)
        if dataset is None:
            self.replica = Replica.create(
                self.store.conn, self.store, identity, "limits", [OLD.public_key]
            )
        else:
            self.replica = Replica.open(
                self.store.conn, self.store, identity, dataset.cid, dataset.data
            )

    def close(self) -> None:
        self.store.close()


@asynccontextmanager
async def serving(replica: Replica, limits_: Limits | None = None):
    """``replica`` served by a real sync server on 127.0.0.1; yields its URL."""
    allow = AllowList()
    allow.allow(OWNER.public_key)
    app = make_sync_app({replica.dataset: replica}, allow, limits=limits_)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def sized_fact(rel: str, size: int, key: object) -> Fact:
    """A fact whose block encodes to exactly ``size`` bytes (``key`` keeps it distinct)."""
    fact = make_fact(rel, [key, b""])
    base = len(encode_fact(fact)[1])
    pad = size - base
    for _ in range(4):  # the bytes' length prefix grows with the length: converge
        fact = make_fact(rel, [key, b"x" * pad])
        got = len(encode_fact(fact)[1])
        if got == size:
            return fact
        pad += size - got
    raise AssertionError(f"cannot size a fact to {size} bytes")


def legacy_delta(replica: Replica, identity: Identity, seq: int, ops: list[dict], blocks):
    """Build and apply one delta the way a pre-limits writer did (no packing, no checks)."""
    heads = replica.heads()
    clock = 1 + max(replica._clock_of(h) or 0 for h in heads)
    delta = build_delta(identity, replica.dataset, seq, clock, heads, ops)
    replica.apply_blocks([*blocks, (delta.cid, delta.data)])
    return delta


async def sync_to_peer(writer: Replica, peer: Replica, limits_: Limits | None = None, **kw):
    async with serving(peer, limits_) as url:
        async with SyncClient(OWNER, **kw) as client:
            return await client.sync(url, writer)


def assert_same(a: Replica, b: Replica) -> None:
    assert a.heads() == b.heads()
    assert a.visible_cids() == b.visible_cids()
    assert a.delta_count() == b.delta_count()


# ---------------------------------------------------------------- the rule itself


def test_every_writer_limit_is_within_the_receiver_limit() -> None:
    for name, (writer, receiver) in limits.PAIRS.items():
        assert writer <= receiver, name
    assert Limits().max_block == limits.RECEIVE_MAX_SECTION
    assert Limits().max_push_body == limits.RECEIVE_MAX_BODY


def test_oversized_fact_is_refused_at_put_naming_the_limit(tmp_path) -> None:
    home = Home(tmp_path / "a.sqlite", OWNER)
    before = home.replica.heads()
    big = sized_fact("blob", limits.MAX_FACT_BYTES + 1, 1)
    with pytest.raises(TooLarge) as info:
        home.replica.assert_facts([make_fact("small", [1]), big])
    assert f"{limits.MAX_FACT_BYTES}-byte limit" in str(info.value)
    assert "blob/2" in str(info.value)
    assert home.replica.heads() == before and home.replica.visible_cids() == set()
    home.close()


def test_assert_of_a_visible_fact_adds_no_assert(tmp_path) -> None:
    home = Home(tmp_path / "a.sqlite", OWNER)
    r = home.replica
    fact = make_fact("p", [1])
    assert len(r.assert_facts([fact])) == 1
    assert r.assert_facts([fact]) == []
    assert r.assert_facts([fact, fact]) == []
    # 1, 1.0, true and "1" are different facts: each is asserted once.
    mixed = [make_fact("p", [v]) for v in (1.0, True, "1", b"\x01")]
    assert len(r.assert_facts(mixed)) == 1
    assert len(r.relations()["asserts"]) == 5
    # Retract and assert in one call: the fact stays, asserted anew.
    r.write_many([Retract(fact), Assert(fact)])
    assert encode_fact(fact)[0] in r.visible_cids()
    home.close()


def test_retract_of_a_fact_never_visible_writes_nothing(tmp_path) -> None:
    home = Home(tmp_path / "a.sqlite", OWNER)
    assert home.replica.retract_facts([make_fact("p", [1])]) == []
    assert home.replica.delta_count() == 0
    home.close()


# ---------------------------------------------------------------- property


mixed_value = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0.0 or str(f) == "0.0"),
    st.booleans(),
    st.text(max_size=8),
    st.binary(max_size=8),
)


# Each example writes up to MAX_OPS + 1 facts and WRITE_MAX_OBSERVED + 1 deltas and syncs
# them twice through a real server (~4 s on a loaded machine): 4 in CI, 12 in long mode.
@settings(
    max_examples=12 if os.environ.get("MERKLOG_LONG") == "1" else 4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    big=st.lists(st.integers(0, 64), max_size=3),
    small=st.sampled_from([0, 1, limits.MAX_OPS - 1, limits.MAX_OPS, limits.MAX_OPS + 1]),
    values=st.lists(mixed_value, min_size=1, max_size=6),
    legacy=st.sampled_from([0, 1, limits.WRITE_MAX_OBSERVED, limits.WRITE_MAX_OBSERVED + 1]),
)
def test_writes_near_every_limit_are_accepted_by_a_real_peer(
    tmp_path_factory, big, small, values, legacy
) -> None:
    tmp = tmp_path_factory.mktemp("near")
    a = Home(tmp / "a.sqlite", OWNER)
    b = Home(tmp / "b.sqlite", PEER, a.replica.genesis)
    try:
        r = a.replica
        # Facts just under the per-fact limit, several of them in one write.
        bigs = [sized_fact("blob", limits.MAX_FACT_BYTES - k, i) for i, k in enumerate(big)]
        # Around MAX_OPS facts of mixed-type values in one write (1, 1.0, true, "1" differ).
        smalls = [make_fact("v", [i, values[i % len(values)]]) for i in range(small)]
        r.write_many([Assert(f) for f in bigs + smalls])
        # The same fact asserted by many deltas (an old writer, or concurrent writers),
        # then retracted here: the retract observes them all.
        shared = make_fact("shared", [values[0]])
        cid, data = encode_fact(shared)
        for seq in range(1, legacy + 1):
            legacy_delta(r, OLD, seq, [{"op": "assert", "fact": cid}], [(cid, data)])
        r.write_many([Retract(shared), Retract(smalls[0])] if smalls else [Retract(shared)])
        assert cid not in r.visible_cids()
        # Every delta written here fits the receiver's limits ...
        for delta in r.iter_deltas():
            assert len(delta.data) <= limits.MAX_DELTA_BYTES
            assert len(delta.ops) <= limits.MAX_OPS
            for op in delta.ops:
                if op["op"] == "retract" and delta.author == OWNER.public_key:
                    assert len(op["observed"]) <= limits.WRITE_MAX_OBSERVED
        # ... and a real peer takes all of it, in both directions.
        asyncio.run(sync_to_peer(r, b.replica))
        assert_same(r, b.replica)
        c = Home(tmp / "c.sqlite", PEER, a.replica.genesis)
        asyncio.run(sync_to_peer(c.replica, b.replica))
        assert_same(c.replica, b.replica)
        c.close()
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- old shapes, batching


def test_datasets_holding_old_oversized_deltas_sync_again(tmp_path) -> None:
    a = Home(tmp_path / "a.sqlite", OWNER)
    b = Home(tmp_path / "b.sqlite", PEER, a.replica.genesis)
    r = a.replica
    # A 1.1 MB fact, as `put` accepted before the limit existed.
    huge = sized_fact("blob", 1_100_000, 0)
    hcid, hdata = encode_fact(huge)
    legacy_delta(r, OLD, 1, [{"op": "assert", "fact": hcid}], [(hcid, hdata)])
    # 1,025 asserts of one fact, then one retract listing all of them in one op.
    fact = make_fact("p", [1])
    cid, data = encode_fact(fact)
    for seq in range(2, 2 + 1025):
        legacy_delta(r, OLD, seq, [{"op": "assert", "fact": cid}], [(cid, data)])
    observed = sorted(link for link, in_ in r.relations()["asserts"] if in_ == cid)
    assert len(observed) == 1025
    legacy_delta(r, OLD, 3000, [{"op": "retract", "fact": cid, "observed": observed}], [])
    r.assert_facts([make_fact("after", [1])])  # a new write on top still travels
    asyncio.run(sync_to_peer(r, b.replica))
    assert_same(r, b.replica)
    assert hcid in b.replica.visible_cids() and cid not in b.replica.visible_cids()
    a.close()
    b.close()


def test_a_delta_reasserting_stored_facts_past_the_limit_is_refused(
    tmp_path, monkeypatch
) -> None:
    """QA: a writer signed one 16 KB delta re-asserting 280 stored facts of ~1 MB and
    pushed the delta alone: acceptance counted only the fact blocks that came with it,
    took it, and every later sync answer carried the delta with all 280 MB of its facts,
    over what any peer takes: every peer stopped syncing for good. Acceptance now counts
    the stored blocks too (``RECEIVE_MAX_DELTA_FACT_BYTES``, here lowered to 64 KiB):
    the delta is refused and nothing of it applied, while deltas within it (what a
    writer makes) keep syncing to a real peer."""
    from merklog.replication import acceptance, packing

    monkeypatch.setattr(acceptance, "RECEIVE_MAX_DELTA_FACT_BYTES", 64 << 10)
    monkeypatch.setattr(packing, "WRITE_MAX_DELTA_FACT_BYTES", 32 << 10)  # below, as ever
    a = Home(tmp_path / "a.sqlite", OWNER)
    b = Home(tmp_path / "b.sqlite", PEER, a.replica.genesis)
    r = a.replica
    big = [sized_fact("big", 10_000, i) for i in range(10)]
    r.assert_facts(big)  # 100 KB of stored facts, in deltas of 30 KB the writer packs
    asyncio.run(sync_to_peer(r, b.replica))
    assert_same(r, b.replica)
    before = (r.heads(), r.visible_cids(), r.delta_count())
    ops = [{"op": "assert", "fact": encode_fact(f)[0]} for f in big]
    heads = r.heads()
    clock = 1 + max(r._clock_of(h) or 0 for h in heads)
    delta = build_delta(OLD, r.dataset, 1, clock, heads, ops)  # the delta block alone
    with pytest.raises(TooLarge, match="bytes of facts"):
        r.apply_blocks([(delta.cid, delta.data)])
    assert (r.heads(), r.visible_cids(), r.delta_count()) == before
    ok = build_delta(OLD, r.dataset, 1, clock, heads, ops[:5])  # 50 KB: within the limit
    r.apply_blocks([(ok.cid, ok.data)])
    r.assert_facts([make_fact("after", [1])])
    asyncio.run(sync_to_peer(r, b.replica))
    assert_same(r, b.replica)
    a.close()
    b.close()


def test_large_histories_travel_in_several_bounded_requests(tmp_path) -> None:
    a = Home(tmp_path / "a.sqlite", OWNER)
    b = Home(tmp_path / "b.sqlite", PEER, a.replica.genesis)
    c = Home(tmp_path / "c.sqlite", PEER, a.replica.genesis)
    for i in range(40):
        a.replica.assert_facts([make_fact("row", [i, j, "x" * 200]) for j in range(20)])
    small = Limits(max_response=32 << 10)
    # Push: the client splits into bodies of ~32 KiB.
    stats = asyncio.run(sync_to_peer(a.replica, b.replica, small, max_batch=32 << 10))
    assert stats.round_trips > 3
    assert_same(a.replica, b.replica)
    # Pull: the server answers in responses of ~32 KiB; the client asks again.
    stats = asyncio.run(sync_to_peer(c.replica, b.replica, small))
    assert stats.round_trips > 3
    assert_same(c.replica, b.replica)
    for h in (a, b, c):
        h.close()


def test_sync_with_a_peer_that_is_down_says_so(tmp_path) -> None:
    import socket

    a = Home(tmp_path / "a.sqlite", OWNER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        async with SyncClient(OWNER) as client:
            await client.sync(f"http://127.0.0.1:{port}", a.replica)

    with pytest.raises(PeerUnreachable) as info:
        asyncio.run(go())
    assert f"127.0.0.1:{port}" in str(info.value) and info.value.code == "peer_unreachable"
    a.close()


def test_async_messages_stay_within_the_inbox_limits(tmp_path) -> None:
    from aiohttp import ClientSession

    from merklog.replication.messages import Inbox, Outbox

    a_store = SQLiteBlockStore(tmp_path / "a.sqlite")
    b_store = SQLiteBlockStore(tmp_path / "b.sqlite")
    outbox = Outbox(a_store.conn, OWNER, blockstore=a_store)
    got = []
    inbox = Inbox(b_store.conn, got.append, blockstore=b_store)
    allow = AllowList()
    allow.allow(OWNER.public_key)

    async def go() -> None:
        runner = web.AppRunner(make_sync_app({}, allow, inbox=inbox))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            # Over the per-message limit: refused at put, never queued.
            with pytest.raises(TooLarge):
                outbox.put(url, "big", ["x" * limits.MAX_MESSAGE_BYTES])
            # 200 messages just under it (~12 MiB, over the 4 MiB inbox body): they go in
            # several requests within the receiver's body limit, all accepted.
            near = "y" * (limits.MAX_MESSAGE_BYTES - 300)
            outbox.put_many((url, "near", [i, near]) for i in range(200))
            async with ClientSession() as session:
                report = await outbox.deliver(session)
            assert report.delivered == 200 and report.failed == 0, report.errors
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert sorted(m.fact.args[0] for m in got) == list(range(200))
    a_store.close()
    b_store.close()


def test_a_retract_names_each_observed_assert_once_even_from_a_damaged_index(tmp_path) -> None:
    """A fact CID with two ids in ``repl_fact`` (a table damaged by hand, or by a
    merklog whose schema lacked the UNIQUE) made a retract list one delta twice in
    ``observed``: every peer refused that delta for good ("observed must be sorted and
    free of duplicates") and the writer noticed nothing. The writer lists each once."""
    from merklog.replication.blocks import parse_delta

    home = Home(tmp_path / "a.sqlite", OWNER)
    fact = make_fact("p", [1])
    [asserted] = home.replica.assert_facts([fact])
    conn = home.store.conn
    with home.store.transaction():  # the damage: the same CID under a second id
        conn.execute("CREATE TABLE repl_fact_loose (id INTEGER PRIMARY KEY, cid BLOB NOT NULL)")
        conn.execute("INSERT INTO repl_fact_loose SELECT id, cid FROM repl_fact")
        conn.execute("DROP VIEW repl_assert_cid")
        conn.execute("DROP VIEW repl_rel_member")
        conn.execute("DROP TABLE repl_fact")
        conn.execute("ALTER TABLE repl_fact_loose RENAME TO repl_fact")
        [(old_id,)] = conn.execute("SELECT id FROM repl_fact").fetchall()
        conn.execute(
            "INSERT INTO repl_fact (cid) SELECT cid FROM repl_fact WHERE id = ?", (old_id,)
        )
        conn.execute(
            "INSERT INTO repl_assert (ds, fact, delta, killed) SELECT ds, last_insert_rowid(),"
            " delta, killed FROM repl_assert WHERE fact = ?",
            (old_id,),
        )
    from merklog.replication.schema import SCHEMA

    for statement in SCHEMA.split(";"):  # the views, back on the loose table
        if "CREATE VIEW" in statement:
            conn.execute(statement)
    delta_cid = home.replica.retract_facts([fact])[0]
    delta = parse_delta(delta_cid, home.store.get(delta_cid))  # what every peer checks
    [op] = delta.ops
    assert op["op"] == "retract" and len(op["observed"]) == 1
    home.close()
