"""Serving single blocks of a dataset by CID (``POST /v1/datasets/{id}/blocks``).

A repair (``merklog fsck --repair-from PEER``) knows exactly which blocks it lacks
or holds corrupted; asking a peer for those CIDs costs their bytes, where a sync
from the genesis costs the whole log. A peer serves only blocks its replica of
the dataset names (the genesis, accepted deltas, asserted facts), so a caller
allowed for one dataset cannot read another dataset's blocks, inbox messages or
programs that share the store; a block the server holds corrupted is not sent.
The caller re-hashes every block it receives against its CID anyway.

The response streams (ADR 0097): which CIDs it covers is planned from stored sizes
first (``X-Merklog-Processed`` is a header, sent before the body), then blocks are
read, re-hashed and written about 1 MiB at a time, so the server holds one run of
blocks, not the whole response (up to ~64 MiB).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from merklog.store import BlockNotFound, CIDMismatch, Link
from merklog.store.car import car_section

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
                f"SELECT f.cid FROM repl_fact f WHERE f.cid IN ({marks})"
                " AND EXISTS (SELECT 1 FROM repl_assert a WHERE a.ds = ? AND a.fact = f.id)",
                [*by_raw, replica.ds],
            ).fetchall()
        out.update(by_raw[bytes(r[0])] for r in rows)
    return out


#: What one worker-thread read of a streamed response holds at most: this many bytes of
#: blocks (plus the one that crosses it) or this many blocks.
RUN_BYTES = 1 << 20
RUN_BLOCKS = 256


def plan_blocks(
    replica: Any, cids: Sequence[Link], budget: int
) -> tuple[int, list[tuple[Link, int]]]:
    """Which blocks one response carries, decided before any block is read (so the
    response can stream): ``(how many of cids were looked at, [(cid, size), …] to send)``.

    CIDs are taken in order while the stored sizes of the blocks to send stay under
    ``budget`` bytes (at least one block is always sent). A CID looked at but not
    planned (unknown to the dataset, absent) is not served here; the caller asks again
    for ``cids[looked_at:]``. Sizes come from :meth:`BlockStore.sizes` (no block read)."""
    named = named_blocks(replica, cids)
    sizes = replica.blockstore.sizes([c for c in dict.fromkeys(cids) if c in named])
    send: list[tuple[Link, int]] = []
    total = 0
    looked = 0
    for cid in cids:
        if send and total >= budget:
            break
        looked += 1
        size = sizes.get(cid)
        if size is None:
            continue
        send.append((cid, size))
        total += size
    return looked, send


def runs(plan: Sequence[tuple[Link, int]]) -> Iterator[list[Link]]:
    """The planned CIDs in consecutive runs of about :data:`RUN_BYTES` (or
    :data:`RUN_BLOCKS` blocks): the memory a streamed response holds at once."""
    run: list[Link] = []
    size = 0
    for cid, n in plan:
        run.append(cid)
        size += n
        if size >= RUN_BYTES or len(run) >= RUN_BLOCKS:
            yield run
            run, size = [], 0
    if run:
        yield run


def read_sections(replica: Any, cids: Sequence[Link]) -> tuple[bytes, int]:
    """CAR sections of the planned blocks ``cids`` and how many blocks they hold, each
    re-hashed as it is read: a block found corrupted (or gone since it was planned) is
    left out, not sent."""
    store = replica.blockstore
    out: list[bytes] = []
    for cid in cids:
        try:
            data = store.get(cid)  # re-hashed on read: a corrupted copy is not served
        except (BlockNotFound, CIDMismatch):
            continue
        out.append(car_section(cid, data))
    return b"".join(out), len(out)
