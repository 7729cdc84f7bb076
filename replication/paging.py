"""Visible fact CIDs in CID order from a cursor: the index range scan behind paged reads
(``GET /v1/facts``, ``merklog ls`` through a running node).

``repl_assert``'s primary key is ``(ds, fact, delta)``, so "the next ``limit`` distinct
visible fact CIDs after ``after``" is one range scan of that index: a page costs
O(limit · log n), not a sort of the whole visible set (which made every page of a
450,000-fact home take seconds, and following all pages quadratic).
"""

from __future__ import annotations

from typing import Any

from merklog.store import Link, encode

from .blocks import fast_link

#: How a canonical dag-cbor fact block ``{"rel": …, "args": …}`` starts: a 2-entry map
#: whose first key is ``"rel"`` (dag-cbor sorts keys by length first).
REL_KEY = b"\xa2crel"


def rel_prefix(rel: str) -> bytes:
    """The first bytes of every canonical fact block of relation ``rel``: a page filtered
    by relation skips other relations' blocks without decoding them (a block not
    starting with :data:`REL_KEY` is decoded as before)."""
    return REL_KEY + encode(rel)


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
