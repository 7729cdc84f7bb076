"""Rules of the node's write path that sit above the replica's own.

- A write by a key that is not a writer fails with :class:`NotAWriter` saying plainly
  why and what to do, instead of the replica's "author … is not a writer in the
  causal past of …".
- A home made by ``init --join URL`` has never seen the grants made after the
  dataset's genesis: before its first write (CLI ``put`` and ``POST /v1/facts``) it
  syncs once with that origin (``[peers] origin``), so a grant the owner already made
  takes effect; if the origin cannot be reached the write fails with
  :class:`NotWritableYet` naming it (HTTP 503, CLI exit 4).
- The Python API does the same (``Node.write``, ``assert_``, ``retract``): outside an
  event loop it syncs there and then; ``async with merklog.open(home)`` syncs when it
  opens (an unreachable origin is logged, the node still opens); a write made inside a
  running event loop that still needs the sync cannot wait for it and raises
  :class:`NotWritableYet` saying ``await node.sync(origin)`` (ADR 0076).
- ``retract`` reports the facts that were not visible (nothing to retract).

It also holds the write path itself, which :class:`~.node.Node` delegates to:
:func:`coerce_facts` and :func:`check_declared` (input checks), :func:`write_facts`
(one signed, durable write) and :class:`GroupCommit` (``Node.write_async``: concurrent
event-loop writers share one delta and one fsync).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from merklog.replication.blocks import Assert, Retract
from merklog.replication.errors import PeerUnreachable
from merklog.store import Fact, Link, check_facts, encode_facts, make_fact
from merklog.store.gcpause import gc_paused

from . import queries
from .config import ORIGIN
from .failures import NotAWriter, NotWritableYet

log = logging.getLogger(__name__)

FactLike = Fact | tuple | str


@dataclass
class WriteResult:
    """What a write produced: the fact CIDs (in input order) and the delta that carries them."""

    asserted: list[tuple[Link, Fact]] = field(default_factory=list)
    retracted: list[tuple[Link, Fact]] = field(default_factory=list)
    delta: Link | None = None
    #: Retracted facts that were not visible (nothing was retracted for them).
    not_visible: list[tuple[Link, Fact]] = field(default_factory=list)

    def to_json(self, answer: str = "full") -> dict[str, Any]:
        """The HTTP answer. ``"full"``: ``{"cid", "fact"}`` per fact; ``"cids"``: the CIDs
        alone, in input order (the caller has the facts; a 200k-fact write renders no
        fact and answers a third of the bytes, ADR 0082). ``not_visible`` is always full."""
        if answer == "cids":
            asserted: list = [str(c) for c, _f in self.asserted]
            retracted: list = [str(c) for c, _f in self.retracted]
        else:
            asserted = [{"cid": str(c), "fact": str(f)} for c, f in self.asserted]
            retracted = [{"cid": str(c), "fact": str(f)} for c, f in self.retracted]
        return {
            "asserted": asserted,
            "retracted": retracted,
            "delta": str(self.delta) if self.delta else None,
            "not_visible": [{"cid": str(c), "fact": str(f)} for c, f in self.not_visible],
        }


def origin_url(config: Any) -> str | None:
    """The URL this home joined from (``[peers] origin``), if any."""
    peer = config.peers.get(ORIGIN)
    if isinstance(peer, dict) and isinstance(peer.get("url"), str):
        return str(peer["url"])
    return None


def can_write(node: Any) -> bool:
    """Whether the node's key may write on top of its current heads."""
    return bool(node.replica.is_writer(node.identity.public_key))


def require_writer(node: Any) -> None:
    """Raise :class:`NotAWriter` unless the node's key may write now."""
    if can_write(node):
        return
    key = node.identity.public_key.hex()
    from merklog.replication.authstate import last_revoke

    revoked = last_revoke(node.replica, node.identity.public_key)
    if revoked is not None:
        raise NotAWriter(
            f"this node cannot write: the dataset owner revoked its key {key} (delta"
            f" {revoked}); its earlier writes stay. Ask the owner to grant it again"
            f" (`merklog writers grant KEY`), then `merklog sync` and write again."
        )
    origin = origin_url(node.config)
    synced = origin is not None and bool(node.replica.peer_heads(origin.rstrip("/")))
    hint = (
        f"; it synced with {origin}, so the grant has not been made there yet"
        if synced
        else (f" and has not synced with {origin} yet" if origin else "")
    )
    raise NotAWriter(
        f"this node cannot write yet: its key {key} is not a writer of dataset"
        f" {node.dataset}{hint}. Ask the dataset owner to grant it (on the owner's home:"
        f" `merklog peers add NAME URL --writer`), then `merklog sync` and write again."
    )


