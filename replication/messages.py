"""``@async`` delivery (Dedalus): a persisted outbox and a deduplicating inbox.

A message is a DAG-CBOR block ``{"kind": "message", "from": <sender key>,
"to": <destination>, "rel", "args", "nonce"}``; its CID is its identity. The
outbox retries delivery (``POST /v1/inbox``, signed) until the receiver
acknowledges: at-least-once. The inbox stores each CID once (dedup) and hands
new messages to a callback and to :meth:`Inbox.pending` so the node feeds them
into a later epoch.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from merklog.store import Fact, InvalidValue, Link, Value, decode, encode, make_fact
from merklog.store.car import iter_car

from .auth import sign_headers
from .errors import CIDMismatchError, Forbidden, MalformedBlock, TooLarge
from .identity import Identity

if TYPE_CHECKING:  # aiohttp costs ~1 s to import under load: only delivery needs it
    import aiohttp
from .limits import MAX_MESSAGE_BYTES, WRITE_MAX_INBOX_BATCH_BYTES
from .schema import ensure_schema
from .txn import conn_lock, require_autocommit, transaction

MESSAGE_KEYS = {"kind", "from", "to", "rel", "args", "nonce"}
MAX_BATCH = 256
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Message:
    """A received ``@async`` tuple: the relation fact, its sender key and message CID."""

    cid: Link
    sender: bytes
    dest: str
    fact: Fact


def encode_message(sender: bytes, dest: Value, fact: Fact, nonce: bytes) -> tuple[Link, bytes]:
    data = encode(
        {
            "kind": "message",
            "from": sender,
            "to": str(dest),
            "rel": fact.rel,
            "args": list(fact.args),
            "nonce": nonce,
        }
    )
    return Link.for_dag_cbor(data), data


def decode_message(cid: Link, data: bytes) -> Message:
    """Check and decode a message block (MalformedBlock / CIDMismatchError)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise MalformedBlock(f"message block of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if not cid.verifies(data):
        raise CIDMismatchError(f"message block does not hash to {cid}")
    try:
        obj = decode(data)
    except Exception as exc:
        raise MalformedBlock(f"message: {exc}") from exc
    if not isinstance(obj, dict) or set(obj) != MESSAGE_KEYS or obj["kind"] != "message":
        raise MalformedBlock("a message is a map {kind, from, to, rel, args, nonce}")
    if not isinstance(obj["from"], bytes) or not isinstance(obj["to"], str):
        raise MalformedBlock("message 'from' must be a key and 'to' text")
    if not isinstance(obj["args"], list) or not isinstance(obj["nonce"], bytes):
        raise MalformedBlock("message 'args' must be a list and 'nonce' bytes")
    try:
        fact = make_fact(obj["rel"], obj["args"])
    except InvalidValue as exc:
        raise MalformedBlock(f"message holds an invalid tuple: {exc}") from exc
    if encode(obj) != bytes(data):
        raise MalformedBlock("message block is not canonical DAG-CBOR")
    return Message(cid, obj["from"], obj["to"], fact)


def default_resolve(dest: Value) -> str:
    """Destinations are peer base URLs unless the node supplies a resolver."""
    if isinstance(dest, str) and dest.startswith(("http://", "https://")):
        return dest.rstrip("/")
    raise ValueError(f"cannot resolve @async destination {dest!r} to a peer URL")


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


class Outbox:
    """Persisted ``@async`` outbox: ``put`` tuples, ``deliver`` them with retries."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        identity: Identity,
        resolve: Callable[[Value], str] = default_resolve,
        blockstore: Any = None,
        max_backoff: float = 60.0,
    ) -> None:
        require_autocommit(conn)
        self.conn = conn
        self.identity = identity
        self.resolve = resolve
        self.blockstore = blockstore
        self.max_backoff = max_backoff
        self._lock = conn_lock(conn, blockstore)
        with self._lock:
            ensure_schema(conn)

    def put(self, dest: Value, rel: str, args: Sequence[Value]) -> Link:
        """Queue one tuple for ``dest`` (durable on return); returns the message CID.
        A message over ``MAX_MESSAGE_BYTES`` raises TooLarge (no receiver takes it)."""
        cids = self.put_many([(dest, rel, args)])
        if not cids:
            raise TooLarge(f"an @async {rel} message over {MAX_MESSAGE_BYTES} bytes is not sent")
        return cids[0]

    def put_many(self, tuples: Iterable[tuple[Value, str, Sequence[Value]]]) -> list[Link]:
        """Queue many tuples in one transaction (the sink of one epoch). A message over
        ``MAX_MESSAGE_BYTES`` is logged and dropped: every receiver would refuse it, and
        queued it would be retried forever."""
        rows = []
        for dest, rel, args in tuples:
            cid, data = encode_message(
                self.identity.public_key, dest, make_fact(rel, args), os.urandom(12)
            )
            if len(data) > MAX_MESSAGE_BYTES:
                log.error(
                    "@async %s/%d message to %s is %d bytes, over the %d-byte limit: not sent",
                    rel,
                    len(args),
                    dest,
                    len(data),
                    MAX_MESSAGE_BYTES,
                )
                continue
            rows.append((cid.raw, str(dest), data))
        with self._lock, transaction(self.conn, self.blockstore):
            self.conn.executemany(
                "INSERT OR IGNORE INTO repl_outbox (cid, dest, data) VALUES (?, ?, ?)", rows
            )
        return [Link(r[0]) for r in rows]

    def pending_count(self) -> int:
        with self._lock:
            (n,) = self.conn.execute(
                "SELECT count(*) FROM repl_outbox WHERE delivered IS NULL"
            ).fetchone()
        return int(n)

    def _due(self, now: float) -> list[tuple[int, bytes, str, bytes, int]]:
        with self._lock:
            return self.conn.execute(
                "SELECT id, cid, dest, data, attempts FROM repl_outbox"
                " WHERE delivered IS NULL AND next_try <= ? ORDER BY id",
                (now,),
            ).fetchall()

    async def deliver(
        self, session: aiohttp.ClientSession, now: float | None = None, timeout: float = 10.0
    ) -> DeliveryReport:
        """Try every due message once, batched per destination; failures back off.

        The store work runs in a worker thread: the connection's lock may be held for
        seconds by a large write in another thread, and waiting for it on the event loop
        would stall every request the node serves meanwhile."""
        now = time.time() if now is None else now
        report = DeliveryReport()
        by_url: dict[str, list[tuple[int, bytes, str, bytes, int]]] = {}
        for row in await asyncio.to_thread(self._due, now):
            try:
                url = self.resolve(row[2])
            except ValueError as exc:
                await asyncio.to_thread(self._failed, [row], now, str(exc))
                report.failed += 1
                report.errors.append(str(exc))
                continue
            by_url.setdefault(url, []).append(row)
        for url, rows in by_url.items():
            for batch in _batches(rows):
                error = await self._post(session, url, batch, timeout)
                if error is None:
                    await asyncio.to_thread(self._delivered, batch)
                    report.delivered += len(batch)
                else:
                    await asyncio.to_thread(self._failed, batch, now, error)
                    report.failed += len(batch)
                    report.errors.append(error)
        return report

    async def _post(
        self, session: aiohttp.ClientSession, url: str, batch: list, timeout: float
    ) -> str | None:
        import aiohttp

        body = b"".join(iter_car([], [(Link(r[1]), r[3]) for r in batch]))
        path = "/v1/inbox"
        headers = sign_headers(self.identity, "POST", path, hashlib.sha256(body).hexdigest())
        headers["Content-Type"] = "application/vnd.ipld.car"
        try:
            async with session.post(
                url + path, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status == 200:
                    await resp.read()
                    return None
                return f"{url}: HTTP {resp.status} {(await resp.text())[:200]}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return f"{url}: {type(exc).__name__}: {exc}"

    def _delivered(self, rows: list) -> None:
        with self._lock, transaction(self.conn, self.blockstore):
            self.conn.executemany(
                "UPDATE repl_outbox SET delivered = ?, attempts = attempts + 1 WHERE id = ?",
                [(time.time(), r[0]) for r in rows],
            )

    def _failed(self, rows: list, now: float, error: str) -> None:
        with self._lock, transaction(self.conn, self.blockstore):
            self.conn.executemany(
                "UPDATE repl_outbox SET attempts = attempts + 1, next_try = ?, last_error = ?"
                " WHERE id = ?",
                [
                    (now + min(self.max_backoff, 0.25 * 2 ** min(r[4], 16)), error[:500], r[0])
                    for r in rows
                ],
            )

    async def run(self, session: aiohttp.ClientSession, interval: float = 0.5) -> None:
        """Deliver forever (cancel the task to stop)."""
        while True:
            await self.deliver(session)
            await asyncio.sleep(interval)


class Inbox:
    """Receiver side: dedup by message CID, persist, hand new messages to the node.

    Messages reach a database through its one ``Inbox`` (the node's): it counts what it
    received, so :meth:`pending` answers "nothing" without the connection's lock when
    nothing came since it last found none. An epoch asks every time, and a large write
    can hold that lock for seconds (ADR 0145)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        on_message: Callable[[Message], None] | None = None,
        blockstore: Any = None,
    ) -> None:
        require_autocommit(conn)
        self.conn = conn
        self.on_message = on_message
        self.blockstore = blockstore
        self._lock = conn_lock(conn, blockstore)
        #: Receives that stored something (incremented under ``_lock``, before the lock
        #: is released), and the count at which :meth:`pending` last found nothing.
        self._received = 0
        self._none_pending_at = -1
        with self._lock:
            ensure_schema(conn)

    def receive(self, sender: bytes, blocks: Iterable[tuple[Link, bytes]]) -> tuple[int, int]:
        """Store new messages from ``sender`` (all or nothing); returns (new, duplicates)."""
        messages = []
        for cid, data in blocks:
            msg = decode_message(cid, bytes(data))
            if msg.sender != sender:
                raise Forbidden(
                    "message 'from' differs from the signing peer", code="sender_mismatch"
                )
            messages.append((msg, bytes(data)))
        new: list[Message] = []
        with self._lock, transaction(self.conn, self.blockstore):
            for msg, data in messages:
                cur = self.conn.execute(
                    "INSERT OR IGNORE INTO repl_inbox (cid, sender, rel, data, received)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (msg.cid.raw, msg.sender, msg.fact.rel, data, time.time()),
                )
                if cur.rowcount:
                    new.append(msg)
            if new:
                self._received += 1
        if self.on_message is not None:
            for msg in new:
                self.on_message(msg)
        return len(new), len(messages) - len(new)

    def pending(self, limit: int | None = None) -> list[Message]:
        """Messages not yet consumed by an epoch, in arrival order."""
        received = self._received
        if received == self._none_pending_at:  # nothing came since none were pending
            return []
        with self._lock:
            rows = self.conn.execute(
                "SELECT cid, data FROM repl_inbox WHERE consumed = 0 ORDER BY id LIMIT ?",
                (-1 if limit is None else limit,),
            ).fetchall()
        if not rows:
            # A receive after ``received`` was read counted past it: the next call looks.
            self._none_pending_at = received
        return [decode_message(Link(c), bytes(d)) for c, d in rows]

    def ack(self, cids: Iterable[Link]) -> None:
        """Mark messages consumed (call after the epoch that used them committed)."""
        with self._lock, transaction(self.conn, self.blockstore):
            self.conn.executemany(
                "UPDATE repl_inbox SET consumed = 1 WHERE cid = ?", [(c.raw,) for c in cids]
            )

    def drain(self, limit: int | None = None) -> list[Message]:
        """``pending`` then ``ack`` in one call."""
        msgs = self.pending(limit)
        self.ack(m.cid for m in msgs)
        return msgs


def _batches(rows: list) -> Iterator[list]:
    """Consecutive batches of outbox rows within ``MAX_BATCH`` messages and
    ``WRITE_MAX_INBOX_BATCH_BYTES`` of message bytes (receivers' inbox body limit)."""
    batch: list = []
    size = 0
    for row in rows:
        n = len(row[3])
        if batch and (len(batch) >= MAX_BATCH or size + n > WRITE_MAX_INBOX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += n
    if batch:
        yield batch
