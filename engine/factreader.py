"""Fast reader for bulk ground facts (``merklog put -f``, Datalog write bodies).

A file of ground facts ``rel(v1, v2, …).`` is read by one compiled regular
expression per fact instead of the general lexer and recursive-descent parser
(:mod:`merklog.engine.parser`), which cost ~85 µs a fact. It accepts exactly a
subset of the grammar and yields the same values the parser does:

- integers (decimal, ``0x…``, ``0b…``, optionally negated) within int64,
- floats (``1.5``, ``2e3``, negated; ``-0.0`` stays ``-0.0`` as the parser gives it,
  :func:`merklog.store.make_fact` normalises it later for both),
- ``true``/``false``, strings with the lexer's escapes, ``x"…"`` bytes, ``cid"…"`` links,
- blank lines and ``%`` / ``//`` comments between facts.

Anything else (a rule, a variable, ``/* */`` comments, an out-of-range number, a bad
escape …) makes :func:`read_ground_facts` return ``None`` and the caller runs the full
parser over the whole text, so every error keeps its exact message and ``line:col``.
"""

from __future__ import annotations

import re

from merklog.store import Fact, Link, Value

from .errors import ParseError
from .lexer import INT64_MAX, INT64_MIN, Source, _decode_string

# Alternatives in the lexer's order (float before int, hex/bin before decimal), so
# the structural match below and ``findall`` split an argument list identically.
_ARG = (
    r'x"[^"\n]*"'
    r'|cid"[^"\n]*"'
    r"|-?(?:\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)"
    r'|"(?:[^"\\\n]|\\.)*"'
    r"|true|false"
)
_GAP = r"(?:[ \t\r\n\f]+|%[^\n]*|//[^\n]*)*"
_FACT = re.compile(
    rf"{_GAP}([a-z][A-Za-z0-9_]*)[ \t]*\([ \t]*"
    rf"((?:(?:{_ARG})[ \t]*,[ \t]*)*(?:{_ARG}))?[ \t]*\)[ \t]*\.(?![.a-z])"
)
_END = re.compile(rf"{_GAP}\Z")
_ARGS = re.compile(_ARG)
_NOSRC = Source("")


class _Fallback(Exception):
    """The text leaves the fast subset: the full parser decides."""


def _number(tok: str) -> Value:
    neg = tok[0] == "-"
    body = tok[1:] if neg else tok
    head = body[:2]
    if head in ("0x", "0X"):
        value: int | float = int(body[2:], 16)
    elif head in ("0b", "0B"):
        value = int(body[2:], 2)
    elif "." in body or "e" in body or "E" in body:
        value = float(body)
        if value == float("inf"):
            raise _Fallback
    else:
        value = int(body)
    if neg:
        value = -value
    if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
        raise _Fallback
    return value


def _value(tok: str) -> Value:
    c = tok[0]
    if c == '"':
        if "\\" not in tok:
            return tok[1:-1]
        try:
            return _decode_string(_NOSRC, tok, 0)
        except ParseError:
            raise _Fallback from None
    if c == "t":
        return True
    if c == "f":
        return False
    if c == "x":
        try:
            return bytes.fromhex(tok[2:-1])
        except ValueError:
            raise _Fallback from None
    if c == "c":
        try:
            return Link.parse(tok[4:-1])
        except Exception:  # noqa: BLE001 - any decoding failure: the parser reports it
            raise _Fallback from None
    return _number(tok)


def _args(raw: str) -> tuple[Value, ...]:
    if '"' not in raw:  # numbers and booleans only: commas split them exactly
        toks = raw.split(",")
    else:
        toks = _ARGS.findall(raw)
    values = []
    for tok in toks:
        try:
            value = int(tok)  # decimal (the regex allows no "_" and no inner spaces)
        except ValueError:
            values.append(_value(tok.strip(" \t")))
            continue
        if not INT64_MIN <= value <= INT64_MAX:
            raise _Fallback
        values.append(value)
    return tuple(values)


def read_ground_facts(text: str) -> list[Fact] | None:
    """The ground facts of ``text`` as the parser would give them, or ``None`` when
    ``text`` holds anything outside the fast subset (then use the full parser)."""
    facts: list[Fact] = []
    append = facts.append
    pos = 0
    try:
        for m in _FACT.finditer(text):
            if m.start() != pos:  # something between two facts that is no fact
                return None
            pos = m.end()
            rel, raw = m.groups()
            if raw is None:
                append(Fact(rel, ()))
            elif "," not in raw and raw.isdigit():
                value = int(raw)
                if value > INT64_MAX:
                    raise _Fallback
                append(Fact(rel, (value,)))
            else:
                append(Fact(rel, _args(raw)))
    except _Fallback:
        return None
    if _END.match(text, pos) is None:
        return None
    return facts


__all__ = ["read_ground_facts"]
