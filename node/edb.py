"""The stored facts as the node's evaluation sees them: one entry per relation, read in bulk.

A relation is held either as a 2-D int64 array (one row per fact) — when every
fact of it has the same arity and only ``int`` arguments — or as a set of rows in
engine form (:mod:`merklog.engine.values`), so ``p(1)``, ``p(1.0)``,
``p(true)``, ``p("1")`` and ``p(x"01")`` stay five rows. Floats and bools never
enter an int64 array. The arrays are what the batch evaluator's columnar path
(:meth:`merklog.engine.batch.BatchEvaluator.step`, the path ``merklog eval``
takes) reads without building a Python tuple per fact. A change keeps an all-int
relation columnar (ADR 0103): the matrix becomes the engine's
:class:`~merklog.engine.arraybase.ArrayBase`, the change's rows are looked up
together through its hash index and kept in its overlay, and :meth:`Edb.base` hands
on one int64 matrix with the overlay folded in. Only a relation that gains a row
with a non-int value (``p(1.0)`` beside int ``p`` facts) becomes a set.

:func:`read_visible` reads the replica's visible set: on a SQLite home over a few
thousand facts it is one ordered scan of the fact blocks (through the store's
documented :class:`~merklog.store.SharedSQLite` offer; every block re-hashed,
blocks decoded in batches) joined in memory with the visible CIDs
(:func:`merklog.replication.bulk.visible_cids`) — several times cheaper per
fact than looking each block up — otherwise :meth:`Replica.visible` (batched
lookups). The scan is column-wise first (:mod:`.factscan`, ADR 0118: all-int
relations go straight into int64 matrices); the per-fact scan remains its fallback. The cyclic collector is paused meanwhile: the read allocates millions of
small objects and no cycles, and collections re-traversing them doubled its cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import suppress
from itertools import chain, compress
from operator import itemgetter, methodcaller, not_
from typing import Any

import numpy as np

from merklog.engine.arraybase import ArrayBase
from merklog.engine.rows import EngineSet, engine_rows
from merklog.engine.values import row_to_engine
from merklog.store import Fact
from merklog.store.gcpause import gc_paused

Row = tuple
#: A relation's rows: int64 array (n × arity) or a set of engine-form tuples.
Rows = Any

#: Below this many visible facts, read them by lookup; from here, scan the fact blocks.
SCAN_FROM = 4096


class Edb:
    """Stored facts by relation (see the module docstring): an all-int relation as an
    :class:`~merklog.engine.arraybase.ArrayBase` (its int64 matrix plus the overlay of
    rows added and removed since), any other as an engine-form set."""

    def __init__(self, rels: Mapping[str, Rows] | None = None) -> None:
        self._rels: dict[str, ArrayBase | set[Row]] = {
            rel: ArrayBase(rows) if isinstance(rows, np.ndarray) else rows
            for rel, rows in (rels or {}).items()
        }

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
        if isinstance(rows, ArrayBase):
            matrix = rows.matrix
            out = set(map(len, rows.added))
            if matrix.shape[0] > len(rows.removed):
                out.add(matrix.shape[1])
            return out
        return set(map(len, rows))

    def arity_counts(self) -> dict[str, dict[int, int]]:
        """``{relation: {arity: number of facts}}``: what reads need to know of the
        stored facts (:class:`~.epochview.FactShape`). An all-int relation answers from
        its matrix's shape and its overlay; another counts its rows' lengths."""
        out: dict[str, dict[int, int]] = {}
        for rel, rows in self._rels.items():
            if isinstance(rows, ArrayBase):
                counts = Counter(map(len, rows.added))
                in_matrix = rows.matrix.shape[0] - len(rows.removed)
                if in_matrix:
                    counts[rows.matrix.shape[1]] += in_matrix
            else:
                counts = Counter(map(len, rows))
            if counts:
                out[rel] = dict(counts)
        return out

    def base(self) -> dict[str, Rows]:
        """Every non-empty relation as an int64 array (an all-int relation, its overlay
        folded in) or an engine-form set (shared, do not mutate): the input of a batch
        evaluation, and of the incremental engine's first epoch, which keeps an int64
        array as its columnar base instead of a tuple per fact (ADR 0090, ADR 0103).

        A relation whose overlay holds a row that is not all int64 (``p(1.0)`` beside
        int ``p`` facts) is a set from now on: such a value never enters an int64 column."""
        out: dict[str, Rows] = {}
        for rel, rows in self._rels.items():
            if not len(rows):
                continue
            if isinstance(rows, ArrayBase):
                matrix = rows.folded()
                if matrix is None:
                    rows = self._rels[rel] = EngineSet(rows.to_set(), mixed=True)
                else:
                    rows = matrix
            out[rel] = rows
        return out

    # ------------------------------------------------------------------ changes
    def apply(
        self, changes: Iterable[tuple[Fact, int]]
    ) -> tuple[dict[str, list[Row]], dict[str, list[Row]]]:
        """Apply visible-set changes (``+1`` now visible, ``-1`` no longer) in order and
        return the net ``(inserts, deletes)`` per relation, rows in engine form.

        A row's last change decides whether it is there after; whether it was there
        before is asked once per relation for all its changed rows together (an
        all-int relation answers through its matrix's hash index, ADR 0103)."""
        final: dict[str, dict[Row, bool]] = {}
        for fact, weight in changes:
            rel = final.get(fact.rel)
            if rel is None:
                rel = final[fact.rel] = {}
            # engine form: p(1), p(1.0), p(true) are three keys
            rel[row_to_engine(fact.args)] = weight > 0
        inserts: dict[str, list[Row]] = {}
        deletes: dict[str, list[Row]] = {}
        for name, last in final.items():
            rows = self._rels.get(name)
            if rows is None:
                rows = self._rels[name] = EngineSet(mixed=True)
            if isinstance(rows, ArrayBase):
                was = rows.present(last.keys())
            else:
                # Iterates the changed rows, not the relation: ``set & dict_keys`` walked
                # every row of the relation (a subclass of set is not "exactly" a set to
                # the dict view), O(relation) per epoch (ADR 0110).
                was = rows.intersection(last)
            ins = [r for r, now in last.items() if now and r not in was]
            dels = [r for r, now in last.items() if not now and r in was]
            if isinstance(rows, ArrayBase):
                rows.remove_present(dels)
                rows.add_new(ins)
                if len(rows.added) + len(rows.removed) > max(FOLD_FROM, rows.matrix.shape[0] // 8):
                    self._fold(name, rows)
            else:
                rows.difference_update(dels)
                rows.update(ins)
            if ins:
                inserts[name] = ins
            if dels:
                deletes[name] = dels
        return inserts, deletes

    def _fold(self, rel: str, rows: ArrayBase) -> None:
        """Fold a grown overlay into a new matrix (its index is rebuilt on the next
        lookup), so a lookup stays O(k log n) and the overlay's sets stay small."""
        matrix = rows.folded()
        if matrix is not None:
            self._rels[rel] = ArrayBase(matrix)


#: An overlay of more rows than this (and than an eighth of the matrix) is folded in.
FOLD_FROM = 65_536


def read_visible(replica: Any, progress: Callable[[int, int], None] | None = None) -> Edb:
    """The replica's visible facts as an :class:`Edb` (see the module docstring).
    ``progress(read, visible)``: told the facts read so far as a large read goes (the
    column scan's batches; the other paths tell nothing)."""
    with gc_paused():  # millions of small lists and tuples, no cycles among them
        # The temporaries die with _read's frame, before the collector is back: its
        # first collection would otherwise traverse every one of them.
        return _read(replica, progress)


def _read(replica: Any, progress: Callable[[int, int], None] | None = None) -> Edb:
    from merklog.replication import bulk

    offer = replica.blockstore.shared_sqlite()
    if offer is not None and offer.conn is replica.conn:
        cids = bulk.visible_cids(replica)
        if len(cids) >= SCAN_FROM:
            from merklog.node.factscan import scan_visible

            columns = scan_visible(offer, cids, progress)  # int64 matrices, no row per fact
            if columns is not None:
                return Edb({rel: _relation(rows) for rel, rows in columns.items()})
            visible = set(cids)
            grouped = _scan(offer, visible)
            if grouped is not None:
                return Edb({rel: _relation(grouped.pop(rel)) for rel in list(grouped)})
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
    The per-block work runs as C-level ``map``/``compress`` passes over each batch.
    None when some visible fact has no block (the lookups then say which)."""
    import libipld

    from merklog.replication.bulk import FACT_PREFIX

    sql = (
        f"SELECT cid, data FROM {offer.blocks_table} WHERE cid > ? AND substr(data, 1, 5) = ?"
        " ORDER BY cid LIMIT ?"
    )
    grouped: dict[str, list[Any]] = {}
    after = b""
    while True:
        with offer.lock:
            rows = offer.conn.execute(sql, (after, FACT_PREFIX, _SCAN_BATCH)).fetchall()
        kept = list(compress(rows, map(visible.__contains__, map(_first, rows))))
        cids = list(map(_first, kept))
        datas = list(map(_second, kept))
        _check_hashes(cids, datas)
        linked = list(map(_has_link, datas))
        if any(linked):
            _add_linked(grouped, compress(datas, linked))
            datas = list(compress(datas, map(not_, linked)))
        objs = libipld.decode_dag_cbor_multi(b"".join(datas)) if datas else []
        if len(objs) != len(datas):
            return None
        _add_decoded(grouped, objs)
        if len(rows) < _SCAN_BATCH:
            break
        after = rows[-1][0]
    return grouped if sum(map(len, grouped.values())) == len(visible) else None


_first = itemgetter(0)
_second = itemgetter(1)
_hash_part = itemgetter(slice(4, None))
_digest = methodcaller("digest")
_has_link = methodcaller("__contains__", _TAG42)


def _check_hashes(cids: list[bytes], datas: list[bytes]) -> None:
    """Raise :class:`~merklog.store.CIDMismatch` (or ValueError) unless every block
    hashes to its CID: sha2-256 of each block at C level, the generic check otherwise."""
    import hashlib

    from merklog.replication.blocks import fast_link
    from merklog.store import verify

    fast = all(map(methodcaller("startswith", _CID_PREFIX), cids))
    if fast and list(map(_digest, map(hashlib.sha256, datas))) == list(map(_hash_part, cids)):
        return
    for cid, data in zip(cids, datas, strict=True):
        verify(fast_link(bytes(cid)), bytes(data), "block store")  # raises at the damaged one


def _add_linked(grouped: dict[str, list[Any]], datas: Iterable[bytes]) -> None:
    """Blocks holding a DAG-CBOR link: the full decoder turns links into CIDs."""
    from merklog.replication.blocks import decode_fact_fast

    for data in datas:
        fact = decode_fact_fast(data)
        grouped.setdefault(fact.rel, []).append(fact.args)


def _add_decoded(grouped: dict[str, list[Any]], objs: list[dict[str, Any]]) -> None:
    """Append decoded ``{"rel", "args"}`` maps to their relation's list: one C-level
    ``compress`` pass per relation of the batch (few), else a loop."""
    rels = list(map(itemgetter("rel"), objs))
    args = list(map(itemgetter("args"), objs))
    names = set(rels)
    if len(names) > 8:
        for rel, a in zip(rels, args, strict=True):
            grouped.setdefault(rel, []).append(a)
        return
    for rel in names:
        out = grouped.setdefault(rel, [])
        out.extend(args if len(names) == 1 else compress(args, map(rel.__eq__, rels)))


def _by_relation(facts: Iterator[tuple[str, tuple]]) -> dict[str, Rows]:
    grouped: dict[str, list[Any]] = {}
    for rel, args in facts:
        grouped.setdefault(rel, []).append(args)
    return {rel: _relation(rows) for rel, rows in grouped.items()}


def _relation(rows: list[Any]) -> Rows:
    """One relation's distinct fact arguments as an int64 array when they are all plain
    ints of one arity that fit 64 bits (``bool`` is not ``int`` here), else an
    engine-form set. The type scan runs in C (``map`` over ``chain``). An int64 matrix
    (from :mod:`.factscan`) is already the former."""
    if isinstance(rows, np.ndarray):
        return rows
    arity = len(rows[0])
    if arity and set(map(len, rows)) == {arity}:
        if set(map(type, chain.from_iterable(rows))) == {int}:
            with suppress(OverflowError):  # an int beyond 64 bits: keep Python ints
                flat = np.fromiter(chain.from_iterable(rows), np.int64, len(rows) * arity)
                return flat.reshape(len(rows), arity)
    return engine_rows(map(tuple, rows))
