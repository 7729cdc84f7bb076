"""Bootstrap an empty replica from a compacted OR-set snapshot, without delta blocks.

A snapshot (see docs/spark.md) holds the visible facts with their supporting
assert tags, the covered deltas' ids, authors, clocks and parents, the
grant/revoke history and the heads it covers. Installing it gives the replica
exactly the state it would have after applying those deltas, so acceptance of
later deltas ("are the parents known?", "is the author a writer?") and later
retracts (which observe assert tags) behave as if the history were present.
Sync then only ever sends what came after the snapshot heads.

This is the one place outside replica.py that writes the replication tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from merklog.store import Fact, Link, encode_fact

from . import relindex
from .assertrows import insert_asserts
from .authsets import AuthSets
from .errors import InvalidDelta
from .replica import Replica


@dataclass(frozen=True, slots=True)
class CoveredDelta:
    """A delta the snapshot covers: its identity and place in the DAG, not its ops."""

    cid: Link
    author: bytes
    seq: int
    clock: int
    parents: tuple[Link, ...]


@dataclass(frozen=True, slots=True)
class AclEntry:
    """A grant or revoke the snapshot covers."""

    key: bytes
    delta: Link
    clock: int
    grant: bool


def _check_closed(genesis: Link, deltas: Sequence[CoveredDelta], heads: Sequence[Link]) -> None:
    """Refuse a snapshot whose deltas name a parent it does not cover (other than the
    genesis), or whose heads it does not cover: made from a partial log (the export of a
    pruned home), it would claim heads whose history this replica then never receives."""
    covered = {d.cid for d in deltas}
    covered.add(genesis)
    for d in deltas:
        for parent in d.parents:
            if parent not in covered:
                raise InvalidDelta(
                    f"snapshot delta {d.cid} names parent {parent}, which the snapshot does not"
                    " cover: it was made from a partial log (the export of a pruned home?)"
                )
    for head in heads:
        if head not in covered:
            raise InvalidDelta(f"snapshot head {head} is not a delta the snapshot covers")


def install_snapshot_state(
    replica: Replica,
    facts: Iterable[tuple[Link, Fact, Sequence[Link]]],
    deltas: Sequence[CoveredDelta],
    acl: Sequence[AclEntry],
    heads: Sequence[Link],
) -> int:
    """Give an empty replica a snapshot's OR-set state; return the number of visible facts.

    ``facts`` are ``(fact CID, fact, supporting assert delta CIDs)``; every CID is
    recomputed from the fact and must match. All-or-nothing: one transaction.
    """
    if replica.delta_count():
        raise InvalidDelta("a snapshot can only be installed into an empty replica")
    _check_closed(replica.dataset, deltas, heads)
    ds = replica.ds
    blocks: list[tuple[Link, bytes]] = []
    asserts: list[tuple[int, bytes, bytes, int]] = []
    visible: list[tuple[Link, Fact]] = []
    for cid, fact, support in facts:
        real, data = encode_fact(fact)
        if real != cid:
            raise InvalidDelta(f"snapshot fact {fact} does not hash to its CID {cid}")
        blocks.append((cid, data))
        asserts.extend((ds, cid.raw, s.raw, 0) for s in support)
        visible.append((cid, fact))
    delta_rows = [(ds, d.cid.raw, d.author, d.seq, d.clock, 0, 0) for d in deltas]
    parent_rows = [(ds, d.cid.raw, p.raw) for d in deltas for p in d.parents]
    auth_rows = [
        (ds, a.key, a.delta.raw, a.clock, int(a.grant))
        for a in sorted(acl, key=lambda a: (a.clock, a.delta.raw))
    ]
    with replica._lock:
        try:
            with replica._tx():
                replica.blockstore.put_many(blocks)
                conn = replica.conn
                conn.executemany("INSERT INTO repl_delta VALUES (?, ?, ?, ?, ?, ?, ?)", delta_rows)
                # Their blocks stay with the snapshot: not lost (fsck), never served.
                conn.executemany(
                    "INSERT OR IGNORE INTO repl_covered VALUES (?, ?)",
                    [(ds, d.cid.raw) for d in deltas],
                )
                conn.executemany("INSERT OR IGNORE INTO repl_parent VALUES (?, ?, ?)", parent_rows)
                conn.executemany(
                    "INSERT OR REPLACE INTO repl_auth VALUES (?, ?, ?, ?, ?)", auth_rows
                )
                AuthSets(conn, ds).number_new()
                insert_asserts(conn, asserts)
                relindex.record(conn, ((ds, fact.rel, cid.raw) for cid, fact in visible))
                if heads:
                    conn.execute("DELETE FROM repl_head WHERE ds = ?", (ds,))
                    conn.executemany(
                        "INSERT INTO repl_head VALUES (?, ?)", [(ds, h.raw) for h in heads]
                    )
                for cid, fact in visible:
                    replica._note(cid, +1, fact)
        except BaseException:
            replica._changes.clear()
            raise
    replica._emit()
    return len(visible)
