"""Visible fact CIDs from a cursor: the index range scans behind paged reads
(``GET /v1/facts``, ``merklog ls`` through a running node).

All facts come in CID order: a range scan of ``repl_fact``'s CID index from the cursor
with one ``repl_assert`` primary-key probe ``(ds, fact id)`` per fact passed, so a page
costs O(limit · log n), not a sort of the whole visible set (which made every page of a
450,000-fact home take seconds, and following all pages quadratic). A page of one
relation scans that relation's rows of ``repl_rel_fact`` (:mod:`.relindex`) instead,
so it never reads another relation's facts (ADR 0095); that index is keyed by fact id
(ADR 0132), rows and id ranges (ADR 0151), so a relation's facts come in the order this
node first stored them, and a cursor (a fact CID of an earlier page) is turned into its
id first.
"""

from __future__ import annotations

import heapq
from itertools import islice
from operator import itemgetter
from typing import Any

from merklog.store import Link

from .blocks import fast_link
from .errors import NotFound


def visible_after(replica: Any, after: Link | None, limit: int) -> list[Link]:
    """Up to ``limit`` visible fact CIDs greater than ``after`` (byte order, which is
    Link order), ascending."""
    with replica._lock:
        rows = replica.conn.execute(
            "SELECT f.cid FROM repl_fact f WHERE f.cid > ?"
            " AND EXISTS (SELECT 1 FROM repl_assert a"
            " WHERE a.ds = ? AND a.fact = f.id AND a.killed = 0)"
            " ORDER BY f.cid LIMIT ?",
            (after.raw if after is not None else b"", replica.ds, limit),
        ).fetchall()
    return [fast_link(bytes(r[0])) for r in rows]


#: ``?1`` ds, ``?2`` relation, ``?3`` the cursor's id, ``?4`` limit: the visible facts
#: of the relation's rows after the cursor, as ``(id, cid)`` in id order.
_ROWS_AFTER = (
    "SELECT r.fact, f.cid FROM repl_rel_fact r CROSS JOIN repl_fact f"
    " WHERE r.ds = ?1 AND r.rel = ?2 AND r.fact > ?3 AND f.id = r.fact"
    " AND EXISTS (SELECT 1 FROM repl_assert a WHERE a.ds = ?1 AND a.fact = r.fact"
    " AND a.killed = 0)"
    " ORDER BY r.fact LIMIT ?4"
)

#: The same from the relation's id ranges (ADR 0151): the ranges from the last one that
#: starts at or before the cursor on, in ``lo`` order (ranges never overlap, so that is
#: id order), each a rowid range of ``repl_fact``.
_RANGES_AFTER = (
    "SELECT f.id, f.cid FROM repl_rel_range g CROSS JOIN repl_fact f"
    " WHERE g.ds = ?1 AND g.rel = ?2 AND g.lo >= coalesce((SELECT h.lo FROM repl_rel_range h"
    " WHERE h.ds = ?1 AND h.rel = ?2 AND h.lo <= ?3 ORDER BY h.lo DESC LIMIT 1), 0)"
    " AND f.id BETWEEN max(g.lo, ?3 + 1) AND g.hi"
    " AND EXISTS (SELECT 1 FROM repl_assert a WHERE a.ds = ?1 AND a.fact = f.id"
    " AND a.killed = 0)"
    " ORDER BY g.lo, f.id LIMIT ?4"
)


def visible_of_relation_after(replica: Any, rel: str, after: Link | None, limit: int) -> list[Link]:
    """Up to ``limit`` visible fact CIDs of relation ``rel`` that come after the fact
    ``after`` in the relation's index (the order this node first stored them, which is
    fact id order; from the start when ``after`` is None): range scans of the index's
    rows and of its id ranges from the cursor, with one ``repl_assert`` primary-key
    probe per fact passed (retracted facts of ``rel`` are skipped there; other
    relations' facts are never touched), merged by id. A cursor this node never stored,
    or a fact of another relation (whose id would skip some of ``rel``'s facts), raises
    NotFound."""
    with replica._lock:
        start = 0
        if after is not None:
            row = replica.conn.execute(
                "SELECT id FROM repl_fact WHERE cid = ?", (after.raw,)
            ).fetchone()
            if row is None:
                raise NotFound(f"fact {after} is not a cursor of this node's pages")
            start = int(row[0])
            member = replica.conn.execute(
                "SELECT 1 FROM repl_rel_member WHERE ds = ? AND rel = ? AND fact = ? LIMIT 1",
                (replica.ds, rel, start),
            ).fetchone()
            if member is None:
                raise NotFound(f"fact {after} is not a cursor of the pages of relation {rel!r}")
        params = (replica.ds, rel, start, limit)
        rows = replica.conn.execute(_ROWS_AFTER, params).fetchall()
        ranged = replica.conn.execute(_RANGES_AFTER, params).fetchall()
    merged = heapq.merge(rows, ranged, key=_first) if rows and ranged else rows or ranged
    return [fast_link(bytes(cid)) for _id, cid in islice(merged, limit)]


_first = itemgetter(0)
