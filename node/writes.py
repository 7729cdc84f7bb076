"""The node's write path, which :class:`~.node.Node` delegates to:
:func:`coerce_facts` and :func:`check_declared` (input checks), :func:`write_facts`
(one signed, durable write; the key must be a writer, :mod:`.writeaccess`) and
:class:`GroupCommit` (``Node.write_async``: concurrent event-loop writers share one
delta and one fsync). ``retract`` reports the facts that were not visible (nothing to
retract).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from merklog.replication.blocks import Assert, Retract
from merklog.replication.errors import TooLarge
from merklog.store import (
    Fact,
    InvalidValue,
    Link,
    check_facts,
    check_writable_relation,
    encode_facts,
    make_fact,
)
from merklog.store.codec import fact_texts
from merklog.store.gcpause import gc_paused

from . import queries
from .errors import NodeInputError
from .writeaccess import require_writer

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
        full = answer != "cids"
        asserted, retracted = _answer(self.asserted, full), _answer(self.retracted, full)
        return {
            "asserted": asserted,
            "retracted": retracted,
            "delta": str(self.delta) if self.delta else None,
            "not_visible": [{"cid": str(c), "fact": str(f)} for c, f in self.not_visible],
        }


_rel_of = itemgetter(0)


def _answer(pairs: list[tuple[Link, Fact]], full: bool) -> list:
    """The CIDs of ``pairs`` as text, or ``{"cid", "fact"}`` per pair when ``full``,
    each rendered in bulk (a 200k-fact write answers 200k of them, ADR 0153)."""
    cids = Link.texts([cid for cid, _fact in pairs])
    if not full:
        return cids
    facts = fact_texts([fact for _cid, fact in pairs])
    return [{"cid": cid, "fact": fact} for cid, fact in zip(cids, facts, strict=True)]


def with_cids(encoded: list[tuple[Link, bytes]], facts: list[Fact]) -> list[tuple[Link, Fact]]:
    """``(CID, fact)`` pairs from ``encode_facts(facts)`` (no second encoding)."""
    return [(cid, fact) for (cid, _data), fact in zip(encoded, facts, strict=True)]


def not_visible(replica: Any, facts: list[tuple[Link, Fact]]) -> list[tuple[Link, Fact]]:
    """The ``(CID, fact)`` pairs among ``facts`` whose fact is not visible now."""
    if not facts:
        return []
    visible = replica.visible_among([c for c, _f in facts])
    return [(c, f) for c, f in facts if c not in visible]


def coerce_facts(facts: Iterable[FactLike]) -> list[Fact]:
    """Facts from Fact objects, ``(rel, args)`` pairs or Datalog text, each with a
    relation name Datalog can write (:func:`~merklog.store.check_writable_relation`)."""
    items = facts if isinstance(facts, list) else list(facts)
    if items and set(map(type, items)) == {Fact}:  # bulk: one column-wise check
        # The writable rule first: the looser one of check_facts worded "A B" otherwise.
        for rel in {r for r in map(_rel_of, items) if isinstance(r, str)}:
            check_writable_relation(rel)
        return checked_relations(check_facts(items))
    out: list[Fact] = []
    for item in items:
        if isinstance(item, Fact):
            out.append(make_fact(_writable(item.rel), item.args))
        elif isinstance(item, str):
            out.extend(queries.parse_facts(item))
        elif isinstance(item, tuple | list) and len(item) == 2:
            rel, args = item
            out.append(make_fact(_writable(rel), args))
        else:
            raise InvalidValue(
                f"{item!r:.80} is not a fact: give a Fact, a (rel, args) pair or Datalog text"
            )
    return checked_relations(out)


def _writable(rel: Any) -> Any:
    """``rel`` once a new fact may have it, when it is text (else ``make_fact`` names
    what it is): the rule a write states is the writable one, not the looser one facts
    read from a store keep (``"a b"`` said "must start with a letter", QA)."""
    if isinstance(rel, str):
        check_writable_relation(rel)
    return rel


def checked_relations(facts: list[Fact]) -> list[Fact]:
    """``facts``, once every relation they name is one a new fact may have."""
    for rel in set(map(_rel_of, facts)):
        check_writable_relation(rel)
    return facts


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
    node: Any,
    asserts: Iterable[FactLike],
    retracts: Iterable[FactLike],
    checked: bool = False,
    encoded_asserts: list[tuple[Link, bytes]] | None = None,
) -> WriteResult:
    """Assert and retract in one durable write of ``node``'s replica (``Node._write``).

    ``checked``: ``asserts``/``retracts`` are lists of facts already checked
    (``coerce_facts``, ``facts_from_json``) and declared-checked, as ``write_async``
    takes them: not checked a second time (a 200k-fact request paid it twice).
    ``encoded_asserts``: ``encode_facts(asserts)``, computed by the caller (a request's
    decoding thread, ADR 0145), so that the writes, which run one at a time, do not
    encode."""
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
        # Each fact encoded once; asserts maybe by the caller, off the write's turn.
        enc_add = encode_facts(add) if encoded_asserts is None else encoded_asserts
        enc_rem = encode_facts(rem)
        result = WriteResult(asserted=with_cids(enc_add, add), retracted=with_cids(enc_rem, rem))
        if add or rem:
            require_writer(node)
            result.not_visible = not_visible(node.replica, result.retracted)
            result.delta = node.atomically(replica_write, node.replica, add, rem, enc_add + enc_rem)
            if result.delta is not None:
                node.metrics.deltas.inc()
            # No wake here: the changes' hand-over woke the epoch loop (one that changed
            # nothing needs no epoch). A second wake could land while that epoch ran and
            # run it again: a failing program's epoch (~1 min past its budget) twice.
            node.metrics.writes.inc(len(add) + len(rem))
    return result


@dataclass
class PreparedAsserts:
    """Asserts ready for :func:`write_prepared`: checked against the values' rules and the
    program's declarations, and encoded (each fact's CID and block, in input order).
    ``storing`` is set once their write's rows start going into SQLite, or when that
    write ends, whichever comes first. ``before_commit``, if set, is called inside the
    write's transaction just before it commits; what it raises rolls the write back."""

    facts: list[Fact]
    encoded: list[tuple[Link, bytes]]
    storing: threading.Event = field(default_factory=threading.Event)
    before_commit: Callable[[], None] | None = None


