"""The ONE definition of arithmetic and comparison used by every evaluator.

Batch, incremental and Spark evaluation must agree tuple for tuple, so they all
call these functions (or the specialised closures of :func:`make_arith` /
:func:`make_compare`, which avoid per-tuple dispatch on the operator).

Arithmetic ``a op b`` (``op`` in ``+ - * / %``):

- int op int -> int. ``/`` and ``%`` truncate toward zero (C, WebAssembly,
  Soufflé): ``-7 / 2 == -3``, ``-7 % 2 == -1`` (the remainder has the sign of
  the dividend).
- division or modulo by zero (int or float) -> :class:`NoBinding`.
- ``int_bits=64`` (merklog dialect): a result outside int64 -> :class:`NoBinding`
  (the rule derives nothing for that binding; values never silently wrap).
  ``int_bits=32`` (Soufflé dialect): results wrap two's complement to int32 as
  Soufflé's ``number`` does (``2147483647 + 1 == -2147483648``).
- any float operand -> float (IEEE f64; ``%`` is C ``fmod``) returned as an engine
  :class:`~merklog.engine.values.Float`; a non-finite result -> :class:`NoBinding`;
  ``-0.0`` is normalised to ``0.0`` like stored values.
- ``str + str`` concatenates; ``bytes + bytes`` concatenates. Every other
  combination (bools, CIDs, strings with numbers, …) -> :class:`NoBinding`.

Comparisons ``== != < <= > >=``:

- same type: natural order (numbers numerically, strings by code point, bytes
  lexicographically, ``false < true``, CIDs by their raw bytes);
- int vs float: numerically and exactly (``1 == 1.0``, ``2**53 + 1 > 2.0**53``);
- bool is NOT a number: ``true == 1`` is false, and a bool is not ordered against numbers;
- any other mixed pair: ``==`` is false, ``!=`` is true, and ordering comparisons
  are false (the constraint filters the binding out).

:func:`sort_key` gives the total order used where one is needed across types
(min/max aggregates, deterministic output): bool < number < str < bytes < CID,
with an int before an equal float (``1`` before ``1.0``).

Every function accepts values in engine form (:mod:`merklog.engine.values`:
``Float``, ``Bool``) as well as plain merklog values, and returns engine values,
so results keep their identity (``1.0 + 1`` is the float ``2.0``, never ``2``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable

from merklog.store import Link, Value

from .values import Bool, Float

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


class NoBinding(ArithmeticError):
    """The operation has no value (division by zero, overflow, bad operand types):
    the evaluator drops this binding, the rule derives nothing for it."""


def _wrap32(value: int) -> int:
    return ((value + 2**31) & 0xFFFFFFFF) - 2**31


def _trunc_div(a: int, b: int) -> int:
    q = a // b
    if q < 0 and q * b != a:
        q += 1
    return q


def _trunc_mod(a: int, b: int) -> int:
    return a - b * _trunc_div(a, b)


def _float_result(value: float) -> Float:
    if value != value or value in (math.inf, -math.inf):
        raise NoBinding
    return Float(value)  # Float() normalises -0.0


#: Python types holding a number, plain or in engine form (``bool`` is not one).
_NUMBER = frozenset((int, float, Float))
_FLOATS = frozenset((float, Float))


def _generic(op: str, a: Value, b: Value, int_bits: int) -> Value:
    ta = type(a)
    tb = type(b)
    if ta is int and tb is int:
        if op == "+":
            r = a + b  # type: ignore[operator]
        elif op == "-":
            r = a - b  # type: ignore[operator]
        elif op == "*":
            r = a * b  # type: ignore[operator]
        elif op == "/":
            if b == 0:
                raise NoBinding
            r = _trunc_div(a, b)  # type: ignore[arg-type]
        elif op == "%":
            if b == 0:
                raise NoBinding
            r = _trunc_mod(a, b)  # type: ignore[arg-type]
        else:
            raise ValueError(f"unknown arithmetic operator {op!r}")
        if int_bits == 32:
            return _wrap32(r)
        if INT64_MIN <= r <= INT64_MAX:
            return r
        raise NoBinding
    if ta in _NUMBER and tb in _NUMBER:
        x = float(a)  # type: ignore[arg-type]
        y = float(b)  # type: ignore[arg-type]
        if op == "+":
            return _float_result(x + y)
        if op == "-":
            return _float_result(x - y)
        if op == "*":
            return _float_result(x * y)
        if op == "/":
            if y == 0.0:
                raise NoBinding
            return _float_result(x / y)
        if op == "%":
            if y == 0.0:
                raise NoBinding
            return _float_result(math.fmod(x, y))
        raise ValueError(f"unknown arithmetic operator {op!r}")
    if op == "+" and ta is tb and (ta is str or ta is bytes):
        return a + b  # type: ignore[operator]
    if op not in ("+", "-", "*", "/", "%"):
        raise ValueError(f"unknown arithmetic operator {op!r}")
    raise NoBinding


def arith(op: str, a: Value, b: Value, int_bits: int = 64) -> Value:
    """``a op b`` under merklog's semantics (module docstring); raises NoBinding."""
    return _generic(op, a, b, int_bits)


