"""Small SQL helpers shared by the replica modules."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any


def chunks(seq: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    """``seq`` in slices of ``size`` (bounded ``IN (...)`` parameter lists)."""
    for i in range(0, len(seq), size):
        yield seq[i : i + size]
