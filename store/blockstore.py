"""The one interface every block store implements, plus the in-memory store.

Every block that leaves a store is re-hashed against the CID it was asked for;
a mismatch raises :class:`CIDMismatch` and no data is returned. ``put`` verifies
too, so a store never holds a block under the wrong name.
"""

from __future__ import annotations

import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import islice
from typing import Any

from .errors import BlockNotFound, CIDMismatch
from .link import Link


@dataclass(frozen=True)
class SharedSQLite:
    """A store's offer to share its SQLite connection with the layers above it.

    Replication and the node keep their own tables in the same database and commit
    them together with blocks: inside ``transaction()`` (nestable; only the outermost
    level commits), holding ``lock`` (re-entrant) for any other use of ``conn``.
    Blocks are rows ``(cid BLOB UNIQUE, data BLOB)`` of table ``blocks_table`` (raw
    binary CIDv1; a reader names these two columns only); readers of that table
    re-hash what they read.

    A store may release ``lock`` while its outermost transaction waits for something
    outside SQLite (an IPFS home waiting for its daemon, ADR 0180): other threads then
    read the last committed state, and a ``transaction()`` they open waits until that
    one ends. So a write reads what it depends on inside its ``transaction()``, not
    before it under ``lock`` alone.
    """

    conn: sqlite3.Connection
    lock: threading.RLock
    transaction: Callable[[], AbstractContextManager[Any]]
    blocks_table: str = "blocks"


def verify(cid: Link, data: bytes, where: str = "") -> bytes:
    """Return ``data`` if it hashes to ``cid``; raise CIDMismatch otherwise."""
    if not cid.verifies(data):
        raise CIDMismatch(cid, Link.for_block(data, cid.codec), where)
    return data


