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
from merklog.store.codec import fact_texts
from merklog.store.gcpause import gc_paused

from .jsonvalues import fact_to_json

#: The largest page ``GET /v1/facts?limit=`` serves (the client asks for pages this size).
FACTS_PAGE_MAX = 10_000


def list_facts(replica: Any, store: Any, rel: str | None = None) -> list[tuple[Link, Fact]]:
    """Visible stored facts (optionally of one relation: read through its index) with
    their CIDs, in CID order. The cyclic collector is paused meanwhile: the list holds
    several objects per fact and no cycles, and with a node's EDB in memory collections
    over them more than doubled the time (250k facts beside 1M: 2.3-2.7 → 5.7 s)."""
    with gc_paused():
        return _list_facts(replica, store, rel)


def _list_facts(replica: Any, store: Any, rel: str | None) -> list[tuple[Link, Fact]]:
    if rel is None:
        return list(replica.visible())
    out: list[tuple[Link, Fact]] = []
    after: Link | None = None
    while True:
        page, after = _page_facts(replica, store, rel, after, FACTS_PAGE_MAX)
        out += page
        if after is None:
            out.sort(key=_cid_of)  # a relation's pages come in id order (ADR 0132)
            return out


def _cid_of(item: tuple[Link, Fact]) -> Link:
    return item[0]


def fact_refs(items: list[tuple[Link, Fact]]) -> list[dict[str, str]]:
    """``{"cid", "fact"}`` of each ``(cid, fact)`` as ``GET /v1/facts`` and ``merklog ls``
    show them: ``str`` of each, rendered in bulk (``Link.texts``, ``fact_texts``)."""
    cids = Link.texts([cid for cid, _fact in items])
    texts = fact_texts([fact for _cid, fact in items])
    return [{"cid": c, "fact": f} for c, f in zip(cids, texts, strict=True)]


def typed_fact_refs(items: list[tuple[Link, Fact]]) -> list[dict[str, Any]]:
    """``{"cid", "rel", "args"}`` of each ``(cid, fact)``: the typed JSON fact form that
    ``POST /v1/facts`` takes (:func:`merklog.node.jsonvalues.fact_to_json`) with the CID,
    for ``GET /v1/facts?form=json``."""
    cids = Link.texts([cid for cid, _fact in items])
    return [{"cid": c, **fact_to_json(f)} for c, (_cid, f) in zip(cids, items, strict=True)]


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
    with gc_paused():  # a page's objects, no cycles (see list_facts)
        return _page_facts(replica, store, rel, after, limit)


def _page_facts(
    replica: Any, store: Any, rel: str | None, after: Link | None, limit: int
) -> tuple[list[tuple[Link, Fact]], Link | None]:
    from merklog.replication.blocks import decode_fact_fast
    from merklog.replication.paging import visible_after, visible_of_relation_after
    from merklog.store import InvalidBlock

    if rel is None:
        cids = visible_after(replica, after, limit + 1)
    else:
        cids = visible_of_relation_after(replica, rel, after, limit + 1)
    more = len(cids) > limit
    del cids[limit:]
    page: list[tuple[Link, Fact]] = []
    for cid, data in store.get_many(cids):  # each block re-hashed against its CID
        fact = decode_fact_fast(data)  # the fact as the replica's reads decode it
        if rel is not None and fact.rel != rel:
            raise InvalidBlock(f"fact {cid} is indexed under {rel!r}, not {fact.rel!r}")
        page.append((cid, fact))
    return page, (cids[-1] if more and cids else None)
