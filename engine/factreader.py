"""The one reader of ground facts ``rel(v1, v2, …).`` (ADRs 0035 and 0100).

Every place that reads Datalog ground facts goes through this module: ``merklog put``
(:func:`read_fact_lines`), the node's Datalog write bodies and ``parse_facts``
(:func:`read_ground_facts`), and the parser, which hands it a program's fact lines
before tokenising the rest (:func:`split_fact_lines`) -- ``merklog eval``'s ``.dl``
fact files and programs with inline facts take that path. The full lexer and
recursive-descent parser (:mod:`merklog.engine.parser`, ~85 µs a fact) remain the one
definition of the grammar and of every error; this reader accepts exactly a subset
of it and yields the values the parser does:

- integers (decimal, ``0x…``, ``0b…``, optionally negated) within int64,
- floats (``1.5``, ``2e3``, negated; ``-0.0`` stays ``-0.0`` as the parser gives it,
  :func:`merklog.store.make_fact` normalises it later for both),
- ``true``/``false``, strings with the lexer's escapes, ``x"…"`` bytes, ``cid"…"`` links,
- blank lines and ``%`` / ``//`` comments between facts.

It has two tiers, used in this order on each text:

1. **JSON lines**: when every line is one fact whose arguments are written in the
   spellings JSON shares with the parser (decimal numbers, ``true``/``false``, strings
   without backslashes), one ``findall`` splits the lines and one ``json.loads``
   converts every argument list in C (~2 µs a fact).
2. **One regular expression per fact** (``_FACT``) and a split of its arguments, for
   every other spelling and layout (~7 µs a fact).

Anything else (a rule, a variable, ``/* */`` comments, an out-of-range number, a bad
escape …) is left to the parser: :func:`read_ground_facts` returns ``None`` and the
caller parses the whole text, and :func:`split_fact_lines` leaves that line in the
text. So every error keeps the parser's exact message and ``line:col``.
"""

from __future__ import annotations

import json
import re
from itertools import chain
from math import isfinite

from merklog.store import MAX_RELATION_CHARS, Fact, Link, Value
from merklog.store.gcpause import gc_paused

from .ast import Pos
from .errors import ParseError
from .lexer import (
    INT64_MAX,
    INT64_MIN,
    Source,
    _decode_string,
    float_in_range,
    has_surrogate,
    may_underflow,
)

# Alternatives in the lexer's order (float before int, hex/bin before decimal), so
# the structural match below and ``findall`` split an argument list identically.
_ARG = (
    r'x"[^"\n]*"'
    r'|cid"[^"\n]*"'
    r"|-?(?:[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|0[xX][0-9a-fA-F]+|0[bB][01]+|[0-9]+)"
    r'|"(?:[^"\\\n]|\\.)*"'
    r"|true|false"
)
# Possessive: a comment runs to the end of its line, never giving back what it holds
# (with backtracking, ``% p(1).`` read as a blank ``%`` and then the fact ``p(1)``).
_GAP = r"(?:[ \t\r\n\f]++|%[^\n]*+|//[^\n]*+)*+"
# A relation name as the lexer reads it, up to its length limit: a longer one is left to
# the parser, which names its position.
_NAME = rf"[a-z][A-Za-z0-9_]{{0,{MAX_RELATION_CHARS - 1}}}"
_FACT = re.compile(
    rf"{_GAP}({_NAME})[ \t]*\([ \t]*"
    rf"((?:(?:{_ARG})[ \t]*,[ \t]*)*(?:{_ARG}))?[ \t]*\)[ \t]*\.(?![.a-z])"
)
_END = re.compile(rf"{_GAP}\Z")
_ARGS = re.compile(_ARG)
_NOSRC = Source("")

# Tier 1: one fact per line, nothing else on it; the argument list goes to ``json.loads``.
_LINE_BODY = rf"[ \t]*({_NAME})[ \t]*\((.*)\)[ \t]*\.[ \t]*\r?"
_LINES = re.compile(rf"^{_LINE_BODY}$", re.MULTILINE)
_ONE_LINE = re.compile(_LINE_BODY)
_JSON_VALUE_TYPES = frozenset((int, float, str, bool))
_JSON_UNSAFE = re.compile(r"[\\\[\]{}]")  # JSON reads these otherwise than the parser
_new_fact = tuple.__new__


