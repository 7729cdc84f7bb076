"""A replica of one dataset: the signed delta DAG, its acceptance rule and the add-wins set.

State lives in SQLite (see :mod:`.schema`) plus a BlockStore for blocks. Every
change - a local write or a remote batch - runs in one transaction covering the
delta rows, the blocks and the visible-set update; subscribers hear about the
net visible changes only after that transaction committed.

Acceptance (DESIGN §2), decided from the delta's ancestry alone so every replica
agrees: the block is canonical and signed by its author; it belongs to this
dataset; all parents are accepted; ``clock`` = 1 + max parent clock; the author
is the owner or a writer in the delta's causal past; grant/revoke ops come from
the owner only; every asserted fact block is present and well formed.

Writer status of a key in a causal past: the latest grant/revoke of that key among
the delta's ancestors (genesis ``writers`` count as grants at clock 0), ordered by
(Lamport clock, revoke before grant, CID). The owner is always a writer.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import libipld

from merklog.store import BlockNotFound, BlockStore, Fact, Link, verify

from .blocks import (
    Assert,
    Delta,
    Genesis,
    Grant,
    Op,
    Retract,
    Revoke,
    build_delta,
    decode_fact_fast,
    fast_link,
    fast_verifies,
    make_genesis,
    parse_delta,
    parse_genesis,
)
from .errors import (
    CIDMismatchError,
    InvalidDelta,
    MalformedBlock,
    MissingParents,
    NeedSummary,
    NotFound,
    ReplicationError,
    TooLarge,
    Unauthorized,
    WrongDataset,
)
from .identity import Identity
from .limits import MAX_PARENTS, RECEIVE_MAX_PENDING_BLOCKS, RECEIVE_MAX_PENDING_BYTES
from .packing import pack_ops, plan_ops
from .schema import ensure_schema
from .txn import conn_lock, connect, gc_paused, require_autocommit, transaction

#: Callback signature for visible-set changes: (+1 | -1, fact, fact CID).
ChangeCallback = Callable[[int, Fact, Link], None]

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


@dataclass
class Summary:
    """Set-reconciliation summary a caller sends with its heads (see docs/sync-protocol.md).

    ``window`` holds the caller's heads plus its ``k`` newest deltas (by clock);
    ``boundary`` the parents of window deltas outside the window. ``complete``
    means the window is the caller's entire log.
    """

    window: list[Link]
    boundary: list[Link]
    complete: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "window": [str(c) for c in self.window],
            "boundary": [str(c) for c in self.boundary],
            "complete": self.complete,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Summary:
        if not isinstance(obj, dict):
            raise MalformedBlock("summary must be an object {window, boundary, complete}")
        try:
            window = [Link.parse(c) for c in obj.get("window", [])]
            boundary = [Link.parse(c) for c in obj.get("boundary", [])]
        except (ValueError, TypeError) as exc:
            raise MalformedBlock(f"summary holds a bad CID: {exc}") from exc
        return cls(window, boundary, bool(obj.get("complete", False)))


class LogRow(NamedTuple):
    """One op of the delta log, the row shape of the Parquet export (stable; see docs/crdt.md).

    ``op`` is assert|retract|grant|revoke. ``relation``/``args``/``fact`` are set for
    assert and retract, ``observed`` (delta CIDs as strings) for retract, ``key``
    (hex) for grant/revoke. CIDs are base32 strings, ``author`` is hex.
    """

    dataset: str
    delta: str
    author: str
    seq: int
    clock: int
    index: int
    op: str
    relation: str | None
    args: tuple[Any, ...] | None
    fact: str | None
    observed: tuple[str, ...]
    key: str | None


def _op_order(op: tuple[int, int, bytes]) -> tuple[int, int, bytes]:
    """Total order of grant/revoke ops: later clock wins, then revoke, then larger CID."""
    clock, is_grant, delta = op
    return (clock, 1 - is_grant, delta)


def _asserted_facts(delta_block: bytes) -> list[Link]:
    """Distinct fact CIDs asserted by an (already accepted) delta block."""
    obj = libipld.decode_dag_cbor(delta_block)
    return [
        fast_link(f)
        for f in dict.fromkeys(op["fact"] for op in obj["ops"] if op.get("op") == "assert")
    ]


def _chunks(seq: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


class Replica:
    """One dataset replica on a SQLite connection and a block store."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        blockstore: BlockStore,
        identity: Identity,
        genesis: Genesis,
    ) -> None:
        require_autocommit(conn)
        self.conn = conn
        self.blockstore = blockstore
        self.identity = identity
        self.genesis = genesis
        self.dataset: Link = genesis.cid
        self._lock = conn_lock(conn, blockstore)
        self._subscribers: list[ChangeCallback] = []
        self._changes: dict[Link, list[Any]] = {}
        with self._lock, self._tx():
            ensure_schema(conn)
            row = conn.execute(
                "SELECT ds FROM repl_dataset WHERE cid = ?", (genesis.cid.raw,)
            ).fetchone()
            if row is None:
                cur = conn.execute(
                    "INSERT INTO repl_dataset (cid, owner, name) VALUES (?, ?, ?)",
                    (genesis.cid.raw, genesis.owner, genesis.name),
                )
                self.ds = int(cur.lastrowid)
                self._init_genesis()
            else:
                self.ds = int(row[0])

    # ------------------------------------------------------------ opening

    @staticmethod
    def _conn(conn_or_path: sqlite3.Connection | str | os.PathLike[str]) -> sqlite3.Connection:
        if isinstance(conn_or_path, sqlite3.Connection):
            return conn_or_path
        return connect(conn_or_path)

    @classmethod
    def create(
        cls,
        conn_or_path: sqlite3.Connection | str | os.PathLike[str],
        blockstore: BlockStore,
        identity: Identity,
        name: str,
        writers: Sequence[bytes] = (),
    ) -> Replica:
        """Create a new dataset owned by ``identity`` and open its (empty) replica."""
        genesis = make_genesis(identity.public_key, name, writers)
        blockstore.put(genesis.cid, genesis.data)
        return cls(cls._conn(conn_or_path), blockstore, identity, genesis)

    @classmethod
    def open(
        cls,
        conn_or_path: sqlite3.Connection | str | os.PathLike[str],
        blockstore: BlockStore,
        identity: Identity,
        dataset: Link | Genesis,
        genesis_block: bytes | None = None,
    ) -> Replica:
        """Open (or start following) a dataset by id; its genesis block must be in the
        block store or passed as ``genesis_block`` (verified against the id)."""
        if isinstance(dataset, Genesis):
            genesis = dataset
        else:
            if genesis_block is None:
                try:
                    genesis_block = blockstore.get(dataset)
                except BlockNotFound:
                    raise NotFound(f"genesis block of dataset {dataset} is not known") from None
            genesis = parse_genesis(dataset, genesis_block)
        blockstore.put(genesis.cid, genesis.data)
        return cls(cls._conn(conn_or_path), blockstore, identity, genesis)

    def _init_genesis(self) -> None:
        g = self.genesis
        self.conn.execute(
            "INSERT INTO repl_delta VALUES (?, ?, ?, 0, 0, 0, ?)",
            (self.ds, g.cid.raw, g.owner, len(g.data)),
        )
        self.conn.execute("INSERT INTO repl_head VALUES (?, ?)", (self.ds, g.cid.raw))
        self.conn.executemany(
            "INSERT OR REPLACE INTO repl_auth VALUES (?, ?, ?, 0, 1)",
            [(self.ds, w, g.cid.raw) for w in g.writers],
        )

    def _tx(self) -> Any:
        return transaction(self.conn, self.blockstore)

    # ------------------------------------------------------------ reading

    def heads(self) -> list[Link]:
        """Current heads (deltas without children), sorted; ``[genesis]`` when empty."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT cid FROM repl_head WHERE ds = ?", (self.ds,)
            ).fetchall()
        return sorted(Link(r[0]) for r in rows)

    def has_delta(self, cid: Link) -> bool:
        with self._lock:
            return self._clock_of(cid) is not None

    def _clock_of(self, cid: Link) -> int | None:
        row = self.conn.execute(
            "SELECT clock FROM repl_delta WHERE ds = ? AND cid = ?", (self.ds, cid.raw)
        ).fetchone()
        return None if row is None else int(row[0])

    def delta_count(self) -> int:
        """Accepted deltas (genesis excluded)."""
        with self._lock:
            (n,) = self.conn.execute(
                "SELECT count(*) FROM repl_delta WHERE ds = ? AND clock > 0", (self.ds,)
            ).fetchone()
        return int(n)

    def is_writer(self, key: bytes) -> bool:
        """Whether ``key`` may write on top of the current heads."""
        with self._lock:
            heads = self.heads()
            clock = 1 + max(self._clock_of(h) or 0 for h in heads)
            return self._authorized(key, heads, clock)

    def visible_cids(self) -> set[Link]:
        with self._lock:
            rows = self.conn.execute(
                "SELECT DISTINCT fact FROM repl_assert WHERE ds = ? AND killed = 0", (self.ds,)
            ).fetchall()
        return {Link(r[0]) for r in rows}

    def visible_among(self, cids: Iterable[Link]) -> set[Link]:
        """Which of these fact CIDs are visible now."""
        with self._lock:
            return set(self._live_asserts_many(cids))

    def visible(self) -> Iterator[tuple[Link, Fact]]:
        """Every visible fact with its CID (sorted by CID)."""
        for cid in sorted(self.visible_cids()):
            yield cid, decode_fact_fast(self.blockstore.get(cid))

    def visible_facts(self) -> set[Fact]:
        return {fact for _cid, fact in self.visible()}

    def subscribe(self, callback: ChangeCallback) -> Callable[[], None]:
        """Call ``callback(+1|-1, fact, cid)`` for every committed visible-set change."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    # ------------------------------------------------------------ local writes

    def assert_facts(self, facts: Iterable[Fact]) -> list[Link]:
        """Assert facts (as many deltas as receivers' limits need); the new delta CIDs."""
        return self.write_many([Assert(f) for f in facts])

    def retract_facts(self, facts: Iterable[Fact]) -> list[Link]:
        """Retract the currently visible assertions of these facts."""
        return self.write_many([Retract(f) for f in facts])

    def grant(self, key: bytes) -> Link | None:
        return self.write([Grant(key)])

    def revoke(self, key: bytes) -> Link | None:
        return self.write([Revoke(key)])

    def write(self, ops: Sequence[Op]) -> Link | None:
        """``write_many`` returning only the last delta's CID (None if nothing was written)."""
        cids = self.write_many(ops)
        return cids[-1] if cids else None

    def write_many(self, ops: Sequence[Op]) -> list[Link]:
        """Sign and commit ``ops`` on top of the current heads; the new delta CIDs.

        Durable when it returns: every delta of the call commits in one transaction.
        What is written always fits every receiver's limits (:mod:`.limits`): ops are
        packed into as many deltas as op count, delta size and fact bytes need; a
        retract observing more asserts than one op may list becomes several retract
        ops; a fact whose block exceeds ``MAX_FACT_BYTES`` is refused (TooLarge,
        nothing written). No-ops are dropped: an assert of a fact already visible
        (and not retracted in the same call) and a retract of a fact not visible.
        Retracts observe the state before the call, never an assert in it.
        """
        with self._lock:
            planned = plan_ops(ops, self._live_asserts_many, self._owner_check)
            if not planned:
                return []
            out: list[Link] = []
            try:
                with self._tx():
                    for group in pack_ops(planned, len(self.heads())):
                        heads = self.heads()[:MAX_PARENTS]
                        clock = 1 + max(self._clock_of(h) or 0 for h in heads)
                        wire = [p.wire for p in group]
                        delta = build_delta(
                            self.identity, self.dataset, self._next_seq(), clock, heads, wire
                        )
                        blocks = {p.block[0]: p.block[1:] for p in group if p.block}
                        self._accept(delta, blocks)
                        out.append(delta.cid)
            finally:
                changes, self._changes = self._changes, {}
        self._emit(changes)
        return out

    def _owner_check(self) -> None:
        if self.identity.public_key != self.genesis.owner:
            raise Unauthorized("only the dataset owner grants or revokes writers")

    def _next_seq(self) -> int:
        (seq,) = self.conn.execute(
            "SELECT max(seq) FROM repl_delta WHERE ds = ? AND author = ?",
            (self.ds, self.identity.public_key),
        ).fetchone()
        return 1 + int(seq or 0)

    def _live_asserts(self, fact: Link) -> list[Link]:
        return self._live_asserts_many([fact]).get(fact, [])

    def _live_asserts_many(self, facts: Iterable[Link]) -> dict[Link, list[Link]]:
        """For each of ``facts`` that is visible: its live asserting deltas, sorted."""
        out: dict[Link, list[Link]] = {}
        for chunk in _chunks(list(dict.fromkeys(facts))):
            marks = ",".join("?" * len(chunk))
            for fact, delta in self.conn.execute(
                f"SELECT fact, delta FROM repl_assert WHERE ds = ? AND killed = 0"
                f" AND fact IN ({marks})",
                (self.ds, *[f.raw for f in chunk]),
            ):
                out.setdefault(fast_link(bytes(fact)), []).append(fast_link(bytes(delta)))
        for observed in out.values():
            observed.sort()
        return out

    # ------------------------------------------------------------ remote batches

    def apply_blocks(
        self, blocks: Iterable[tuple[Link, bytes]], verified: bool = False
    ) -> ApplyResult:
        """Validate and apply a batch of blocks (fact blocks before the delta asserting them).

        All or nothing: the first invalid block (bad CID, malformed, bad signature,
        unauthorised author, unknown parent, missing fact, …) raises its
        ReplicationError and rolls the whole batch back; no subscriber is called.
        Already-known deltas are counted as duplicates; fact blocks no following
        delta asserts are dropped. Memory is bounded by one delta's blocks.
        ``verified=True`` skips re-hashing blocks a verifying CAR decoder already checked.
        """
        result = ApplyResult()
        with gc_paused(), self._lock:
            try:
                with self._tx():
                    self._apply_stream(blocks, result, verified)
            finally:
                # Taken under the lock: another thread's uncommitted changes never leak here.
                changes, self._changes = self._changes, {}
        self._emit(changes)
        return result

    def _apply_stream(
        self, blocks: Iterable[tuple[Link, bytes]], result: ApplyResult, verified: bool
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
                raise MalformedBlock(f"block {cid}: malformed DAG-CBOR: {exc}") from exc
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

    # ------------------------------------------------------------ acceptance

    def _accept(self, delta: Delta, facts: dict[Link, tuple[bytes, Fact]]) -> None:
        """Check the DAG rules for ``delta`` and commit its effects (inside a transaction)."""
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
        auth_ops = [op for op in delta.ops if op["op"] in ("grant", "revoke")]
        if auth_ops and delta.author != owner:
            raise Unauthorized(f"delta {delta.cid}: only the owner may grant or revoke writers")
        # Fact blocks: from the batch, else already stored.
        new_blocks: list[tuple[Link, bytes]] = []
        asserted = list(dict.fromkeys(delta.asserted))
        for fcid in asserted:
            got = facts.get(fcid)
            if got is not None:
                new_blocks.append((fcid, got[0]))
            elif not self.blockstore.has(fcid):
                raise MissingParents(
                    f"delta {delta.cid} asserts fact {fcid} whose block is missing"
                )
        new_blocks.append((delta.cid, delta.data))
        self.blockstore.put_many(new_blocks)
        # DAG rows.
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
        self._apply_asserts(delta.cid, asserted, facts)
        for op in delta.ops:
            if op["op"] == "retract":
                self._apply_retract(delta.cid, op["fact"], op["observed"])

    def _authorized(self, author: bytes, parents: Sequence[Link], clock: int) -> bool:
        """Writer status of ``author`` in the causal past of a delta with these parents."""
        if author == self.genesis.owner:
            return True
        ops = self._auth_ops(author)
        if not ops:
            return False
        if all(c == 0 for c, _g, _d in ops.values()):
            return bool(next(iter(ops.values()))[1])
        found = [self._latest_op(author, p.raw, ops) for p in parents]
        best = max((op for op in found if op is not None), key=_op_order, default=None)
        return best is not None and bool(best[1])

    def _auth_ops(self, key: bytes) -> dict[bytes, tuple[int, int, bytes]]:
        """Every grant/revoke of ``key``: delta -> (clock, is_grant, delta)."""
        return {
            bytes(d): (int(c), int(g), bytes(d))
            for d, c, g in self.conn.execute(
                "SELECT delta, clock, is_grant FROM repl_auth WHERE ds = ? AND key = ?",
                (self.ds, key),
            )
        }

    def _latest_op(
        self, key: bytes, node: bytes, ops: dict[bytes, tuple[int, int, bytes]]
    ) -> tuple[int, int, bytes] | None:
        """The deciding grant/revoke of ``key`` among ``node`` and its ancestors.

        L(n) = max(op of n, L(parents of n)) by (clock, revoke first, CID), memoised in
        ``repl_auth_memo`` so each delta is visited once per key: acceptance stays
        linear in the log instead of walking the ancestry for every delta.
        """
        floor = min(c for c, _g, _d in ops.values() if c > 0)
        base = next((op for op in ops.values() if op[0] == 0), None)  # genesis writers
        memo: dict[bytes, tuple[int, int, bytes] | None] = {}
        stack = [node]
        while stack:
            n = stack[-1]
            if n in memo:
                stack.pop()
                continue
            row = self.conn.execute(
                "SELECT clock FROM repl_delta WHERE ds = ? AND cid = ?", (self.ds, n)
            ).fetchone()
            if row is None or row[0] < floor:
                memo[n] = base  # older than any later grant/revoke of this key
                stack.pop()
                continue
            cached = self.conn.execute(
                "SELECT op FROM repl_auth_memo WHERE ds = ? AND key = ? AND delta = ?",
                (self.ds, key, n),
            ).fetchone()
            if cached is not None:
                memo[n] = ops.get(bytes(cached[0])) if cached[0] else None
                stack.pop()
                continue
            parents = [
                bytes(r[0])
                for r in self.conn.execute(
                    "SELECT parent FROM repl_parent WHERE ds = ? AND child = ?", (self.ds, n)
                )
            ]
            todo = [p for p in parents if p not in memo]
            if todo:
                stack.extend(todo)
                continue
            candidates = [memo[p] for p in parents]
            candidates.append(ops.get(n))
            best = max((c for c in candidates if c is not None), key=_op_order, default=None)
            memo[n] = best
            self.conn.execute(
                "INSERT OR REPLACE INTO repl_auth_memo VALUES (?, ?, ?, ?)",
                (self.ds, key, n, best[2] if best else b""),
            )
            stack.pop()
        return memo[node]

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

    def _apply_asserts(
        self, delta: Link, asserted: list[Link], facts: dict[Link, tuple[bytes, Fact]]
    ) -> None:
        if not asserted:
            return
        conn, ds = self.conn, self.ds
        killed = {
            bytes(r[0])
            for r in conn.execute(
                "SELECT fact FROM repl_retract WHERE ds = ? AND observed = ?", (ds, delta.raw)
            )
        }
        live = sorted((f for f in asserted if f.raw not in killed), key=lambda f: f.raw)
        visible_before: set[bytes] = set()
        for chunk in _chunks(live):
            marks = ",".join("?" * len(chunk))
            visible_before.update(
                bytes(r[0])
                for r in conn.execute(
                    f"SELECT DISTINCT fact FROM repl_assert WHERE ds = ? AND killed = 0"
                    f" AND fact IN ({marks})",
                    (ds, *[f.raw for f in chunk]),
                )
            )
        conn.executemany(
            "INSERT INTO repl_assert VALUES (?, ?, ?, ?)",
            sorted((ds, f.raw, delta.raw, 1 if f.raw in killed else 0) for f in asserted),
        )
        for f in live:
            if f.raw not in visible_before:
                got = facts.get(f)
                self._note(f, +1, got[1] if got else None)

    def _apply_retract(self, delta: Link, fact: Link, observed: list[Link]) -> None:
        conn, ds = self.conn, self.ds
        conn.executemany(
            "INSERT OR IGNORE INTO repl_retract VALUES (?, ?, ?, ?)",
            [(ds, fact.raw, obs.raw, delta.raw) for obs in observed],
        )
        killed = 0
        for obs in observed:
            killed += conn.execute(
                "UPDATE repl_assert SET killed = 1 WHERE ds = ? AND fact = ? AND delta = ?"
                " AND killed = 0",
                (ds, fact.raw, obs.raw),
            ).rowcount
        if killed:
            still = conn.execute(
                "SELECT 1 FROM repl_assert WHERE ds = ? AND fact = ? AND killed = 0 LIMIT 1",
                (ds, fact.raw),
            ).fetchone()
            if still is None:
                self._note(fact, -1, None)

    def _note(self, cid: Link, weight: int, fact: Fact | None) -> None:
        entry = self._changes.get(cid)
        if entry is None:
            self._changes[cid] = [weight, fact]
        else:
            entry[0] += weight
            if fact is not None:
                entry[1] = fact

    def _emit(self, changes: dict[Link, list[Any]] | None = None) -> None:
        """Notify subscribers of committed net changes (after the lock is released)."""
        if changes is None:
            with self._lock:
                changes, self._changes = self._changes, {}
        if not self._subscribers:
            return
        for cid, (weight, fact) in changes.items():
            if weight == 0:
                continue
            if fact is None:
                fact = decode_fact_fast(self.blockstore.get(cid))
            for callback in list(self._subscribers):
                callback(weight, fact, cid)

    # ------------------------------------------------------------ sync support

    def remember_peer_heads(self, peer: str, heads: Sequence[Link]) -> None:
        """Record a peer's heads as last seen (sizes the next summary for that peer)."""
        with self._lock, self._tx():
            self.conn.execute(
                "INSERT OR REPLACE INTO repl_peer VALUES (?, ?, ?)",
                (self.ds, peer, b"".join(h.raw for h in sorted(heads))),
            )

    def peer_heads(self, peer: str) -> list[Link]:
        """The heads last recorded for ``peer`` (empty if never synced)."""
        with self._lock:
            row = self.conn.execute(
                "SELECT heads FROM repl_peer WHERE ds = ? AND peer = ?", (self.ds, peer)
            ).fetchone()
        if row is None:
            return []
        raw = bytes(row[0])
        return [fast_link(raw[i : i + 36]) for i in range(0, len(raw), 36)]

    def unsynced_count(self, peer: str) -> int | None:
        """How many of our deltas the peer lacked when last seen (None if never synced)."""
        last = [h for h in self.peer_heads(peer) if self.has_delta(h)]
        if not last:
            return None
        return len(self.missing_deltas(last))

    def summary(self, k: int | None = 32) -> Summary:
        """Reconciliation summary: heads + ``k`` newest deltas + their outside parents.

        ``k=None`` sends the whole log (always sufficient).
        """
        with self._lock:
            heads = [h.raw for h in self.heads()]
            if k is None:
                rows = self.conn.execute(
                    "SELECT cid FROM repl_delta WHERE ds = ?", (self.ds,)
                ).fetchall()
            else:
                rows = self.conn.execute(
                    "SELECT cid FROM repl_delta WHERE ds = ? ORDER BY clock DESC, cid LIMIT ?",
                    (self.ds, k),
                ).fetchall()
            window = set(heads) | {bytes(r[0]) for r in rows}
            boundary: set[bytes] = set()
            if k is not None:
                for chunk in _chunks(sorted(window)):
                    marks = ",".join("?" * len(chunk))
                    boundary.update(
                        bytes(r[0])
                        for r in self.conn.execute(
                            f"SELECT parent FROM repl_parent WHERE ds = ? AND child IN ({marks})",
                            (self.ds, *chunk),
                        )
                    )
                boundary -= window
            (total,) = self.conn.execute(
                "SELECT count(*) FROM repl_delta WHERE ds = ?", (self.ds,)
            ).fetchone()
        return Summary(
            sorted(Link(c) for c in window),
            sorted(Link(c) for c in boundary),
            complete=len(window) >= total,
        )

    def missing_deltas(
        self, their_heads: Sequence[Link], summary: Summary | None = None
    ) -> list[Link]:
        """Deltas we hold that a peer with ``their_heads`` (+ ``summary``) lacks, in clock order.

        Raises NeedSummary if some of their heads are unknown here and the summary
        (if any) does not prove which of our deltas they hold.
        """
        with self._lock:
            seeds = set(their_heads)
            if summary is not None:
                seeds |= set(summary.window) | set(summary.boundary)
            known = self._known_subset(seeds)
            unknown_heads = [h for h in their_heads if h.raw not in known]
            if unknown_heads:
                if summary is None:
                    raise NeedSummary(
                        f"{len(unknown_heads)} of the caller's heads are unknown here;"
                        " send a summary"
                    )
                if not summary.complete:
                    unknown_boundary = [b for b in summary.boundary if b.raw not in known]
                    if unknown_boundary:
                        raise NeedSummary(
                            f"summary boundary holds {len(unknown_boundary)} unknown deltas;"
                            " send a larger window"
                        )
            self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS repl_seed (cid BLOB PRIMARY KEY)")
            self.conn.execute("DELETE FROM temp.repl_seed")
            self.conn.executemany("INSERT INTO temp.repl_seed VALUES (?)", [(k,) for k in known])
            rows = self.conn.execute(
                "WITH RECURSIVE have(cid) AS (SELECT cid FROM temp.repl_seed"
                " UNION SELECT p.parent FROM repl_parent p JOIN have ON p.ds = ? AND p.child = have.cid)"
                " SELECT d.cid FROM repl_delta d WHERE d.ds = ? AND d.clock > 0"
                " AND d.cid NOT IN (SELECT cid FROM have) ORDER BY d.clock, d.cid",
                (self.ds, self.ds),
            ).fetchall()
            self.conn.execute("DELETE FROM temp.repl_seed")
        return [Link(r[0]) for r in rows]

    def _known_subset(self, cids: Iterable[Link]) -> set[bytes]:
        cids = list(cids)
        known: set[bytes] = set()
        for chunk in _chunks(cids):
            marks = ",".join("?" * len(chunk))
            known.update(
                bytes(r[0])
                for r in self.conn.execute(
                    f"SELECT cid FROM repl_delta WHERE ds = ? AND cid IN ({marks})",
                    (self.ds, *[c.raw for c in chunk]),
                )
            )
        return known

    def blocks_for(self, deltas: Iterable[Link]) -> Iterator[tuple[Link, bytes]]:
        """For each delta (in order): its asserted fact blocks, then the delta block."""
        offer = self.blockstore.shared_sqlite()
        shared = offer is not None and offer.conn is self.conn
        for cid in deltas:
            with self._lock:
                data = self.blockstore.get(cid)
                facts = _asserted_facts(data)
                if shared:  # SQLiteBlockStore on our connection: batched reads
                    blocks = self._sqlite_blocks(facts)
                else:
                    blocks = list(self.blockstore.get_many(facts))
                blocks.append((cid, data))
            yield from blocks

    def _sqlite_blocks(self, cids: list[Link]) -> list[tuple[Link, bytes]]:
        """Blocks read straight from the shared SQLite store's blocks table
        (:class:`merklog.store.SharedSQLite`), ``IN`` batches, re-hashed like any read."""
        out = []
        for chunk in _chunks(cids):
            marks = ",".join("?" * len(chunk))
            rows = self.conn.execute(
                f"SELECT cid, data FROM blocks WHERE cid IN ({marks})", [c.raw for c in chunk]
            ).fetchall()
            if len(rows) != len(chunk):
                found = {bytes(r[0]) for r in rows}
                raise BlockNotFound(next(c for c in chunk if c.raw not in found))
            for raw, data in rows:
                cid = fast_link(bytes(raw))
                data = bytes(data)
                if not fast_verifies(cid, data):
                    verify(cid, data, "sqlite store")
                out.append((cid, data))
        return out

    def missing_for(
        self, their_heads: Sequence[Link], summary: Summary | None = None
    ) -> Iterator[tuple[Link, bytes]]:
        """Every block a peer with ``their_heads`` lacks (raises NeedSummary eagerly)."""
        return self.blocks_for(self.missing_deltas(their_heads, summary))

    # ------------------------------------------------------------ log as relations

    def iter_deltas(self) -> Iterator[Delta]:
        """Accepted deltas in (clock, CID) order - a topological order."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT cid FROM repl_delta WHERE ds = ? AND clock > 0 ORDER BY clock, cid",
                (self.ds,),
            ).fetchall()
        for (raw,) in rows:
            cid = Link(raw)
            yield parse_delta(cid, self.blockstore.get(cid))

    def iter_log(self) -> Iterator[LogRow]:
        """One row per op of every accepted delta, in (clock, CID, op index) order."""
        ds = str(self.dataset)
        for delta in self.iter_deltas():
            for i, op in enumerate(delta.ops):
                kind = op["op"]
                rel = args = fcid = key = None
                observed: tuple[str, ...] = ()
                if kind in ("assert", "retract"):
                    fact = (
                        decode_fact_fast(self.blockstore.get(op["fact"]))
                        if (kind == "assert" or self.blockstore.has(op["fact"]))
                        else None
                    )
                    fcid = str(op["fact"])
                    if fact is not None:
                        rel, args = fact.rel, fact.args
                    if kind == "retract":
                        observed = tuple(str(o) for o in op["observed"])
                else:
                    key = op["key"].hex()
                yield LogRow(
                    ds,
                    str(delta.cid),
                    delta.author.hex(),
                    delta.seq,
                    delta.clock,
                    i,
                    kind,
                    rel,
                    args,
                    fcid,
                    observed,
                    key,
                )

    def relations(self) -> dict[str, set[tuple[Any, ...]]]:
        """The log as relations: delta/4 (D, author, seq, clock), parent/2 (D, P),
        asserts/2 (D, F), retracts/3 (D, F, observed D). CIDs are Links, author bytes."""
        ds = self.ds
        with self._lock:
            q = self.conn.execute
            return {
                "delta": {
                    (Link(c), bytes(a), s, k)
                    for c, a, s, k in q(
                        "SELECT cid, author, seq, clock FROM repl_delta WHERE ds = ? AND clock > 0",
                        (ds,),
                    )
                },
                "parent": {
                    (Link(c), Link(p))
                    for c, p in q("SELECT child, parent FROM repl_parent WHERE ds = ?", (ds,))
                },
                "asserts": {
                    (Link(d), Link(f))
                    for f, d in q("SELECT fact, delta FROM repl_assert WHERE ds = ?", (ds,))
                },
                "retracts": {
                    (Link(d), Link(f), Link(o))
                    for f, o, d in q(
                        "SELECT fact, observed, delta FROM repl_retract WHERE ds = ?", (ds,)
                    )
                },
            }


__all__ = ["ApplyResult", "ChangeCallback", "LogRow", "Replica", "ReplicationError", "Summary"]
