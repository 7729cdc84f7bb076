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
thousand facts it is one sequential scan of the fact blocks
(:func:`merklog.replication.bulk.iter_fact_batches`, every block re-hashed) joined
in memory with the visible CIDs — several times cheaper per fact than looking
each block up — otherwise :meth:`Replica.visible` (batched lookups).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from typing import Any

import numpy as np

from merklog.engine.rows import EngineSet, engine_rows
from merklog.engine.values import row_to_engine
from merklog.store import Fact

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

    store = replica.blockstore
    if store.shared_sqlite() is not None:
        visible: set[bytes] = set()
        for cids in bulk.iter_visible_cids(replica):
            visible.update(cids)
        if len(visible) >= SCAN_FROM:
            grouped: dict[str, list[list[Any]]] = {}
            found = 0
            for batch in bulk.iter_fact_batches(replica):
                for cid, rel, args in batch:
                    if cid in visible:
                        found += 1
                        rows = grouped.get(rel)
                        if rows is None:
                            rows = grouped[rel] = []
                        rows.append(args)
            if found == len(visible):  # else a block is missing: the lookups say which
                return Edb({rel: _relation(rows) for rel, rows in grouped.items()})
    return Edb(_by_relation((fact.rel, fact.args) for _cid, fact in replica.visible()))


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
