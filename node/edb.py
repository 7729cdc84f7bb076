"""The stored facts as the node's evaluation sees them: one entry per relation, read in bulk.

A relation is held either as a 2-D int64 array (one row per fact) — when every
fact of it has the same arity and only ``int`` arguments — or as a set of rows in
engine form (:mod:`merklog.engine.values`), so ``p(1)``, ``p(1.0)``,
``p(true)``, ``p("1")`` and ``p(x"01")`` stay five rows. Floats and bools never
enter an int64 array. The arrays are what the batch evaluator's columnar path
(:meth:`merklog.engine.batch.BatchEvaluator.step`, the path ``merklog eval``
takes) reads without building a Python tuple per fact; a relation turns into a
set only when a change touches it or a consumer needs its tuples.

:func:`read_visible` reads the replica's visible set: on a SQLite home over a few
thousand facts it is one ordered scan of the fact blocks (through the store's
documented :class:`~merklog.store.SharedSQLite` offer; every block re-hashed,
blocks decoded in batches) joined in memory with the visible CIDs
(:func:`merklog.replication.bulk.iter_visible_cids`) — several times cheaper per
fact than looking each block up — otherwise :meth:`Replica.visible` (batched
lookups). The cyclic collector is paused meanwhile: the read allocates millions of
small objects and no cycles, and collections re-traversing them doubled its cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from typing import Any

import numpy as np

from merklog.engine.rows import EngineSet, engine_rows
from merklog.engine.values import row_to_engine
from merklog.store import Fact
from merklog.store.codec import gc_paused

Row = tuple
#: A relation's rows: int64 array (n × arity) or a set of engine-form tuples.
Rows = Any

#: Below this many visible facts, read them by lookup; from here, scan the fact blocks.
SCAN_FROM = 4096


class Edb:
    """Stored facts by relation (arrays or engine-form sets, see the module docstring)."""

    def __init__(self, rels: Mapping[str, Rows] | None = None) -> None:
        self._rels: dict[str, Rows] = dict(rels or {})

    # ------------------------------------------------------------------ reads
    def __contains__(self, rel: object) -> bool:
        return rel in self._rels and len(self._rels[rel]) > 0

    def __len__(self) -> int:
        """Number of stored facts (all relations)."""
        return sum(len(r) for r in self._rels.values())

    def names(self) -> list[str]:
        return [rel for rel, rows in self._rels.items() if len(rows)]

    def arities(self, rel: str) -> set[int]:
        """The arities the facts of ``rel`` have (empty when it has none)."""
        rows = self._rels.get(rel)
        if rows is None or len(rows) == 0:
            return set()
        if isinstance(rows, np.ndarray):
            return {rows.shape[1]}
        return set(map(len, rows))

    def rows(self, rel: str) -> set[Row]:
        """The facts of ``rel`` as a set of engine-form rows (materialised and kept)."""
        rows = self._rels.get(rel)
        if rows is None:
            return set()
        if isinstance(rows, np.ndarray):
            rows = self._rels[rel] = EngineSet(map(tuple, rows.tolist()), mixed=False)
        return rows

    def base(self) -> dict[str, Rows]:
        """Every non-empty relation as it is held (arrays or sets; shared, do not mutate):
        the input of a batch evaluation."""
        return {rel: rows for rel, rows in self._rels.items() if len(rows)}

    def all_rows(self) -> dict[str, set[Row]]:
        """Every non-empty relation as a set of engine-form rows (materialises arrays)."""
        return {rel: self.rows(rel) for rel in self.names()}

    # ------------------------------------------------------------------ changes
    def apply(
        self, changes: Iterable[tuple[Fact, int]]
    ) -> tuple[dict[str, list[Row]], dict[str, list[Row]]]:
        """Apply visible-set changes (``+1`` now visible, ``-1`` no longer) in order and
        return the net ``(inserts, deletes)`` per relation, rows in engine form."""
        before: dict[tuple[str, Row], bool] = {}
        for fact, weight in changes:
            rows = self.rows(fact.rel) if fact.rel in self._rels else self._new(fact.rel)
            args = row_to_engine(fact.args)  # engine form: p(1), p(1.0), p(true) differ
            key = (fact.rel, args)
            if key not in before:
                before[key] = args in rows
            if weight > 0:
                rows.add(args)
            else:
                rows.discard(args)
        inserts: dict[str, list[Row]] = {}
        deletes: dict[str, list[Row]] = {}
        for (rel, args), was in before.items():
            now = args in self._rels[rel]
            if now != was:
                (inserts if now else deletes).setdefault(rel, []).append(args)
        return inserts, deletes

    def _new(self, rel: str) -> set[Row]:
        rows = self._rels[rel] = EngineSet(mixed=True)
        return rows


def read_visible(replica: Any) -> Edb:
    """The replica's visible facts as an :class:`Edb` (see the module docstring)."""
    from merklog.replication import bulk

    with gc_paused():  # millions of small lists and tuples, no cycles among them
        offer = replica.blockstore.shared_sqlite()
        if offer is not None and offer.conn is replica.conn:
            visible: set[bytes] = set()
            for cids in bulk.iter_visible_cids(replica):
                visible.update(cids)
            if len(visible) >= SCAN_FROM:
                grouped = _scan(offer, visible)
                if grouped is not None:
                    return Edb({rel: _relation(rows) for rel, rows in grouped.items()})
        return Edb(_by_relation((fact.rel, fact.args) for _cid, fact in replica.visible()))


