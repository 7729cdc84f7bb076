"""Live queries: each subscriber gets the whole answer once, then +/− row deltas per epoch."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Row = tuple[Any, ...]
#: ``callback(event, added, removed)``; event is ``"result"`` (added = whole answer) or ``"delta"``.
Callback = Callable[[str, list[Row], list[Row]], None]

_ids = itertools.count(1)


@dataclass
class Subscription:
    """One live query. ``rels`` are the relations it reads: only epochs touching them re-run it."""

    query: Any
    rels: frozenset[str]
    callback: Callback
    rows: set[Row] = field(default_factory=set)
    id: int = field(default_factory=lambda: next(_ids))
    closed: bool = False

    def deliver(self, new_rows: set[Row], initial: bool = False) -> None:
        """Diff against the last answer and call back (once for the initial answer)."""
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
        try:
            self.callback(event, added, removed)
        except Exception:  # a broken subscriber must not stop the epoch loop
            log.exception("live-query subscriber %s failed; unsubscribing", self.id)
            self.closed = True


def _sort_key(row: Row) -> tuple:
    return tuple((type(v).__name__, str(v)) for v in row)
