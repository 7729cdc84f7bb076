"""``merklog fsck``: check a stopped home, and repair missing or corrupted blocks from a peer.

Checks, in order: SQLite's ``PRAGMA integrity_check`` (page-level damage cannot be
repaired block by block: restore a backup), every block re-hashed against its CID,
and the replica tables against each other and the blocks (heads and parents are
accepted deltas; every delta and asserted fact has its block). With a peer URL,
corrupted blocks are deleted and every missing block is fetched from the peer's
copy of the dataset (verified by hash before it is stored), then the checks run
again. Only the wanted blocks travel: they are asked for by CID
(``POST /v1/datasets/{id}/blocks``, ADR 0075), so a repair costs the bytes of the
blocks it replaces, not the peer's whole log. The store is opened directly, without the epoch loop, so a home whose
damage keeps the node from starting can still be checked and repaired.

On an IPFS home the checks run over the home's SQLite file (indexes, replica tables and
the verified cache of every block; a block the cache lacks is read from the daemon). A
block missing from the cache or corrupted there is first asked of the home's own daemon,
which may still hold it, and put back (verified, ``refilled``): no peer is needed for
that. A repair also imports every cached block into the daemon again, pinned: a daemon that
lost blocks (garbage-collected, ``block rm``) gets them back. Asking the daemon for a
block it lacks only ends by timing out, so its copy is not checked block by block.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from merklog.store import BlockNotFound, CIDMismatch, Link

from .failures import ExitCode, Failure, classify

if TYPE_CHECKING:
    from merklog.store.ipfs_home import IPFSHomeStore


@dataclass
class FsckResult:
    """What fsck found and did."""

    problems: list[str] = field(default_factory=list)
    blocks: int = 0
    deltas: int = 0
    #: Accepted deltas whose blocks a snapshot covers (pruned or bootstrapped): not kept
    #: here by design, so not problems.
    covered: int = 0
    repaired: int = 0
    #: Payload bytes of the repaired blocks, and the requests and HTTP body bytes the
    #: repair cost (what moved over the network).
    repaired_bytes: int = 0
    requests: int = 0
    bytes_received: int = 0
    #: Blocks wanted that the peer did not serve (absent or corrupted there too).
    unavailable: int = 0
    #: The peer predates the blocks route: its whole log was read instead.
    from_log: bool = False
    #: On an IPFS home: blocks imported into the daemon again by a repair.
    repinned: int = 0
    #: Of the problems, the missing or corrupted blocks a peer's copy can replace (the
    #: others are damage no peer repairs: tables that lost rows, a fact no peer takes).
    repairable: int = 0
    #: On an IPFS home: blocks put back into the cache from the home's own daemon.
    refilled: int = 0
    #: SQLite found page-level damage (or could not read its pages at all): the
    #: problem says what; no block can be repaired, a backup must be restored.
    page_damage: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


def _open(cfg: Any) -> tuple[Any, Any]:
    from merklog.store.sqlite import SQLiteBlockStore

    from .storecheck import load_key

    identity = load_key(cfg.home)  # never a new one; a damaged one is exit 5
    backend = cfg.get("store.backend")
    if backend == "ipfs":
        from .storage import open_store

        store = open_store(cfg)
    elif backend == "sqlite":
        store = SQLiteBlockStore(cfg.path("store.path"))
    else:
        raise Failure(
            f"fsck checks a home's store, and a {backend} store has none", ExitCode.BAD_INPUT
        )
    return store, identity


def _replica(store: Any, identity: Any, dataset: Link) -> Any:
    from merklog.replication.replica import Replica

    from .storage import store_conn

    return Replica.open(store_conn(store), store, identity, dataset)


def fsck(
    cfg: Any,
    repair_from: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    reimport_progress: Callable[[int, int], None] | None = None,
) -> FsckResult:
    """Check the home of ``cfg`` (and repair from ``repair_from``; ``progress(blocks,
    bytes)`` as repaired blocks arrive, then on an IPFS home ``reimport_progress(blocks,
    bytes)`` as its blocks go into the daemon again); the store is closed after."""
    from merklog.replication.client import SyncClient
    from merklog.replication.consistency import check_replica, check_unopened
    from merklog.replication.errors import NotFound

    dataset = Link.parse(cfg.get("dataset.id"))
    try:
        store, identity = _open(cfg)
    except sqlite3.DatabaseError as exc:
        # A file SQLite cannot even open as a database (cut short: "malformed"): page
        # damage too, reported as the damage found once it is open is (--json included).
        if classify(exc, cfg.home)[0] != ExitCode.STORE_DAMAGED:
            raise
        return FsckResult(problems=[f"SQLite reports page-level damage: {exc}"], page_damage=True)
    # Seconds per peer request, as `sync` waits (the client's 60 s default ignored
    # `--set sync.timeout=N`: a silent peer held a repair for a minute whatever it said).
    seconds = float(cfg.get("sync.timeout"))
    result = FsckResult()
    try:
        pages = _page_damage(store, cfg.home)
        if pages:
            result.problems.append(pages)
            result.page_damage = True
            return result
        try:
            replica = _replica(store, identity, dataset)
        except (BlockNotFound, CIDMismatch, NotFound):
            if repair_from is None:
                # Listed with every other problem the tables show (ADR: each is listed).
                from .storage import store_conn

                report = check_unopened(store_conn(store), store, dataset)
                result.problems.append(f"genesis block {dataset} is missing or corrupted")
                result.problems.extend(p for p in report.problems if str(dataset) not in p)
                result.repairable = 1 + len((report.missing | report.corrupted) - {dataset})
                result.blocks, result.deltas = report.blocks, report.deltas
                return result
            client = SyncClient(identity, timeout=seconds)
            genesis = asyncio.run(_genesis(client, repair_from, dataset))
            store.delete_many([dataset])
            store.put(dataset, genesis)
            result.repaired += 1
            result.repaired_bytes += len(genesis)
            result.requests += 1
            result.bytes_received += len(genesis)
            replica = _replica(store, identity, dataset)
        report = check_replica(replica)
        if cfg.get("store.backend") == "ipfs" and (report.missing or report.corrupted):
            # The home's own daemon first: it holds every block the home wrote, pinned.
            result.refilled = len(store.refill(report.missing | report.corrupted))
            if result.refilled:
                report = check_replica(replica)
        if repair_from is not None and (report.missing or report.corrupted):
            wanted = report.missing | report.corrupted
            client = SyncClient(identity, timeout=seconds)
            fetch = asyncio.run(_fetch(client, repair_from, replica, wanted, progress))
            with store.transaction():
                store.delete_many(report.corrupted)
                store.put_many(fetch.found.items())
            result.repaired += len(fetch.found)
            result.repaired_bytes += fetch.block_bytes
            result.requests += fetch.requests
            result.bytes_received += fetch.bytes_received
            result.unavailable = len(wanted) - len(fetch.found)
            result.from_log = fetch.from_log
            report = check_replica(replica)
        if repair_from is not None and cfg.get("store.backend") == "ipfs":
            result.repinned = _reimport(store, reimport_progress)
        result.problems.extend(report.problems)
        result.repairable = len(report.missing | report.corrupted)
        result.blocks, result.deltas = report.blocks, report.deltas
        result.covered = report.covered
        return result
    finally:
        store.close()


def _page_damage(store: Any, home: Any) -> str | None:
    """One line summing up what SQLite's ``PRAGMA integrity_check`` reports (it lists up
    to 100 problems, mostly "Page N is never used"), or None if it reports none. A store
    so damaged that the check itself cannot run (``database disk image is malformed``)
    counts too; other SQLite errors (a full disk, a lock) are raised as themselves."""
    try:
        # Block-level problems it also finds are left to the replica checks; one
        # report of SQLite's may hold several lines.
        reports = [
            p.removeprefix("sqlite: ") for p in store.integrity_check() if p.startswith("sqlite:")
        ]
        found = [line.strip() for p in reports for line in p.splitlines() if line.strip()]
        lines = [p for p in found if not p.startswith("***")] or found
    except sqlite3.DatabaseError as exc:
        if classify(exc, home)[0] != ExitCode.STORE_DAMAGED:
            raise
        lines = [str(exc)]
    if not lines:
        return None
    more = f" (and {len(lines) - 1} more SQLite reports)" if len(lines) > 1 else ""
    return f"SQLite reports page-level damage: {lines[0]}{more}"


def _reimport(
    store: IPFSHomeStore,
    progress: Callable[[int, int], None] | None = None,
    chunk: int = 1000,
) -> int:
    """Import every block of an IPFS home's cache into its daemon again, pinned (the
    daemon keeps one copy of each: a block it still has costs a request, not space);
    ``progress(blocks, bytes)`` after each ``chunk`` of them (the ~1 s a chunk takes
    js-ipfs; the bar said "0 blocks" for the whole phase)."""
    count = size = 0
    batch: list[Link] = []
    for cid in store.iter_cids():
        batch.append(cid)
        if len(batch) == chunk:
            count, size = _import_cached(store, batch, count, size, progress)
            batch = []
    if batch:
        count, size = _import_cached(store, batch, count, size, progress)
    return count


def _import_cached(
    store: IPFSHomeStore,
    cids: list[Link],
    count: int,
    size: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[int, int]:
    """Import the cached ones of ``cids``; the running (blocks, bytes) totals after."""
    present = store.has_many(cids)
    blocks = [(cid, data) for cid, data in store.get_many(cids) if cid in present]
    store.remote.import_blocks(blocks)
    count += len(blocks)
    size += sum(len(data) for _, data in blocks)
    if progress is not None:
        progress(count, size)
    return count, size


async def _genesis(client: Any, url: str, dataset: Link) -> bytes:
    async with client:
        return await client.genesis(url, dataset)


async def _fetch(
    client: Any,
    url: str,
    replica: Any,
    wanted: set[Link],
    progress: Callable[[int, int], None] | None,
) -> Any:
    async with client:
        return await client.fetch_blocks(url, replica, wanted, progress)
