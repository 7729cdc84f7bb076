"""Row collections at the engine's boundary: plain values out, engine identity inside.

Inside the engine a relation is a set of tuples in engine form
(:mod:`merklog.engine.values`), where ``(1,)``, ``(1.0,)`` and ``(true,)`` are
three rows. A Python ``set`` of the *plain* tuples would hold one of them, so
results are handed out as views that keep the engine set and convert only what
leaves it:

- :class:`RowSet` (a :class:`collections.abc.Set`): iterating yields plain
  tuples (``1.0`` is a ``float``, ``true`` a ``bool``); ``len``, ``in``, ``==``
  and the set operators work on engine identity, so ``(1,) in rows`` does not
  find ``(1.0,)`` and ``{(1,), (1.0,)}``-shaped results keep both rows.
- :class:`DeltaMap` (a :class:`collections.abc.Mapping`): ``row -> weight``
  deltas of the incremental engine, keyed the same way.

Copying one into a plain ``set``/``dict`` collapses values Python considers
equal; keep the view (or use ``.engine``) when identity matters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Set
from itertools import chain
from typing import Any

from merklog.store import Link, type_name

from .errors import NotAValueError
from .values import Bool, Float, row_from_engine, row_to_engine, to_engine

Row = tuple

_ENGINE_ONLY = frozenset((Float, Bool))
#: Python types of values already in engine form.
_ENGINE_TYPES = frozenset((int, str, bytes, Link, Float, Bool))
#: Plain types that need converting (``float`` -> ``Float``, ``bool`` -> ``Bool``).
_CONVERTIBLE = _ENGINE_TYPES | {float, bool, bytearray, memoryview}


def has_engine_only(rows: Iterable[Row]) -> bool:
    """Does any row hold a value whose plain form differs from its engine form?

    The scan runs in C (``map``/``chain``), so checking a large relation is cheap
    next to converting it row by row.
    """
    return not _ENGINE_ONLY.isdisjoint(map(type, chain.from_iterable(rows)))


class EngineSet(set):
    """A set of rows known to be in engine form (what :func:`engine_rows` returns),
    so converting it again costs nothing. ``mixed``: may hold floats or bools."""

    __slots__ = ("mixed",)

    def __init__(self, rows: Iterable[Row] = (), mixed: bool = True) -> None:
        super().__init__(rows)
        self.mixed = mixed


def _convert(tuples: list[Row]) -> list[Row]:
    """Rows holding plain floats/bools in engine form, a column at a time (C-level
    ``zip``/``map``; only the columns that need it are converted)."""
    lengths = set(map(len, tuples))
    if len(lengths) != 1:  # ragged rows (several arities under one name): row by row
        return list(map(row_to_engine, tuples))
    if lengths == {0}:
        return tuples
    cols: list[Iterable[Any]] = []
    for col in zip(*tuples, strict=True):
        types = set(map(type, col))
        if types <= _ENGINE_TYPES:
            cols.append(col)
        elif types == _FLOAT_ONLY:
            cols.append(map(Float, col))
        else:
            cols.append(map(to_engine, col))
    return list(zip(*cols, strict=True))


_FLOAT_ONLY = {float}


def engine_row_list(rows: Iterable[Row]) -> list[Row]:
    """``rows`` as a list of engine-form tuples, converted with one C-level type scan
    when nothing needs converting (the common, all-int/str case)."""
    if isinstance(rows, EngineSet):
        return list(rows)
    if isinstance(rows, RowSet):
        return list(rows.engine)
    tuples = list(map(tuple, rows))
    types = set(map(type, chain.from_iterable(tuples)))
    if types <= _ENGINE_TYPES:
        return tuples
    bad = types - _CONVERTIBLE
    if bad:
        name = sorted(type_name(t) for t in bad)[0]
        raise NotAValueError(f"{name} is not a merklog value (int, float, str, bytes, bool or CID)")
    return _convert(tuples)


def engine_rows(rows: Iterable[Row]) -> set[Row]:
    """The set of ``rows`` in engine form (plain or engine rows accepted).

    Rows are converted *before* they meet in a set, so ``[(1,), (1.0,), (True,)]``
    gives three rows. An :class:`EngineSet` or a :class:`RowSet`'s rows are returned
    as they are (shared: callers copy before mutating). Raises :class:`TypeError`
    naming a value that is not a merklog value (e.g. ``None``).
    """
    if isinstance(rows, EngineSet):
        return rows
    if isinstance(rows, RowSet):
        return rows.engine
    tuples = rows if isinstance(rows, set | frozenset | list) else list(map(tuple, rows))
    types = set(map(type, chain.from_iterable(tuples)))
    if types <= _ENGINE_TYPES:
        # One C-level type scan of the rows (lists of lists, namedtuples: copied as tuples).
        if not isinstance(tuples, set | frozenset) and set(map(type, tuples)) - {tuple}:
            tuples = list(map(tuple, tuples))
        return EngineSet(tuples, mixed=not _ENGINE_ONLY.isdisjoint(types))
    bad = types - _CONVERTIBLE
    if bad:
        name = sorted(type_name(t) for t in bad)[0]
        raise NotAValueError(f"{name} is not a merklog value (int, float, str, bytes, bool or CID)")
    return EngineSet(_convert(list(map(tuple, tuples))), mixed=True)


class RowSet(Set):
    """A read-only set of rows: plain values when iterated, engine identity otherwise."""

    __slots__ = ("engine", "_mixed")

    def __init__(self, engine: set[Row] | frozenset[Row] = frozenset()) -> None:
        #: The rows in engine form (shared, not copied: do not mutate).
        self.engine = engine
        self._mixed: bool | None = engine.mixed if isinstance(engine, EngineSet) else None

    @classmethod
    def _from_iterable(cls, it: Iterable[Row]) -> RowSet:
        return cls(engine_rows(it))

    def __iter__(self) -> Iterator[Row]:
        if self._mixed is None:
            self._mixed = has_engine_only(self.engine)
        if not self._mixed:
            return iter(self.engine)
        return map(row_from_engine, self.engine)

    def __len__(self) -> int:
        return len(self.engine)

    def __contains__(self, row: object) -> bool:
        if not isinstance(row, tuple):
            return False
        try:
            return row_to_engine(row) in self.engine
        except TypeError:
            return False

    def _other(self, other: Any) -> set[Row] | frozenset[Row] | None:
        if isinstance(other, RowSet):
            return other.engine
        if isinstance(other, Set):
            try:
                return engine_rows(other)
            except TypeError:
                return None
        return None

    def __eq__(self, other: object) -> bool:
        rows = self._other(other)
        return NotImplemented if rows is None else self.engine == rows  # type: ignore[return-value]

    def __ne__(self, other: object) -> bool:
        rows = self._other(other)
        return NotImplemented if rows is None else self.engine != rows  # type: ignore[return-value]

    __hash__ = None  # type: ignore[assignment]

    def __le__(self, other: Any) -> bool:
        rows = self._other(other)
        return NotImplemented if rows is None else self.engine <= rows

    def __ge__(self, other: Any) -> bool:
        rows = self._other(other)
        return NotImplemented if rows is None else self.engine >= rows

    def __sub__(self, other: Any) -> RowSet:
        rows = self._other(other)
        return NotImplemented if rows is None else RowSet(self.engine - rows)  # type: ignore[return-value]

    def __or__(self, other: Any) -> RowSet:
        rows = self._other(other)
        return NotImplemented if rows is None else RowSet(self.engine | rows)  # type: ignore[return-value]

    def __and__(self, other: Any) -> RowSet:
        rows = self._other(other)
        return NotImplemented if rows is None else RowSet(self.engine & rows)  # type: ignore[return-value]

    def __rsub__(self, other: Any) -> RowSet:
        rows = self._other(other)
        return NotImplemented if rows is None else RowSet(rows - self.engine)  # type: ignore[return-value]

    __ror__ = __or__
    __rand__ = __and__

    def __repr__(self) -> str:
        from .arith import sort_key

        shown = sorted(self.engine, key=lambda r: tuple(sort_key(v) for v in r))
        return f"RowSet({[row_from_engine(r) for r in shown]!r})"


class DeltaMap(Mapping):
    """``row -> weight`` (+1 inserted, -1 deleted) keyed by engine identity, plain rows out."""

    __slots__ = ("engine",)

    def __init__(self, engine: dict[Row, int]) -> None:
        #: The delta keyed by engine-form rows (shared, not copied: do not mutate).
        self.engine = engine

    def __getitem__(self, row: Row) -> int:
        return self.engine[row_to_engine(tuple(row))]

    def __iter__(self) -> Iterator[Row]:
        return map(row_from_engine, self.engine)

    def __len__(self) -> int:
        return len(self.engine)

    def __contains__(self, row: object) -> bool:
        if not isinstance(row, tuple):
            return False
        try:
            return row_to_engine(row) in self.engine
        except TypeError:
            return False

    def items(self):  # type: ignore[override]
        """``(plain row, weight)`` pairs, one per engine row."""
        return [(row_from_engine(r), w) for r, w in self.engine.items()]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeltaMap):
            return self.engine == other.engine
        if isinstance(other, Mapping):
            try:
                return self.engine == {row_to_engine(tuple(r)): w for r, w in other.items()}
            except TypeError:
                return False
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DeltaMap({dict(self.items())!r})"


__all__ = ["DeltaMap", "EngineSet", "RowSet", "engine_row_list", "engine_rows", "has_engine_only"]
