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

import json
import re
from itertools import chain
from math import isfinite

from merklog.store import Fact, Link, Value
from merklog.store.codec import gc_paused

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


# One fact per line, nothing else on it: the argument list is handed to ``json.loads``.
_LINE = re.compile(r"^[ \t]*([a-z][A-Za-z0-9_]*)[ \t]*\((.*)\)[ \t]*\.[ \t]*\r?$", re.MULTILINE)
_JSON_VALUE_TYPES = frozenset((int, float, str, bool))
_new_fact = tuple.__new__


def read_fact_lines(text: str) -> tuple[list[Fact], list[str]] | None:
    """The ground facts of ``text`` and the source line of each, when ``text`` is the
    bulk shape: one fact per line, blank lines between, arguments written in the
    common spellings shared with JSON (decimal numbers, ``true``/``false``, strings
    without backslashes); ``None`` otherwise.

    Why: a per-fact regex and per-value conversion cost ~7 µs a fact; here one
    ``findall`` splits the lines and one ``json.loads`` converts every argument list at
    once in C. JSON is used only where its reading of a token is the parser's:
    any backslash or bracket in the text, a line that is not exactly one fact, a
    token JSON refuses (``0x1F``, ``007``, ``x"…"``, ``cid"…"``) or one it reads
    differently (``NaN``, ``null``, an out-of-range number) returns ``None``."""
    with gc_paused():
        return _read_fact_lines(text)


def _read_fact_lines(text: str) -> tuple[list[Fact], list[str]] | None:
    if "\\" in text or "[" in text or "]" in text or "{" in text or "}" in text:
        return None
    pairs = _LINE.findall(text)
    lines = text.split("\n")
    if len(pairs) != len(lines) - lines.count(""):  # a line that is no lone fact
        return None
    if not pairs:
        return [], []
    rels, raws = zip(*pairs, strict=True)
    try:
        values = json.loads("[[" + "],[".join(raws) + "]]", strict=False)
    except ValueError:  # a token JSON does not read (hex, bytes, CIDs, …): the parser's
        return None
    if len(values) != len(raws):
        return None
    flat = list(chain.from_iterable(values))
    kinds = set(map(type, flat))
    if not kinds <= _JSON_VALUE_TYPES:  # null, …
        return None
    if int in kinds:
        ints = [v for v in flat if type(v) is int]
        if min(ints) < INT64_MIN or max(ints) > INT64_MAX:
            return None
    if float in kinds and not all(map(isfinite, [v for v in flat if type(v) is float])):
        return None
    facts = [_new_fact(Fact, (rel, tuple(args))) for rel, args in zip(rels, values, strict=True)]
    return facts, [line for line in lines if line]


def read_ground_facts(text: str) -> list[Fact] | None:
    """The ground facts of ``text`` as the parser would give them, or ``None`` when
    ``text`` holds anything outside the fast subset (then use the full parser)."""
    with gc_paused():  # a million new tuples: cyclic GC passes would cost as much again
        bulk = read_fact_lines(text)
        if bulk is not None:
            return bulk[0]
        return _read_per_fact(text)


def _read_per_fact(text: str) -> list[Fact] | None:
    """One regex match per fact (any layout of the fast subset)."""
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


__all__ = ["read_fact_lines", "read_ground_facts"]
