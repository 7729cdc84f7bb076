"""``@async`` delivery: persisted outbox, signed POST /v1/inbox, retries, receiver dedup."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

from aiohttp import ClientSession, web

from merklog.replication.auth import AllowList, sign_headers
from merklog.replication.identity import Identity
from merklog.replication.messages import Inbox, Outbox, encode_message
from merklog.replication.server import SYNC_SERVICE, make_sync_app
from merklog.replication.txn import conn_lock
from merklog.store import make_fact
from merklog.store.car import iter_car
from merklog.store.sqlite import SQLiteBlockStore


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def test_outbox_delivers_once_with_retries_and_dedup(tmp_path):
    sender = Identity.generate()
    a_store = SQLiteBlockStore(tmp_path / "a.sqlite")
    b_store = SQLiteBlockStore(tmp_path / "b.sqlite")
    outbox = Outbox(a_store.conn, sender, blockstore=a_store)
    got = []
    inbox = Inbox(b_store.conn, got.append, blockstore=b_store)
    app = make_sync_app({}, AllowList({sender.public_key: None}), inbox=inbox)
    runner, url = await serve(app)
    port = url.rsplit(":", 1)[1]
    try:
        outbox.put(url, "ping", [1, "hello"])
        outbox.put(url, "ping", [1, "hello"])  # same tuple, later epoch: a distinct message
        queued = a_store.conn.execute("SELECT cid, dest, data FROM repl_outbox").fetchall()
        async with ClientSession() as session:
            report = await outbox.deliver(session)
            assert report.delivered == 2 and outbox.pending_count() == 0
            assert [m.fact for m in got] == [make_fact("ping", [1, "hello"])] * 2
            assert all(m.sender == sender.public_key for m in got)
            # Delivered messages are deleted: nothing needs them any more.
            assert a_store.conn.execute("SELECT count(*) FROM repl_outbox").fetchone() == (0,)
            # Lost acknowledgement: the sender retries; the receiver deduplicates by CID.
            a_store.conn.executemany(
                "INSERT INTO repl_outbox (cid, dest, data) VALUES (?, ?, ?)", queued
            )
            report = await outbox.deliver(session)
            assert report.delivered == 2
            assert len(got) == 2
            assert app[SYNC_SERVICE].metrics["inbox_duplicates"] == 2
            # The node consumes inbox messages as the input of a later epoch.
            pending = inbox.pending()
            assert len(pending) == 2
            inbox.ack([pending[0].cid])
            assert [m.cid for m in inbox.drain()] == [pending[1].cid]
            assert inbox.pending() == []
            # Receiver down: delivery fails, backs off, is retried after restart.
            await runner.cleanup()
            outbox.put(url, "ping", [2, "later"])
            report = await outbox.deliver(session)
            assert report.failed == 1 and outbox.pending_count() == 1
            # in plain words, as sync says it (it quoted aiohttp's "Cannot connect to host
            # … ssl:default [Connect call failed ('127.0.0.1', N)]")
            assert report.errors == [f"{url}: connection refused"], report.errors
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", int(port)).start()
            assert (await outbox.deliver(session)).delivered == 0  # still backing off
            report = await outbox.deliver(session, now=time.time() + 120)
            assert report.delivered == 1 and outbox.pending_count() == 0
            assert got[-1].fact == make_fact("ping", [2, "later"])
    finally:
        await runner.cleanup()
        a_store.close()
        b_store.close()


async def test_outbox_survives_restart(tmp_path):
    ident = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "a.sqlite")
    Outbox(store.conn, ident, blockstore=store).put("http://127.0.0.1:9", "m", [1])
    store.close()
    store = SQLiteBlockStore(tmp_path / "a.sqlite")
    assert Outbox(store.conn, ident, blockstore=store).pending_count() == 1
    store.close()


async def test_inbox_rejects_spoofed_sender(tmp_path):
    sender, other = Identity.generate(), Identity.generate()
    store = SQLiteBlockStore(tmp_path / "b.sqlite")
    inbox = Inbox(store.conn, blockstore=store)
    app = make_sync_app({}, AllowList({sender.public_key: None}), inbox=inbox)
    runner, url = await serve(app)
    try:
        cid, data = encode_message(other.public_key, url, make_fact("m", [1]), b"n" * 12)
        body = b"".join(iter_car([], [(cid, data)]))
        h = sign_headers(sender, "POST", "/v1/inbox", hashlib.sha256(body).hexdigest())
        async with ClientSession() as session:
            async with session.post(url + "/v1/inbox", data=body, headers=h) as resp:
                assert resp.status == 403
                assert (await resp.json())["error"] == "sender_mismatch"
            # Unlisted peers may not deliver at all.
            h = sign_headers(other, "POST", "/v1/inbox", hashlib.sha256(body).hexdigest())
            async with session.post(url + "/v1/inbox", data=body, headers=h) as resp:
                assert resp.status == 403
                assert (await resp.json())["error"] == "forbidden"
        assert inbox.pending() == []
    finally:
        await runner.cleanup()
        store.close()


async def test_delivery_waits_for_the_store_off_the_event_loop(tmp_path):
    """A large write holds the store's lock in a worker thread for seconds; a delivery
    pass that waited for it on the event loop would stall every request meanwhile. Here
    the writer only lets go when a coroutine on the loop tells it to: with the wait on
    the loop, that coroutine could not run and the writer would time out."""
    ident = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "a.sqlite")
    try:
        outbox = Outbox(store.conn, ident, blockstore=store)
        outbox.put("http://127.0.0.1:9", "m", [1])  # nothing listens: the pass fails
        lock = conn_lock(store.conn, store)
        held, release = threading.Event(), threading.Event()

        def long_write() -> bool:
            with lock:
                held.set()
                return not release.wait(10)  # True: nobody on the loop could release it

        writer = asyncio.get_running_loop().run_in_executor(None, long_write)
        await asyncio.to_thread(held.wait)
        async with ClientSession() as session:
            delivery = asyncio.create_task(outbox.deliver(session, timeout=2))
            await asyncio.sleep(0.05)  # the pass starts and waits for the store
            release.set()
            assert await writer is False
            report = await delivery
        assert report.failed == 1 and outbox.pending_count() == 1
    finally:
        store.close()


def test_inbox_knows_it_is_empty_without_waiting_for_the_store(tmp_path):
    """An epoch asks the inbox every time; while a large write holds the connection's
    lock, "nothing pending" is answered from what this inbox received (ADR 0145), and a
    message received later, or left unconsumed before a restart, is still found."""
    sender = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "b.sqlite")
    inbox = Inbox(store.conn, blockstore=store)
    lock = conn_lock(store.conn, store)

    def while_locked(fn):
        taken, release, out = threading.Event(), threading.Event(), []

        def hold():
            with lock:
                taken.set()
                release.wait(30)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        assert taken.wait(10)
        worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
        worker.start()
        worker.join(5)
        answered = not worker.is_alive()
        release.set()
        holder.join(10)
        worker.join(10)
        return answered, out[0]

    def message(n):
        return encode_message(sender.public_key, "http://x", make_fact("m", [n]), b"n" * 12)

    assert inbox.pending() == []  # looked once: nothing
    assert while_locked(inbox.pending) == (True, [])
    inbox.receive(sender.public_key, [message(1)])
    # Something came: the next call reads the table, so it waits for the lock.
    answered, pending = while_locked(inbox.pending)
    assert not answered and [m.fact for m in pending] == [make_fact("m", [1])]
    inbox.ack([pending[0].cid])
    assert inbox.pending() == []
    assert while_locked(inbox.pending) == (True, [])
    inbox.receive(sender.public_key, [message(1)])  # a duplicate stores nothing
    assert while_locked(inbox.pending) == (True, [])
    inbox.receive(sender.public_key, [message(2)])
    store.close()
    store = SQLiteBlockStore(tmp_path / "b.sqlite")  # restart: the message is still due
    assert [m.fact for m in Inbox(store.conn, blockstore=store).pending()] == [make_fact("m", [2])]
    store.close()
