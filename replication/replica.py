"""A replica of one dataset: the signed delta DAG, its acceptance rule and the add-wins set.

State lives in SQLite (see :mod:`.schema`) plus a BlockStore for blocks. Every
change - a local write or a remote batch - runs in one transaction covering the
delta rows, the blocks and the visible-set update; subscribers hear about the
net visible changes only after that transaction committed.

The rules live in three modules, mixed into :class:`Replica`: which deltas are
accepted and how a batch is applied (:mod:`.acceptance`), the add-wins visible set
(:mod:`.orset`), and what a peer lacks (:mod:`.reconcile`). Local writes are
packed to receivers' limits by :mod:`.packing` (:mod:`.limits`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import compress
from operator import attrgetter, itemgetter
from threading import Event
from typing import Any, NamedTuple

from merklog.store import BlockNotFound, BlockStore, Fact, Link, StoreCorrupt
from merklog.store.gcpause import gc_paused

from . import relindex
from .acceptance import MAX_PENDING_BLOCKS, MAX_PENDING_BYTES, Acceptance, ApplyResult
from .assertrows import insert_asserts, insert_new_facts
from .authsets import AuthSets, forget_auth_memo
from .blocks import (
    Assert,
    Delta,
    Genesis,
    Grant,
    Op,
    Retract,
    Revoke,
    build_assert_delta,
    build_delta,
    decode_fact_fast,
    make_genesis,
    parse_delta,
    parse_genesis,
)
from .errors import (
    NotFound,
    NotTheOwner,
    ReplicationError,
)
from .identity import Identity
from .limits import MAX_FACT_BYTES, MAX_PARENTS
from .orset import ChangeCallback, NewFactsCallback, ORSet
from .packing import pack_asserts, pack_ops, plan_ops
from .reconcile import Reconciliation, Summary
from .schema import ensure_schema
from .txn import conn_lock, connect, require_autocommit, transaction

#: The length of a dag-cbor/sha2-256 CIDv1 (every CID a local write computes).
_CID_BYTES = 36
_first = itemgetter(0)
_second = itemgetter(1)
_raw_attr = attrgetter("raw")


class _Deferred(NamedTuple):
    """What a local write stores when its last delta is in (see ``_write_locked``):
    ``(CID, block)`` pairs, ``repl_assert`` rows (None: inserted per delta) and
    ``repl_rel_fact`` rows (the index is insert-only and nothing in the call reads it,
    so it always waits: one sorted pass per relation instead of one per delta)."""

    blocks: list[tuple[Link, bytes]]
    asserts: list[tuple[int, bytes, bytes, int]] | None
    relations: list[tuple[int, str, bytes]]
    #: ``write_asserts`` keeps its rows as columns (ADR 0127): live ``repl_assert`` rows
    #: as ``fact || delta`` records, and each record's relation name (its index row).
    records: list[bytes]
    rel_names: list[str]
    #: ``write_asserts``' facts new to the visible set (each +1, unique in the call):
    #: told to subscribers as columns after the commit, not as one change entry each.
    new_cids: list[Link]
    new_facts: list[Fact]


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


class WriterState(NamedTuple):
    """A key's write access on top of a replica's heads (:meth:`Replica.writers`)."""

    key: bytes
    #: Whether it may write now.
    writer: bool
    #: The grant or revoke that decides it (the genesis for the owner and its writers).
    delta: Link
    owner: bool = False


class Replica(Acceptance, ORSet, Reconciliation):
    """One dataset replica on a SQLite connection and a block store: opening, local
    writes and the log as relations here; acceptance (:mod:`.acceptance`), the
    add-wins set (:mod:`.orset`) and reconciliation (:mod:`.reconcile`) in mixins."""

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
        self._on_new: dict[ChangeCallback, NewFactsCallback] = {}
        self._changes: dict[Link, list[Any]] = {}
        self._deferred: _Deferred | None = None
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
                relindex.mark_complete(conn, self.ds)
            else:
                self.ds = int(row[0])
                relindex.ensure_index(conn, blockstore, self.ds)  # once, for older homes
                forget_auth_memo(conn, self.ds)  # once, for older homes (ADR 0219)
                AuthSets(conn, self.ds).number_new()  # grants an older merklog accepted

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
        if not blockstore.has(genesis.cid):
            # Only when missing: on an IPFS home every put ships to the daemon, and every
            # command, `status` included, waited on a dag/import for a block it had (QA).
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
        if not rows:  # the genesis at least is a head: the table lost its rows
            raise StoreCorrupt(
                f"the replica of dataset {self.dataset} has no heads (table repl_head is empty)"
            )
        return sorted(Link(r[0]) for r in rows)

    def has_delta(self, cid: Link) -> bool:
        with self._lock:
            return self._clock_of(cid) is not None

    def ever_asserted(self, rel: str) -> bool:
        """Whether an accepted delta of this dataset asserted a fact of relation ``rel``
        (visible now or not): two probes of the relation index (:mod:`.relindex`)."""
        with self._lock:
            row = self.conn.execute(
                "SELECT EXISTS (SELECT 1 FROM repl_rel_fact WHERE ds = ?1 AND rel = ?2)"
                " OR EXISTS (SELECT 1 FROM repl_rel_range WHERE ds = ?1 AND rel = ?2)",
                (self.ds, rel),
            ).fetchone()
        return bool(row[0])

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

    def delta_graph(self) -> list[tuple[bytes, bytes, int, list[bytes]]]:
        """``(delta CID, author, seq, parent CIDs)`` of every accepted delta (genesis
        excluded), raw bytes; pruned deltas too (their metadata stays)."""
        with self._lock:
            rows = self.conn.execute(
                "SELECT cid, author, seq FROM repl_delta WHERE ds = ? AND clock > 0",
                (self.ds,),
            ).fetchall()
            parents: dict[bytes, list[bytes]] = {}
            for child, parent in self.conn.execute(
                "SELECT child, parent FROM repl_parent WHERE ds = ?", (self.ds,)
            ):
                parents.setdefault(bytes(child), []).append(bytes(parent))
        return [(bytes(c), bytes(a), int(s), sorted(parents.get(bytes(c), []))) for c, a, s in rows]

    def covered_count(self) -> int:
        """Accepted deltas whose blocks this replica does not keep because a snapshot
        covers them (installed from one, or pruned after one)."""
        with self._lock:
            (n,) = self.conn.execute(
                "SELECT count(*) FROM repl_covered WHERE ds = ?", (self.ds,)
            ).fetchone()
        return int(n)

    def covered(self) -> set[bytes]:
        """The raw CIDs :meth:`covered_count` counts."""
        with self._lock:
            return {
                bytes(r[0])
                for r in self.conn.execute("SELECT cid FROM repl_covered WHERE ds = ?", (self.ds,))
            }

    def drop_covered(self, cids: Sequence[Link]) -> int:
        """Delete the blocks of accepted deltas ``cids`` that a snapshot covers, recording
        them as covered (so a check does not call them lost); their metadata stays.
        Returns how many blocks were present. The caller has checked they are stable."""
        with self._lock, self._tx():
            self.conn.executemany(
                "INSERT OR IGNORE INTO repl_covered VALUES (?, ?)",
                [(self.ds, c.raw) for c in cids],
            )
            present = self.blockstore.has_many(cids)
            self.blockstore.delete_many(list(present))
        return len(present)

    def is_writer(self, key: bytes) -> bool:
        """Whether ``key`` may write on top of the current heads."""
        with self._lock:
            heads = self.heads()
            clock = 1 + max(self._clock_of(h) or 0 for h in heads)
            return self._authorized(key, heads, clock)

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

    def write_many(
        self,
        ops: Sequence[Op],
        encoded: Sequence[tuple[Link, bytes]] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> list[Link]:
        """Sign and commit ``ops`` on top of the current heads; the new delta CIDs.

        Durable when it returns: every delta of the call commits in one transaction.
        What is written always fits every receiver's limits (:mod:`.limits`): ops are
        packed into as many deltas as op count, delta size and fact bytes need; a
        retract observing more asserts than one op may list becomes several retract
        ops; a fact whose block exceeds ``MAX_FACT_BYTES`` is refused (TooLarge,
        nothing written). No-ops are dropped: an assert of a fact already visible
        (and not retracted in the same call) and a retract of a fact not visible.
        Retracts observe the state before the call, never an assert in it.

        ``encoded``: the ``(CID, block)`` of every Assert/Retract fact in op order, if the
        caller has them (see :func:`~.packing.plan_ops`). The bulk path costs one
        visibility query per 500 facts for the whole call, no re-hash of the blocks it
        encoded itself, and no second visibility query per delta: a fact that was not
        visible when the call began and that the call does not retract cannot become
        visible before its own assert.

        ``before_commit``: called inside the transaction once everything is stored,
        just before the commit; what it raises rolls the call back.
        """
        with gc_paused():  # millions of short-lived objects: no cyclic GC passes
            with self._lock:
                out = self._write_locked(ops, encoded, before_commit)
                changes, self._changes = self._changes, {}
            self._emit(changes)  # subscribers run after the commit, unlocked
        return out

    def _write_locked(
        self,
        ops: Sequence[Op],
        encoded: Sequence[tuple[Link, bytes]] | None,
        before_commit: Callable[[], None] | None = None,
    ) -> list[Link]:
        # The plan reads the visible set: inside the write's transaction, so that it is
        # the state the write commits on even where the store lets other writes end
        # while this thread holds the lock (an IPFS home, SharedSQLite).
        try:
            with self._tx():
                return self._plan_and_write(ops, encoded, before_commit)
        except BaseException:
            self._changes = {}  # rolled back (also at the commit): nothing to tell
            raise

    def _plan_and_write(
        self,
        ops: Sequence[Op],
        encoded: Sequence[tuple[Link, bytes]] | None,
        before_commit: Callable[[], None] | None,
    ) -> list[Link]:
        visible_at_start: set[Link] = set()

        def live(cids: Iterable[Link]) -> dict[Link, list[Link]]:
            state = self._live_asserts_many(cids)
            visible_at_start.update(state)
            return state

        planned = plan_ops(ops, live, self._owner_check, encoded)
        if not planned:
            return []
        out: list[Link] = []
        # A call without retracts never reads back its own asserts, so its blocks and
        # assert rows go in once, sorted by CID, when its last delta is accepted: one
        # in-order pass over each random-key B-tree instead of one per delta.
        retracts = any(p.wire["op"] == "retract" for p in planned)
        deferred = _Deferred([], None if retracts else [], [], [], [], [], [])
        with self._deferring(deferred, before_commit=before_commit):
            for group in pack_ops(planned, len(self.heads())):
                heads = self.heads()[:MAX_PARENTS]
                clock = 1 + max(self._clock_of(h) or 0 for h in heads)
                wire = [p.wire for p in group]
                delta = build_delta(
                    self.identity, self.dataset, self._next_seq(), clock, heads, wire
                )
                # The delta's asserted facts, in its op order (plan_ops made them unique).
                blocks = [p.block for p in group if p.block]
                self._accept(delta, blocks, visible_at_start)
                out.append(delta.cid)
        return out

    @contextmanager
    def _deferring(
        self,
        deferred: _Deferred,
        storing: Event | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> Iterator[None]:
        """One local write's transaction with its rows deferred to ``deferred`` and
        stored sorted at its end; a rollback tells subscribers nothing. ``storing`` is
        set when the deferred rows start going into SQLite; ``before_commit`` is called
        once they are stored, before the commit (what it raises rolls the write back)."""
        self._deferred = deferred
        try:
            with self._tx():
                yield
                if storing is not None:
                    storing.set()
                self._flush_deferred()
                if before_commit is not None:
                    before_commit()
        except BaseException:
            self._changes = {}  # rolled back: nothing to tell subscribers
            raise
        finally:
            self._deferred = None

    def _flush_deferred(self) -> None:
        """Store the blocks, ``repl_assert`` and ``repl_rel_fact`` rows a local write
        deferred (in its transaction), each sorted by key."""
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            return
        self.blockstore.put_encoded(deferred.blocks)
        if deferred.asserts:
            insert_asserts(self.conn, deferred.asserts)
        if deferred.records:  # 36-byte fact and delta CIDs (build_assert_delta's shape)
            insert_new_facts(
                self.conn, self.ds, deferred.records, deferred.rel_names, _CID_BYTES, _CID_BYTES
            )
        relindex.record(self.conn, deferred.relations)

    def write_asserts(
        self,
        facts: Sequence[Fact],
        encoded: Sequence[tuple[Link, bytes]],
        storing: Event | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> list[Link]:
        """``write_many([Assert(f) for f in facts], encoded)``, column-wise (ADR 0127):
        the same deltas, rows and visible-set changes, without an op object, a wire op
        or a row tuple per fact. ``encoded``: ``encode_facts(facts)``. Calls of another
        shape (CIDs not 36 bytes, a fact over ``MAX_FACT_BYTES``, pending changes) take
        ``write_many``. Subscribers with an ``on_new`` are told the new facts in one
        list after the commit (ADR 0138).

        The facts' blocks are stored first: a fact whose block was not stored cannot be
        visible, so the visibility lookup runs only when some block was there already
        (ADR 0144).

        ``storing``, when given, is set when the call's rows start going into SQLite
        (its blocks): from there to the commit the write is mostly SQLite's own work,
        which holds no GIL, so another thread can run Python meanwhile (``put -f``
        encodes its next chunk, ADR 0143). A call that takes ``write_many`` never sets
        it.

        ``before_commit``, when given, is called inside the transaction once every row
        is stored, just before the commit, whichever path the call takes; what it
        raises rolls the whole call back (``put -f`` holds its first chunk's commit
        until the rest of its input has parsed, ADR 0144)."""
        cids = list(map(_first, encoded))
        datas = list(map(_second, encoded))
        with gc_paused():
            with self._lock:
                out, new = self._write_asserts_locked(facts, cids, datas, storing, before_commit)
                changes, self._changes = self._changes, {}
            self._emit(changes)
            self._emit_new(new.new_cids, new.new_facts)
        return out

    def _write_asserts_locked(
        self,
        facts: Sequence[Fact],
        cids: list[Link],
        datas: list[bytes],
        storing: Event | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> tuple[list[Link], _Deferred]:
        """The deltas' CIDs, and the deferred columns (its new visible facts)."""
        new = _Deferred([], [], [], [], [], [], [])
        raws = list(map(_raw_attr, cids))
        sizes = list(map(len, datas))  # once: the size check and the deltas' packing
        if (
            len(cids) != len(facts)
            or len(datas) != len(facts)
            or self._changes
            or (raws and set(map(len, raws)) != {_CID_BYTES})
            or (sizes and max(sizes) > MAX_FACT_BYTES)
        ):
            encoded = list(zip(cids, datas, strict=False))
            return self._write_locked([Assert(f) for f in facts], encoded, before_commit), new
        facts = facts if isinstance(facts, list) else list(facts)
        if len(set(raws)) != len(raws):  # repeats: the first of each, as plan_ops keeps
            seen: set[bytes] = set()
            keep = [not (r in seen or seen.add(r)) for r in raws]  # type: ignore[func-returns-value]
            raws, cids, datas, facts, sizes = (
                list(compress(c, keep)) for c in (raws, cids, datas, facts, sizes)
            )
        out: list[Link] = []
        with self._deferring(new, before_commit=before_commit):
            if storing is not None:
                storing.set()  # from here on the write is mostly SQLite's own work
            # The facts' blocks go in first. Every accepted assert's fact block is stored,
            # so a fact whose block is new cannot be visible: when every block is new the
            # visibility lookup is not needed (ADR 0144).
            fresh = self.blockstore.put_encoded(list(zip(cids, datas, strict=True)))
            drop = self._visible_raws(raws) if fresh != len(raws) else ()
            if drop:  # asserts of visible facts are dropped, as plan_ops drops them
                keep = [r not in drop for r in raws]
                raws, cids, datas, facts, sizes = (
                    list(compress(c, keep)) for c in (raws, cids, datas, facts, sizes)
                )
            for start, end in pack_asserts(sizes, len(self.heads())):
                heads = self.heads()[:MAX_PARENTS]
                clock = 1 + max(self._clock_of(h) or 0 for h in heads)
                delta = build_assert_delta(
                    self.identity,
                    self.dataset,
                    self._next_seq(),
                    clock,
                    heads,
                    cids[start:end],
                )
                self._accept_local_asserts(
                    delta, cids[start:end], datas[start:end], facts[start:end], raws[start:end]
                )
                out.append(delta.cid)
        return out, new

    def _owner_check(self) -> None:
        if self.identity.public_key != self.genesis.owner:
            raise NotTheOwner("only the dataset owner grants or revokes writers")

    def writers(self) -> list[WriterState]:
        """Every key with write access on top of the current heads, and every key that
        had it and was revoked: the owner first, then by key. Each with the delta that
        decides (the genesis for its writers and the owner)."""
        with self._lock:
            heads = self.heads()
            keys = sorted(
                {
                    bytes(r[0])
                    for r in self.conn.execute(
                        "SELECT DISTINCT key FROM repl_auth WHERE ds = ?", (self.ds,)
                    )
                }
                - {self.genesis.owner}
            )
            out = [WriterState(self.genesis.owner, True, self.dataset, owner=True)]
            past = AuthSets(self.conn, self.ds).past([h.raw for h in heads])  # once for all
            for key in keys:
                op = self._deciding_op(key, heads, past)
                if op is not None:
                    out.append(WriterState(key, bool(op[1]), Link(op[2])))
        return out

    def has_written(self, key: bytes) -> bool:
        """Whether this replica holds a delta signed by ``key``."""
        with self._lock:
            row = self.conn.execute(
                "SELECT 1 FROM repl_delta WHERE ds = ? AND author = ? LIMIT 1", (self.ds, key)
            ).fetchone()
        return row is not None

    def _next_seq(self) -> int:
        (seq,) = self.conn.execute(
            "SELECT max(seq) FROM repl_delta WHERE ds = ? AND author = ?",
            (self.ds, self.identity.public_key),
        ).fetchone()
        return 1 + int(seq or 0)

    # ------------------------------------------------------------ remote batches

    # ------------------------------------------------------------ acceptance

    # ------------------------------------------------------------ sync support

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
                    for f, d in q("SELECT fact, delta FROM repl_assert_cid WHERE ds = ?", (ds,))
                },
                "retracts": {
                    (Link(d), Link(f), Link(o))
                    for f, o, d in q(
                        "SELECT fact, observed, delta FROM repl_retract WHERE ds = ?", (ds,)
                    )
                },
            }


__all__ = [
    "MAX_PENDING_BLOCKS",
    "MAX_PENDING_BYTES",
    "ApplyResult",
    "ChangeCallback",
    "LogRow",
    "Replica",
    "ReplicationError",
    "Summary",
]
