"""A node home on IPFS: blocks on the daemon (pinned), indexes and a verified cache in SQLite.

:class:`IPFSHomeStore` *is* a :class:`~merklog.store.sqlite.SQLiteBlockStore` (same
file layout, same ``transaction()``, so replication keeps its tables and its atomic
sections in that file) whose every committed block is also on an IPFS daemon,
pinned. The ``blocks`` table is the local cache: every block this home wrote or
accepted, re-hashed on every read like any store read.

Writes: blocks put inside a transaction are collected and, at the outermost commit
and *before* SQLite commits, sent in one ``dag/import`` CAR (see
:meth:`IPFSBlockStore.import_blocks`). If the daemon is down, slow (every request is
bounded by ``timeout``) or answers garbage, the SQLite transaction rolls back and
the caller gets a :class:`StoreError`: nothing is half-applied. If the daemon took
the blocks but the SQLite commit failed, the daemon merely holds blocks nobody
references yet; a retry re-imports them harmlessly (they are content-addressed).

The wait for the daemon runs with the store's lock released (:mod:`.shipgate`,
ADR 0180): while it lasts, other threads read the last committed state on a read-only
connection and their transactions wait for this one to end, so a slow or stopped
daemon delays writes, never reads.

Reads come from the cache; a block the cache lacks is fetched from the daemon with a
bounded wait and verified against its CID (a tampered block raises CIDMismatch and
is not kept). ``has`` answers for this home (the cache), never by asking the network,
which for an absent block only ends by timing out. The cache holds what this home wrote
or accepted, so a read does not add to it; :meth:`IPFSHomeStore.refill` puts back blocks
it lost that the daemon still holds (``fsck`` asks for the blocks the home's tables name).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from itertools import islice

from .blockstore import verify
from .codec import Fact, encode_facts
from .errors import BlockNotFound, CIDMismatch
from .ipfs import IPFSBlockStore, api_multiaddr
from .link import Link
from .shipgate import ShipGate, ShippingConnection
from .sqlite import SQLiteBlockStore

_CHUNK = 500
#: Daemon requests at once when refilling the cache (each may wait out its bound).
_REFILL_THREADS = 8


class IPFSHomeStore(SQLiteBlockStore):
    """SQLite file (indexes, replica tables, block cache) + IPFS daemon (every block, pinned).

    ``api`` is the daemon's RPC API as a multiaddr or ``http://host:port`` URL;
    ``timeout`` bounds every request to it, in seconds. Opening checks that the
    daemon answers (StoreError otherwise), so a misconfigured home fails at once.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        api: str,
        *,
        timeout: float = 30.0,
        check: bool = True,
        **kwargs: object,
    ) -> None:
        self.remote = IPFSBlockStore(api_multiaddr(api), timeout=timeout)
        if check:
            try:
                self.remote.ping()
            except BaseException:
                self.remote.close()
                raise
        self._outgoing: dict[Link, bytes] = {}
        super().__init__(path, **kwargs)  # type: ignore[arg-type]

    def _connect(self, busy_timeout: float) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=busy_timeout,
            factory=ShippingConnection,
        )
        self._gate = ShipGate(self.lock, self.path, busy_timeout)
        self._gate.attach(conn)
        return conn

    @property
    def api(self) -> str:
        """The daemon's API multiaddr."""
        return self.remote.addr

    # ------------------------------------------------------------ transactions

    @contextmanager
    def transaction(self) -> Iterator:  # type: ignore[override]
        """SQLite's nestable transaction; the outermost one ships its blocks to the daemon
        (one ``dag/import``) before it commits, and rolls back if that fails. While it
        waits for the daemon the lock is released (:class:`ShipGate`); a transaction
        another thread opens meanwhile waits for this one to end."""
        with self.lock:
            self._gate.wait()
            outermost = self._depth == 0
            if outermost:
                self._outgoing = {}
            mark = len(self._outgoing)
            try:
                with super().transaction() as conn:
                    yield conn
                    if outermost and self._outgoing:
                        blocks = list(self._outgoing.items())
                        self._gate.ship(lambda: self.remote.import_blocks(blocks))
            except BaseException:
                if outermost:
                    self._outgoing = {}
                else:  # a savepoint rolled back: so do the blocks it put
                    for cid in list(self._outgoing)[mark:]:
                        del self._outgoing[cid]
                raise
            if outermost:
                self._outgoing = {}

    # ------------------------------------------------------------ writes

    def put_many(self, blocks: Iterable[tuple[Link, bytes]]) -> int:
        checked = [(cid, verify(cid, bytes(data), "put")) for cid, data in blocks]
        if not checked:
            return 0
        with self.transaction():
            self._outgoing.update(checked)
            return super().put_many(checked)

    def put_encoded(self, blocks: list[tuple[Link, bytes]]) -> int:
        """Trusted local blocks (see :meth:`BlockStore.put_encoded`): cached and queued
        for the daemon like ``put_many``'s, without the re-hash."""
        if not blocks:
            return 0
        with self.transaction():
            self._outgoing.update(blocks)
            return super().put_encoded(blocks)

    def put_facts(self, facts: Iterable[Fact]) -> list[Link]:
        facts = facts if isinstance(facts, list | tuple) else list(facts)
        with self.transaction():
            cids = super().put_facts(facts)
            # Encoding again costs ~1/20 of the round trip; it keeps SQLiteBlockStore's
            # ingest path untouched.
            self._outgoing.update(encode_facts(facts))
        return cids

    def delete_many(self, cids: Iterable[Link]) -> int:
        """Unpin on the daemon first (its GC may then drop them), then drop from the cache."""
        cids = list(cids)
        self.remote.unpin(cids)
        return super().delete_many(cids)

    # ------------------------------------------------------------ reads

    def get(self, cid: Link) -> bytes:
        try:
            return super().get(cid)
        except BlockNotFound:
            return self.remote.get(cid)  # bounded wait, verified

    def get_held(self, cid: Link) -> bytes:
        """The cache alone, which holds every block this home wrote or accepted. The
        daemon is not asked: it may hold blocks of other homes sharing it (another
        dataset's facts, served to anyone with this home's read token, QA) or fetch
        anything from the network, and one asked for a block it lacks answers only by
        timing out. A block the cache lost is put back by ``merklog fsck``."""
        return super().get(cid)

    def get_many(self, cids: Iterable[Link]) -> Iterator[tuple[Link, bytes]]:
        it = iter(cids)
        while chunk := list(islice(it, _CHUNK)):
            present = self.has_many(chunk)
            cached = dict(super().get_many(c for c in chunk if c in present))
            for cid in chunk:
                data = cached.get(cid)
                yield cid, (data if data is not None else self.remote.get(cid))

    def refill(self, cids: Iterable[Link], wait: float | None = None) -> list[Link]:
        """Put the blocks of ``cids`` back into the cache from the daemon, which may
        still hold what the cache lost (a deleted or corrupted row): each asked for with
        a wait of ``wait`` seconds (default the existence probe's bound: a daemon asked
        for a block it lacks answers only by timing out), several at once, verified
        against its CID, and stored in place of the cache's row. Returns the CIDs put
        back; the others the daemon does not hold (or not intact)."""
        wait = self.remote.probe_timeout if wait is None else wait

        def fetch(cid: Link) -> tuple[Link, bytes] | None:
            try:
                return cid, self.remote.get(cid, wait)
            except (BlockNotFound, CIDMismatch):
                return None

        wanted = list(dict.fromkeys(cids))
        if not wanted:
            return []
        with ThreadPoolExecutor(min(_REFILL_THREADS, len(wanted))) as pool:
            found = [got for got in pool.map(fetch, wanted) if got is not None]
        with self.transaction() as conn:
            self._upsert(conn, found)
        return [cid for cid, _ in found]

    @staticmethod
    def _upsert(conn: sqlite3.Connection, blocks: list[tuple[Link, bytes]]) -> None:
        """Store verified blocks in the cache, replacing a row under the same CID (one
        that no longer hashes to it); nothing goes to the daemon, which holds them."""
        conn.executemany(
            "INSERT INTO blocks (cid, data) VALUES (?, ?)"
            " ON CONFLICT (cid) DO UPDATE SET data = excluded.data",
            [(cid.raw, data) for cid, data in blocks],
        )

    def fetch(self, cid: Link) -> bytes:
        """The verified bytes of ``cid`` from the daemon (which may find it on the network)."""
        return self.remote.get(cid)

    def close(self) -> None:
        try:
            with self.lock:
                self._gate.wait()  # a write still waiting for the daemon ends first
                super().close()
                self._gate.close()
        finally:
            self.remote.close()

    def __repr__(self) -> str:
        return f"IPFSHomeStore({self.path!r}, {self.api!r})"
