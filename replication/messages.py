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
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from merklog.store import Fact, InvalidValue, Link, Value, decode, encode, make_fact
from merklog.store.car import iter_car

from .auth import sign_headers
from .errors import CIDMismatchError, Forbidden, MalformedBlock, TooLarge, unreachable_reason
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


#: A ``repl_outbox`` row as delivery reads it: id, cid, dest, data, attempts, refused_since.
Row = tuple[int, bytes, str, bytes, int, float | None]

#: ``next_try`` of a dropped row: never due again.
NEVER = 1e300

#: HTTP statuses of a refusal that retrying the same request may cure: a timeout, "too
#: early", rate limiting. Any other 4xx answer (a key the receiver does not list, a message
#: it refuses) is a refusal that only a change of configuration can cure.
_TRANSIENT_4XX = frozenset({408, 425, 429})


def refusal_is_permanent(status: int) -> bool:
    """Whether an HTTP answer ``status`` to ``POST /v1/inbox`` refuses the messages for good
    (a 4xx that is no timeout or rate limit) rather than for now (5xx, 408, 429)."""
    return 400 <= status < 500 and status not in _TRANSIENT_4XX


@dataclass
class DestinationReport:
    """What one delivery attempt to one destination did with its due messages."""

    #: The peer URL, or the destination text when it names none (no route).
    target: str
    delivered: int = 0
    #: Messages that failed and will be retried after a backoff.
    failed: int = 0
    #: Messages given up for good: refused or without a route for ``give_up`` seconds.
    dropped: int = 0
    #: Why the attempt failed (None when everything was delivered).
    error: str | None = None


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, part: DestinationReport) -> None:
        """Count one destination's report in this pass's totals."""
        self.delivered += part.delivered
        self.failed += part.failed
        self.dropped += part.dropped
        if part.error is not None:
            self.errors.append(part.error)