def prepare_asserts(node: Any, facts: Iterable[FactLike]) -> PreparedAsserts:
    """Check and encode asserts for ``node`` without touching its store: the part of a
    write that can run on one thread while another thread's write is in SQLite."""
    try:
        add = node.coerce_facts(facts)
        node.check_declared(add)
    except Exception:
        node.metrics.rejected.inc()
        raise
    with gc_paused():
        return PreparedAsserts(add, encode_facts(add))


def write_prepared(node: Any, prepared: PreparedAsserts) -> Link | None:
    """One durable write of asserts from :func:`prepare_asserts` (possibly prepared on
    another thread, ``put -f``, ADR 0143), without the first-write sync; the CID of its
    last delta (None: every fact was already visible). The facts' CIDs are the caller's:
    ``prepared.encoded``. Sets ``prepared.storing`` at the latest when it ends."""
    try:
        if not prepared.facts:
            return None
        with gc_paused():
            require_writer(node)
            delta = node.atomically(
                replica_write,
                node.replica,
                prepared.facts,
                [],
                prepared.encoded,
                prepared.storing,
                prepared.before_commit,
            )
            if delta is not None:
                node.metrics.deltas.inc()
            node.metrics.writes.inc(len(prepared.facts))  # the hand-over woke the loop
        return delta
    finally:
        prepared.storing.set()


def replica_write(
    replica: Any,
    asserts: list[Fact],
    retracts: list[Fact],
    encoded: list | None = None,
    storing: threading.Event | None = None,
    before_commit: Callable[[], None] | None = None,
) -> Link | None:
    """One transaction of as many signed deltas as receivers' limits need; the last CID.
    ``encoded``: the ``(CID, block)`` of ``asserts + retracts`` (computed once);
    ``storing``: set when a write of asserts alone starts storing its rows
    (``Replica.write_asserts``); ``before_commit``: called just before the write
    commits (what it raises rolls it back)."""
    if not retracts and encoded is not None:  # asserts alone: column-wise (ADR 0127)
        cids = replica.write_asserts(asserts, encoded, storing, before_commit)
        return cids[-1] if cids else None
    ops = [Assert(f) for f in asserts] + [Retract(f) for f in retracts]
    cids = replica.write_many(ops, encoded, before_commit)
    return cids[-1] if cids else None


