"""Hostile input: every class is a 4xx JSON error, counted in metrics, nothing applied.

Rule under test (docs/sync-protocol.md): a pushed CAR is applied all-or-nothing;
a bad block anywhere rejects the whole batch, including valid deltas before it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import time

import pytest
from aiohttp import ClientSession, web

from merklog.replication.auth import AllowList, sign_headers
from merklog.replication.blocks import Delta, build_delta, parse_delta
from merklog.replication.client import SyncClient
from merklog.replication.errors import CycleError, Unauthorized
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.replication.server import SYNC_SERVICE, Limits, make_sync_app
from merklog.store import Link, encode, encode_fact, make_fact
from merklog.store.car import car_header, car_section, iter_car
from merklog.store.sqlite import SQLiteBlockStore


class Node:
    def __init__(self, tmp_path, limits: Limits) -> None:
        self.owner = Identity.generate()
        self.writer = Identity.generate()
        self.peer = Identity.generate()  # allowed to sync
        self.store = SQLiteBlockStore(tmp_path / "node.sqlite")
        self.replica = Replica.create(
            self.store.conn, self.store, self.owner, "hostile", [self.writer.public_key]
        )
        self.replica.assert_facts([make_fact("base", [i]) for i in range(3)])
        self.allow = AllowList({self.peer.public_key: None})
        self.app = make_sync_app({self.replica.dataset: self.replica}, self.allow, limits=limits)

    def state(self) -> tuple:
        return (
            self.replica.heads(),
            self.replica.visible_cids(),
            self.replica.delta_count(),
            len(self.store),
        )

    @property
    def metrics(self):
        return self.app[SYNC_SERVICE].metrics


@pytest.fixture
async def node(tmp_path):
    n = Node(tmp_path, Limits(max_push_body=1 << 20, max_block=64 << 10, read_timeout=0.5))
    runner = web.AppRunner(n.app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    n.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    async with ClientSession() as session:
        n.session = session
        yield n
    await runner.cleanup()
    n.store.close()


def delta_for(node: Node, author: Identity, ops, parents=None, clock=None, facts=()) -> list:
    """Blocks (facts then delta) of a delta on top of the node's heads."""
    r = node.replica
    parents = r.heads() if parents is None else parents
    if clock is None:
        clock = 1 + max((r._clock_of(p) or 0) for p in parents)
    d = build_delta(author, r.dataset, 1, clock, parents, ops)
    return [*[encode_fact(f) for f in facts], (d.cid, d.data)]


def assert_fact_ops(facts):
    return [{"op": "assert", "fact": encode_fact(f)[0]} for f in facts]


async def post(node: Node, path: str, body: bytes, ident: Identity | None = None, headers=None):
    ident = ident or node.peer
    h = sign_headers(ident, "POST", path, hashlib.sha256(body).hexdigest())
    h.update(headers or {})
    async with node.session.post(node.url + path, data=body, headers=h) as resp:
        return resp.status, await resp.json()


async def push(node: Node, blocks, **kw):
    body = b"".join(iter_car([], blocks))
    return await post(node, f"/v1/datasets/{node.replica.dataset}/push", body, **kw)


async def expect_rejected(node: Node, coro, status: int, code: str) -> dict:
    before = node.state()
    got_status, body = await coro
    assert (got_status, body["error"]) == (status, code), body
    assert body["detail"]
    assert node.metrics[f"rejected.{code}"] >= 1
    assert node.state() == before
    return body


FACT = make_fact("new", ["x"])


async def test_valid_push_is_accepted(node):
    status, body = await push(
        node, delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT])
    )
    assert status == 200 and body["accepted"] == 1
    assert encode_fact(FACT)[0] in node.replica.visible_cids()


async def test_body_too_large(node):
    big = [encode_fact(make_fact("big", [os.urandom(30_000).hex()])) for _ in range(20)]
    await expect_rejected(node, push(node, big), 413, "too_large")


async def test_block_too_large(node):
    huge = encode_fact(make_fact("huge", ["y" * (100 << 10)]))
    await expect_rejected(node, push(node, [huge]), 413, "too_large")