class Outbox:
    """Persisted ``@async`` outbox: ``put`` tuples, ``deliver`` them with retries.

    Each destination (peer URL) is delivered to on its own: :meth:`deliver` posts to all
    of them at once, and one that fails (a timeout, a refusal) holds only its own
    messages, which all back off together. A refusal that retrying cannot cure (no route
    to the destination, a 4xx answer such as 403) is retried for ``give_up`` seconds —
    long enough to add the peer to ``[peers]`` on either side — then its messages are
    dropped: kept as ``dropped`` rows, never sent (ADR 0176). Delivered messages are
    deleted."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        identity: Identity,
        resolve: Callable[[Value], str] = default_resolve,
        blockstore: Any = None,
        max_backoff: float = 60.0,
        give_up: float = 3600.0,
        address: Callable[[Value], str] = str,
    ) -> None:
        require_autocommit(conn)
        self.conn = conn
        self.identity = identity
        self.resolve = resolve
        self.blockstore = blockstore
        self.max_backoff = max_backoff
        self.give_up = give_up
        #: The ``to`` text of a message for a destination (the node: the recipient's key
        #: when it knows it, so the recipient can tell a message meant for another node).
        self.address = address
        self._lock = conn_lock(conn, blockstore)
        #: URL -> time before which it is not tried again (its last attempt failed).
        self._held: dict[str, float] = {}
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
        """Queue many tuples in one transaction (the sink of one epoch); returns the CIDs
        queued. A message over ``MAX_MESSAGE_BYTES`` (its whole block: the tuple, the
        destination text, the sender key and nonce) is logged and left out: every
        receiver would refuse it, and queued it would be retried forever."""
        rows = []
        # One address per destination, not per message: the node's may read config.toml.
        # Keyed by type too: the values 1 and "1" are two destinations.
        addresses: dict[tuple[type, str], str] = {}
        for dest, rel, args in tuples:
            key = (type(dest), str(dest))
            to = addresses.get(key)
            if to is None:
                to = addresses[key] = self.address(dest)
            cid, data = encode_message(
                self.identity.public_key, to, make_fact(rel, args), os.urandom(12)
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
        """Messages waiting to be delivered (not dropped)."""
        with self._lock:
            (n,) = self.conn.execute(
                "SELECT count(*) FROM repl_outbox WHERE delivered IS NULL AND dropped IS NULL"
            ).fetchone()
        return int(n)

    def dropped_count(self) -> int:
        """Messages given up and still kept (see :meth:`purge`)."""
        with self._lock:
            (n,) = self.conn.execute(
                "SELECT count(*) FROM repl_outbox WHERE dropped IS NOT NULL"
            ).fetchone()
        return int(n)

    def _due(self, now: float) -> list[Row]:
        with self._lock:
            return self.conn.execute(
                "SELECT id, cid, dest, data, attempts, refused_since FROM repl_outbox"
                " WHERE delivered IS NULL AND next_try <= ? AND dropped IS NULL ORDER BY id",
                (now,),
            ).fetchall()

    def plan(
        self, now: float, busy: Collection[str] = ()
    ) -> tuple[dict[str, list[Row]], list[DestinationReport]]:
        """The due messages by peer URL, leaving out URLs in ``busy`` (a delivery to them
        is under way) and URLs held after a failure; and the reports of the due messages
        without a route (a destination that names no peer), which are backed off or
        dropped here. Blocking: call it in a worker thread."""
        by_url: dict[str, list[Row]] = {}
        unroutable: dict[str, list[Row]] = {}
        reasons: dict[str, str] = {}
        urls: dict[str, str] = {}  # resolved once per destination: it may read config.toml
        for row in self._due(now):
            dest = row[2]
            if dest in reasons:
                unroutable[dest].append(row)
                continue
            url = urls.get(dest)
            if url is None:
                try:
                    url = urls[dest] = self.resolve(dest)
                except ValueError as exc:
                    unroutable[dest] = [row]
                    reasons[dest] = str(exc)
                    continue
            if url in busy or self._held.get(url, 0.0) > now:
                continue
            by_url.setdefault(url, []).append(row)
        reports = []
        for dest, rows in unroutable.items():
            report = DestinationReport(dest, error=reasons[dest])
            report.dropped = self._failed(rows, now, reasons[dest], permanent=True)
            report.failed = len(rows) - report.dropped
            reports.append(report)
        return by_url, reports

    async def deliver(
        self,
        session: aiohttp.ClientSession,
        now: float | None = None,
        timeout: float = 10.0,
        on_report: Callable[[DestinationReport], None] | None = None,
    ) -> DeliveryReport:
        """Try every due message once: all destinations at once, each in batches; a
        destination whose batch fails is backed off as a whole. ``on_report`` is called
        with each destination's report as soon as that destination is done.

        The store work runs in a worker thread: the connection's lock may be held for
        seconds by a large write in another thread, and waiting for it on the event loop
        would stall every request the node serves meanwhile."""
        now = time.time() if now is None else now
        total = DeliveryReport()

        def done(part: DestinationReport) -> None:
            total.add(part)
            if on_report is not None:
                on_report(part)

        by_url, unroutable = await asyncio.to_thread(self.plan, now)
        for part in unroutable:
            done(part)

        async def one(url: str, rows: list[Row]) -> None:
            done(await self.deliver_to(session, url, rows, now, timeout))

        await asyncio.gather(*(one(url, rows) for url, rows in by_url.items()))
        return total

    async def deliver_to(
        self,
        session: aiohttp.ClientSession,
        url: str,
        rows: list[Row],
        now: float,
        timeout: float = 10.0,
    ) -> DestinationReport:
        """Post ``rows`` (due messages for ``url``, from :meth:`plan`) in batches, each
        within ``timeout`` seconds. At the first batch that fails, it and every later one
        back off together (one slow or refusing peer costs one timeout per attempt, not
        one per batch), and ``url`` is held until they are due again."""
        report = DestinationReport(url)
        started = time.monotonic()
        batches = list(_batches(rows))
        for i, batch in enumerate(batches):
            error, permanent = await self._post(session, url, batch, timeout)
            if error is None:
                await asyncio.to_thread(self._delivered, batch)
                report.delivered += len(batch)
                continue
            # Back off from when the attempt failed (a timeout may have taken a while).
            failed_at = now + (time.monotonic() - started)
            rest = [row for b in batches[i:] for row in b]
            report.error = error
            report.dropped = await asyncio.to_thread(
                self._failed, rest, failed_at, error, permanent
            )
            report.failed = len(rest) - report.dropped
            self._held[url] = failed_at + self._backoff(min(r[4] for r in rest))
            return report
        self._held.pop(url, None)
        return report

    async def _post(
        self, session: aiohttp.ClientSession, url: str, batch: list, timeout: float
    ) -> tuple[str | None, bool]:
        """(None, False) when the receiver acknowledged ``batch``; else (why, whether the
        refusal is one retrying cannot cure)."""
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
                    return None, False
                text = " ".join((await resp.text(errors="replace"))[:200].split())
                return f"{url}: HTTP {resp.status} {text}", refusal_is_permanent(resp.status)
        except TimeoutError:
            return f"{url}: timed out after {timeout:g} s", False
        except (aiohttp.ClientError, OSError) as exc:
            # plain words (connection refused), not aiohttp's text: "Cannot connect to
            # host 127.0.0.1:N ssl:default [Connect call failed ('127.0.0.1', N)]"
            return f"{url}: {unreachable_reason(exc)}", False

    def _backoff(self, attempts: int) -> float:
        """Seconds before a message that failed ``attempts`` times before is tried again."""
        return min(self.max_backoff, 0.25 * 2 ** min(attempts, 16))

    def _delivered(self, rows: list[Row]) -> None:
        """Delete acknowledged messages: nothing needs them any more (the epoch state
        remembers which tuples were sent; the receiver deduplicates by CID)."""
        with self._lock, transaction(self.conn, self.blockstore):
            self.conn.executemany("DELETE FROM repl_outbox WHERE id = ?", [(r[0],) for r in rows])

    def _failed(self, rows: list[Row], now: float, error: str, permanent: bool = False) -> int:
        """Back ``rows`` off after a failed attempt; a ``permanent`` refusal that has lasted
        ``give_up`` seconds for a row drops it. Returns how many were dropped."""
        dropped = 0
        updates = []
        for row in rows:
            since = (row[5] if row[5] is not None else now) if permanent else row[5]
            if permanent and now - since >= self.give_up:
                updates.append((row[4] + 1, NEVER, error[:500], since, now, row[0]))
                dropped += 1
            else:
                updates.append(
                    (row[4] + 1, now + self._backoff(row[4]), error[:500], since, None, row[0])
                )
        with self._lock, transaction(self.conn, self.blockstore):
            self.conn.executemany(
                "UPDATE repl_outbox SET attempts = ?, next_try = ?, last_error = ?,"
                " refused_since = ?, dropped = ? WHERE id = ?",
                updates,
            )
        return dropped

    def purge(self, before: float) -> int:
        """Delete dropped messages given up before ``before`` (unix seconds); returns how
        many. Delivered messages are deleted as they are acknowledged."""
        with self._lock, transaction(self.conn, self.blockstore):
            cur = self.conn.execute(
                "DELETE FROM repl_outbox WHERE dropped IS NOT NULL AND dropped < ?", (before,)
            )
        return cur.rowcount

    async def run(self, session: aiohttp.ClientSession, interval: float = 0.5) -> None:
        """Deliver forever (cancel the task to stop)."""
        while True:
            await self.deliver(session)
            await asyncio.sleep(interval)


#: ``repl_inbox.consumed``: not yet taken by an epoch, taken, refused (did not fit).
PENDING, CONSUMED, REFUSED = 0, 1, 2


def names_a_key(to: str) -> bool:
    """Whether a message's ``to`` is a node key (64 hex digits), which a receiver checks
    against its own; other ``to`` texts (a peer name, a URL) only the sender can resolve."""
    return len(to) == 64 and all(c in "0123456789abcdef" for c in to)


class Inbox:
    """Receiver side: dedup by message CID, persist, hand new messages to the node.

    Messages reach a database through its one ``Inbox`` (the node's): it counts what it
    received, so :meth:`pending` answers "nothing" without the connection's lock when
    nothing came since it last found none. An epoch asks every time, and a large write
    can hold that lock for seconds (ADR 0145).

    ``recipient`` (this node's public key): a message addressed to another node's key is
    refused (403 ``wrong_recipient``). A consumed message keeps only its CID, for
    dedup, until :meth:`purge` deletes it (ADR 0176)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        on_message: Callable[[Message], None] | None = None,
        blockstore: Any = None,
        recipient: bytes | None = None,
    ) -> None:
        require_autocommit(conn)
        self.conn = conn
        self.on_message = on_message
        self.blockstore = blockstore
        self.recipient = None if recipient is None else recipient.hex()
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
            if self.recipient is not None and names_a_key(msg.dest) and msg.dest != self.recipient:
                raise Forbidden(
                    f"message {msg.cid} is addressed to node {msg.dest[:16]}…, not this node",
                    code="wrong_recipient",
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

    def ack(self, cids: Iterable[Link], state: int = CONSUMED) -> None:
        """Mark messages consumed (call after the epoch that used them committed), or
        ``REFUSED`` (the epoch set them aside). Only the CID is kept: a retry of the same
        message is recognised until :meth:`purge` deletes the row."""
        with self._lock, transaction(self.conn, self.blockstore):
            self.conn.executemany(
                "UPDATE repl_inbox SET consumed = ?, data = X'' WHERE cid = ?",
                [(state, c.raw) for c in cids],
            )

    def purge(self, before: float) -> int:
        """Delete the consumed or refused messages received before ``before`` (unix
        seconds); returns how many. A sender that retries one of them later (it never saw
        the acknowledgement, and was down meanwhile) has it taken again. Rows are in
        arrival order, so the scan stops at the first one kept."""
        with self._lock, transaction(self.conn, self.blockstore):
            cur = self.conn.execute(
                "DELETE FROM repl_inbox WHERE consumed != 0 AND id < coalesce("
                " (SELECT id FROM repl_inbox WHERE received >= ? ORDER BY id LIMIT 1),"
                " 9223372036854775807)",
                (before,),
            )
        return cur.rowcount

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
