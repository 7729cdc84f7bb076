"""Result columns for writers: sort keys and text of whole columns (ADR 0101).

``merklog eval`` writes each derived relation as text, sorted on request
(``--sorted``) in the total order of :func:`merklog.engine.arith.sort_key`
(bool < number < str < bytes < CID; numbers by exact value, an int just before an
equal float). A column reaches the writer as an int64 array in which entries
``<= base`` stand for the dictionary entry ``values[base - id]`` (the columnar
executor's encoding, :class:`merklog.engine.columnar.Encoder`); rows of the tuple
executor are put in the same form first (:meth:`Column.of_values`).

Why: sorting with a Python key and formatting value by value cost most of
``merklog eval`` on large results. Here the per-row work is numpy and pyarrow:
each column becomes four sort keys (type rank; nearest float64; exact int64
difference from it; int-before-float) ordered by one ``np.lexsort``, and its text is
the dictionary's text taken by id beside pyarrow's cast of the ints. Python touches
each *distinct* non-integer value once (to split the dictionary by type), never
each row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arith import sort_key
from .values import Bool, Float

_I64 = np.int64
_INT64_MAX = 2**63 - 1
_TWO63 = float(2**63)

#: Type ranks of :func:`~merklog.engine.arith.sort_key`.
_BOOL, _NUMBER, _STR, _BYTES, _CID = 0, 1, 2, 3, 4

Decoder = tuple[int, list] | None


@dataclass(frozen=True, slots=True)
class Column:
    """One output column: ``ints`` where ``mask`` is false, else the dictionary entry
    ``values[idx]`` (``mask`` None: ints only)."""

    ints: np.ndarray
    mask: np.ndarray | None
    idx: np.ndarray | None
    values: list

    @classmethod
    def encoded(cls, col: np.ndarray, decoder: Decoder) -> Column:
        """A column of the columnar executor (ids ``<= base`` stand for
        ``values[base - id]``, :class:`merklog.engine.columnar.Encoder`)."""
        if decoder is None:
            return cls(col, None, None, [])
        base, values = decoder
        mask = col <= base
        if not mask.any():
            return cls(col, None, None, [])
        return cls(col, mask, np.where(mask, base - col, 0), values)

    @classmethod
    def of_values(cls, values: Sequence[Any]) -> Column:
        """A column of engine-form values. Engine-form ``==``/``hash`` keep ``1``,
        ``1.0`` and ``true`` apart, so the dictionary holds each distinct non-integer
        value once."""
        kinds = set(map(type, values))
        if kinds <= {int}:
            return cls(np.array(values, dtype=_I64), None, None, [])
        n = len(values)
        if len(kinds) == 1 and kinds <= {str, Float}:  # one kind: the rows are the dictionary
            every = np.ones(n, dtype=bool)
            return cls(np.zeros(n, dtype=_I64), every, np.arange(n, dtype=_I64), list(values))
        ids: dict[Any, int] = {}
        setdefault = ids.setdefault
        idx = np.array(
            [-1 if type(v) is int else setdefault(v, len(ids)) for v in values], dtype=_I64
        )
        mask = idx >= 0
        ints = np.array([v if type(v) is int else 0 for v in values], dtype=_I64)
        return cls(ints, mask, np.where(mask, idx, 0), list(ids))

    def take(self, rows: np.ndarray | slice) -> Column:
        """The rows ``rows`` (an index array or a slice) of the column."""
        if self.mask is None:
            return Column(self.ints[rows], None, None, [])
        return Column(self.ints[rows], self.mask[rows], self.idx[rows], self.values)  # type: ignore[index]


def _split(values: list) -> dict[int, np.ndarray]:
    """Dictionary positions of each type rank (CIDs: any type not named in ``_KIND``)."""
    types = set(map(type, values))
    if len(types) == 1:  # one kind (the common case): no pass per value
        return {_KIND.get(types.pop(), _CID): np.arange(len(values))}
    kinds = np.array([_KIND.get(type(v), _CID) for v in values], dtype=np.int8)
    return {k: np.flatnonzero(kinds == k) for k in np.unique(kinds).tolist()}


_KIND = {Bool: _BOOL, bool: _BOOL, Float: _NUMBER, float: _NUMBER, str: _STR, bytes: _BYTES}


def _number_keys(floats: np.ndarray, ints: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nearest float64, exact int64 difference) of int values: rounding is monotone,
    so two numbers whose float64 differ compare as those do; for an int and a float
    that tie there, the difference from the float decides exactly."""
    over = floats >= _TWO63  # float64(i) rounds up to 2**63 for i near INT64_MAX
    whole = np.where(over, 0.0, floats).astype(_I64)
    diff = np.where(over, (ints - _INT64_MAX) - 1, ints - whole)
    return floats, diff


def _dense_codes(order: np.ndarray) -> np.ndarray:
    codes = np.empty(len(order), dtype=_I64)
    codes[order] = np.arange(len(order), dtype=_I64)
    return codes


