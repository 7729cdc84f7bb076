"""A history written by several writers taking turns, as blocks a replica accepts: what
``bench/writers.py`` times and the writer-status tests check (ADR 0219), built once.

The owner grants every writer, each in its own delta; then the writers assert one fact
each in turn, each delta on top of the one before (a linear history), so that every
writer's check must look past the deltas of all the others since its last one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from merklog.store import Link, encode_fact, make_fact

from .blocks import build_delta
from .identity import Identity


def writer_keys(n: int) -> list[Identity]:
    """``n`` distinct writer identities, the same on every call."""
    return [Identity.from_seed(i.to_bytes(4, "big") * 8) for i in range(1, n + 1)]


def turn_taking_blocks(
    owner: Identity, dataset: Link, writers: Sequence[Identity], deltas: int
) -> tuple[list[tuple[Link, bytes]], Link]:
    """The blocks (each delta after the facts it asserts, in clock order; no genesis) of
    the history above on the dataset ``dataset`` owned by ``owner``, and its head."""
    blocks: list[tuple[Link, bytes]] = []
    head, clock = dataset, 0
    seq: dict[bytes, int] = {}

    def add(ident: Identity, ops: list[dict[str, Any]], extra: tuple = ()) -> None:
        nonlocal head, clock
        clock += 1
        seq[ident.public_key] = seq.get(ident.public_key, 0) + 1
        d = build_delta(ident, dataset, seq[ident.public_key], clock, [head], ops)
        blocks.extend(extra)
        blocks.append((d.cid, d.data))
        head = d.cid

    for w in writers:
        add(owner, [{"op": "grant", "key": w.public_key}])
    for i in range(deltas):
        cid, data = encode_fact(make_fact("p", [i]))
        add(writers[i % len(writers)], [{"op": "assert", "fact": cid}], ((cid, data),))
    return blocks, head
