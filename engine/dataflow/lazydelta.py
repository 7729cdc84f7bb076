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
