"""Is a replica whole? Its tables agree with each other and every block they name is
present and hashes to its CID (``merklog fsck``).

Read-only: finds problems and the CIDs whose blocks must be fetched again; the
repair itself (fetch from a peer, put back) is :meth:`SyncClient.fetch_blocks`
plus ``BlockStore.put``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from merklog.store import CIDMismatch, Link

from .replica import Replica


@dataclass
class Report:
    """Problems found (human-readable) and the blocks missing or corrupted."""

    problems: list[str] = field(default_factory=list)
    missing: set[Link] = field(default_factory=set)
    corrupted: set[Link] = field(default_factory=set)
    blocks: int = 0
    deltas: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def scan_blocks(replica: Replica, report: Report) -> None:
    """Re-hash every block of the store (a corrupted one reads as CIDMismatch)."""
    store = replica.blockstore
    for cid in list(store.iter_cids()):
        report.blocks += 1
        try:
            store.get(cid)
        except CIDMismatch:
            report.corrupted.add(cid)
            report.problems.append(f"block {cid} does not hash to its CID")


def check_tables(replica: Replica, report: Report) -> None:
    """Heads and parents are known deltas; every delta and asserted fact has a block."""
    conn, ds = replica.conn, replica.ds
    with replica._lock:
        deltas = {
            bytes(r[0]) for r in conn.execute("SELECT cid FROM repl_delta WHERE ds = ?", (ds,))
        }
        heads = [bytes(r[0]) for r in conn.execute("SELECT cid FROM repl_head WHERE ds = ?", (ds,))]
        parents = {
            bytes(r[0]) for r in conn.execute("SELECT parent FROM repl_parent WHERE ds = ?", (ds,))
        }
        facts = {
            bytes(r[0])
            for r in conn.execute("SELECT DISTINCT fact FROM repl_assert_cid WHERE ds = ?", (ds,))
        }
    report.deltas = len(deltas)
    for raw in heads:
        if raw not in deltas:
            report.problems.append(f"head {Link(raw)} is not an accepted delta")
    for raw in parents - deltas:
        report.problems.append(f"parent {Link(raw)} is not an accepted delta")
    needed = [Link(raw) for raw in deltas | facts]
    present = replica.blockstore.has_many(needed)
    for cid in needed:
        if cid not in present:
            report.missing.add(cid)
            report.problems.append(f"block {cid} is missing")


def check_replica(replica: Replica) -> Report:
    """Every check: blocks re-hashed, then the replica tables against the blocks."""
    report = Report()
    scan_blocks(replica, report)
    check_tables(replica, report)
    return report
