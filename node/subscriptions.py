"""Live queries: each subscriber gets the whole answer once, then +/− row deltas per epoch.

A query that is one atom of constants and variables (``path(1, X)``) is
maintained from the incremental engine's output deltas alone: each ``±1`` of a
tuple of its relation adjusts a count per answer row, and a row is added when
its count leaves 0 and removed when it returns to 0 (projection can map several
tuples to one row). Other queries (conjunctions, negation, aggregates) are
re-evaluated in epochs that touched one of their relations and diffed.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from merklog.engine.arith import sort_key
from merklog.engine.values import row_from_engine

log = logging.getLogger(__name__)

Row = tuple[Any, ...]
#: ``callback(event, added, removed)``; event is ``"result"`` (added = whole answer) or ``"delta"``.
Callback = Callable[[str, list[Row], list[Row]], None]

_ids = itertools.count(1)


@dataclass
class Subscription:
    """One live query. ``rels`` are the relations it reads: only epochs touching them re-run it.

    ``match`` (single-atom queries) maps a tuple of the relation to its answer row;
    with it the subscription follows deltas (:meth:`apply`) instead of re-evaluating.
    """

    query: Any
    rels: frozenset[str]
    callback: Callback
    match: Callable[[tuple], Row | None] | None = None
    rows: set[Row] = field(default_factory=set)
    counts: dict[Row, int] = field(default_factory=dict)
    id: int = field(default_factory=lambda: next(_ids))
    closed: bool = False
    epoch: int = 0

    @property
    def incremental(self) -> bool:
        return self.match is not None

    def start(self, tuples: Iterable[tuple], epoch: int, initial: bool = True) -> None:
        """The answer from the relation's current tuples (single-atom queries): the initial
        result, or (``initial=False``, after a program change) a delta against the last one."""
        assert self.match is not None
        counts: dict[Row, int] = {}
        for t in tuples:
            row = self.match(t)
            if row is not None:
                counts[row] = counts.get(row, 0) + 1
        self.counts = counts
        self.deliver(set(counts), initial=initial, epoch=epoch)

    def apply(self, delta: dict[tuple, int], epoch: int) -> None:
        """Follow one epoch's ``{tuple: ±1}`` delta of the query's relation."""
        assert self.match is not None
        added: set[Row] = set()
        removed: set[Row] = set()
        counts = self.counts
        for t, w in delta.items():
            row = self.match(t)
            if row is None:
                continue
            before = counts.get(row, 0)
            after = before + w
            if after > 0:
                counts[row] = after
            else:
                counts.pop(row, None)
            if before <= 0 < after:
                if row in removed:
                    removed.discard(row)
                else:
                    added.add(row)
            elif after <= 0 < before:
                if row in added:
                    added.discard(row)
                else:
                    removed.add(row)
        if added or removed:
            self.rows = (self.rows - removed) | added
            self.epoch = epoch
            self._call("delta", sorted(added, key=_sort_key), sorted(removed, key=_sort_key))

    def deliver(self, new_rows: set[Row], initial: bool = False, epoch: int = 0) -> None:
        """Diff against the last answer and call back (once for the initial answer)."""
        self.epoch = epoch
        if initial:
            self.rows = set(new_rows)
            self._call("result", sorted(self.rows, key=_sort_key), [])
            return
        added = new_rows - self.rows
        removed = self.rows - new_rows
        if not added and not removed:
            return
        self.rows = set(new_rows)
        self._call("delta", sorted(added, key=_sort_key), sorted(removed, key=_sort_key))

    def _call(self, event: str, added: list[Row], removed: list[Row]) -> None:
        # Rows are kept in engine form (1, 1.0 and true stay apart); plain values leave here.
        added = [row_from_engine(r) for r in added]
        removed = [row_from_engine(r) for r in removed]
        try:
            self.callback(event, added, removed)
        except Exception:  # a broken subscriber must not stop the epoch loop
            log.exception("live-query subscriber %s failed; unsubscribing", self.id)
            self.closed = True


def _sort_key(row: Row) -> tuple:
    """merklog's one value order, column by column, as ``Node.query`` and ``/v1/query``
    answer (``false < true <`` numbers by value ``<`` strings ``<`` bytes ``<`` CIDs). The
    rows came sorted by type name, then text: ``Bool < Float < bytes < int < str`` with
    ``10`` before ``9``."""
    return tuple(sort_key(v) for v in row)
