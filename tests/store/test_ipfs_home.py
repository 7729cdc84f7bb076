"""IPFSHomeStore against a real js-ipfs daemon: batched pinned writes, all-or-nothing
transactions, verified reads, and clear errors from a daemon that is down or lies."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import threading

import pytest
from aiohttp import web

from merklog.store import CIDMismatch, Link, StoreError, encode, encode_fact, make_fact
from merklog.store.ipfs import api_multiaddr
from merklog.store.ipfs_home import IPFSHomeStore

from ..ipfsproxy import ImportProxy

pytestmark = [
    pytest.mark.ipfs,
    pytest.mark.filterwarnings("ignore:The 'strict' parameter:FutureWarning"),
]


@pytest.fixture
def home_store(tmp_path, ipfs_daemon):
    store = IPFSHomeStore(tmp_path / "home.sqlite", ipfs_daemon, timeout=30)
    yield store
    store.close()


def _facts(tag: str, n: int) -> list:
    """Mixed-type facts (1, 1.0, true, "1", bytes differ) unique to this test run."""
    token = os.urandom(6).hex()
    values = [1, 1.0, True, "1", b"\x01"]
    return [make_fact(tag, [token, i, values[i % len(values)]]) for i in range(n)]


def _pins(store: IPFSHomeStore, cid: Link) -> str:
    """The daemon's pin type for ``cid`` ("direct", "recursive", "indirect through …")."""
    keys = store.remote.client.pin.ls(str(cid))["Keys"]
    (kind,) = [v["Type"] for k, v in keys.items() if Link.parse(k) == cid]  # any base
    return kind


def test_put_facts_land_on_the_daemon_pinned_and_survive_gc(home_store, ipfs_daemon_handle):
    facts = _facts("pinned", 300)
    cids = home_store.put_facts(facts)
    assert len(set(cids)) == 300  # 1, 1.0, true, "1", x"01" stay distinct values
    ipfs_daemon_handle.call("repo/gc")
    for cid, fact in zip(cids[:20], facts, strict=False):
        assert _pins(home_store, cid).startswith(("indirect", "recursive", "direct"))
        assert home_store.remote.get(cid) == encode_fact(fact)[1]
    assert home_store.count_facts("pinned") == 300


def test_linking_blocks_are_pinned_directly(home_store, ipfs_daemon_handle):
    """A block linking elsewhere (a delta and its parents) is pinned alone: the daemon
    must not walk to (or, offline, wait for) blocks it does not hold."""
    absent, _ = encode_fact(make_fact("absent", [os.urandom(8).hex()]))
    data = encode({"kind": "delta", "parents": [absent]})
    cid = home_store.put_block(data)
    assert _pins(home_store, cid) == "direct"
    ipfs_daemon_handle.call("repo/gc")
    assert home_store.remote.get(cid) == data


def test_failed_savepoint_drops_its_blocks(home_store):
    kept, dropped = _facts("kept", 1)[0], _facts("dropped", 1)[0]
    with home_store.transaction():
        home_store.put_facts([kept])
        with pytest.raises(RuntimeError):
            with home_store.transaction():
                home_store.put_facts([dropped])
                raise RuntimeError("inner step failed")
    assert home_store.count_facts("kept") == 1
    assert home_store.count_facts("dropped") == 0
    assert home_store.has(encode_fact(kept)[0])
    assert not home_store.has(encode_fact(dropped)[0])


def test_tampered_block_on_the_daemon_is_rejected_and_not_cached(
    home_store, ipfs_daemon_handle, tmp_path
):
    """A block this home lacks comes from the daemon; bytes not matching the CID are refused."""
    fact = _facts("tamper", 1)[0]
    cid, data = encode_fact(fact)
    other = IPFSHomeStore(tmp_path / "other.sqlite", ipfs_daemon_handle.api_addr)
    try:
        other.put_facts([fact])
    finally:
        other.close()
    assert not home_store.has(cid)
    assert home_store.get(cid) == data  # fetched from the daemon, verified
    key = base64.b32encode(cid.raw[2:]).decode().rstrip("=")
    (path,) = (ipfs_daemon_handle.repo / "blocks").glob(f"*/{key}.data")
    path.write_bytes(encode_fact(make_fact("tamper", ["evil"]))[1])
    with pytest.raises(CIDMismatch) as err:
        home_store.get(cid)
    assert err.value.expected == cid
    with pytest.raises(CIDMismatch):
        list(home_store.get_many([cid]))
    assert not home_store.has(cid)


