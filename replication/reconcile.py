"""Reconciliation: which deltas a peer lacks, from its heads and a summary of its log
(docs/sync-protocol.md), and the blocks that carry them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import libipld

from merklog.store import BlockNotFound, Link, verify

from .blocks import (
    fast_link,
    fast_verifies,
)
from .errors import (
    MalformedBlock,
    NeedSummary,
)
from .sqlutil import chunks as _chunks
from .state import ReplicaState


@dataclass
class Summary:
    """Set-reconciliation summary a caller sends with its heads (see docs/sync-protocol.md).

    ``window`` holds the caller's heads plus its ``k`` newest deltas (by clock);
    ``boundary`` the parents of window deltas outside the window. ``complete``
    means the window is the caller's entire log.
    """

    window: list[Link]
    boundary: list[Link]
    complete: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "window": [str(c) for c in self.window],
            "boundary": [str(c) for c in self.boundary],
            "complete": self.complete,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Summary:
        if not isinstance(obj, dict):
            raise MalformedBlock("summary must be an object {window, boundary, complete}")
        try:
            window = [Link.parse(c) for c in obj.get("window", [])]
            boundary = [Link.parse(c) for c in obj.get("boundary", [])]
        except (ValueError, TypeError) as exc:
            raise MalformedBlock(f"summary holds a bad CID: {exc}") from exc
        return cls(window, boundary, bool(obj.get("complete", False)))


def _asserted_facts(delta_block: bytes) -> list[Link]:
    """Distinct fact CIDs asserted by an (already accepted) delta block."""
    obj = libipld.decode_dag_cbor(delta_block)
    return [
        fast_link(f)
        for f in dict.fromkeys(op["fact"] for op in obj["ops"] if op.get("op") == "assert")
    ]


class Reconciliation(ReplicaState):
    """What a peer lacks and the blocks to send it; peers' last known heads."""

    def remember_peer_heads(self, peer: str, heads: Sequence[Link]) -> None:
        """Record a peer's heads as last seen (sizes the next summary for that peer).
        Heads already recorded are not written again: a periodic sync of an idle pair
        would otherwise write its WAL every round (~32 KB per 5 s per node)."""
        raw = b"".join(h.raw for h in sorted(heads))
        with self._lock:
            row = self.conn.execute(
                "SELECT heads FROM repl_peer WHERE ds = ? AND peer = ?", (self.ds, peer)
            ).fetchone()
            if row is not None and bytes(row[0]) == raw:
                return
            with self._tx():
                self.conn.execute(
                    "INSERT OR REPLACE INTO repl_peer VALUES (?, ?, ?)", (self.ds, peer, raw)
                )

    def peer_heads(self, peer: str) -> list[Link]:
        """The heads last recorded for ``peer`` (empty if never synced)."""
        with self._lock:
            row = self.conn.execute(
                "SELECT heads FROM repl_peer WHERE ds = ? AND peer = ?", (self.ds, peer)
            ).fetchone()
        if row is None:
            return []
        raw = bytes(row[0])
        return [fast_link(raw[i : i + 36]) for i in range(0, len(raw), 36)]

    def unsynced_count(self, peer: str, author: bytes | None = None) -> int | None:
        """How many of our deltas the peer lacked when last seen (None if never synced);
        ``author``: the peer's own key, whose deltas it cannot lack whatever its heads
        said when last seen (QA: a peer was shown 2 behind on its own grant and revoke,
        which had reached us through a third node)."""
        last = [h for h in self.peer_heads(peer) if self.has_delta(h)]
        if not last:
            return None
        missing = self.missing_deltas(last)
        if author is None or not missing:
            return len(missing)
        mine = 0
        with self._lock:
            for chunk in _chunks(sorted(c.raw for c in missing)):
                marks = ",".join("?" * len(chunk))
                (n,) = self.conn.execute(
                    f"SELECT count(*) FROM repl_delta WHERE ds = ? AND author = ?"
                    f" AND cid IN ({marks})",
                    (self.ds, author, *chunk),
                ).fetchone()
                mine += n
        return len(missing) - mine

    def summary(self, k: int | None = 32) -> Summary:
        """Reconciliation summary: heads + ``k`` newest deltas + their outside parents.

        ``k=None`` sends the whole log (always sufficient).
        """
        with self._lock:
            heads = [h.raw for h in self.heads()]
            if k is None:
                rows = self.conn.execute(
                    "SELECT cid FROM repl_delta WHERE ds = ?", (self.ds,)
                ).fetchall()
            else:
                rows = self.conn.execute(
                    "SELECT cid FROM repl_delta WHERE ds = ? ORDER BY clock DESC, cid LIMIT ?",
                    (self.ds, k),
                ).fetchall()
            window = set(heads) | {bytes(r[0]) for r in rows}
            boundary: set[bytes] = set()
            if k is not None:
                for chunk in _chunks(sorted(window)):
                    marks = ",".join("?" * len(chunk))
                    boundary.update(
                        bytes(r[0])
                        for r in self.conn.execute(
                            f"SELECT parent FROM repl_parent WHERE ds = ? AND child IN ({marks})",
                            (self.ds, *chunk),
                        )
                    )
                boundary -= window
            (total,) = self.conn.execute(
                "SELECT count(*) FROM repl_delta WHERE ds = ?", (self.ds,)
            ).fetchone()
        return Summary(
            sorted(Link(c) for c in window),
            sorted(Link(c) for c in boundary),
            complete=len(window) >= total,
        )

    def missing_deltas(
        self, their_heads: Sequence[Link], summary: Summary | None = None
    ) -> list[Link]:
        """Deltas we hold that a peer with ``their_heads`` (+ ``summary``) lacks, in clock order.

        Raises NeedSummary if some of their heads are unknown here and the summary
        (if any) does not prove which of our deltas they hold.
        """
        with self._lock:
            seeds = set(their_heads)
            if summary is not None:
                seeds |= set(summary.window) | set(summary.boundary)
            known = self._known_subset(seeds)
            unknown_heads = [h for h in their_heads if h.raw not in known]
            if unknown_heads:
                if summary is None:
                    raise NeedSummary(
                        f"{len(unknown_heads)} of the caller's heads are unknown here;"
                        " send a summary"
                    )
                if not summary.complete:
                    unknown_boundary = [b for b in summary.boundary if b.raw not in known]
                    if unknown_boundary:
                        raise NeedSummary(
                            f"summary boundary holds {len(unknown_boundary)} unknown deltas;"
                            " send a larger window"
                        )
            self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS repl_seed (cid BLOB PRIMARY KEY)")
            self.conn.execute("DELETE FROM temp.repl_seed")
            self.conn.executemany("INSERT INTO temp.repl_seed VALUES (?)", [(k,) for k in known])
            rows = self.conn.execute(
                "WITH RECURSIVE have(cid) AS (SELECT cid FROM temp.repl_seed"
                " UNION SELECT p.parent FROM repl_parent p JOIN have ON p.ds = ? AND p.child = have.cid)"
                " SELECT d.cid FROM repl_delta d WHERE d.ds = ? AND d.clock > 0"
                " AND d.cid NOT IN (SELECT cid FROM have) ORDER BY d.clock, d.cid",
                (self.ds, self.ds),
            ).fetchall()
            self.conn.execute("DELETE FROM temp.repl_seed")
        return [Link(r[0]) for r in rows]

    def sendable(self, deltas: Sequence[Link]) -> tuple[list[Link], int]:
        """``deltas`` (in clock order) split into those this replica can send and how many
        it cannot: a delta whose block it does not hold (kept only as a snapshot's
        metadata: pruned, or bootstrapped from a snapshot) and every delta after it
        that has such a one among its parents, which a receiver would refuse for its
        unknown parent. A peer gets those from a peer that holds them."""
        present = self.blockstore.has_many(deltas)
        if len(present) == len(deltas):
            return list(deltas), 0
        held = {d.raw for d in deltas if d not in present}
        parents: dict[bytes, list[bytes]] = {}
        with self._lock:
            for chunk in _chunks(list(deltas)):
                marks = ",".join("?" * len(chunk))
                for child, parent in self.conn.execute(
                    f"SELECT child, parent FROM repl_parent WHERE ds = ? AND child IN ({marks})",
                    (self.ds, *[c.raw for c in chunk]),
                ):
                    parents.setdefault(bytes(child), []).append(bytes(parent))
        out = []
        for d in deltas:  # parents first: one pass carries the holding back to descendants
            if d.raw in held or any(p in held for p in parents.get(d.raw, ())):
                held.add(d.raw)
            else:
                out.append(d)
        return out, len(deltas) - len(out)

    def _known_subset(self, cids: Iterable[Link]) -> set[bytes]:
        cids = list(cids)
        known: set[bytes] = set()
        for chunk in _chunks(cids):
            marks = ",".join("?" * len(chunk))
            known.update(
                bytes(r[0])
                for r in self.conn.execute(
                    f"SELECT cid FROM repl_delta WHERE ds = ? AND cid IN ({marks})",
                    (self.ds, *[c.raw for c in chunk]),
                )
            )
        return known

    def blocks_for(self, deltas: Iterable[Link]) -> Iterator[tuple[Link, bytes]]:
        """For each delta (in order): its asserted fact blocks, then the delta block."""
        offer = self.blockstore.shared_sqlite()
        shared = offer is not None and offer.conn is self.conn
        for cid in deltas:
            with self._lock:
                data = self.blockstore.get(cid)
                facts = _asserted_facts(data)
                if shared:  # SQLiteBlockStore on our connection: batched reads
                    assert offer is not None
                    blocks = self._sqlite_blocks(facts, offer.blocks_table)
                else:
                    blocks = list(self.blockstore.get_many(facts))
                blocks.append((cid, data))
            yield from blocks

    def _sqlite_blocks(self, cids: list[Link], table: str) -> list[tuple[Link, bytes]]:
        """Blocks read straight from the shared SQLite store's blocks table (named by its
        :class:`merklog.store.SharedSQLite` offer), ``IN`` batches, re-hashed like any read."""
        out = []
        for chunk in _chunks(cids):
            marks = ",".join("?" * len(chunk))
            rows = self.conn.execute(
                f'SELECT cid, data FROM "{table}" WHERE cid IN ({marks})', [c.raw for c in chunk]
            ).fetchall()
            if len(rows) != len(chunk):
                found = {bytes(r[0]) for r in rows}
                raise BlockNotFound(next(c for c in chunk if c.raw not in found))
            for raw, data in rows:
                cid = fast_link(bytes(raw))
                data = bytes(data)
                if not fast_verifies(cid, data):
                    verify(cid, data, "sqlite store")
                out.append((cid, data))
        return out

    def reasserted_facts(self) -> set[bytes]:
        """Raw CIDs of the facts that more than one delta of this dataset asserts (a fact
        asserted again, e.g. after its retraction). :meth:`blocks_for` yields their blocks
        with every such delta; a CAR export writes each once. Usually few: the set stays
        small where a set of every exported CID would grow with the dataset."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT f.cid FROM repl_assert a JOIN repl_fact f ON f.id = a.fact"
                " WHERE a.ds = ? GROUP BY a.fact HAVING COUNT(*) > 1",
                (self.ds,),
            ).fetchall()
        return {bytes(r[0]) for r in rows}

    def missing_for(
        self, their_heads: Sequence[Link], summary: Summary | None = None
    ) -> Iterator[tuple[Link, bytes]]:
        """Every block a peer with ``their_heads`` lacks (raises NeedSummary eagerly)."""
        return self.blocks_for(self.missing_deltas(their_heads, summary))