class BlockStore(ABC):
    """A content-addressed block store: CID → bytes, verified on the way in and out."""

    @abstractmethod
    def put_many(self, blocks: Iterable[tuple[Link, bytes]]) -> int:
        """Store blocks atomically where the backend can (one transaction); return how many were new."""

    @abstractmethod
    def get(self, cid: Link) -> bytes:
        """Return the verified bytes of ``cid``; BlockNotFound if absent, CIDMismatch if corrupt."""

    @abstractmethod
    def has(self, cid: Link) -> bool:
        """True if the block is present (no verification)."""

    @abstractmethod
    def iter_cids(self) -> Iterator[Link]:
        """Every CID held, in no particular order."""

    @abstractmethod
    def delete_many(self, cids: Iterable[Link]) -> int:
        """Remove blocks (used by pruning); return how many were removed."""

    def put_encoded(self, blocks: list[tuple[Link, bytes]]) -> int:
        """``put_many`` for blocks whose CIDs this process has just computed from these
        very bytes (``encode_facts``, a delta it built): the bulk write path of local
        writes. Stores may skip re-hashing them; reads verify every block anyway."""
        return self.put_many(blocks)

    def put(self, cid: Link, data: bytes) -> bool:
        """Store one block; True if it was new."""
        return self.put_many([(cid, data)]) == 1

    def put_block(self, data: bytes) -> Link:
        """Store a dag-cbor block under its computed CID and return the CID."""
        cid = Link.for_dag_cbor(data)
        self.put_many([(cid, data)])
        return cid

    def get_held(self, cid: Link) -> bytes:
        """``get`` for a caller who names a block by its CID alone (``merklog get``,
        ``GET /v1/blocks/{cid}``): a block the store does not hold is BlockNotFound at
        once, not after a remote store's whole request timeout. Local stores: ``get``."""
        return self.get(cid)

    def get_many(self, cids: Iterable[Link]) -> Iterator[tuple[Link, bytes]]:
        """Verified blocks for ``cids`` in order; BlockNotFound on the first missing one."""
        for cid in cids:
            yield cid, self.get(cid)

    def has_many(self, cids: Iterable[Link]) -> set[Link]:
        """The subset of ``cids`` that is present."""
        return {cid for cid in cids if self.has(cid)}

    def sizes(self, cids: Iterable[Link]) -> dict[Link, int]:
        """The stored size in bytes of each of ``cids`` that is present (not verified:
        a reader that sends the block re-hashes it then). Lets a server plan a bounded
        response before reading any block (``POST …/blocks``); stores that keep sizes
        answer without reading the data."""
        out: dict[Link, int] = {}
        for cid in cids:
            try:
                out[cid] = len(self.get(cid))
            except (BlockNotFound, CIDMismatch):
                continue
        return out

    def scan_prefixed(
        self, prefix: bytes, batch: int = 65_536, lo: bytes = b"", hi: bytes | None = None
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        """Every block whose data starts with ``prefix`` and whose raw CID lies in
        ``[lo, hi)`` (bytewise; ``hi=None``: no upper end), as ``(raw CID, data)`` pages of
        at most ``batch`` in CID order, for bulk readers that check a whole page at once
        (a range lets several processes share one scan, see :meth:`file_for_readers`).

        This default reads the sorted CIDs and fetches them in batches; a store that can
        scan its blocks in CID order does it in one pass (the SQLite store)."""
        cids = iter(sorted(c for c in self.iter_cids() if _in_range(c.raw, lo, hi)))
        while chunk := list(islice(cids, batch)):
            page = [(c.raw, d) for c, d in self.get_many(chunk) if d.startswith(prefix)]
            if page:
                yield page

    def file_for_readers(self) -> str | None:
        """The SQLite file another process may open as a :class:`~merklog.store.sqlite.
        SQLiteBlockStore` to read every block of this store at the same time as this one
        (WAL readers do not block each other), or None when there is none: a memory
        store, or one whose blocks live elsewhere."""
        return None

    def __len__(self) -> int:
        return sum(1 for _ in self.iter_cids())

    def __contains__(self, cid: object) -> bool:
        return isinstance(cid, Link) and self.has(cid)

    def shared_sqlite(self) -> SharedSQLite | None:
        """The SQLite connection this store keeps its blocks in, offered for sharing
        (see :class:`SharedSQLite`); None for stores that have none to share."""
        return None

    def set_cache_mb(self, cache_mb: int) -> None:  # noqa: B027 - optional hint
        """Let this store's page cache grow to ``cache_mb`` MiB for a bulk write in a
        short-lived process; stores without a page cache of their own ignore it."""

    def set_wal_checkpoint_mb(self, wal_mb: int) -> None:  # noqa: B027 - optional hint
        """Let this store's write-ahead log grow to ``wal_mb`` MiB before it is copied back
        into the database, for a bulk write in a short-lived process; stores without a
        write-ahead log ignore it."""

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing to release
        """Release resources; the default store holds none."""

    def __enter__(self) -> BlockStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemoryBlockStore(BlockStore):
    """A dict-backed store for tests and throwaway replicas."""

    def __init__(self) -> None:
        self._blocks: dict[Link, bytes] = {}
        self._lock = threading.Lock()

    def put_many(self, blocks: Iterable[tuple[Link, bytes]]) -> int:
        checked = [(cid, verify(cid, bytes(data), "put")) for cid, data in blocks]
        with self._lock:
            new = 0
            for cid, data in checked:
                if cid not in self._blocks:
                    self._blocks[cid] = data
                    new += 1
            return new

    def get(self, cid: Link) -> bytes:
        try:
            data = self._blocks[cid]
        except KeyError:
            raise BlockNotFound(cid) from None
        return verify(cid, data, "memory store")

    def has(self, cid: Link) -> bool:
        return cid in self._blocks

    def sizes(self, cids: Iterable[Link]) -> dict[Link, int]:
        blocks = self._blocks
        return {cid: len(blocks[cid]) for cid in cids if cid in blocks}

    def iter_cids(self) -> Iterator[Link]:
        return iter(list(self._blocks))

    def delete_many(self, cids: Iterable[Link]) -> int:
        with self._lock:
            return sum(1 for cid in cids if self._blocks.pop(cid, None) is not None)

    def __len__(self) -> int:
        return len(self._blocks)

    def corrupt(self, cid: Link, data: bytes) -> None:
        """Overwrite a block's bytes without verification (fault injection for tests)."""
        self._blocks[cid] = data


def _in_range(raw: bytes, lo: bytes, hi: bytes | None) -> bool:
    return lo <= raw and (hi is None or raw < hi)