class GroupCommit:
    """``Node.write_async``: concurrent event-loop writers share one delta and one fsync.

    Requests queue here; one flush task at a time takes as many as fit in one delta (at
    most 256, cut before a retract of a fact an earlier queued request asserts, which
    the same delta would not observe), commits them with ``Node._write`` on a worker
    thread, and hands each request its own slice of the result. When that shared write
    fails for one request's input (a fact over 1 MiB), each of its requests is written
    alone, so the misfit fails only its own request."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.queue: list = []
        self.flushing = False

    async def write(
        self,
        asserts: list[Fact],
        retracts: list[Fact],
        encoded_asserts: list[tuple[Link, bytes]] | None = None,
    ) -> WriteResult:
        """Queue one request of checked facts; returns its part of the shared write.
        ``encoded_asserts``: ``encode_facts(asserts)``, if the caller has it."""
        node = self.node
        try:
            node.check_declared(asserts)  # before queueing: a misfit fails only its request
        except Exception:
            node.metrics.rejected.inc()
            raise
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[WriteResult] = loop.create_future()
        self.queue.append((asserts, retracts, encoded_asserts, fut))
        if not self.flushing:
            self.flushing = True
            loop.create_task(self.flush())
        return await fut

    async def flush(self) -> None:
        """Commit queued requests batch by batch until the queue is empty."""
        try:
            while self.queue:
                batch: list = []
                # The batch's asserts, gathered only once a queued request retracts: a
                # bulk put's 125,000-fact requests assert alone, and hashing each of
                # their facts here, on the event loop, was ~0.2 s per 1M facts. Python's
                # equality matches more than value identity (p(1) and p(true)), which
                # only cuts a batch where it need not.
                adds: set[Fact] | None = None
                while self.queue:
                    add, rem, enc, fut = self.queue[0]
                    if batch and len(batch) >= 256:
                        break
                    if batch and rem:
                        if adds is None:
                            adds = {f for a, _, _, _ in batch for f in a}
                        # A retract in the same delta would not observe an assert of it.
                        if not adds.isdisjoint(rem):
                            break
                    self.queue.pop(0)
                    batch.append((add, rem, enc, fut))
                    if adds is not None:
                        adds.update(add)
                try:
                    res = await self._commit(batch)
                except Exception as exc:
                    if len(batch) == 1 or not isinstance(exc, _INPUT_ERRORS):
                        _fail(batch, exc)  # e.g. a full disk: every request meets it
                        continue
                    # The shared write rolled back. One request's facts are what failed
                    # it (a fact no receiver takes: over 1 MiB, a relation name too
                    # long): each request is written alone, in order, so that a misfit
                    # fails only its own request, not the others queued with it.
                    for item in batch:
                        try:
                            alone = await self._commit([item])
                        except Exception as own:
                            _fail([item], own)
                        else:
                            _settle([item], alone)
                    continue
                _settle(batch, res)
        finally:
            self.flushing = False

    async def _commit(self, batch: list) -> WriteResult:
        """One durable write of the requests of ``batch`` (on a worker thread)."""
        all_add = [f for a, _, _, _ in batch for f in a]
        all_rem = [f for _, r, _, _ in batch for f in r]
        encs = [e for _, _, e, _ in batch]
        all_enc = None if None in encs else [b for e in encs for b in e]
        return await asyncio.get_running_loop().run_in_executor(
            None, self.node._write, all_add, all_rem, True, all_enc
        )


#: Failures of a shared write that one request's input can cause (see ``flush``).
_INPUT_ERRORS = (TooLarge, InvalidValue, NodeInputError)


def _fail(batch: list, exc: BaseException) -> None:
    """Answer each request of ``batch`` with ``exc``."""
    for _, _, _, fut in batch:
        if not fut.done():
            fut.set_exception(exc)


def _settle(batch: list, res: WriteResult) -> None:
    """Give each request of ``batch`` its slice of the shared result ``res`` (which lists
    CIDs in the batch's assert and retract order)."""
    missing = {c for c, _f in res.not_visible}
    at_add = at_rem = 0
    for add, rem, _enc, fut in batch:
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