async def test_slow_body_times_out(node):
    path = f"/v1/datasets/{node.replica.dataset}/push"
    body = b"".join(
        iter_car([], delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT]))
    )
    h = sign_headers(node.peer, "POST", path, hashlib.sha256(body).hexdigest())

    async def slow():
        yield body[:10]
        await asyncio.sleep(2)
        yield body[10:]

    before = node.state()
    async with node.session.post(node.url + path, data=slow(), headers=h) as resp:
        assert resp.status == 408
        assert (await resp.json())["error"] == "timeout"
    assert node.metrics["rejected.timeout"] == 1
    assert node.state() == before


async def test_malformed_cbor_block(node):
    junk = b"\xff\xfe not cbor"
    await expect_rejected(
        node, push(node, [(Link.for_dag_cbor(junk), junk)]), 400, "malformed_block"
    )


async def test_truncated_car(node):
    body = b"".join(
        iter_car([], delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT]))
    )
    path = f"/v1/datasets/{node.replica.dataset}/push"
    await expect_rejected(node, post(node, path, body[:-5]), 400, "malformed_block")


async def test_malformed_sync_json(node):
    path = f"/v1/datasets/{node.replica.dataset}/sync"
    await expect_rejected(node, post(node, path, b"{not json"), 400, "malformed_block")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"[]", "got a JSON list"),  # was "list indices must be integers or slices, not str"
        (b"{}", '"heads" must be a list of CID strings'),  # was "'heads'"
        (b'{"heads": 5}', '"heads" must be a list of CID strings'),  # "'int' object is not …"
        (b'{"heads": ["nope"]}', '"heads" holds a bad CID'),
        (b'{"heads": [], "summary": 3}', "summary must be an object"),
    ],
)
async def test_a_malformed_sync_request_is_said_in_the_protocols_words(node, body, said):
    path = f"/v1/datasets/{node.replica.dataset}/sync"
    err = await expect_rejected(node, post(node, path, body), 400, "malformed_block")
    assert said in err["detail"], err


async def test_cid_mismatch(node):
    cid, data = encode_fact(FACT)
    body = car_header([]) + car_section(cid, data + b"\x00")
    path = f"/v1/datasets/{node.replica.dataset}/push"
    await expect_rejected(node, post(node, path, body), 400, "cid_mismatch")


async def test_bad_delta_signature(node):
    (fcid, fdata), (cid, data) = delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT])
    d = parse_delta(cid, data)
    forged = encode({**d.unsigned(), "sig": bytes(64)})
    await expect_rejected(
        node,
        push(node, [(fcid, fdata), (Link.for_dag_cbor(forged), forged)]),
        422,
        "invalid_signature",
    )


async def test_non_canonical_delta(node):
    (cid, data) = delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT])[-1]
    d = parse_delta(cid, data)
    obj = {**d.unsigned(), "sig": d.sig}
    obj["parents"] = list(reversed(d.parents)) + d.parents  # duplicates: not canonical
    bad = encode(obj)
    await expect_rejected(node, push(node, [(Link.for_dag_cbor(bad), bad)]), 400, "malformed_block")


async def test_unauthorized_author(node):
    stranger = Identity.generate()
    blocks = delta_for(node, stranger, assert_fact_ops([FACT]), facts=[FACT])
    await expect_rejected(node, push(node, blocks), 422, "unauthorized_author")


async def test_non_owner_cannot_grant(node):
    blocks = delta_for(node, node.writer, [{"op": "grant", "key": Identity.generate().public_key}])
    await expect_rejected(node, push(node, blocks), 422, "unauthorized_author")


async def test_unknown_parents(node):
    ghost = Link.for_dag_cbor(b"\xa0ghost")
    blocks = delta_for(
        node, node.writer, assert_fact_ops([FACT]), parents=[ghost], clock=5, facts=[FACT]
    )
    await expect_rejected(node, push(node, blocks), 422, "missing_parents")


async def test_missing_fact_block(node):
    blocks = delta_for(node, node.writer, assert_fact_ops([FACT]))  # fact block not sent
    await expect_rejected(node, push(node, blocks), 422, "missing_parents")


async def test_wrong_clock(node):
    blocks = delta_for(node, node.writer, assert_fact_ops([FACT]), clock=99, facts=[FACT])
    await expect_rejected(node, push(node, blocks), 422, "invalid_delta")


