"""Merklog values in JSON, both ways: the one rendering used by every HTTP answer and the
typed JSON fact form accepted by ``POST /v1/facts``.

JSON keeps the value types apart (``1``, ``1.0``, ``true`` and ``"1"`` are four
different values with four different CIDs): an integer literal is an int, a
literal with a fraction or exponent is a float. Bytes and CIDs use DAG-JSON's
tagged forms (https://ipld.io/specs/codecs/dag-json/spec/): ``{"/": {"bytes":
"<base64, no padding>"}}`` and ``{"/": "bafy…"}``.
"""

from __future__ import annotations

import base64
import binascii
import math
from itertools import chain
from typing import Any

from merklog.engine.lexer import float_in_range
from merklog.store import (
    Fact,
    InvalidValue,
    Link,
    check_facts,
    check_writable_relation,
    make_fact,
)

from .errors import NodeInputError

__all__ = ["fact_from_json", "fact_to_json", "facts_from_json", "value_from_json", "value_to_json"]


def value_to_json(value: Any) -> Any:
    """A value as JSON: CIDs ``{"/": "bafy…"}``, bytes ``{"/": {"bytes": base64}}``."""
    if isinstance(value, Link):
        return {"/": str(value)}
    if isinstance(value, bytes):
        return {"/": {"bytes": base64.b64encode(value).decode().rstrip("=")}}
    return value