def negate(a: Value, int_bits: int = 64) -> Value:
    """Unary minus: ``0 - a`` for numbers; NoBinding otherwise (or on int64 overflow)."""
    if type(a) is int:
        r = -a  # type: ignore[operator]
        if int_bits == 32:
            return _wrap32(r)
        if r > INT64_MAX:
            raise NoBinding
        return r
    if type(a) in _FLOATS:
        return _float_result(-float(a))  # type: ignore[arg-type]
    raise NoBinding


def make_arith(op: str, int_bits: int = 64) -> Callable[[Value, Value], Value]:
    """A closure computing ``a op b``, with an inlined fast path for int op int."""
    if op not in ("+", "-", "*", "/", "%"):
        raise ValueError(f"unknown arithmetic operator {op!r}")
    if int_bits not in (32, 64):
        raise ValueError("int_bits must be 32 or 64")
    lo, hi = (INT64_MIN, INT64_MAX) if int_bits == 64 else (INT32_MIN, INT32_MAX)
    generic = _generic

    if op == "+":

        def f(a: Value, b: Value) -> Value:
            if type(a) is int and type(b) is int:
                r = a + b
                if lo <= r <= hi:
                    return r
            return generic("+", a, b, int_bits)

    elif op == "-":

        def f(a: Value, b: Value) -> Value:
            if type(a) is int and type(b) is int:
                r = a - b
                if lo <= r <= hi:
                    return r
            return generic("-", a, b, int_bits)

    elif op == "*":

        def f(a: Value, b: Value) -> Value:
            if type(a) is int and type(b) is int:
                r = a * b
                if lo <= r <= hi:
                    return r
            return generic("*", a, b, int_bits)

    else:

        def f(a: Value, b: Value) -> Value:
            return generic(op, a, b, int_bits)

    return f


# ----------------------------------------------------------------- comparisons

#: The comparison class of each Python type a value may have (plain or engine form).
_CLASS = {
    int: "number",
    float: "number",
    Float: "number",
    bool: "bool",
    Bool: "bool",
    str: "str",
    bytes: "bytes",
    Link: "cid",
}


def _comparable(a: Value, b: Value) -> bool:
    ta = type(a)
    tb = type(b)
    if ta is tb:
        return True
    return ta in _NUMBER and tb in _NUMBER or _CLASS.get(ta, ta) == _CLASS.get(tb, tb)


def _plain(value: Value) -> Value:
    """A value whose Python comparison operators follow merklog's within its class:
    ``Float`` -> ``float`` (exact against ints), ``Bool`` -> ``bool``, ``Link`` -> raw bytes."""
    kind = type(value)
    if kind is Float:
        return float(value)  # type: ignore[arg-type]
    if kind is Bool:
        return bool(value)
    if kind is Link:
        return value.raw  # type: ignore[union-attr]
    return value


def compare(op: str, a: Value, b: Value) -> bool:
    """``a op b`` under merklog's semantics (module docstring)."""
    return make_compare(op)(a, b)


def make_compare(op: str) -> Callable[[Value, Value], bool]:
    """A closure for one comparison operator (fast path: two ints, or two strings)."""
    if op not in ("==", "!=", "<", "<=", ">", ">="):
        raise ValueError(f"unknown comparison operator {op!r}")
    comparable = _comparable
    plain = _plain
    import operator

    fn = {
        "==": operator.eq,
        "!=": operator.ne,
        "<": operator.lt,
        "<=": operator.le,
        ">": operator.gt,
        ">=": operator.ge,
    }[op]
    # Same-type pairs whose Python operators already are merklog's (Float's are
    # float's, exact): no conversion needed.
    direct = frozenset((int, str, Float, bytes))
    if op == "!=":

        def f(a: Value, b: Value) -> bool:
            ta = type(a)
            if ta is type(b) and ta in direct:
                return a != b
            return not comparable(a, b) or plain(a) != plain(b)

    else:

        def f(a: Value, b: Value) -> bool:
            ta = type(a)
            if ta is type(b) and ta in direct:
                return fn(a, b)
            return comparable(a, b) and fn(plain(a), plain(b))

    return f


_RANK = {bool: 0, Bool: 0, int: 1, float: 1, Float: 1, str: 2, bytes: 3, Link: 4}


def sort_key(value: Value) -> tuple:
    """Total order across types: bool < number < str < bytes < CID, natural within
    (an int sorts just before an equal float, so ``1`` and ``1.0`` never tie)."""
    kind = type(value)
    if kind is str:  # the common cases first: this runs once per value of a sorted output
        return (2, value)
    if kind is int:
        return (1, value, 0)
    if kind is Float or kind is float:
        return (1, float(value), 1)  # type: ignore[arg-type]
    if kind is Link:
        return (4, value.raw)  # type: ignore[union-attr]
    if kind is Bool:
        return (0, bool(value))
    return (_RANK[kind], value)