def test_unreachable_daemon_fails_at_open(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(StoreError, match=r"is not reachable \(.*asked for version\)"):
        IPFSHomeStore(tmp_path / "x.sqlite", f"http://127.0.0.1:{port}", timeout=2)
    assert not (tmp_path / "x.sqlite").exists()


class _FakeAPI:
    """A loopback HTTP server posing as an IPFS API: a fault a real daemon will not produce.

    ``/version`` answers like js-ipfs; every other call gets ``answer`` (garbage), or
    never an answer when ``hang`` is set.
    """

    def __init__(self, answer: bytes = b"<html>not an IPFS API</html>", hang: bool = False):
        self.answer = answer
        self.hang = hang
        self.calls: list[str] = []
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(request.path)
        await request.read()
        if request.path.endswith("/version"):
            return web.json_response({"Version": "0.18.1", "Commit": "", "Repo": "12"})
        if self.hang:
            assert self._stop is not None
            await self._stop.wait()  # until the test ends: no answer in the meantime
        return web.Response(body=self.answer, content_type="application/json")

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> _FakeAPI:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:  # the server's loop runs in its thread: stop it there
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.mark.parametrize("answer", [b"<html>nope</html>", b'{"Root": 1}', b""])
def test_daemon_answering_garbage_rolls_the_write_back(tmp_path, answer):
    with _FakeAPI(answer) as fake:
        store = IPFSHomeStore(tmp_path / "g.sqlite", f"http://127.0.0.1:{fake.port}", timeout=5)
        try:
            with pytest.raises(StoreError, match="IPFS"):
                store.put_facts(_facts("garbage", 10))
            assert store.count_facts() == 0
            assert len(store) == 0
            assert "/api/v0/dag/import" in fake.calls
        finally:
            store.close()


def test_daemon_that_never_answers_fails_within_the_timeout(tmp_path):
    with _FakeAPI(hang=True) as fake:
        store = IPFSHomeStore(tmp_path / "s.sqlite", f"http://127.0.0.1:{fake.port}", timeout=1)
        try:
            with pytest.raises(StoreError, match="did not answer|timed out"):
                store.put_facts(_facts("slow", 3))
            assert len(store) == 0
        finally:
            store.close()


@pytest.mark.parametrize(
    ("text", "addr"),
    [
        ("http://127.0.0.1:5001", "/ip4/127.0.0.1/tcp/5001/http"),
        ("http://127.0.0.1:5001/api/v0", "/ip4/127.0.0.1/tcp/5001/http"),
        ("http://[::1]:5002", "/ip6/::1/tcp/5002/http"),
        ("http://ipfs:5001", "/dns/ipfs/tcp/5001/http"),
        ("/ip4/10.0.0.1/tcp/5001/http", "/ip4/10.0.0.1/tcp/5001/http"),
        ("/ip4/10.0.0.1/tcp/5001", "/ip4/10.0.0.1/tcp/5001"),
        ("/dns4/ipfs/tcp/5001/https", "/dns4/ipfs/tcp/5001/https"),
        ("/ip6/::1/tcp/5001/http", "/ip6/::1/tcp/5001/http"),
    ],
)
def test_api_addresses_accept_urls_and_multiaddrs(text, addr):
    assert api_multiaddr(text) == addr


@pytest.mark.parametrize(
    "text",
    [
        "ftp://x:1",
        "127.0.0.1:5001",
        "http://h:notaport",
        # Multiaddrs were passed on unchecked: the HTTP client's "Unsupported Multiaddr
        # pattern" then read as a daemon that cannot be reached (exit 1, not bad input).
        "/garbage",
        "/ip4/127.0.0.1/tcp/99999/http",
        "/ip4/127.0.0.1/udp/5001/http",
        "/ip4/300.1.1.1/tcp/5001/http",
        "/ip6/127.0.0.1/tcp/5001/http",
        "/ip4/127.0.0.1/tcp/5001/ws",
        "/dns//tcp/5001/http",
    ],
)
def test_bad_api_address_is_a_clear_error(text):
    with pytest.raises(StoreError, match="not an IPFS API address"):
        api_multiaddr(text)


def test_a_daemon_that_fails_to_pin_is_unavailable_not_a_store_fault(tmp_path):
    """A daemon shutting down answers ``dag/import`` with ``PinErrorMsg: Database is not
    open``: that was a plain StoreError (exit 1); it is StoreUnavailable (exit 4, worth
    retrying), the write rolled back, like any daemon failure."""
    from merklog.store.errors import StoreUnavailable

    answer = b'{"Root": {"Cid": {"/": "bafyreib"}, "PinErrorMsg": "Database is not open"}}'
    with _FakeAPI(answer) as fake:
        store = IPFSHomeStore(tmp_path / "p.sqlite", f"http://127.0.0.1:{fake.port}", timeout=5)
        try:
            with pytest.raises(StoreUnavailable, match="could not pin .*Database is not open"):
                store.put_facts(_facts("pin", 3))
            assert len(store) == 0
        finally:
            store.close()


class _HoldingProxy(ImportProxy):
    """An :class:`ImportProxy` that, once armed, keeps a ``dag/import`` request from
    reaching the daemon (``held`` is then set) until ``release``."""

    def __init__(self, target_port: int) -> None:
        self.held = threading.Event()
        self.release = threading.Event()
        super().__init__(target_port, self._hold)

    def _hold(self) -> None:
        self.held.set()
        self.release.wait(120)

    def close(self) -> None:
        self.release.set()
        super().close()


def test_a_write_waiting_for_the_daemon_lets_other_threads_read(tmp_path, ipfs_daemon_handle):
    """A write waiting for the daemon held the store's lock, so every reader of the home
    waited with it (a stopped daemon: its whole timeout). Now other threads read the last
    committed state meanwhile (not the waiting write's rows), a transaction another
    thread opens waits until the first one ends, and both then commit, pinned."""
    proxy = _HoldingProxy(ipfs_daemon_handle.api_port)
    store = IPFSHomeStore(tmp_path / "h.sqlite", f"http://127.0.0.1:{proxy.port}", timeout=60)
    try:
        old, new, other = _facts("old", 5), _facts("new", 5), _facts("other", 5)
        old_cids = store.put_facts(old)
        proxy.armed = True
        writes: dict[str, list[Link]] = {}
        writer = threading.Thread(target=lambda: writes.update(new=store.put_facts(new)))
        writer.start()
        assert proxy.held.wait(60)  # the write's blocks wait on their way to the daemon
        seen: dict[str, object] = {}

        def read() -> None:
            seen["count"] = store.count_facts()
            seen["old"] = [store.get(c) for c in old_cids] == [encode_fact(f)[1] for f in old]
            seen["new"] = store.has_many(encode_fact(f)[0] for f in new)
            with store.lock:  # the shared connection, as replication reads it
                (seen["rows"],) = store.conn.execute("SELECT count(*) FROM facts").fetchone()

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(60)
        assert not reader.is_alive() and "rows" in seen  # it did not wait for the write
        assert seen == {"count": 5, "old": True, "new": set(), "rows": 5}
        second = threading.Thread(target=lambda: writes.update(other=store.put_facts(other)))
        second.start()
        second.join(1)
        assert second.is_alive() and "other" not in writes  # waits for the first write
        assert writer.is_alive()
        proxy.release.set()
        writer.join(60)
        second.join(60)
        assert sorted(writes) == ["new", "other"]
        assert store.count_facts() == 15
        for cid in writes["new"][:2] + writes["other"][:2]:
            assert _pins(store, cid).startswith(("indirect", "recursive", "direct"))
    finally:
        proxy.close()
        store.close()