#: Blocks per scan query: large enough to amortise it, small enough to keep memory flat.
_SCAN_BATCH = 65_536
#: dag-cbor, sha2-256 (the prefix of every CID merklog makes); other CIDs use ``verify``.
_CID_PREFIX = bytes([0x01, 0x71, 0x12, 0x20])
#: DAG-CBOR's link tag (42): a block holding it (or those bytes by chance) is decoded
#: by the full fact decoder, which tells links from byte strings.
_TAG42 = b"\xd8\x2a"


def _scan(offer: Any, visible: set[bytes]) -> dict[str, list[Any]] | None:
    """The visible facts' arguments by relation, from one ordered scan of the fact blocks
    in the store's ``blocks`` table (the layout :class:`merklog.store.SharedSQLite`
    documents). Every block kept is re-hashed against its CID; blocks without links
    are decoded together (``libipld.decode_dag_cbor_multi``), the others one by one.
    None when some visible fact has no block (the lookups then say which)."""
    import hashlib

    import libipld

    from merklog.replication.blocks import decode_fact_fast, fast_link
    from merklog.replication.bulk import FACT_PREFIX
    from merklog.store import verify

    sql = (
        f"SELECT cid, data FROM {offer.blocks_table} WHERE cid > ? AND substr(data, 1, 5) = ?"
        " ORDER BY cid LIMIT ?"
    )
    sha256 = hashlib.sha256
    grouped: dict[str, list[Any]] = {}
    after = b""
    while True:
        with offer.lock:
            rows = offer.conn.execute(sql, (after, FACT_PREFIX, _SCAN_BATCH)).fetchall()
        plain: list[bytes] = []
        for cid, data in rows:
            if cid not in visible:
                continue
            if cid[:4] != _CID_PREFIX or sha256(data).digest() != cid[4:]:
                verify(fast_link(bytes(cid)), bytes(data), "block store")  # raises if damaged
            if _TAG42 in data:
                fact = decode_fact_fast(data)
                grouped.setdefault(fact.rel, []).append(fact.args)
            else:
                plain.append(data)
        objs = libipld.decode_dag_cbor_multi(b"".join(plain)) if plain else []
        if len(objs) != len(plain):
            return None
        for obj in objs:
            rel = obj["rel"]
            rows_of = grouped.get(rel)
            if rows_of is None:
                rows_of = grouped[rel] = []
            rows_of.append(obj["args"])
        if len(rows) < _SCAN_BATCH:
            break
        after = rows[-1][0]
    return grouped if sum(map(len, grouped.values())) == len(visible) else None


def _by_relation(facts: Iterator[tuple[str, tuple]]) -> dict[str, Rows]:
    grouped: dict[str, list[Any]] = {}
    for rel, args in facts:
        grouped.setdefault(rel, []).append(args)
    return {rel: _relation(rows) for rel, rows in grouped.items()}


def _relation(rows: list[Any]) -> Rows:
    """One relation's distinct fact arguments as an int64 array when they are all plain
    ints of one arity that fit 64 bits (``bool`` is not ``int`` here), else an
    engine-form set. The type scan runs in C (``map`` over ``chain``)."""
    arity = len(rows[0])
    if arity and set(map(len, rows)) == {arity}:
        if set(map(type, chain.from_iterable(rows))) == {int}:
            try:
                return np.array(rows, dtype=np.int64).reshape(len(rows), arity)
            except OverflowError:  # an int beyond 64 bits: keep Python ints
                pass
    return engine_rows(map(tuple, rows))
