"""A Z-set batch held as columns: an int64 matrix of distinct rows with one weight.

A bulk epoch (a node's first incremental epoch over its stored facts, an ingest)
hands the engine hundreds of thousands of rows of a relation whose values are all
64-bit ints — the shape :mod:`merklog.node.edb` already holds such relations in.
Building a Python tuple and a dict entry per row costs far more than the
evaluation itself, so such a delta travels as a :class:`ColumnBatch`: the matrix
and the weight every row has (±1, rows distinct). Operators that know columns
(:class:`~merklog.engine.dataflow.GroupAggregate` for ``count``/``sum``) read the
columns directly; every other operator sees an ordinary read-only
``Mapping[row, weight]`` and the tuples are built on first access, once
(``map(tuple, matrix.tolist())``: plain Python ints, the engine form of ints).

Only real ints travel this way: a float, bool, string or bytes value never enters
an int64 column (value identity, ADR 0001); such relations keep tuple rows.
Feldera's ``dbsp`` crate holds batches as sorted columnar layers in the same
spirit; here the columns are only a transport, never a trace.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .lazydelta import LazyDelta

Row = tuple


class ColumnBatch(LazyDelta):
    """``{row: weight}`` for the distinct rows of ``matrix`` (n x arity, int64).

    ``weight`` is the weight of every row (non-zero). The tuple view is built
    lazily by :meth:`rows`; :attr:`materialised` says whether that happened (tests
    and benchmarks check that a columnar epoch stayed columnar).
    """

    __slots__ = ("matrix", "weight", "_dict")

    def __init__(self, matrix: np.ndarray, weight: int = 1) -> None:
        if matrix.ndim != 2 or matrix.dtype != np.int64:
            raise TypeError("a ColumnBatch holds a 2-D int64 matrix")
        if not weight:
            raise ValueError("a Z-set holds no zero weights")
        self.matrix = matrix
        self.weight = weight
        self._dict: dict[Row, int] | None = None

    @property
    def arity(self) -> int:
        return int(self.matrix.shape[1])

    @property
    def materialised(self) -> bool:
        return self._dict is not None

    def column(self, i: int) -> np.ndarray:
        """Column ``i`` (a view, do not mutate)."""
        return self.matrix[:, i]

    def rows(self) -> dict[Row, int]:
        """The batch as an ordinary Z-set dict (built once, then shared: do not mutate)."""
        d = self._dict
        if d is None:
            d = self._dict = dict.fromkeys(map(tuple, self.matrix.tolist()), self.weight)
        return d

    # -- LazyDelta: the row count without building the rows
    def __len__(self) -> int:
        return int(self.matrix.shape[0])

    def __repr__(self) -> str:
        return f"ColumnBatch({len(self)} rows x {self.arity}, weight {self.weight})"


def as_delta(delta: Mapping[Row, int]) -> dict[Row, int]:
    """``delta`` as a plain dict (a :class:`ColumnBatch`'s tuple view, shared)."""
    return delta.rows() if isinstance(delta, ColumnBatch) else delta  # type: ignore[return-value]


__all__ = ["ColumnBatch", "as_delta"]
