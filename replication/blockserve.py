"""Serving single blocks of a dataset by CID (``POST /v1/datasets/{id}/blocks``).

A repair (``merklog fsck --repair-from PEER``) knows exactly which blocks it lacks
or holds corrupted; asking a peer for those CIDs costs their bytes, where a sync
from the genesis costs the whole log. A peer serves only blocks its replica of
the dataset names (the genesis, accepted deltas, asserted facts), so a caller
allowed for one dataset cannot read another dataset's blocks, inbox messages or
programs that share the store; a block the server holds corrupted is not sent.
The caller re-hashes every block it receives against its CID anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from merklog.store import BlockNotFound, CIDMismatch, Link

from .sqlutil import chunks


def named_blocks(replica: Any, cids: Sequence[Link]) -> set[Link]:
    """The CIDs among ``cids`` that ``replica``'s dataset names: its genesis, its
    accepted deltas and the facts they assert (one indexed ``IN`` query per chunk)."""
    out: set[Link] = {c for c in cids if c == replica.dataset}
    for chunk in chunks(list(dict.fromkeys(cids))):
        by_raw = {c.raw: c for c in chunk}
        marks = ",".join("?" * len(by_raw))
        params = [replica.ds, *by_raw]
        with replica._lock:
            rows = replica.conn.execute(
                f"SELECT cid FROM repl_delta WHERE ds = ? AND cid IN ({marks})", params
            ).fetchall()
            rows += replica.conn.execute(
                f"SELECT DISTINCT fact FROM repl_assert WHERE ds = ? AND fact IN ({marks})",
                params,
            ).fetchall()
        out.update(by_raw[bytes(r[0])] for r in rows)
    return out


def read_blocks(
    replica: Any, cids: Sequence[Link], budget: int
) -> tuple[int, list[tuple[Link, bytes]]]:
    """Blocks of ``cids`` (in order) this replica names and holds intact, until ``budget``
    bytes are reached (at least one block is always sent): ``(how many of cids were
    looked at, [(cid, data), …])``. A CID looked at but not returned is not served
    here (unknown to the dataset, absent or corrupted); the caller asks again for
    ``cids[looked_at:]``."""
    named = named_blocks(replica, cids)
    store = replica.blockstore
    out: list[tuple[Link, bytes]] = []
    size = 0
    looked = 0
    for cid in cids:
        if out and size >= budget:
            break
        looked += 1
        if cid not in named:
            continue
        try:
            data = store.get(cid)  # re-hashed on read: a corrupted copy is not served
        except (BlockNotFound, CIDMismatch):
            continue
        out.append((cid, data))
        size += len(data)
    return looked, out
