"""Sync through IPFS: heads announced on the daemon's pubsub, blocks fetched via the daemon.

A node whose store is on IPFS (``store.backend = "ipfs"``) and whose
``sync.ipfs_interval`` is above 0 runs :class:`IPFSHeadSync` beside its epoch loop:

- every ``sync.ipfs_interval`` seconds it publishes its signed heads on the dataset's
  topic (:func:`merklog.replication.pubsub.topic_for`) through its daemon's
  ``pubsub/pub``;
- it reads the topic's stream (``pubsub/sub``); an announcement that verifies (dataset,
  signature, a writer's key: :func:`~merklog.replication.pubsub.parse_announcement`)
  and names unknown heads makes it fetch the missing deltas and facts *through its
  daemon*, which finds them on the peers it is connected to (bitswap), each block
  verified against its CID and bounded by ``store.ipfs_timeout``;
- the fetched blocks go through the same acceptance code as HTTP sync
  (:meth:`Node.import_blocks` → ``Replica.apply_blocks``, all or nothing).

No HTTP route between the peers is needed: only their IPFS daemons talk.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any

import aiohttp

from merklog.replication.errors import ReplicationError
from merklog.replication.pubsub import HeadFetch, make_announcement, parse_announcement, topic_for
from merklog.store import Link, StoreError

log = logging.getLogger("merklog.node.ipfs_sync")


def _multibase(data: bytes) -> str:
    """base64url multibase (``u`` prefix), how the IPFS RPC API spells topics and data."""
    return "u" + base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unmultibase(text: str) -> bytes:
    if not text.startswith("u"):
        raise ValueError(f"not base64url multibase: {text[:10]!r}")
    body = text[1:]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def api_url(multiaddr: str) -> str:
    """``/ip4/H/tcp/P/http`` (or ``/dns/…``, ``/ip6/…``) → ``http://H:P/api/v0``."""
    parts = multiaddr.strip("/").split("/")
    if len(parts) < 4 or parts[2] != "tcp":
        raise StoreError(f"cannot turn {multiaddr!r} into an HTTP URL")
    host = f"[{parts[1]}]" if parts[0] == "ip6" else parts[1]
    scheme = parts[4] if len(parts) > 4 and parts[4] in ("http", "https") else "http"
    return f"{scheme}://{host}:{parts[3]}/api/v0"