async def test_valid_then_invalid_rejects_whole_batch(node):
    good = delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT])
    good_delta = parse_delta(*good[-1])
    stranger = Identity.generate()
    d2 = build_delta(
        stranger,
        node.replica.dataset,
        1,
        good_delta.clock + 1,
        [good_delta.cid],
        assert_fact_ops([make_fact("evil", [1])]),
    )
    blocks = good + [encode_fact(make_fact("evil", [1])), (d2.cid, d2.data)]
    await expect_rejected(node, push(node, blocks), 422, "unauthorized_author")
    assert not node.replica.has_delta(good_delta.cid)


def test_self_reference_is_a_cycle_error():
    """A delta naming its own CID cannot be built (hashes), but a forged pair is refused."""
    ident = Identity.generate()
    fake_self = Link.for_dag_cbor(b"\xa0")
    d: Delta = build_delta(ident, fake_self, 1, 1, [fake_self], assert_fact_ops([FACT]))
    with pytest.raises(CycleError):
        parse_delta(fake_self, d.data)  # as if d.data hashed to fake_self
    obs = build_delta(
        ident,
        fake_self,
        1,
        1,
        [Link.for_dag_cbor(b"\x80")],
        [{"op": "retract", "fact": encode_fact(FACT)[0], "observed": [fake_self]}],
    )
    with pytest.raises(CycleError):
        parse_delta(fake_self, obs.data)


# ---------------------------------------------------------------- request authentication


async def test_replayed_request(node):
    path = f"/v1/datasets/{node.replica.dataset}/sync"
    body = b'{"heads": [], "summary": null}'
    h = sign_headers(node.peer, "POST", path, hashlib.sha256(body).hexdigest())
    async with node.session.post(node.url + path, data=body, headers=h) as resp:
        assert resp.status == 200
        await resp.read()
    async with node.session.post(node.url + path, data=body, headers=h) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"] == "replayed_request"
    assert node.metrics["rejected.replayed_request"] == 1


async def test_an_unlisted_key_takes_no_place_in_the_replay_cache(node):
    """QA: requests signed by a key nobody listed were refused (403) only after their
    nonce was remembered, so a stranger filled the replay cache (200,000 places, ~4
    minutes at ~1,000 requests/s) and every listed peer was then answered 429. A key the
    server does not admit is now refused before its nonce is kept: the same request
    again is 403 again, not a replay, and a cache of 3 places still serves the peer."""
    node.app[SYNC_SERVICE].guard.max_entries = 3
    path = f"/v1/datasets/{node.replica.dataset}/sync"
    body = b'{"heads": [], "summary": null}'
    stranger = Identity.generate()
    for _ in range(5):
        h = sign_headers(stranger, "POST", path, hashlib.sha256(body).hexdigest())
        for _again in range(2):  # the same signed request twice: refused both times
            async with node.session.post(node.url + path, data=body, headers=h) as resp:
                assert resp.status == 403, await resp.text()
    for _ in range(2):
        h = sign_headers(node.peer, "POST", path, hashlib.sha256(body).hexdigest())
        async with node.session.post(node.url + path, data=body, headers=h) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()


async def test_a_sync_request_names_each_head_once_and_a_bounded_number(node):
    """QA: one signed sync request naming 1,250,000 heads (78.7 MB, under the body
    limit) was decoded on the event loop for ~20 s, the node answering nothing else. It
    is decoded on a worker thread now, a head named many times counts once, and more
    distinct heads than the summary limit are refused (413) like a summary that is."""
    service = node.app[SYNC_SERVICE]
    service.limits = dataclasses.replace(service.limits, max_summary=1000)
    path = f"/v1/datasets/{node.replica.dataset}/sync"
    [head] = node.replica.heads()
    same = json.dumps({"heads": [str(head)] * 5000, "summary": None}).encode()
    h = sign_headers(node.peer, "POST", path, hashlib.sha256(same).hexdigest())
    async with node.session.post(node.url + path, data=same, headers=h) as resp:
        assert resp.status == 200, await resp.text()  # one head, which the server has
        await resp.read()
    others = [str(encode_fact(make_fact("h", [i]))[0]) for i in range(1001)]
    many = json.dumps({"heads": others, "summary": None}).encode()
    await expect_rejected(node, post(node, path, many), 413, "too_large")