def values_equal(a: Value, b: Value) -> bool:
    """Datalog comparison ``a == b`` (``true`` is not ``1``; ``1 == 1.0``). Value
    *identity* (joins, constants in atoms, sets) is engine-form ``==`` instead."""
    return _comparable(a, b) and _plain(a) == _plain(b)


def equal_values(value: Value) -> tuple[Value, ...]:
    """The engine-form values ``value == v`` holds for: ``value`` itself, and for a number
    the other numeric type's value of exactly the same magnitude (``2`` and ``2.0``;
    ``2**53 + 1`` has no float twin, ``0.5`` no int one). An evaluator that looks an
    expression's value up in an index (``q(X * 2)``) looks up each, so the atom compares
    as ``==`` does rather than by identity."""
    kind = type(value)
    if kind is int:
        twin = float(value)  # type: ignore[arg-type]
        if int(twin) == value:
            return (value, Float(twin))
    elif kind is Float and value.is_integer():  # type: ignore[union-attr]
        twin_int = int(value)  # type: ignore[arg-type]
        if INT64_MIN <= twin_int <= INT64_MAX:
            return (value, twin_int)
    return (value,)


def numeric_key(value: Value) -> Value:
    """One representative of the values ``==`` holds between: an integral ``Float`` within
    int64 becomes that int (``2.0`` -> ``2``), anything else is itself. Two values are
    ``==``-equal numbers exactly when their keys are identical, so an evaluator that joins
    by identity joins an expression's value by ``==`` when both sides map through this."""
    if type(value) is Float and value.is_integer():  # type: ignore[union-attr]
        whole = int(value)  # type: ignore[arg-type]
        if INT64_MIN <= whole <= INT64_MAX:
            return whole
    return value


# ----------------------------------------------------------------- sum aggregate

_FSCALE = 1074  # every finite double is an integer multiple of 2**-1074


class ExactSum:
    """The ONE definition of the ``sum`` aggregate, shared by batch and incremental.

    The result must not depend on the order in which a group's values arrive
    (a set has no order, and the incremental engine adds and retracts values
    in whatever order epochs bring them), so the sum is computed exactly and
    rounded once:

    - only ints: the exact integer sum; ``int_bits=64`` gives no value when it
      lies outside int64 (``sum`` never wraps in the merklog dialect),
      ``int_bits=32`` wraps it two's complement to int32 as Soufflé does;
    - at least one float: the exact rational sum of every value (ints
      included), rounded once to the nearest double (``1e16, 1.0, -1e16`` sum
      to ``1.0``, whatever the order); a non-finite result gives no value;
    - any value that is not a number (a string, bytes, a bool, a CID) or is a
      non-finite float: no value.

    Values may be added and retracted (``weight`` ±n), so the incremental
    engine keeps one accumulator per group in O(1) space; floats are held as
    integers scaled by 2**1074, which makes retraction exact too.
    """

    __slots__ = ("itotal", "ftotal", "nfloat", "nother")

    def __init__(self) -> None:
        self.itotal = 0
        self.ftotal = 0  # sum of the float values, times 2**1074
        self.nfloat = 0
        self.nother = 0

    def add(self, value: Value, weight: int = 1) -> None:
        """Add ``value`` ``weight`` times (a negative weight retracts it)."""
        if type(value) is int:
            self.itotal += value * weight
        elif isinstance(value, float) and math.isfinite(value):
            m, e = math.frexp(value)
            scaled = int(m * 9007199254740992.0)  # m * 2**53, exact
            shift = e - 53 + _FSCALE
            self.ftotal += (scaled << shift if shift >= 0 else scaled >> -shift) * weight
            self.nfloat += weight
        else:
            self.nother += weight

    def add_many(self, values: list, weights: list[int], skip: object = None) -> None:
        """Add ``values[i]`` ``weights[i]`` times each, ignoring values that are ``skip``
        (one C-level sum when every value is an int: bulk loads)."""
        if all(type(v) is int for v in values):
            self.itotal += sum(map(operator.mul, values, weights))
            return
        for v, w in zip(values, weights, strict=True):
            if v is not skip:
                self.add(v, w)

    def result(self, int_bits: int = 64) -> Value:
        """The sum (module docstring); raises :class:`NoBinding` when it has no value."""
        if self.nother:
            raise NoBinding
        if self.nfloat:
            try:
                total = ((self.itotal << _FSCALE) + self.ftotal) / (1 << _FSCALE)
            except OverflowError:
                raise NoBinding from None
            return _float_result(total)
        total = self.itotal
        if int_bits == 32:
            return _wrap32(total)
        if INT64_MIN <= total <= INT64_MAX:
            return total
        raise NoBinding


def sum_values(values: Iterable[Value], int_bits: int = 64) -> Value:
    """``sum`` of a group's values (:class:`ExactSum`); raises NoBinding when it has none."""
    acc = ExactSum()
    for v in values:
        acc.add(v)
    return acc.result(int_bits)


__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "ExactSum",
    "NoBinding",
    "arith",
    "compare",
    "make_arith",
    "make_compare",
    "negate",
    "sort_key",
    "sum_values",
    "values_equal",
]