def _dict_keys(values: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sort keys (rank, float, int, is-float) of every dictionary entry."""
    import pyarrow.compute as pc

    from .arrowbuf import from_strs, to_numpy

    m = len(values)
    rank = np.zeros(m, dtype=np.int8)
    fkey = np.zeros(m, dtype=np.float64)
    ikey = np.zeros(m, dtype=_I64)
    tkey = np.zeros(m, dtype=np.int8)
    for kind, pos in _split(values).items():
        rank[pos] = kind
        sub = values if len(pos) == len(values) else [values[i] for i in pos]
        if kind == _NUMBER:
            fkey[pos] = np.array(sub, dtype=np.float64)
            tkey[pos] = 1
        elif kind == _STR:
            # UTF-8 byte order is code point order; equal strings (a dictionary of one
            # kind may repeat them) get equal ranks
            ranks = pc.rank(from_strs(sub), sort_keys="ascending", tiebreaker="dense")
            ikey[pos] = to_numpy(ranks, np.uint64).astype(_I64)  # to_numpy: no pandas
        elif kind == _BOOL:
            ikey[pos] = [1 if bool(v) else 0 for v in sub]
        else:  # bytes and CIDs: rare in bulk, ordered by their own sort key
            order = sorted(range(len(sub)), key=lambda i: sort_key(sub[i]))
            ikey[pos] = _dense_codes(np.array(order, dtype=_I64))
    return rank, fkey, ikey, tkey


def column_keys(col: Column) -> list[np.ndarray]:
    """Arrays whose lexicographic order (first most significant) is
    :func:`~merklog.engine.arith.sort_key`'s order of the column's values."""
    floats, diff = _number_keys(col.ints.astype(np.float64), col.ints)
    if col.mask is None:
        return [floats, diff]
    rank, fkey, ikey, tkey = _dict_keys(col.values)
    mask, idx = col.mask, col.idx
    return [
        np.where(mask, rank[idx], np.int8(_NUMBER)),
        np.where(mask, fkey[idx], floats),
        np.where(mask, ikey[idx], diff),
        np.where(mask, tkey[idx], np.int8(0)),
    ]


def row_order(cols: Sequence[Column]) -> np.ndarray:
    """Row indices in :func:`~merklog.engine.batch.sort_rows`' order (``np.lexsort`` is
    stable; rows of a relation are distinct anyway)."""
    keys: list[np.ndarray] = []
    for col in cols:
        keys.extend(column_keys(col))
    return np.lexsort(keys[::-1])


def float_text(floats: np.ndarray) -> Any:
    """Text of float64 values, each exactly as :func:`merklog.store.format_value` renders
    it (Python's ``repr``: the shortest round-trip digits, fixed notation from 1e-4 up
    to 1e16, else ``1e-07``, ``1e+16``), so a value has one rendering everywhere.

    pyarrow formats a whole column at once with the same shortest digits but its own
    layout (``1e-7``, ``-0.00001``, ``1e+15``, ``1`` for ``1.0``): its text is kept
    where both are the same fixed notation (no exponent, magnitude in [1e-4, 1e16),
    ``.0`` added to a whole number), and the rest, rare in most data, take ``repr``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .arrowbuf import str_scalar

    floats = np.ascontiguousarray(floats, dtype=np.float64) + 0.0  # -0.0 is 0.0, as stored
    arr = pa.Array.from_buffers(pa.float64(), len(floats), [None, pa.py_buffer(floats)])
    text = arr.cast(pa.string())
    whole = pc.match_substring_regex(text, r"^-?[0-9]+$")
    text = pc.if_else(
        whole, pc.binary_join_element_wise(text, str_scalar(".0"), str_scalar("")), text
    )
    size = np.abs(floats)
    other = pc.match_substring(text, "e").to_numpy(zero_copy_only=False) | (
        (size < 1e-4) & (size != 0.0) | (size >= 1e16)
    )
    if other.any():
        reprs = pa.array(list(map(float.__repr__, floats[other].tolist())), pa.string())
        text = pc.replace_with_mask(text, pa.array(other), reprs)
    return text


def dictionary_text(col: Column, format_field: Callable[[Any], str]) -> Any:
    """Text of every entry of the column's dictionary, in dictionary order (None
    without one): computed once per column, taken by id for each batch of rows.
    Floats are formatted here as whole arrays; ``format_field`` (the writer's one
    per-field definition, :func:`merklog.engine.tsv.format_field`) gives the text of
    the rarer kinds (bools, bytes, CIDs), one per distinct value."""
    import pyarrow as pa

    from .arrowbuf import from_ints, from_strs

    if col.mask is None:
        return None
    values = col.values
    parts = []
    positions = []
    for kind, pos in _split(values).items():
        sub = values if len(pos) == len(values) else [values[i] for i in pos]
        if kind == _STR:
            parts.append(from_strs(sub))
        elif kind == _NUMBER:
            parts.append(float_text(np.array(sub, dtype=np.float64)))
        else:
            parts.append(from_strs([format_field(v) for v in sub]))
        positions.append(pos)
    text = pa.concat_arrays([p.cast(pa.string()) for p in parts])
    where = np.concatenate(positions)
    return text.take(from_ints(np.argsort(where, kind="stable")))


def column_text(col: Column, table: Any) -> Any:
    """The column as a pyarrow string array: ints by pyarrow's cast, other values
    from their dictionary entry's text in ``table`` (:func:`dictionary_text`)."""
    import pyarrow as pa

    from .arrowbuf import from_ints

    if col.mask is not None and col.mask.all():  # no ints: the dictionary's text alone
        return table.take(from_ints(col.idx))
    if col.mask is None:
        return from_ints(col.ints).cast(pa.string())
    # Each row's text taken once, from its own kind: taking the dictionary's text for
    # every row (an int row's id is 0) and choosing with if_else copied entry 0 once
    # per int row, rows x its length: 2 GB for 1,000 ints beside one 2 MB string (QA).
    mask = col.mask
    text = table.take(from_ints(col.idx[mask]))
    ints = from_ints(col.ints[~mask]).cast(text.type)
    where = np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)])
    joined = pa.concat_arrays([text, ints])
    return joined.take(from_ints(np.argsort(where, kind="stable")))


__all__ = [
    "Column",
    "column_keys",
    "column_text",
    "dictionary_text",
    "float_text",
    "row_order",
]
