"""Acceptance of deltas (docs/crdt.md), decided from a delta's ancestry alone so every
replica agrees: the block is canonical and signed by its author; it belongs to this
dataset; all parents are accepted; ``clock`` = 1 + max parent clock; the author is the
owner or a writer in the delta's causal past; grant/revoke ops come from the owner
only; every asserted fact block is present and well formed.

Writer status of a key in a causal past: the latest grant/revoke of that key among
the delta's ancestors (genesis ``writers`` count as grants at clock 0), ordered by
(Lamport clock, revoke before grant, CID). The owner is always a writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, attrgetter
from typing import Any

import libipld

from merklog.store import Fact, Link
from merklog.store.errors import one_line
from merklog.store.gcpause import gc_paused

from .authsets import AuthSets
from .blocks import (
    Delta,
    decode_fact_fast,
    fast_verifies,
    parse_delta,
)
from .errors import (
    CIDMismatchError,
    InvalidDelta,
    MalformedBlock,
    MissingParents,
    TooLarge,
    Unauthorized,
    WrongDataset,
)
from .limits import (
    RECEIVE_MAX_DELTA_FACT_BYTES,
    RECEIVE_MAX_PENDING_BLOCKS,
    RECEIVE_MAX_PENDING_BYTES,
)
from .sqlutil import chunks as _chunks
from .state import ReplicaState

#: Fact blocks a batch may carry ahead of the delta that asserts them (see .limits).
MAX_PENDING_BLOCKS = RECEIVE_MAX_PENDING_BLOCKS
MAX_PENDING_BYTES = RECEIVE_MAX_PENDING_BYTES


@dataclass
class ApplyResult:
    """Outcome of :meth:`Replica.apply_blocks`: counts of new and already-known deltas."""

    accepted: int = 0
    duplicates: int = 0
    facts: int = 0
    accepted_cids: list[Link] = field(default_factory=list)

    def to_json(self) -> dict[str, int]:
        return {"accepted": self.accepted, "duplicates": self.duplicates, "facts": self.facts}


def _op_order(op: tuple[int, int, bytes]) -> tuple[int, int, bytes]:
    """Total order of grant/revoke ops: later clock wins, then revoke, then larger CID."""
    clock, is_grant, delta = op
    return (clock, 1 - is_grant, delta)


_rel_attr = attrgetter("rel")


class Acceptance(ReplicaState):
    """Validating and applying remote batches and local deltas (all or nothing)."""

    def apply_blocks(
        self,
        blocks: Iterable[tuple[Link, bytes]],
        verified: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> ApplyResult:
        """Validate and apply a batch of blocks (fact blocks before the delta asserting them).

        All or nothing: the first invalid block (bad CID, malformed, bad signature,
        unauthorised author, unknown parent, missing fact, …) raises its
        ReplicationError and rolls the whole batch back; no subscriber is called.
        Already-known deltas are counted as duplicates; fact blocks no following
        delta asserts are dropped. Memory is bounded by one delta's blocks.
        ``verified=True`` skips re-hashing blocks a verifying CAR decoder already checked.
        ``progress(accepted so far)`` after each delta accepted, in the calling thread and
        inside the batch's transaction (a large pulled response takes seconds to apply;
        the count still commits or rolls back with the whole batch).
        """
        result = ApplyResult()
        with gc_paused(), self._lock:
            try:
                with self._tx():
                    self._apply_stream(blocks, result, verified, progress)
            finally:
                # Taken under the lock: another thread's uncommitted changes never leak here.
                changes, self._changes = self._changes, {}
        self._emit(changes)
        return result

    def _apply_stream(
        self,
        blocks: Iterable[tuple[Link, bytes]],
        result: ApplyResult,
        verified: bool,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        pending: dict[Link, tuple[bytes, Any]] = {}
        pending_bytes = 0
        for cid, data in blocks:
            data = bytes(data)
            if not verified and not fast_verifies(cid, data):
                raise CIDMismatchError(f"block does not hash to {cid}")
            try:
                obj = libipld.decode_dag_cbor(data)
            except Exception as exc:
                raise MalformedBlock(f"block {cid}: malformed DAG-CBOR: {one_line(exc)}") from exc
            kind = obj.get("kind") if isinstance(obj, dict) else None
            if kind == "delta":
                delta = parse_delta(cid, data, obj)
                if self._clock_of(cid) is not None:
                    result.duplicates += 1
                else:
                    facts: dict[Link, tuple[bytes, Fact]] = {}
                    for fcid in delta.asserted:
                        got = pending.get(fcid)
                        if got is not None:
                            facts[fcid] = (got[0], decode_fact_fast(got[0], got[1]))
                    self._accept(delta, facts)
                    result.accepted += 1
                    result.facts += len(delta.asserted)
                    result.accepted_cids.append(cid)
                    if progress is not None:
                        progress(result.accepted)
                pending.clear()
                pending_bytes = 0
            elif kind == "dataset":
                if cid != self.dataset:
                    raise WrongDataset(f"genesis block {cid} is not this dataset {self.dataset}")
            elif isinstance(obj, dict) and len(obj) == 2 and "rel" in obj and "args" in obj:
                pending[cid] = (data, obj)
                pending_bytes += len(data)
                if len(pending) > MAX_PENDING_BLOCKS or pending_bytes > MAX_PENDING_BYTES:
                    raise TooLarge(
                        f"more than {MAX_PENDING_BLOCKS} blocks or {MAX_PENDING_BYTES} bytes"
                        " arrived without a delta asserting them"
                    )
            else:
                raise MalformedBlock(f"block {cid} is neither a delta, a genesis nor a fact")

    def _accept(
        self,
        delta: Delta,
        facts: dict[Link, tuple[bytes, Fact]] | list[tuple[Link, bytes, Fact]],
        local: set[Link] | None = None,
    ) -> None:
        """Check the DAG rules for ``delta`` and commit its effects (inside a transaction).

        ``facts``: the fact blocks that came with ``delta`` (CID → (block, fact)).
        ``local``: ``delta`` was built by this replica's own write, ``facts`` is then the
        list of ``(CID, block, fact)`` of its asserts in op order, unique, encoded here
        (stored without re-hashing), and ``local`` holds the facts visible when that
        write began: the only ones whose visibility must be read again."""
        auth_ops = self._check_delta(delta)
        # Fact blocks: from the batch, else already stored.
        new_blocks: list[tuple[Link, bytes]] = []
        if local is not None and isinstance(facts, list):
            asserted = delta.asserted
            new_blocks = [(cid, data) for cid, data, _fact in facts]
            new_blocks.append((delta.cid, delta.data))
            if self._deferred is not None:  # stored once, sorted, when the write ends
                self._deferred.blocks.extend(new_blocks)
            else:
                self.blockstore.put_encoded(new_blocks)
        else:
            assert isinstance(facts, dict)
            asserted = list(dict.fromkeys(delta.asserted))
            size = 0
            stored: list[Link] = []
            for fcid in asserted:
                got = facts.get(fcid)
                if got is not None:
                    new_blocks.append((fcid, got[0]))
                    size += len(got[0])
                else:
                    stored.append(fcid)
            if stored:  # one batched lookup: the stored blocks' sizes count too
                sizes = self.blockstore.sizes(stored)
                for fcid in stored:
                    if fcid not in sizes:
                        raise MissingParents(
                            f"delta {delta.cid} asserts fact {fcid} whose block is missing"
                        )
                size += sum(sizes.values())
            if size > RECEIVE_MAX_DELTA_FACT_BYTES:
                raise TooLarge(
                    f"delta {delta.cid} asserts {size} bytes of facts, over the"
                    f" {RECEIVE_MAX_DELTA_FACT_BYTES}-byte limit of one delta (a sync answer"
                    " carries a delta with all its facts, and no peer takes a larger one)"
                )
            new_blocks.append((delta.cid, delta.data))
            self.blockstore.put_many(new_blocks)
        self._insert_delta_rows(delta, auth_ops)
        self._apply_asserts(delta.cid, asserted, facts, local)
        if not delta.assert_only:
            for op in delta.ops:
                if op["op"] == "retract":
                    self._apply_retract(delta.cid, op["fact"], op["observed"])

    def _check_delta(self, delta: Delta) -> list[dict[str, Any]]:
        """The DAG rules for ``delta`` (dataset, parents, clock, author, owner-only
        grants); returns its grant/revoke ops."""
        conn, ds = self.conn, self.ds
        if delta.dataset != self.dataset:
            raise WrongDataset(f"delta {delta.cid} belongs to dataset {delta.dataset}")
        clocks: dict[Link, int] = {}
        for chunk in _chunks(delta.parents):
            marks = ",".join("?" * len(chunk))
            for raw, clock in conn.execute(
                f"SELECT cid, clock FROM repl_delta WHERE ds = ? AND cid IN ({marks})",
                (ds, *[p.raw for p in chunk]),
            ):
                clocks[Link(raw)] = int(clock)
        missing = [p for p in delta.parents if p not in clocks]
        if missing:
            raise MissingParents(
                f"delta {delta.cid} has {len(missing)} unknown parent(s), e.g. {missing[0]}"
            )
        if delta.clock != 1 + max(clocks.values()):
            raise InvalidDelta(
                f"delta {delta.cid} has clock {delta.clock}, expected {1 + max(clocks.values())}"
            )
        owner = self.genesis.owner
        if not self._authorized(delta.author, delta.parents, delta.clock):
            raise Unauthorized(
                f"author {delta.author.hex()} is not a writer in the causal past of {delta.cid}"
            )
        auth_ops = (
            [] if delta.assert_only else [op for op in delta.ops if op["op"] in ("grant", "revoke")]
        )
        if auth_ops and delta.author != owner:
            raise Unauthorized(f"delta {delta.cid}: only the owner may grant or revoke writers")
        return auth_ops

    def _insert_delta_rows(self, delta: Delta, auth_ops: list[dict[str, Any]]) -> None:
        """``repl_delta``, ``repl_parent``, ``repl_head`` and ``repl_auth`` rows of ``delta``."""
        conn, ds = self.conn, self.ds
        conn.execute(
            "INSERT INTO repl_delta VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                ds,
                delta.cid.raw,
                delta.author,
                delta.seq,
                delta.clock,
                len(delta.ops),
                len(delta.data),
            ),
        )
        conn.executemany(
            "INSERT INTO repl_parent VALUES (?, ?, ?)",
            [(ds, delta.cid.raw, p.raw) for p in delta.parents],
        )
        conn.executemany(
            "DELETE FROM repl_head WHERE ds = ? AND cid = ?", [(ds, p.raw) for p in delta.parents]
        )
        conn.execute("INSERT INTO repl_head VALUES (?, ?)", (ds, delta.cid.raw))
        for op in auth_ops:
            conn.execute(
                "INSERT OR REPLACE INTO repl_auth VALUES (?, ?, ?, ?, ?)",
                (ds, op["key"], delta.cid.raw, delta.clock, 1 if op["op"] == "grant" else 0),
            )
        if auth_ops and delta.clock > 0:
            AuthSets(conn, ds).number([delta.cid.raw])

    def _accept_local_asserts(
        self,
        delta: Delta,
        cids: list[Link],
        datas: list[bytes],
        facts: list[Fact],
        raws: list[bytes],
    ) -> None:
        """``_accept`` of a delta this replica built from asserts alone
        (:func:`~.blocks.build_assert_delta`) of facts that were not visible and are unique
        in the call (``Replica.write_asserts``), inside its transaction: the same checks and
        rows, kept as columns until the write ends (ADR 0127). The facts' blocks are in
        the store already: the call stores them first (ADR 0144). ``raws``: the CIDs'
        bytes (the caller has them)."""
        deferred = self._deferred
        self._insert_delta_rows(delta, self._check_delta(delta))
        deferred.blocks.append((delta.cid, delta.data))
        killed = self.conn.execute(
            "SELECT 1 FROM repl_retract WHERE ds = ? AND observed = ? LIMIT 1",
            (self.ds, delta.cid.raw),
        ).fetchone()
        if killed is not None:  # a retract already observes this delta: the general path
            self._apply_asserts(delta.cid, cids, list(zip(cids, datas, facts, strict=True)), set())
            return
        deferred.records.extend(map(add, raws, repeat(delta.cid.raw)))
        deferred.rel_names.extend(map(_rel_attr, facts))
        # Each fact is new to the visible set and unique in the call: told as columns.
        deferred.new_cids.extend(cids)
        deferred.new_facts.extend(facts)

    def _authorized(self, author: bytes, parents: Sequence[Link], clock: int) -> bool:
        """Writer status of ``author`` in the causal past of a delta with these parents:
        its latest grant/revoke there by (clock, revoke first, CID), the grant/revoke
        deltas of that past read from the parents' auth sets (:mod:`.authsets`)."""
        if author == self.genesis.owner:
            return True
        best = self._deciding_op(author, parents)
        return best is not None and bool(best[1])

    def _deciding_op(
        self, key: bytes, parents: Sequence[Link], past: int | None = None
    ) -> tuple[int, int, bytes] | None:
        """The grant/revoke of ``key`` that decides its writer status in the causal past
        of a delta with these parents, ``(clock, is_grant, delta)``; None when it has none
        (a genesis writer's grant is the genesis, at clock 0). ``past``: the parents'
        auth set, when the caller has it (one for every key it asks about)."""
        ops = self._auth_ops(key)
        base = next((op for op in ops.values() if op[0] == 0), None)  # genesis writers
        later = [op for op in ops.values() if op[0] > 0]
        if not later:
            return base
        sets = AuthSets(self.conn, self.ds)
        if past is None:
            past = sets.past([p.raw for p in parents])
        bits = sets.bits_of([op[2] for op in later])
        found = [op for op in later if op[2] in bits and past >> bits[op[2]] & 1]
        return max(found, key=_op_order, default=base)

    def _auth_ops(self, key: bytes) -> dict[bytes, tuple[int, int, bytes]]:
        """Every grant/revoke of ``key``: delta -> (clock, is_grant, delta)."""
        return {
            bytes(d): (int(c), int(g), bytes(d))
            for d, c, g in self.conn.execute(
                "SELECT delta, clock, is_grant FROM repl_auth WHERE ds = ? AND key = ?",
                (self.ds, key),
            )
        }

    def _authorized_reference(self, author: bytes, parents: Sequence[Link], clock: int) -> bool:
        """Ancestry-walking statement of the rule (tests check ``_authorized`` against it)."""
        if author == self.genesis.owner:
            return True
        rows = self.conn.execute(
            "SELECT delta, clock, is_grant FROM repl_auth WHERE ds = ? AND key = ? AND clock < ?"
            " ORDER BY clock DESC, is_grant ASC, delta DESC",
            (self.ds, author, clock),
        ).fetchall()
        if not rows:
            return False
        later = [r for r in rows if r[1] > 0]
        if not later:
            return bool(rows[0][2])
        floor = min(r[1] for r in later)
        ancestors = self._ancestors_from(parents, floor, {bytes(r[0]) for r in later})
        for raw, rclock, is_grant in rows:
            if rclock == 0 or bytes(raw) in ancestors:
                return bool(is_grant)
        return False

    def _ancestors_from(self, start: Sequence[Link], floor: int, wanted: set[bytes]) -> set[bytes]:
        """Which of ``wanted`` are in the closure of ``start`` (walking only clocks >= floor)."""
        found: set[bytes] = set()
        seen: set[bytes] = set()
        frontier = [p.raw for p in start]
        while frontier and len(found) < len(wanted):
            nxt: list[bytes] = []
            for chunk in _chunks(frontier):
                marks = ",".join("?" * len(chunk))
                rows = self.conn.execute(
                    f"SELECT cid, clock FROM repl_delta WHERE ds = ? AND cid IN ({marks})",
                    (self.ds, *chunk),
                ).fetchall()
                keep = [bytes(raw) for raw, c in rows if c >= floor and bytes(raw) not in seen]
                seen.update(keep)
                found.update(k for k in keep if k in wanted)
                if keep:
                    marks = ",".join("?" * len(keep))
                    nxt.extend(
                        bytes(r[0])
                        for r in self.conn.execute(
                            f"SELECT parent FROM repl_parent WHERE ds = ? AND child IN ({marks})",
                            (self.ds, *keep),
                        )
                    )
            frontier = [p for p in dict.fromkeys(nxt) if p not in seen]
        return found
