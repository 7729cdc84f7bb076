"""Helpers for replication tests: in-memory replicas, identities, an in-process pull."""

from __future__ import annotations

import sqlite3

from merklog.replication.errors import NeedSummary
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import Link, MemoryBlockStore


def memory_conn() -> sqlite3.Connection:
    return sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)


def seeded_identity(n: int) -> Identity:
    return Identity.from_seed(bytes([n + 1]) * 32)


def new_replicas(n: int, writers: list[int] | None = None) -> list[Replica]:
    """``n`` replicas of one dataset owned by identity 0; ``writers`` are initial writers."""
    ids = [seeded_identity(i) for i in range(n)]
    writers = list(range(1, n)) if writers is None else writers
    owner = Replica.create(
        memory_conn(), MemoryBlockStore(), ids[0], "test", [ids[w].public_key for w in writers]
    )
    out = [owner]
    for ident in ids[1:]:
        out.append(
            Replica.open(
                memory_conn(),
                MemoryBlockStore(),
                ident,
                owner.dataset,
                owner.genesis.data,
            )
        )
    return out


def plan_pull(dst: Replica, src: Replica, k: int | None = 8) -> tuple[list[Link], int]:
    """Deltas ``src`` would send ``dst`` using the summary protocol; returns (deltas, requests)."""
    requests = 0
    while True:
        requests += 1
        try:
            return src.missing_deltas(dst.heads(), dst.summary(k)), requests
        except NeedSummary:
            assert k is not None, "a complete summary must always suffice"
            k = k * 8
            if k > 10_000:
                k = None


def pull(dst: Replica, src: Replica, k: int | None = 8) -> int:
    """Bring ``dst`` up to date with ``src``; return the number of deltas accepted."""
    deltas, _ = plan_pull(dst, src, k)
    result = dst.apply_blocks(src.blocks_for(deltas))
    assert result.duplicates == 0, "the summary protocol sent a delta the caller already had"
    return result.accepted