class _Fallback(Exception):
    """The text leaves the fast subset: the full parser decides."""


# ---------------------------------------------------------------- tier 1: JSON


def _json_args(
    raws: tuple[str, ...] | list[str], int_min: int = INT64_MIN, int_max: int = INT64_MAX
) -> list[list[Value]] | None:
    """Every argument list of ``raws`` converted by one ``json.loads``, or ``None``
    when any token is one JSON refuses (``0x1F``, ``007``, ``x"…"``) or reads
    otherwise than the parser (``NaN``, ``null``, a number out of int64 or of float
    range). The caller has excluded backslashes and brackets."""
    joined = "[[" + "],[".join(raws) + "]]"
    try:
        values = json.loads(joined, strict=False)
    except ValueError:
        return None
    if len(values) != len(raws):
        return None
    flat = list(chain.from_iterable(values))
    kinds = set(map(type, flat))
    if not kinds <= _JSON_VALUE_TYPES:  # null, …
        return None
    if int in kinds:
        ints = [v for v in flat if type(v) is int]
        if min(ints) < int_min or max(ints) > int_max:
            return None
    if float in kinds:
        floats = [v for v in flat if type(v) is float]
        if not all(map(isfinite, floats)):
            return None
        if 0.0 in floats and may_underflow(joined):  # 1e-400 read as 0.0: the
            return None  # parser refuses it, as it refuses 1e999
    return values


# ---------------------------------------------------------------- tier 2: one regex a fact


def _number(tok: str) -> Value:
    if len(tok) > 200:  # out of range (int() refuses 4,300 digits): the parser says so
        raise _Fallback
    neg = tok[0] == "-"
    body = tok[1:] if neg else tok
    head = body[:2]
    if head in ("0x", "0X"):
        value: int | float = int(body[2:], 16)
    elif head in ("0b", "0B"):
        value = int(body[2:], 2)
    elif "." in body or "e" in body or "E" in body:
        in_range = float_in_range(body)
        if in_range is None:  # the parser says so, at its place
            raise _Fallback
        value = in_range
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


def _match_fact(m: re.Match[str]) -> Fact:
    """The fact of one ``_FACT`` match (raises ``_Fallback`` on a value the parser refuses)."""
    rel, raw = m.groups()
    if raw is None:
        return Fact(rel, ())
    if "," not in raw and raw.isdigit():
        if len(raw) > 200:  # see _number
            raise _Fallback
        value = int(raw)
        if value > INT64_MAX:
            raise _Fallback
        return Fact(rel, (value,))
    return Fact(rel, _args(raw))


def _facts_at(text: str, pos: int, end: int) -> list[re.Match[str]] | None:
    """The ``_FACT`` matches that cover ``text[pos:end]`` exactly (comments and blanks
    between them), or ``None`` when something else is there."""
    matches = []
    match = _FACT.match
    while True:
        m = match(text, pos, end)
        if m is None:
            break
        matches.append(m)
        pos = m.end()
    if _END.match(text, pos, end) is None:
        return None
    return matches


# ---------------------------------------------------------------- entry points


def read_fact_lines(text: str) -> tuple[list[Fact], list[str]] | None:
    """The ground facts of ``text`` and the source line of each, when ``text`` is the
    bulk shape: one fact per line, blank lines between, arguments written in the
    common spellings shared with JSON (decimal numbers, ``true``/``false``, strings
    without backslashes); ``None`` otherwise.

    Why: ``merklog put`` through a running node sends each chunk of facts as the
    input's own lines; and this shape is read by tier 1 alone (one ``findall``, one
    ``json.loads``), ~2 µs a fact."""
    with gc_paused():
        return _read_fact_lines(text)


def _read_fact_lines(text: str) -> tuple[list[Fact], list[str]] | None:
    # memchr-fast on a whole text (a regex search over megabytes costs more)
    if "\\" in text or "[" in text or "]" in text or "{" in text or "}" in text:
        return None
    if has_surrogate(text):  # no UTF-8 holds one: the parser names where it is
        return None
    pairs = _LINES.findall(text)
    lines = text.split("\n")
    if len(pairs) != len(lines) - lines.count(""):  # a line that is no lone fact
        return None
    if not pairs:
        return [], []
    rels, raws = zip(*pairs, strict=True)
    values = _json_args(raws)
    if values is None:
        return None
    facts = [_new_fact(Fact, (rel, tuple(args))) for rel, args in zip(rels, values, strict=True)]
    return facts, [line for line in lines if line]


