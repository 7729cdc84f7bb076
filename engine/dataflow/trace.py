"""Traces: the integrated history of a stream, indexed by key (Dialog dataflow spec §2.3).

Two shapes, both ``key -> row -> ...`` so joins look up a key in O(1):

- :class:`Trace` lives in the root circuit, whose timestamps are epochs. Every
  entry is at or before the current epoch, so product order makes them all
  comparable with the present: the trace keeps one consolidated weight per row.
- :class:`NestedTrace` lives in a child (recursive) circuit with timestamps
  ``(epoch, iteration)``. Entries of *past* epochs are compacted into one
  "past" epoch (for any later epoch ``e`` only their iteration still matters under
  product order), so a row keeps ``{iteration: weight}``. Work per insert is
  proportional to the delta, never to the trace.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping

from .zset import Row, ZSet


class Trace:
    """Consolidated ``key -> {row: weight}`` index of everything inserted so far."""

    __slots__ = ("index", "rows")

    def __init__(self) -> None:
        self.index: dict[Hashable, dict[Row, int]] = {}
        self.rows = 0

    def insert(self, delta: Mapping[Hashable, Mapping[Row, int]]) -> None:
        """Merge an indexed Z-set delta (trace-append without timestamps)."""
        index = self.index
        for key, rows in delta.items():
            group = index.get(key)
            if group is None:
                group = index[key] = {}
            for row, w in rows.items():
                n = group.get(row, 0) + w
                if n:
                    if row not in group:
                        self.rows += 1
                    group[row] = n
                elif row in group:
                    del group[row]
                    self.rows -= 1
            if not group:
                del index[key]

    def get(self, key: Hashable) -> dict[Row, int] | None:
        """The rows under ``key`` with their weights, or None."""
        return self.index.get(key)

    def keys(self) -> Iterator[Hashable]:
        return iter(self.index)

    def __len__(self) -> int:
        return self.rows

    def __contains__(self, key: Hashable) -> bool:
        return key in self.index

    def consolidate(self) -> ZSet:
        """All rows with their total weights (a full scan: for tests and snapshots)."""
        out: ZSet = {}
        for group in self.index.values():
            for row, w in group.items():
                n = out.get(row, 0) + w
                if n:
                    out[row] = n
                else:
                    out.pop(row, None)
        return out

    def entries(self) -> Iterator[tuple[Hashable, Row, int]]:
        """``(key, row, weight)`` in key order of insertion (sequential access)."""
        for key, group in self.index.items():
            for row, w in group.items():
                yield key, row, w


class NestedTrace:
    """``key -> row -> {iteration: weight}`` for a child circuit (past epochs compacted)."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: dict[Hashable, dict[Row, dict[int, int]]] = {}

    def insert(self, delta: Mapping[Hashable, Mapping[Row, int]], iteration: int) -> None:
        """Append an indexed delta at ``(current epoch, iteration)``."""
        index = self.index
        for key, rows in delta.items():
            group = index.get(key)
            if group is None:
                group = index[key] = {}
            for row, w in rows.items():
                times = group.get(row)
                if times is None:
                    group[row] = {iteration: w}
                    continue
                n = times.get(iteration, 0) + w
                if n:
                    times[iteration] = n
                else:
                    del times[iteration]
                    if not times:
                        del group[row]
            if not group:
                del index[key]

    def get(self, key: Hashable) -> dict[Row, dict[int, int]] | None:
        return self.index.get(key)

    def __len__(self) -> int:
        return sum(len(g) for g in self.index.values())

    def consolidate(self) -> ZSet:
        """Rows with weights summed over every timestamp (Dialog dataflow spec §2.9.2)."""
        out: ZSet = {}
        for group in self.index.values():
            for row, times in group.items():
                n = out.get(row, 0) + sum(times.values())
                if n:
                    out[row] = n
                else:
                    out.pop(row, None)
        return out