def sync_before_first_write(node: Any, sync: Callable[[str], Any]) -> None:
    """If the node may not write and joined from an origin it never synced with, sync
    once with that origin (``sync(url)``) so grants made there arrive first."""
    if can_write(node):
        return
    origin = origin_url(node.config)
    if origin is None or node.replica.peer_heads(origin.rstrip("/")):
        return
    log.info("not a writer yet: syncing once with %s before the first write", origin)
    try:
        sync(origin)
    except PeerUnreachable as exc:
        raise _unreachable(origin, exc) from None
    except Exception as exc:  # refused (not granted): require_writer's message says so
        log.warning("sync with %s before the first write failed: %s", origin, exc)


def _must_sync_first(node: Any) -> str | None:
    """The origin URL when the node may not write and never synced with its origin."""
    if can_write(node):
        return None
    origin = origin_url(node.config)
    if origin is None or node.replica.peer_heads(origin.rstrip("/")):
        return None
    return origin


def _unreachable(origin: str, exc: BaseException) -> NotWritableYet:
    return NotWritableYet(
        f"this node cannot write yet: it joined from {origin} and must sync with it once"
        f" before its first write (to receive its writer grant), but {origin} cannot be"
        f" reached now ({exc}). Start that node or check the URL, then write again."
    )


async def sync_before_first_write_async(node: Any) -> None:
    """The event-loop form of :func:`sync_before_first_write` (HTTP writes): an origin
    that cannot be reached raises :class:`NotWritableYet` naming it (503)."""
    origin = _must_sync_first(node)
    if origin is None:
        return
    log.info("not a writer yet: syncing once with %s before the first write", origin)
    try:
        await node.sync(origin)
    except PeerUnreachable as exc:
        raise _unreachable(origin, exc) from None
    except Exception as exc:  # refused (not granted): require_writer's message says so
        log.warning("sync with %s before the first write failed: %s", origin, exc)


def with_cids(encoded: list[tuple[Link, bytes]], facts: list[Fact]) -> list[tuple[Link, Fact]]:
    """``(CID, fact)`` pairs from ``encode_facts(facts)`` (no second encoding)."""
    return [(cid, fact) for (cid, _data), fact in zip(encoded, facts, strict=True)]


def not_visible(replica: Any, facts: list[tuple[Link, Fact]]) -> list[tuple[Link, Fact]]:
    """The ``(CID, fact)`` pairs among ``facts`` whose fact is not visible now."""
    if not facts:
        return []
    visible = replica.visible_among([c for c, _f in facts])
    return [(c, f) for c, f in facts if c not in visible]


def sync_before_first_write_here(node: Any) -> None:
    """The Python API's form (``Node.write``): sync once with the origin before the first
    write when needed. Outside an event loop the sync runs here (``asyncio.run``); inside
    one it cannot be waited for without blocking that loop, so the write is refused with
    :class:`NotWritableYet` naming the origin and the call that makes it possible.
    A home that joined from nowhere (the owner's) pays one dict lookup, no query."""
    if origin_url(node.config) is None:
        return
    origin = _must_sync_first(node)
    if origin is None:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        sync_before_first_write(node, lambda url: asyncio.run(node.sync(url)))
        return
    raise NotWritableYet(
        f"this node cannot write yet: it joined from {origin} and must sync with it once"
        f" before its first write (to receive its writer grant), and it has not (the origin"
        f" was unreachable when the node opened, or the node was opened without"
        f" `async with`). Inside an event loop that sync cannot run here: `await"
        f" node.sync({origin!r})`, then write again."
    )


async def sync_on_open(node: Any) -> None:
    """``async with merklog.open(home)``: a freshly joined home syncs once with its origin
    now, so writes in the block work; an unreachable origin is logged and the node opens
    anyway (a later write says why it cannot write yet)."""
    try:
        await sync_before_first_write_async(node)
    except NotWritableYet as exc:
        log.warning("%s", exc)


def coerce_facts(facts: Iterable[FactLike]) -> list[Fact]:
    """Facts from Fact objects, ``(rel, args)`` pairs or Datalog text."""
    items = facts if isinstance(facts, list) else list(facts)
    if items and set(map(type, items)) == {Fact}:  # bulk: one column-wise check
        return check_facts(items)
    out: list[Fact] = []
    for item in items:
        if isinstance(item, Fact):
            out.append(make_fact(item.rel, item.args))
        elif isinstance(item, str):
            out.extend(queries.parse_facts(item))
        else:
            rel, args = item
            out.append(make_fact(rel, args))
    return out


