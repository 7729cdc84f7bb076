"""``POST /v1/datasets/{id}/blocks`` on a real aiohttp server on 127.0.0.1: blocks by CID,
only the dataset's, bounded requests and responses, signed like every peer route."""

from __future__ import annotations

import hashlib
import json

import aiohttp
import pytest
from aiohttp import web

from merklog.replication import limits
from merklog.replication.auth import AllowList, sign_headers
from merklog.replication.client import SyncClient
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.replication.server import SYNC_SERVICE, Limits, make_sync_app
from merklog.store import Link, fact_cid, make_fact
from merklog.store.sqlite import SQLiteBlockStore

#: Five values that Python's == would merge into fewer: each is its own fact and block.
MIXED = [1, 1.0, True, "1", b"\x01"]


class Server:
    """Replicas on a real SQLite file and the sync app on an ephemeral loopback port."""

    def __init__(self, tmp_path, limits_: Limits | None = None) -> None:
        self.identity = Identity.generate()
        self.blocks = SQLiteBlockStore(tmp_path / "server.sqlite")
        self.replicas: dict = {}
        self.allow = AllowList()
        self.limits = limits_
        self.url = ""

    async def start(self) -> None:
        self.app = make_sync_app(self.replicas, self.allow, limits=self.limits)
        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def create(self, name: str) -> Replica:
        replica = Replica.create(self.blocks.conn, self.blocks, self.identity, name)
        self.replicas[replica.dataset] = replica
        return replica

    @property
    def metrics(self):
        return self.app[SYNC_SERVICE].metrics


@pytest.fixture
async def server(tmp_path):
    made: list[Server] = []

    async def make(limits_: Limits | None = None) -> Server:
        where = tmp_path / str(len(made))
        where.mkdir()
        s = Server(where, limits_)
        await s.start()
        made.append(s)
        return s

    yield make
    for s in made:
        await s.runner.cleanup()
        s.blocks.close()


async def test_serves_the_asked_blocks_of_the_dataset_and_nothing_else(server) -> None:
    srv = await server()
    caller = Identity.generate()
    shared, other = srv.create("shared"), srv.create("other")
    srv.allow.allow(caller.public_key, [shared.dataset])
    mixed = [make_fact("v", [x]) for x in MIXED]
    shared.assert_facts(mixed + [make_fact("edge", [i, i + 1]) for i in range(50)])
    other.assert_facts([make_fact("secret", ["other dataset"])])
    cids = [fact_cid(f) for f in mixed]
    assert len(set(cids)) == 5
    head = shared.heads()[0]
    not_named = fact_cid(make_fact("secret", ["other dataset"]))  # same store, other dataset
    assert srv.blocks.has(not_named)
    absent = Link.for_block(b"never stored", 0x55)
    seen: list[tuple[int, int]] = []
    async with SyncClient(caller) as client:
        fetch = await client.get_blocks(
            srv.url,
            shared.dataset,
            [*cids, head, shared.dataset, not_named, absent],
            lambda blocks, size: seen.append((blocks, size)),
        )
    assert set(fetch.found) == {*cids, head, shared.dataset}
    for cid, data in fetch.found.items():
        assert data == srv.blocks.get(cid)
    assert fetch.requests == 1 and srv.metrics["block_requests"] == 1
    assert srv.metrics["blocks_out"] == 7
    assert fetch.block_bytes == sum(len(d) for d in fetch.found.values())
    assert seen == [(7, fetch.block_bytes)]
    # Only what was asked moved: the CAR framing is a few bytes per block, not the log.
    assert fetch.bytes_received < fetch.block_bytes + 7 * 64 + 128


async def test_requests_and_responses_stay_within_the_receivers_limits(server) -> None:
    srv = await server(Limits(max_response=1))  # one block per response
    caller = Identity.generate()
    replica = srv.create("many")
    srv.allow.allow(caller.public_key)
    facts = [make_fact("n", [i, float(i), str(i)]) for i in range(limits.WRITE_MAX_BLOCK_REQUEST)]
    replica.assert_facts(facts)
    wanted = [fact_cid(f) for f in facts[:5]]
    async with SyncClient(caller) as client:
        fetch = await client.get_blocks(srv.url, replica.dataset, wanted)
    assert set(fetch.found) == set(wanted) and fetch.requests == 5

    srv2 = await server()
    replica2 = srv2.create("many")
    srv2.allow.allow(caller.public_key)
    replica2.assert_facts(facts)
    many = [fact_cid(f) for f in facts] + [Link.for_block(b"x%d" % i, 0x55) for i in range(10)]
    async with SyncClient(caller) as client:
        fetch = await client.get_blocks(srv2.url, replica2.dataset, many)
    assert len(fetch.found) == len(facts)
    assert fetch.requests == 2  # at most WRITE_MAX_BLOCK_REQUEST CIDs per request

    path = f"/v1/datasets/{replica2.dataset}/blocks"

    async def post(body: bytes, identity: Identity | None = caller) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if identity is not None:
            digest = hashlib.sha256(body).hexdigest()
            headers.update(sign_headers(identity, "POST", path, digest))
        async with (
            aiohttp.ClientSession() as session,
            session.post(srv2.url + path, data=body, headers=headers) as resp,
        ):
            return resp.status, await resp.json()

    too_many = json.dumps({"cids": [str(wanted[0])] * (limits.RECEIVE_MAX_BLOCK_REQUEST + 1)})
    status, body = await post(too_many.encode())
    assert status == 413 and body["error"] == "too_large"
    status, body = await post(b'{"cids": "not a list"}')
    assert status == 400 and body["error"] == "malformed_block"
    status, body = await post(b'{"cids": ["not a cid"]}')
    assert status == 400
    ok = json.dumps({"cids": [str(wanted[0])]}).encode()
    status, body = await post(ok, identity=None)
    assert status == 401
    status, body = await post(ok, identity=Identity.generate())  # not in the allow list
    assert status == 403
    assert srv2.metrics["rejected"] == 5


