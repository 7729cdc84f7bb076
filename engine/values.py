"""The engine's one value representation: typed values whose ``==`` and ``hash`` are identity.

merklog values (:data:`merklog.store.Value`) are Python objects, and Python
equality conflates values that are distinct in merklog: ``True == 1 == 1.0``
and ``hash(True) == hash(1) == hash(1.0)``. Sets, dicts, Z-sets, joins and
group-bys all rely on ``==``/``hash``, so inside the engine every value is held
in its *engine form*, where equality and hashing include the value's type:

- ``int``, ``str``, ``bytes`` and :class:`~merklog.store.Link` are kept as they
  are (their Python equality already separates them from each other, and an
  ``int`` is never equal to a :class:`Float` or a :class:`Bool`);
- a float becomes a :class:`Float` (a ``float`` subclass equal only to another
  ``Float`` of the same value, hashed apart from ints), with ``-0.0`` normalised
  to ``0.0`` exactly as the store normalises it;
- a bool becomes one of the two singletons :data:`TRUE` / :data:`FALSE`
  (:class:`Bool` is not a number: it equals only itself).

So ``{1, Float(1.0), TRUE}`` has three members, ``(1,) != (TRUE,)`` and a join
on a variable never matches ``1`` with ``1.0``. Numeric *comparison*
(``X == Y`` in a rule body, ``<``, ...) is a separate operation defined in
:mod:`merklog.engine.arith`: there ``1 == 1.0`` holds (int vs float compares
exactly), while a bool still compares equal to nothing but itself.

The engine's public API speaks plain merklog values: :func:`to_engine` /
:func:`row_to_engine` convert at the way in, :func:`from_engine` /
:func:`row_from_engine` at the way out. Columnar code keeps int64 columns for
``int`` values only; floats and bools never enter an int64 column.
"""

from __future__ import annotations

from typing import Any

from merklog.store import Link, type_name

from .errors import NotAValueError

__all__ = [
    "FALSE",
    "TRUE",
    "Bool",
    "EValue",
    "Float",
    "from_engine",
    "row_from_engine",
    "row_to_engine",
    "to_engine",
    "value_type",
]


class Float(float):
    """A merklog float in engine form: equal only to a ``Float`` of the same value.

    Arithmetic on a ``Float`` returns a plain ``float`` (Python's float
    operators do not preserve subclasses); :mod:`merklog.engine.arith` wraps
    results again. Ordering comparisons (``<`` ...) are inherited and compare
    numerically and exactly against ints, as docs/language.md specifies.
    """

    __slots__ = ()

    def __new__(cls, value: float) -> Float:
        # -0.0 == 0.0 in IEEE terms, but the store gives them one CID: one value.
        return float.__new__(cls, value if value != 0.0 else 0.0)

    def __eq__(self, other: object) -> bool:
        return type(other) is Float and float.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not (type(other) is Float and float.__eq__(self, other))

    # float's own (C) hash: Float(1.0) shares a hash bucket with 1, which is allowed
    # (equality, not the hash, decides identity) and keeps hashing rows of floats at C speed.
    __hash__ = float.__hash__

    def __repr__(self) -> str:
        return f"Float({float.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Float, (float(self),))


class Bool:
    """A merklog bool in engine form: two singletons, each equal only to itself.

    ``Bool`` is deliberately not an ``int`` subclass (Python's ``bool`` is),
    so ``TRUE != 1`` and the two hash apart. ``bool(TRUE)`` is ``True`` for
    convenience in tests and rendering.
    """

    __slots__ = ("_value",)
    _value: bool

    def __new__(cls, value: bool) -> Bool:
        return TRUE if value else FALSE

    @classmethod
    def _make(cls, value: bool) -> Bool:
        obj = object.__new__(cls)
        obj._value = value
        return obj

    def __bool__(self) -> bool:
        return self._value

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return hash(("bool", self._value))

    def __lt__(self, other: object) -> bool:
        if type(other) is not Bool:
            return NotImplemented
        return (not self._value) and other._value  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return "TRUE" if self._value else "FALSE"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Bool, (self._value,))

    def __copy__(self) -> Bool:
        return self

    def __deepcopy__(self, memo: dict) -> Bool:
        return self


TRUE: Bool = Bool._make(True)
FALSE: Bool = Bool._make(False)

EValue = int | Float | str | bytes | Bool | Link
"""A value in engine form."""


def to_engine(value: Any) -> EValue:
    """The engine form of a merklog value (idempotent on engine values)."""
    kind = type(value)
    if kind is int or kind is str or kind is bytes or kind is Link:
        return value
    if kind is bool:
        return TRUE if value else FALSE
    if kind is float:
        return Float(value)
    if kind is Float or kind is Bool:
        return value
    if kind is bytearray or kind is memoryview:  # bytes, as the node's API reads them
        return bytes(value)
    raise NotAValueError(f"{type_name(kind)} is not a merklog value")


def from_engine(value: EValue) -> Any:
    """The plain merklog value of an engine value (idempotent on plain values)."""
    kind = type(value)
    if kind is Float:
        return float(value)
    if kind is Bool:
        return value._value  # type: ignore[union-attr]
    return value


_PLAIN = frozenset((int, str, bytes, Link))


def row_to_engine(row: tuple) -> tuple:
    """A tuple of merklog values in engine form (returned unchanged when nothing needs wrapping)."""
    plain = _PLAIN
    for v in row:
        if type(v) not in plain:
            return tuple(to_engine(x) for x in row)
    return row


def row_holds(row: tuple, consts: dict[int, Any]) -> bool:
    """Whether the engine-form ``row`` holds ``consts[c]`` in every column ``c`` by value
    identity: a value equals only a value of its own type (``1`` is not ``1.0`` or
    ``true``), never by Python's ``==`` alone."""
    return all(c < len(row) and type(row[c]) is type(v) and row[c] == v for c, v in consts.items())


def row_from_engine(row: tuple) -> tuple:
    """A tuple of engine values as plain merklog values."""
    for v in row:
        kind = type(v)
        if kind is Float or kind is Bool:
            return tuple(from_engine(x) for x in row)
    return row


def value_type(value: EValue) -> str:
    """The merklog type name of an engine (or plain) value: int, float, str, bytes, bool, cid."""
    kind = type(value)
    if kind is int:
        return "int"
    if kind is Float or kind is float:
        return "float"
    if kind is Bool or kind is bool:
        return "bool"
    if kind is str:
        return "str"
    if kind is bytes:
        return "bytes"
    if kind is Link:
        return "cid"
    raise NotAValueError(f"{type_name(kind)} is not a merklog value")
