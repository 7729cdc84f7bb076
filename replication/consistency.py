"""Is a replica whole? Its tables agree with each other and every block they name is
present and hashes to its CID (``merklog fsck``).

Read-only: finds problems and the CIDs whose blocks must be fetched again; the
repair itself (fetch from a peer, put back) is :meth:`SyncClient.fetch_blocks`
plus ``BlockStore.put``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from merklog.store import CIDMismatch, Link

from .blocks import decode_fact_fast
from .errors import MalformedBlock
from .replica import Replica
from .txn import conn_lock


@dataclass
class Report:
    """Problems found (human-readable) and the blocks missing or corrupted."""

    problems: list[str] = field(default_factory=list)
    missing: set[Link] = field(default_factory=set)
    corrupted: set[Link] = field(default_factory=set)
    blocks: int = 0
    deltas: int = 0
    #: Accepted deltas whose blocks a snapshot covers (not kept here, not lost).
    covered: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def scan_blocks(replica: Replica, report: Report, facts: frozenset[bytes] = frozenset()) -> None:
    """Re-hash every block of the store (a corrupted one reads as CIDMismatch), and read
    the blocks of ``facts`` (asserted facts' CIDs) as receivers read them."""
    store = replica.blockstore
    for cid in list(store.iter_cids()):
        report.blocks += 1
        try:
            data = store.get(cid)
        except CIDMismatch:
            report.corrupted.add(cid)
            report.problems.append(f"block {cid} does not hash to its CID")
            continue
        if cid.raw in facts:
            try:
                decode_fact_fast(data)
            except MalformedBlock as exc:
                # Hashes right, so no peer has a better copy: an older merklog's
                # write_async stored a hand-made fact unchecked (QA).
                report.problems.append(
                    f"fact block {cid} holds what no peer accepts ({exc}): sync of the"
                    " delta asserting it fails on every peer, and so do reads of it here;"
                    " restore a backup made before that write"
                )


def table_damage(replica: Replica) -> list[str]:
    """Rows of the replica's tables that name rows the tables lost: a parent link to no
    accepted delta, an assert of a fact id with no ``repl_fact`` row. Index lookups
    only, so cheap enough to run before an export: a CAR written from such tables
    cannot be restored, or silently lacks a fact (QA)."""
    conn, ds = replica.conn, replica.ds
    with replica._lock:
        dangling = [
            bytes(r[0])
            for r in conn.execute(
                "SELECT DISTINCT p.parent FROM repl_parent p WHERE p.ds = ? AND NOT EXISTS"
                " (SELECT 1 FROM repl_delta d WHERE d.ds = p.ds AND d.cid = p.parent)",
                (ds,),
            )
        ]
        (orphans,) = conn.execute(
            "SELECT count(*) FROM repl_assert a WHERE a.ds = ? AND NOT EXISTS"
            " (SELECT 1 FROM repl_fact f WHERE f.id = a.fact)",
            (ds,),
        ).fetchone()
    problems = [f"parent {Link(raw)} is not an accepted delta" for raw in dangling]
    if orphans:
        problems.append(
            f"{orphans} assert row(s) name a fact the table repl_fact lost, so those facts"
            " are missing from queries and ls"
        )
    return problems


def check_tables(replica: Replica, report: Report) -> None:
    """Heads and parents are known deltas; every delta and asserted fact has a block."""
    conn, ds = replica.conn, replica.ds
    with replica._lock:
        deltas = {
            bytes(r[0]) for r in conn.execute("SELECT cid FROM repl_delta WHERE ds = ?", (ds,))
        }
        heads = [bytes(r[0]) for r in conn.execute("SELECT cid FROM repl_head WHERE ds = ?", (ds,))]
        facts = {
            bytes(r[0])
            for r in conn.execute("SELECT DISTINCT fact FROM repl_assert_cid WHERE ds = ?", (ds,))
        }
        try:
            covered = {
                bytes(r[0])
                for r in conn.execute("SELECT cid FROM repl_covered WHERE ds = ?", (ds,))
            }
        except sqlite3.OperationalError:  # a home no merklog with the table opened yet
            covered = set()
    report.deltas = len(deltas)
    report.covered = len(covered & deltas)
    if deltas and not heads:  # the genesis at least is a head: the table lost its rows
        report.problems.append(
            f"the replica has {len(deltas)} accepted deltas but no heads (table repl_head"
            " is empty): its tables are damaged; restore a backup"
        )
    for raw in heads:
        if raw not in deltas:
            report.problems.append(f"head {Link(raw)} is not an accepted delta")
    report.problems.extend(table_damage(replica))
    needed = [Link(raw) for raw in (deltas - covered) | facts]
    present = replica.blockstore.has_many(needed)
    for cid in needed:
        if cid not in present:
            report.missing.add(cid)
            report.problems.append(f"block {cid} is missing")


def check_replica(replica: Replica) -> Report:
    """Every check: blocks re-hashed, then the replica tables against the blocks."""
    report = Report()
    with replica._lock:
        facts = frozenset(
            bytes(r[0])
            for r in replica.conn.execute(
                "SELECT DISTINCT fact FROM repl_assert_cid WHERE ds = ?", (replica.ds,)
            )
        )
    scan_blocks(replica, report, facts)
    check_tables(replica, report)
    return report


@dataclass
class _Tables:
    """What the checks read of a replica: its connection, dataset row, blocks, lock."""

    conn: sqlite3.Connection
    ds: int
    blockstore: Any
    _lock: Any


def check_unopened(conn: sqlite3.Connection, blockstore: Any, dataset: Link) -> Report:
    """:func:`check_replica` of a dataset whose replica cannot be opened because its
    genesis block is missing or corrupted: the same checks over its tables (found by the
    dataset's CID), so every other problem is listed too. A store without the dataset's
    tables reports only the scanned blocks."""
    lock = conn_lock(conn, blockstore)
    with lock:
        try:
            row = conn.execute(
                "SELECT ds FROM repl_dataset WHERE cid = ?", (dataset.raw,)
            ).fetchone()
        except sqlite3.OperationalError:  # no replica tables at all
            row = None
    tables = _Tables(conn, int(row[0]) if row else -1, blockstore, lock)
    report = Report()
    scan_blocks(tables, report)  # type: ignore[arg-type]
    if row is not None:
        check_tables(tables, report)  # type: ignore[arg-type]
    return report
