"""Visible fact CIDs in CID order from a cursor: the index range scans behind paged reads
(``GET /v1/facts``, ``merklog ls`` through a running node).

``repl_assert``'s primary key is ``(ds, fact, delta)``, so "the next ``limit`` distinct
visible fact CIDs after ``after``" is one range scan of that index: a page costs
O(limit · log n), not a sort of the whole visible set (which made every page of a
450,000-fact home take seconds, and following all pages quadratic). A page of one
relation scans that relation's rows of ``repl_rel_fact`` (:mod:`.relindex`) instead,
so it never reads another relation's facts (ADR 0095).
"""

from __future__ import annotations

from typing import Any

from merklog.store import Link

from .blocks import fast_link


def visible_after(replica: Any, after: Link | None, limit: int) -> list[Link]:
    """Up to ``limit`` visible fact CIDs greater than ``after`` (byte order, which is
    Link order), ascending."""
    with replica._lock:
        rows = replica.conn.execute(
            "SELECT DISTINCT fact FROM repl_assert WHERE ds = ? AND fact > ? AND killed = 0"
            " ORDER BY fact LIMIT ?",
            (replica.ds, after.raw if after is not None else b"", limit),
        ).fetchall()
    return [fast_link(bytes(r[0])) for r in rows]


def visible_of_relation_after(replica: Any, rel: str, after: Link | None, limit: int) -> list[Link]:
    """Up to ``limit`` visible fact CIDs of relation ``rel`` greater than ``after``,
    ascending: a range scan of ``repl_rel_fact``'s ``(ds, rel, fact)`` key with one
    ``repl_assert`` primary-key probe per row passed (retracted facts of ``rel`` are
    skipped there; other relations' facts are never touched)."""
    with replica._lock:
        rows = replica.conn.execute(
            "SELECT r.fact FROM repl_rel_fact r WHERE r.ds = ? AND r.rel = ? AND r.fact > ?"
            " AND EXISTS (SELECT 1 FROM repl_assert a"
            " WHERE a.ds = r.ds AND a.fact = r.fact AND a.killed = 0)"
            " ORDER BY r.fact LIMIT ?",
            (replica.ds, rel, after.raw if after is not None else b"", limit),
        ).fetchall()
    return [fast_link(bytes(r[0])) for r in rows]
