"""Visible facts in pages (``GET /v1/facts``, ``merklog ls``, ``Node.list_facts`` and
``Node.page_facts``).

A page is read forward from a cursor in index order (:mod:`merklog.replication.paging`):
the visible set for all facts, the relation's own index with ``rel`` (ADR 0095), so a
page costs O(limit) block reads whatever the home holds besides. The functions take the
replica and store they read; the node delegates here.
"""

from __future__ import annotations

from typing import Any

from merklog.store import Fact, Link


def list_facts(replica: Any, store: Any, rel: str | None = None) -> list[tuple[Link, Fact]]:
    """Visible stored facts (optionally of one relation: read through its index) with
    their CIDs, in CID order."""
    if rel is None:
        return list(replica.visible())
    out: list[tuple[Link, Fact]] = []
    after: Link | None = None
    while True:
        page, after = page_facts(replica, store, rel, after, 10_000)
        out += page
        if after is None:
            out.sort(key=_cid_of)  # a relation's pages come in id order (ADR 0132)
            return out


def _cid_of(item: tuple[Link, Fact]) -> Link:
    return item[0]


def page_facts(
    replica: Any,
    store: Any,
    rel: str | None = None,
    after: Link | None = None,
    limit: int = 1000,
) -> tuple[list[tuple[Link, Fact]], Link | None]:
    """One page of visible facts after the fact ``after`` (CID order; with ``rel``, the
    order the node first stored the relation's facts, ADR 0132); returns (page, cursor
    for the next page or None when this was the last)."""
    from merklog.replication.paging import visible_after, visible_of_relation_after
    from merklog.store import InvalidBlock, decode_fact

    if rel is None:
        cids = visible_after(replica, after, limit + 1)
    else:
        cids = visible_of_relation_after(replica, rel, after, limit + 1)
    more = len(cids) > limit
    del cids[limit:]
    page: list[tuple[Link, Fact]] = []
    for cid, data in store.get_many(cids):
        fact = decode_fact(data)
        if rel is not None and fact.rel != rel:
            raise InvalidBlock(f"fact {cid} is indexed under {rel!r}, not {fact.rel!r}")
        page.append((cid, fact))
    return page, (cids[-1] if more and cids else None)