def read_ground_facts(text: str) -> list[Fact] | None:
    """The ground facts of ``text`` as the parser would give them, or ``None`` when
    ``text`` holds anything outside the reader's subset (then use the full parser)."""
    with gc_paused():  # a million new tuples: cyclic GC passes would cost as much again
        bulk = _read_fact_lines(text)
        if bulk is not None:
            return bulk[0]
        if has_surrogate(text):  # the parser names where it is
            return None
        matches = _facts_at(text, 0, len(text))
        if matches is None:
            return None
        try:
            return [_match_fact(m) for m in matches]
        except _Fallback:
            return None


def split_fact_lines(
    text: str, int_min: int = INT64_MIN, int_max: int = INT64_MAX
) -> tuple[list[tuple[Pos, Fact]], str]:
    """The parser's front: the lines of a program that hold only ground facts (one or
    several, with ``%`` / ``//`` comments) and start a clause become facts with the
    ``line:col`` of each; they are blanked out of the returned text, so the parser
    reads the rest with unchanged line numbers. A program with ``/*`` comments is
    returned whole (the comment may span lines).

    Why: inline facts and ``.dl`` fact files would otherwise cost the tokeniser and
    an AST per fact; the parser still sees every line this reader does not take.
    ``int_min``/``int_max``: the dialect's integer literal range (Soufflé: 32 bits); a
    line with a literal outside it is left to the parser, which reports it."""
    if "/*" in text or has_surrogate(text):  # the parser names where a surrogate is
        return [], text
    with gc_paused():
        return _split_fact_lines(text, int_min, int_max)


def _split_fact_lines(text: str, int_min: int, int_max: int) -> tuple[list[tuple[Pos, Fact]], str]:
    lines = text.split("\n")
    found: list[tuple[int, int, Fact]] = []  # (line index, column, fact)
    json_rows: list[tuple[int, int, str]] = []  # tier-1 candidates: (index, column, rel)
    json_raws: list[str] = []
    at_start = True
    one_line = _ONE_LINE.fullmatch
    unsafe = _JSON_UNSAFE.search
    for i, line in enumerate(lines):
        if at_start and "(" in line:
            m = one_line(line)
            if m is not None and ")" not in m.group(2) and unsafe(m.group(2)) is None:
                json_rows.append((i, m.start(1) + 1, m.group(1)))  # ends with ".": at_start
                json_raws.append(m.group(2))
                continue
            if _take_line(lines, i, found, int_min, int_max):
                continue
        stripped = line.strip()
        if not stripped or stripped[0] == "%" or stripped.startswith("//"):
            continue
        at_start = stripped.endswith(".") and not stripped.endswith("...")
    values = _json_args(json_raws, int_min, int_max) if json_raws else []
    if values is None:  # some token JSON does not read as the parser: tier 2 decides
        for i, _, _ in json_rows:
            _take_line(lines, i, found, int_min, int_max)
    else:
        found.extend(
            (i, col, _new_fact(Fact, (rel, tuple(args))))
            for (i, col, rel), args in zip(json_rows, values, strict=True)
        )
        for i, _, _ in json_rows:
            lines[i] = ""
    if not found:
        return [], text
    found.sort(key=lambda f: (f[0], f[1]))
    return [(Pos(i + 1, col), fact) for i, col, fact in found], "\n".join(lines)


def _take_line(
    lines: list[str], i: int, found: list[tuple[int, int, Fact]], int_min: int, int_max: int
) -> bool:
    """Tier 2 on line ``i``: when it holds only ground facts (and comments) with ints in
    ``[int_min, int_max]``, add them to ``found``, blank the line and say so."""
    line = lines[i]
    matches = _facts_at(line, 0, len(line))
    if not matches:
        return False
    try:
        facts = [(i, m.start(1) + 1, _match_fact(m)) for m in matches]
    except _Fallback:
        return False
    if int_min != INT64_MIN or int_max != INT64_MAX:  # a narrower dialect (Soufflé)
        for _, _, fact in facts:
            for v in fact.args:
                if type(v) is int and not int_min <= v <= int_max:
                    return False
    found.extend(facts)
    lines[i] = ""
    return True


__all__ = ["read_fact_lines", "read_ground_facts", "split_fact_lines"]