async def test_a_corrupted_block_on_the_server_is_not_served(server, tmp_path) -> None:
    srv = await server()
    caller = Identity.generate()
    replica = srv.create("d")
    srv.allow.allow(caller.public_key)
    good, bad = make_fact("x", [1]), make_fact("x", [1.0])
    replica.assert_facts([good, bad])
    with srv.blocks.transaction() as conn:
        conn.execute(
            "UPDATE blocks SET data = ? WHERE cid = ?", (b"\x00garbage", fact_cid(bad).raw)
        )
    async with SyncClient(caller) as client:
        fetch = await client.get_blocks(srv.url, replica.dataset, [fact_cid(bad), fact_cid(good)])
    assert set(fetch.found) == {fact_cid(good)}


async def test_a_peer_without_the_blocks_route_is_read_the_old_way(tmp_path) -> None:
    """An older peer (no ``…/blocks`` route: 404) still repairs: its log is read instead."""
    from merklog.replication.server import sync_routes

    blocks = SQLiteBlockStore(tmp_path / "old.sqlite")
    owner, caller = Identity.generate(), Identity.generate()
    replica = Replica.create(blocks.conn, blocks, owner, "d")
    replica.assert_facts([make_fact("x", [1]), make_fact("x", ["1"])])
    allow = AllowList()
    allow.allow(caller.public_key)
    routes, _service = sync_routes({replica.dataset: replica}, allow)
    app = web.Application()
    app.add_routes([r for r in routes if not r.path.endswith("/blocks")])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        wanted = {fact_cid(make_fact("x", ["1"]))}
        async with SyncClient(caller) as client:
            fetch = await client.fetch_blocks(url, replica, wanted)
        assert fetch.from_log and set(fetch.found) == wanted
    finally:
        await runner.cleanup()
        blocks.close()


async def test_a_large_response_streams_in_bounded_memory(server) -> None:
    """40 blocks of ~800 kB (one response of ~32 MB) leave the server a run of about
    1 MiB at a time: the response is chunked and the process's traced allocations
    while serving and reading it stay far below its size; every block arrives intact."""
    import os
    import tracemalloc

    from merklog.store.car import car_header, car_section

    srv = await server()
    caller = Identity.generate()
    replica = srv.create("big")
    srv.allow.allow(caller.public_key)
    facts = [make_fact("big", [i, os.urandom(800_000)]) for i in range(40)]
    for i in range(0, 40, 8):
        replica.assert_facts(facts[i : i + 8])
    wanted = [fact_cid(f) for f in facts]
    expected = hashlib.sha256(car_header([replica.dataset]))
    for cid in wanted:
        expected.update(car_section(cid, srv.blocks.get(cid)))
    del facts
    path = f"/v1/datasets/{replica.dataset}/blocks"
    body = json.dumps({"cids": [str(c) for c in wanted]}).encode()
    headers = {"Content-Type": "application/json"}
    headers.update(sign_headers(caller, "POST", path, hashlib.sha256(body).hexdigest()))
    got = hashlib.sha256()
    size = 0
    async with aiohttp.ClientSession() as session:
        tracemalloc.start()
        try:
            async with session.post(srv.url + path, data=body, headers=headers) as resp:
                assert resp.status == 200
                assert resp.headers["X-Merklog-Processed"] == "40"
                assert "Content-Length" not in resp.headers
                assert resp.headers.get("Transfer-Encoding") == "chunked"
                async for chunk in resp.content.iter_chunked(1 << 16):
                    got.update(chunk)
                    size += len(chunk)
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert size > 32_000_000 and got.digest() == expected.digest()
    assert peak < 16 << 20, f"serving {size} bytes peaked at {peak} traced bytes"
    assert srv.metrics["blocks_out"] == 40 and srv.metrics["bytes_out"] == size
    async with SyncClient(caller) as client:  # the receiver's checks: sizes, re-hashing
        fetch = await client.get_blocks(srv.url, replica.dataset, wanted)
    assert fetch.requests == 1 and set(fetch.found) == set(wanted)
    assert all(srv.blocks.get(c) == d for c, d in fetch.found.items())