class IPFSHeadSync:
    """Announce this node's heads and follow its peers' over the IPFS daemon's pubsub."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.store = node.store
        self.topic = topic_for(node.dataset)
        self.base = api_url(self.store.api)
        self.interval = float(node.config.get("sync.ipfs_interval"))
        self.timeout = float(node.config.get("store.ipfs_timeout"))
        #: Counters a test or operator can read: published, accepted, ignored, applied.
        self.stats = {"published": 0, "accepted": 0, "ignored": 0, "applied": 0, "failed": 0}
        self._busy = asyncio.Lock()
        #: What fails now (publishing, the subscription, fetching), told at WARNING when
        #: it starts failing and at INFO when it works again: at INFO alone a home whose
        #: announced heads could never be fetched looked healthy (QA).
        self._failing: set[str] = set()

    def _failed(self, what: str, message: str, *args: Any) -> None:
        # An exception without a text (a TimeoutError) ended the line at "failed: " (QA)
        args = tuple(_reason(a) if isinstance(a, BaseException) else a for a in args)
        log.log(logging.INFO if what in self._failing else logging.WARNING, message, *args)
        self._failing.add(what)

    def _works(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            log.info("%s on %s works again", what, self.topic)

    async def run(self) -> None:
        """Publish and subscribe until cancelled; daemon trouble is logged and retried."""
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(self._subscribe_loop(session), self._announce_loop(session))

    # ------------------------------------------------------------ announcing

    async def _announce_loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                await self.publish(session)
                self._works("publishing heads")
            except (aiohttp.ClientError, TimeoutError, StoreError) as exc:
                self._failed(
                    "publishing heads", "publishing heads on %s failed: %s", self.topic, exc
                )
            await asyncio.sleep(self.interval)

    async def publish(self, session: aiohttp.ClientSession) -> None:
        """Publish this node's current heads once. The heads are read on a worker thread:
        the store's lock may be held by a write for seconds, and the event loop also
        answers /healthz, refusals and every other request meanwhile (ADR 0180)."""
        loop = asyncio.get_running_loop()
        heads = await loop.run_in_executor(None, self.node.heads)
        data = make_announcement(self.node.identity, self.node.dataset, heads)
        form = aiohttp.FormData()
        form.add_field("file", data, filename="heads", content_type="application/octet-stream")
        async with session.post(
            f"{self.base}/pubsub/pub",
            params={"arg": _multibase(self.topic.encode())},
            data=form,
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        ) as resp:
            if resp.status != 200:
                raise StoreError(f"pubsub/pub answered HTTP {resp.status}: {await resp.text()}")
        self.stats["published"] += 1

    # ------------------------------------------------------------ following

    async def _subscribe_loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                async with session.post(
                    f"{self.base}/pubsub/sub",
                    params={"arg": _multibase(self.topic.encode())},
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout),
                ) as resp:
                    if resp.status != 200:
                        raise StoreError(f"pubsub/sub answered HTTP {resp.status}")
                    self._works("the pubsub subscription")
                    async for line in resp.content:
                        await self._on_line(line)
            except (aiohttp.ClientError, TimeoutError, StoreError) as exc:
                self._failed(
                    "the pubsub subscription",
                    "pubsub subscription to %s failed: %s",
                    self.topic,
                    exc,
                )
            await asyncio.sleep(min(self.interval, 1.0))

    async def _on_line(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
            data = _unmultibase(msg["data"]) if isinstance(msg, dict) and msg.get("data") else None
        except (ValueError, KeyError, TypeError):
            data = None
        if data is None:
            return  # the daemon's opening {} or noise
        await self.on_announcement(data)

    async def on_announcement(self, data: bytes) -> bool:
        """Handle one announcement; True if it led to applying new deltas. It is checked
        on a worker thread: whether its key is a writer is read from the store."""
        loop = asyncio.get_running_loop()
        try:
            ann = await loop.run_in_executor(
                None, parse_announcement, data, self.node.dataset, self.node.replica.is_writer
            )
        except ReplicationError as exc:
            self.stats["ignored"] += 1
            log.info("ignored an announcement on %s: %s", self.topic, exc)
            return False
        if ann.key == self.node.identity.public_key:
            return False
        self.stats["accepted"] += 1
        async with self._busy:  # one fetch at a time: announcements repeat anyway
            try:
                applied = await loop.run_in_executor(None, self._fetch_and_apply, ann.heads)
            except (StoreError, ReplicationError) as exc:
                self.stats["failed"] += 1
                self._failed(
                    "fetching announced heads",
                    "fetching heads announced by %s failed: %s",
                    ann.key.hex()[:16],
                    exc,
                )
                return False
        self._works("fetching announced heads")
        return applied

    def _fetch_and_apply(self, heads: tuple[Link, ...]) -> bool:
        replica = self.node.replica
        walk = HeadFetch(heads, replica.has_delta, self.store.has)
        while want := walk.wanted():
            for cid in want:
                walk.receive(cid, self.store.fetch(cid))
        blocks = walk.blocks()
        if not blocks:
            return False
        result = self.node.import_blocks(blocks)
        self.stats["applied"] += int(result.get("accepted", 0))
        return True


def start(node: Any) -> asyncio.Task | None:
    """Start IPFS head sync for ``node`` on the running loop, if its store is on IPFS and
    ``sync.ipfs_interval`` > 0; returns the task (cancel it to stop), else None."""
    if (
        node.config.get("store.backend") != "ipfs"
        or float(node.config.get("sync.ipfs_interval")) <= 0
    ):
        return None
    node.ipfs_sync = IPFSHeadSync(node)
    return asyncio.get_running_loop().create_task(node.ipfs_sync.run())


def _reason(exc: BaseException) -> str:
    """What ``exc`` says, or what it is when it says nothing (a timeout)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return "the IPFS daemon did not answer in time"
    return str(exc) or type(exc).__name__