def check_declared(engine: Any, facts: list[Fact]) -> None:
    """Refuse (NodeInputError, nothing stored) the first fact that does not fit the
    ``.decl`` declarations of the program ``engine`` runs. One set lookup per fact when
    a relation is undeclared, so bulk ``put`` of undeclared relations stays cheap."""
    declared = engine.checked.schema.declarations
    if not declared:
        return
    for fact in facts:
        if fact.rel in declared:
            engine.check_fact(fact)


def write_facts(
    node: Any, asserts: Iterable[FactLike], retracts: Iterable[FactLike], checked: bool = False
) -> WriteResult:
    """Assert and retract in one durable write of ``node``'s replica (``Node._write``).

    ``checked``: ``asserts``/``retracts`` are lists of facts already checked
    (``coerce_facts``, ``facts_from_json``) and declared-checked, as ``write_async``
    takes them: not checked a second time (a 200k-fact request paid it twice)."""
    try:
        if checked:
            add, rem = list(asserts), list(retracts)
        else:
            add = node.coerce_facts(asserts)
            rem = node.coerce_facts(retracts)
            node.check_declared(add)
    except Exception:
        node.metrics.rejected.inc()
        raise
    with gc_paused():  # bulk: no cyclic GC passes over the live facts per write
        enc_add, enc_rem = encode_facts(add), encode_facts(rem)  # each fact encoded once
        result = WriteResult(asserted=with_cids(enc_add, add), retracted=with_cids(enc_rem, rem))
        if add or rem:
            require_writer(node)
            result.not_visible = not_visible(node.replica, result.retracted)
            result.delta = node.atomically(replica_write, node.replica, add, rem, enc_add + enc_rem)
            if result.delta is not None:
                node.metrics.deltas.inc()
            node.metrics.writes.inc(len(add) + len(rem))
            node.wake()
    return result


def replica_write(
    replica: Any, asserts: list[Fact], retracts: list[Fact], encoded: list | None = None
) -> Link | None:
    """One transaction of as many signed deltas as receivers' limits need; the last CID.
    ``encoded``: the ``(CID, block)`` of ``asserts + retracts`` (computed once)."""
    ops = [Assert(f) for f in asserts] + [Retract(f) for f in retracts]
    cids = replica.write_many(ops, encoded)
    return cids[-1] if cids else None


class GroupCommit:
    """``Node.write_async``: concurrent event-loop writers share one delta and one fsync.

    Requests queue here; one flush task at a time takes as many as fit in one delta (at
    most 256, cut before a retract of a fact an earlier queued request asserts, which
    the same delta would not observe), commits them with ``Node._write`` on a worker
    thread, and hands each request its own slice of the result."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.queue: list = []
        self.flushing = False

    async def write(self, asserts: list[Fact], retracts: list[Fact]) -> WriteResult:
        """Queue one request of checked facts; returns its part of the shared write."""
        node = self.node
        try:
            node.check_declared(asserts)  # before queueing: a misfit fails only its request
        except Exception:
            node.metrics.rejected.inc()
            raise
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[WriteResult] = loop.create_future()
        self.queue.append((asserts, retracts, fut))
        if not self.flushing:
            self.flushing = True
            loop.create_task(self.flush())
        return await fut

    async def flush(self) -> None:
        """Commit queued requests batch by batch until the queue is empty."""
        loop = asyncio.get_running_loop()
        try:
            while self.queue:
                batch: list = []
                adds: set[Fact] = set()
                while self.queue:
                    add, rem, fut = self.queue[0]
                    # A retract in the same delta would not observe an assert of it: cut here.
                    if batch and (adds.intersection(rem) or len(batch) >= 256):
                        break
                    self.queue.pop(0)
                    batch.append((add, rem, fut))
                    adds.update(add)
                all_add = [f for a, _, _ in batch for f in a]
                all_rem = [f for _, r, _ in batch for f in r]
                try:
                    res = await loop.run_in_executor(None, self.node._write, all_add, all_rem, True)
                except Exception as exc:
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                _settle(batch, res)
        finally:
            self.flushing = False


def _settle(batch: list, res: WriteResult) -> None:
    """Give each request of ``batch`` its slice of the shared result ``res`` (which lists
    CIDs in the batch's assert and retract order)."""
    missing = {c for c, _f in res.not_visible}
    at_add = at_rem = 0
    for add, rem, fut in batch:
        asserted = res.asserted[at_add : at_add + len(add)]
        retracted = res.retracted[at_rem : at_rem + len(rem)]
        at_add, at_rem = at_add + len(add), at_rem + len(rem)
        if not fut.done():
            fut.set_result(
                WriteResult(
                    asserted=asserted,
                    retracted=retracted,
                    delta=res.delta,
                    not_visible=[(c, f) for c, f in retracted if c in missing],
                )
            )
