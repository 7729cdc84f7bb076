"""A read-only delta whose ``{row: weight}`` dict is built only when something reads it.

Vectorised operators hand their output on in the form they computed it (an int64
matrix, per-group old and new values); most consumers of a large epoch read it by
columns, and only the ones that need rows pay for building the dict, once.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any


class LazyDelta(Mapping):
    """A mapping ``row -> weight`` answered from :meth:`rows`, which subclasses build
    (and cache) on first use."""

    __slots__ = ()

    @abstractmethod
    def rows(self) -> dict[tuple, int]:
        """The delta as an ordinary Z-set dict, built on first call and then shared."""

    def __len__(self) -> int:
        return len(self.rows())

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.rows())

    def __getitem__(self, row: tuple) -> int:
        return self.rows()[row]

    def __contains__(self, row: object) -> bool:
        return row in self.rows()

    def get(self, row: tuple, default: Any = None) -> Any:
        return self.rows().get(row, default)

    def items(self):  # type: ignore[override]
        return self.rows().items()

    def keys(self):  # type: ignore[override]
        return self.rows().keys()

    def values(self):  # type: ignore[override]
        return self.rows().values()


class SignedRows(LazyDelta):
    """A delta whose weights are all ±1, held as two lists: ``neg`` (weight -1) and
    ``pos`` (+1), rows distinct and the lists disjoint. Producers that know this shape
    (:class:`~merklog.engine.dataflow.CountSumJoin`) hand it on, and consumers that know
    it (the root :class:`~merklog.engine.dataflow.DistinctTrace`, the engine's state)
    apply it with C-level set and dict operations instead of a Python loop per row;
    anyone else reads the ordinary dict, built once on first use."""

    __slots__ = ("neg", "pos", "_rows")

    def __init__(self, neg: list[tuple], pos: list[tuple]) -> None:
        self.neg = neg
        self.pos = pos
        self._rows: dict[tuple, int] | None = None

    def rows(self) -> dict[tuple, int]:
        d = self._rows
        if d is None:
            d = self._rows = dict.fromkeys(self.neg, -1)
            d.update(dict.fromkeys(self.pos, 1))
        return d

    def __len__(self) -> int:
        return len(self.neg) + len(self.pos)

    def __repr__(self) -> str:
        return f"SignedRows({self.rows()!r})"
