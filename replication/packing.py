"""The writer side of the limits in :mod:`.limits`: turn ops into wire ops, then pack
them into deltas every receiver accepts.

Pure functions over the replica's current state (passed in as a lookup), so the
rules are testable without a database and written once for every writer.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate
from operator import itemgetter
from typing import Any, NamedTuple

from merklog.store import MAX_RELATION_CHARS, Link, encode_facts

from .blocks import Assert, Grant, Op, Retract, Revoke
from .errors import TooLarge
from .limits import (
    MAX_FACT_BYTES,
    MAX_OPS,
    WRITE_MAX_DELTA_BYTES,
    WRITE_MAX_DELTA_FACT_BYTES,
    WRITE_MAX_OBSERVED,
)

#: Upper bounds on the DAG-CBOR size of one wire op / of a delta without its ops and
#: parents (author, dataset, seq, clock, sig and map keys): conservative, so a delta
#: packed to the budget never exceeds it.
_ASSERT_OP = 64
_RETRACT_OP = 96
_KEY_OP = 64
_LINK = 42
_DELTA_BASE = 512

LiveLookup = Callable[[Iterable[Link]], dict[Link, list[Link]]]
_FACT_OPS = (Assert, Retract)
_data_of = itemgetter(1)


class PlannedOp(NamedTuple):
    """One wire op, its encoded-size bound and the fact block it carries, if any:
    ``block`` = (CID, bytes, Fact)."""

    wire: dict[str, Any]
    size: int
    block: tuple[Link, bytes, Any] | None = None


def plan_ops(
    ops: Sequence[Op],
    live: LiveLookup,
    owner_check: Callable[[], None],
    encoded: Sequence[tuple[Link, bytes]] | None = None,
) -> list[PlannedOp]:
    """Wire ops for ``ops`` against the state ``live`` describes (visible fact → live
    asserting deltas). Raises TooLarge for an oversized fact before anything is built.

    Dropped as no-ops: asserts of facts visible now and not retracted in the same
    call (they would only add asserts that a later retract must list), duplicate
    asserts, and retracts of facts not visible now. A retract's observed list is
    split into ops of at most ``WRITE_MAX_OBSERVED`` CIDs.

    ``encoded``: the ``(CID, block)`` of each Assert/Retract op's fact, in op order, when
    the caller already computed them (``encode_facts``): each fact is encoded once.
    """
    # Encoded per op position: Facts are never dict keys here, because Python's ==
    # would merge edge(1), edge(1.0) and edge(true), which are different facts.
    kinds = [type(op) for op in ops]
    if encoded is None:
        encoded = encode_facts(
            [op.fact for op, k in zip(ops, kinds, strict=True) if k in _FACT_OPS]
        )
    if len(kinds) == len(encoded):  # fact ops only (the bulk case): aligned already
        blocks: list[Any] = list(encoded)
    else:
        it = iter(encoded)
        blocks = [next(it) if k in _FACT_OPS else None for k in kinds]
    asserted_rels = {op.fact.rel for op, k in zip(ops, kinds, strict=True) if k is Assert}
    if asserted_rels and max(map(len, asserted_rels)) > MAX_RELATION_CHARS:
        rel = max(asserted_rels, key=len)
        error = TooLarge(
            f"relation name {rel[:40]}… has {len(rel)} characters, over the"
            f" {MAX_RELATION_CHARS}-character limit for a new fact (MAX_RELATION_CHARS)"
        )
        error.fact = next(
            op.fact for op, k in zip(ops, kinds, strict=True) if k is Assert and op.fact.rel == rel
        )
        raise error
    if encoded and max(map(len, map(_data_of, encoded))) > MAX_FACT_BYTES:
        for op, k, got in zip(ops, kinds, blocks, strict=True):
            if k is Assert and len(got[1]) > MAX_FACT_BYTES:
                error = TooLarge(
                    f"fact {op.fact.rel}/{len(op.fact.args)} encodes to {len(got[1])} bytes,"
                    f" over the {MAX_FACT_BYTES}-byte limit for one fact (MAX_FACT_BYTES);"
                    " store large values in several facts"
                )
                error.fact = op.fact  # its place in the input can then be named
                raise error
    state = live([got[0] for got in blocks if got is not None])
    retracted = {got[0] for k, got in zip(kinds, blocks, strict=True) if k is Retract}
    planned: list[PlannedOp] = []
    append = planned.append
    # Raw CID bytes as set keys: bytes hash in C (cached), a Link's __hash__ is a Python
    # call, and this loop runs once per fact of a bulk write.
    seen_raw: set[bytes] = set()
    seen: set[Any] = set()
    for op, k, got in zip(ops, kinds, blocks, strict=True):
        if k is Assert:
            cid = got[0]
            raw = cid.raw
            if raw in seen_raw or (state and cid in state and cid not in retracted):
                continue
            seen_raw.add(raw)
            append(PlannedOp({"op": "assert", "fact": cid}, _ASSERT_OP, (cid, got[1], op.fact)))
        elif k is Retract:
            cid = got[0]
            if ("retract", cid) in seen:
                continue
            seen.add(("retract", cid))
            # In the order receivers require (sorted, each once), whatever the index gave:
            # a repeated entry made a delta every peer refuses for good.
            observed = sorted(set(state.get(cid, ())))
            for i in range(0, len(observed), WRITE_MAX_OBSERVED):
                part = observed[i : i + WRITE_MAX_OBSERVED]
                wire = {"op": "retract", "fact": cid, "observed": part}
                append(PlannedOp(wire, _RETRACT_OP + _LINK * len(part)))
        elif k is Grant or k is Revoke:
            owner_check()
            kind = "grant" if k is Grant else "revoke"
            append(PlannedOp({"op": kind, "key": bytes(op.key)}, _KEY_OP))
        else:
            raise TypeError(f"not an op: {op!r}")
    return planned


def pack_ops(planned: list[PlannedOp], heads: int) -> Iterator[list[PlannedOp]]:
    """Consecutive groups of ``planned``, each one delta within every writer limit:
    at most ``MAX_OPS`` ops, ``WRITE_MAX_DELTA_BYTES`` encoded (counting ``heads``
    parent links) and ``WRITE_MAX_DELTA_FACT_BYTES`` of fact blocks."""
    budget = WRITE_MAX_DELTA_BYTES - _DELTA_BASE - _LINK * max(heads, 1)
    group: list[PlannedOp] = []
    size = fact_bytes = 0
    for op in planned:
        extra = len(op.block[1]) if op.block is not None else 0
        if group and (
            len(group) >= MAX_OPS
            or size + op.size > budget
            or fact_bytes + extra > WRITE_MAX_DELTA_FACT_BYTES
        ):
            yield group
            group, size, fact_bytes = [], 0, 0
        group.append(op)
        size += op.size
        fact_bytes += extra
    if group:
        yield group


def pack_asserts(fact_sizes: Sequence[int], heads: int) -> list[tuple[int, int]]:
    """:func:`pack_ops` for a run of assert ops whose fact blocks have these sizes, as
    ``(start, end)`` slices: the same groups, found per delta (a bisection on the
    running total of fact bytes) instead of per op (ADR 0127). An assert op's bound is
    the constant ``_ASSERT_OP``, so the op count and size limits make one cap."""
    budget = WRITE_MAX_DELTA_BYTES - _DELTA_BASE - _LINK * max(heads, 1)
    cap = max(1, min(MAX_OPS, budget // _ASSERT_OP))
    total = list(accumulate(fact_sizes, initial=0))
    n = len(fact_sizes)
    out: list[tuple[int, int]] = []
    start = 0
    while start < n:
        # Ops start..k-1 fit while total[k] - total[start] <= the fact-byte budget.
        end = bisect_right(total, total[start] + WRITE_MAX_DELTA_FACT_BYTES, start + 1) - 1
        end = min(max(end, start + 1), start + cap, n)
        out.append((start, end))
        start = end
    return out