async def test_stale_request(node):
    path = f"/v1/datasets/{node.replica.dataset}/heads"
    h = sign_headers(node.peer, "GET", path, now=time.time() - 3600)
    async with node.session.get(node.url + path, headers=h) as resp:
        assert resp.status == 401
        body = await resp.json()
        assert body["error"] == "stale_request"
        # said as the clocks it is about (QA: "outside the ±300 s window" named none)
        assert " s behind the clock of the node answering" in body["detail"]
        assert "clocks differ by more than the 300 s allowed" in body["detail"]
        assert body["detail"].split(" is ")[1].startswith(("3,600 s", "3,599 s", "3,601 s"))


async def test_bad_request_signature(node):
    path = f"/v1/datasets/{node.replica.dataset}/heads"
    h = sign_headers(node.peer, "GET", "/v1/other", now=time.time())
    async with node.session.get(node.url + path, headers=h) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"] == "bad_request_signature"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Merklog-Time", "9" * 309),  # overflowed the clock comparison: a 500, logged
        ("X-Merklog-Time", "\u0663\u0663"),  # Arabic-Indic digits, read as 33 by int()
        ("X-Merklog-Time", "-5"),
        ("X-Merklog-Key", "ab"),  # a key of one byte was checked as a signature
        ("X-Merklog-Signature", "00" * 8),
    ],
)
async def test_malformed_signature_headers_are_unauthenticated(node, header, value):
    """A malformed signature header is a 401 ``unauthenticated`` for anyone, signed or
    not: a 309-digit timestamp was a 500 with a traceback in the node's log."""
    path = f"/v1/datasets/{node.replica.dataset}/heads"
    h = sign_headers(node.peer, "GET", path)
    h[header] = value
    headers = {k: v.encode().decode("latin-1") for k, v in h.items()}  # raw bytes on the wire
    async with node.session.get(node.url + path, headers=headers) as resp:
        assert resp.status == 401, await resp.text()
        body = await resp.json()
    assert body["error"] == "unauthenticated" and "malformed" in body["detail"], body


async def test_unsigned_request(node):
    async with node.session.get(f"{node.url}/v1/datasets/{node.replica.dataset}/heads") as resp:
        assert resp.status == 401
        assert (await resp.json())["error"] == "unauthenticated"


async def test_digest_mismatch(node):
    blocks = delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT])
    body = b"".join(iter_car([], blocks))
    path = f"/v1/datasets/{node.replica.dataset}/push"
    h = sign_headers(node.peer, "POST", path, hashlib.sha256(b"other").hexdigest())
    before = node.state()
    async with node.session.post(node.url + path, data=body, headers=h) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"] == "digest_mismatch"
    assert node.state() == before


async def test_peer_not_allowed(node):
    blocks = delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT])
    await expect_rejected(node, push(node, blocks, ident=Identity.generate()), 403, "forbidden")


async def test_dataset_not_in_peer_scope(node):
    scoped = Identity.generate()
    node.allow.allow(scoped.public_key, [Link.for_dag_cbor(b"\xa0other")])
    blocks = delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT])
    await expect_rejected(node, push(node, blocks, ident=scoped), 403, "forbidden")


async def test_a_push_records_only_roots_that_are_deltas_here(node):
    """QA: a push may name any CAR roots (100,000 were taken), and all of them were
    recorded as the pusher's heads for its ``deltas_behind``. Only roots that are deltas
    of the replica are recorded, each once, at most ``MAX_PARENTS``."""
    seen: list[tuple] = []
    node.app[SYNC_SERVICE].on_served = lambda peer, kind, heads: seen.append((kind, heads))
    blocks = delta_for(node, node.writer, assert_fact_ops([FACT]), facts=[FACT])
    delta = blocks[-1][0]
    junk = [Link.for_dag_cbor(b"\xa0" + bytes([i])) for i in range(50)]
    roots = [*junk, delta, delta, blocks[0][0]]  # unknown CIDs, the delta twice, a fact
    body = b"".join(iter_car(roots, blocks))
    status, answer = await post(node, f"/v1/datasets/{node.replica.dataset}/push", body)
    assert status == 200 and answer["accepted"] == 1, answer
    assert seen == [("push", [delta])]


async def test_unknown_dataset(node):
    other = Link.for_dag_cbor(b"\xa0nope")
    status, body = await post(node, f"/v1/datasets/{other}/sync", b'{"heads": []}')
    assert (status, body["error"]) == (404, "not_found")


# ---------------------------------------------------------------- hostile server, client side