class OversizedInt:
    """A JSON integer too long for Python's ``int()`` (over 4,300 digits), far outside
    64 bits: kept as its text so that the field holding it is named in the error, not
    Python's limit (``json.loads(..., parse_int=int_or_oversized)``). No field takes
    it: it is neither a number nor a string."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        digits = self.text.lstrip("-")
        sign = self.text[: len(self.text) - len(digits)]
        return f"{sign}{digits[:12]}…{digits[-4:]} ({len(digits)} digits)"


class OutOfRangeFloat:
    """A JSON number that no double holds as written: beyond ±1.8e308 (Python reads it
    as an infinity) or not zero but read as 0.0 (``1e-400``). Kept as its text so that
    the error names the field and the number, as for an :class:`OversizedInt`
    (``json.loads(..., parse_float=float_or_out_of_range)``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return (
            self.text
            if len(self.text) <= 40
            else f"{self.text[:36]}… ({len(self.text)} characters)"
        )


def float_or_out_of_range(text: str) -> float | OutOfRangeFloat:
    """A JSON float literal as a float, or an :class:`OutOfRangeFloat`."""
    value = float_in_range(text)
    return OutOfRangeFloat(text) if value is None else value


#: More digits than this and a JSON integer is read as an OversizedInt.
_INT_DIGITS_READ = 4300


def int_or_oversized(text: str) -> int | OversizedInt:
    """A JSON integer literal as an int, or an :class:`OversizedInt` if ``int()`` would
    refuse it for its length."""
    if len(text) > _INT_DIGITS_READ:
        return OversizedInt(text)
    return int(text)


def _oversized(value: OversizedInt | OutOfRangeFloat, where: str) -> NodeInputError:
    if isinstance(value, OutOfRangeFloat):
        return NodeInputError(
            f"{where}: float {value} is out of range (a 64-bit double cannot hold it as written)"
        )
    return NodeInputError(f"{where}: integer {value} does not fit in 64 signed bits")


def _infinite(where: str) -> NodeInputError:
    """The error for a float literal such as ``1e999``, read as an infinity where the body
    was not read float by float (``handlers.json_object`` does that only where it sees a
    signed three-digit exponent or an underflow)."""
    return NodeInputError(
        f"{where}: a float beyond ±1.8e308 is out of range (a 64-bit double cannot hold it)"
    )


def value_from_json(obj: Any, where: str = "value") -> Any:
    """The merklog value a JSON value stands for (NodeInputError if none)."""
    if isinstance(obj, OversizedInt | OutOfRangeFloat):
        raise _oversized(obj, where)
    if obj is None:  # named as JSON names it, not as Python does ("NoneType")
        raise NodeInputError(f"{where}: null is not a merklog value")
    if isinstance(obj, list):
        raise NodeInputError(
            f"{where}: an array is not a merklog value (each argument is one value)"
        )
    if isinstance(obj, float) and not math.isfinite(obj):
        raise _infinite(where)
    if isinstance(obj, dict):
        tag = obj.get("/") if len(obj) == 1 else None
        if isinstance(tag, str):
            try:
                return Link.parse(tag)
            except (ValueError, InvalidValue) as exc:
                raise NodeInputError(f"{where}: {exc}") from None  # "not a CID: 'x'", once
        if isinstance(tag, dict) and len(tag) == 1 and isinstance(tag.get("bytes"), str):
            text = tag["bytes"]
            try:
                data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise NodeInputError(f"{where}: {text!r} is not base64") from None
            canonical = base64.b64encode(data).decode().rstrip("=")
            if text.rstrip("=") != canonical:  # QA: "AR" and "AQ" both gave x"01"
                raise NodeInputError(
                    f"{where}: {text!r} is not canonical base64 (unused bits set); these"
                    f" bytes are written {canonical!r}"
                )
            return data
        raise NodeInputError(
            f'{where}: objects must be {{"/": "<cid>"}} or {{"/": {{"bytes": "<base64>"}}}}'
        )
    return obj


def fact_from_json(obj: Any, where: str = "fact") -> Fact:
    """``{"rel": "edge", "args": [1, 2]}`` → ``edge(1, 2)`` with typed values."""
    if not isinstance(obj, dict) or not isinstance(obj.get("rel"), str) or "args" not in obj:
        raise NodeInputError(f'{where}: expected {{"rel": "<name>", "args": [...]}}')
    if len(obj) != 2:
        extra = ", ".join(sorted(repr(k) for k in obj if k not in ("rel", "args")))
        raise NodeInputError(f'{where}: unknown key {extra} (a fact has "rel" and "args")')
    args = obj["args"]
    if not isinstance(args, list):
        raise NodeInputError(f'{where}: "args" must be a list')
    for i, arg in enumerate(args):  # named as make_fact names a value out of range
        if isinstance(arg, OversizedInt | OutOfRangeFloat):
            raise _oversized(arg, f"{where}: {obj['rel']}(…) argument {i}")
        if isinstance(arg, float) and not math.isfinite(arg):
            raise _infinite(f"{where}: {obj['rel']}(…) argument {i}")
    values = [value_from_json(a, f"{where} argument {i}") for i, a in enumerate(args)]
    try:
        return make_fact(check_writable_relation(obj["rel"]), values)
    except InvalidValue as exc:
        raise NodeInputError(f"{where}: {exc}") from None


def fact_to_json(fact: Fact) -> dict[str, Any]:
    """The JSON fact form of ``fact`` (the inverse of :func:`fact_from_json`)."""
    return {"rel": fact.rel, "args": [value_to_json(v) for v in fact.args]}


_PLAIN = frozenset((int, float, str, bool))


def facts_from_json(items: list, where: str = "assert") -> list[Fact]:
    """``[fact_from_json(item, f"{where}[{i}]") ...]`` for a whole request body, in bulk.

    The common body (objects whose ``args`` hold numbers, strings and booleans only)
    is checked column-wise (:func:`merklog.store.check_facts`) instead of one call chain
    per value; anything else, or any error, takes the per-item path, so every message
    names its item exactly as before."""
    if set(map(type, items)) == {dict} and set(map(len, items)) == {2}:
        rels = [item.get("rel") for item in items]
        arg_lists = [item.get("args") for item in items]
        if set(map(type, rels)) == {str} and set(map(type, arg_lists)) == {list}:
            if set(map(type, chain.from_iterable(arg_lists))) <= _PLAIN:
                try:
                    for rel in set(rels):
                        check_writable_relation(rel)
                    return check_facts(
                        [Fact(rel, tuple(args)) for rel, args in zip(rels, arg_lists, strict=True)]
                    )
                except InvalidValue:
                    pass  # the per-item path names the item
    return [fact_from_json(item, f"{where}[{i}]") for i, item in enumerate(items)]