async def test_client_rejects_a_hostile_sync_response(tmp_path):
    """A peer answering /sync with a forged delta: the client applies nothing."""
    owner = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "client.sqlite")
    replica = Replica.create(store.conn, store, owner, "victim")
    replica.assert_facts([make_fact("mine", [1])])
    before = (replica.heads(), replica.visible_cids(), len(store))
    forger = Identity.generate()  # not a writer
    fact_cid, fact_data = encode_fact(make_fact("evil", [1]))
    forged = build_delta(
        forger, replica.dataset, 1, 2, replica.heads(), [{"op": "assert", "fact": fact_cid}]
    )
    body = b"".join(iter_car([forged.cid], [(fact_cid, fact_data), (forged.cid, forged.data)]))

    async def sync(_request):
        return web.Response(body=body, content_type="application/vnd.ipld.car")

    app = web.Application()
    app.router.add_post("/v1/datasets/{id}/sync", sync)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        async with SyncClient(owner) as client:
            with pytest.raises(Unauthorized):
                await client.pull(url, replica)
    finally:
        await runner.cleanup()
    assert (replica.heads(), replica.visible_cids(), len(store)) == before
    store.close()


async def test_compressed_body_bomb_is_cut_at_the_limit(node):
    """Limits count decompressed bytes: a tiny deflate body expanding past 1 MiB is refused."""
    import zlib

    raw = car_header([]) + b"\x00" * (4 << 20)
    body = zlib.compress(raw, 9)
    assert len(body) < 10_000
    path = f"/v1/datasets/{node.replica.dataset}/push"
    h = sign_headers(node.peer, "POST", path, hashlib.sha256(raw).hexdigest())
    h["Content-Encoding"] = "deflate"
    before = node.state()
    async with node.session.post(node.url + path, data=body, headers=h) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"] == "too_large"
    assert node.state() == before



class _Forger:
    """An "author" whose key is a point of small order and who holds no private key: its
    signature is the constant ``R`` = identity, ``S`` = 0."""

    def __init__(self, public_key: bytes) -> None:
        self.public_key = public_key

    def sign(self, data: bytes) -> bytes:
        return bytes([1]) + bytes(31) + bytes(32)


@pytest.mark.parametrize("weak", ["01" + "00" * 31, "00" * 32], ids=["identity", "order-4"])
def test_a_writer_key_of_small_order_signs_nothing(tmp_path, weak: str, monkeypatch) -> None:
    """QA: ``writers grant 00…00`` (or ``01 00…00``) was taken, and OpenSSL verifies forged
    signatures against such a key (for the identity point, ``R`` = identity and ``S`` = 0
    verify for every message): anyone could then write to the dataset with no private
    key. A replica where such a key is a writer (granted before this was checked) now
    refuses every delta signed with it, and the grant itself is refused."""
    from merklog.node.errors import NodeInputError
    from merklog.node.grants import grant
    from merklog.replication import identity
    from merklog.replication.errors import InvalidSignature

    key = bytes.fromhex(weak)
    owner = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "weak.sqlite")
    replica = Replica.create(store.conn, store, owner, "weak", [key])
    replica.assert_facts([make_fact("base", [0])])
    before = (replica.heads(), replica.visible_cids(), replica.delta_count())
    [head] = replica.heads()
    clock = max(d[2] for d in replica.delta_graph())
    refused = 0
    for i in range(200):  # the order-4 key verifies about one message in four
        fcid, fdata = encode_fact(make_fact("pwned", [i]))
        ops = [{"op": "assert", "fact": fcid}]
        delta = build_delta(_Forger(key), replica.dataset, 1, clock + 1, [head], ops)
        with pytest.raises(InvalidSignature):
            replica.apply_blocks([(fcid, fdata), (delta.cid, delta.data)])
        refused += 1
        assert (replica.heads(), replica.visible_cids(), replica.delta_count()) == before
        with monkeypatch.context() as m:  # OpenSSL alone: the forgery that was accepted
            m.setattr(identity, "_weak", lambda _key: False)
            try:
                replica.apply_blocks([(fcid, fdata), (delta.cid, delta.data)])
            except InvalidSignature:
                continue  # not forgeable for this message: the next one
        break
    else:
        pytest.fail("no forgery found: the premise (OpenSSL takes it) no longer holds")
    assert replica.delta_count() == before[2] + 1  # what the check now refuses
    with pytest.raises(NodeInputError, match="small order"):
        grant(replica, weak)
    store.close()
