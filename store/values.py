"""The value types of docs/storage.md and their validation.

-0.0 is normalised to 0.0: the two compare equal in Python and in Datalog, so
they must share one encoding and one CID.

A merklog value is one of: ``int`` (64-bit signed), ``float`` (finite f64),
``str``, ``bytes``, ``bool`` or :class:`~merklog.store.link.Link`. Anything else
is rejected with :class:`~merklog.store.errors.InvalidValue` naming the problem,
so bad input never reaches the encoder or the store.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence

from .errors import InvalidValue
from .link import Link

Value = int | float | str | bytes | bool | Link

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def check_value(value: object, where: str = "value") -> Value:
    """Return ``value`` unchanged if it is a valid merklog value, else raise InvalidValue."""
    kind = type(value)
    if kind is bool or kind is bytes or kind is Link:
        return value  # type: ignore[return-value]
    if kind is str:
        if not value.isascii():  # type: ignore[union-attr]
            try:
                value.encode("utf-8")  # type: ignore[union-attr]
            except UnicodeEncodeError as exc:
                # DAG-CBOR text is UTF-8: a lone surrogate has no encoding, so no CID.
                raise InvalidValue(
                    f"{where}: string holds {value[exc.start]!r} at {exc.start}, "  # type: ignore[index]
                    "a lone surrogate (strings must be valid Unicode)"
                ) from None
        return value  # type: ignore[return-value]
    if kind is int:
        if INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
            return value  # type: ignore[return-value]
        raise InvalidValue(f"{where}: integer {value} does not fit in 64 signed bits")
    if kind is float:
        if math.isfinite(value):  # type: ignore[arg-type]
            # -0.0 == 0.0 in Python (same set member) but not in CBOR: one value, one CID.
            return value if value != 0.0 else 0.0  # type: ignore[return-value]
        raise InvalidValue(
            f"{where}: float {value} is not finite (NaN and infinities are not values)"
        )
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidValue(
        f"{where}: {type_name(kind)} is not a merklog value "
        "(expected int64, finite float, str, bytes, bool or CID link)"
    )


def type_name(kind: type) -> str:
    """``int``, ``str`` for builtins; ``numpy.bool`` (not a bare ``bool``) for others: what
    an error names a value's type by (a bare ``bool`` for numpy's contradicted itself)."""
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def check_relation(name: object) -> str:
    """Relation names are non-empty strings starting with a letter: identifiers in Datalog."""
    if not isinstance(name, str) or not name:
        raise InvalidValue(f"relation name must be a non-empty string, got {name!r}")
    if not (name[0].isalpha() and all(c.isalnum() or c == "_" for c in name)):
        raise InvalidValue(
            f"relation name {name[:40]!r} must start with a letter, then letters, digits or _"
            f" ({_offender(name, str.isalpha, lambda c: c.isalnum() or c == '_')})"
        )
    return name


def _offender(name: str, first: Callable[[str], bool], rest: Callable[[str], bool]) -> str:
    """Which character of ``name`` breaks the rule ``first`` (its first character) and
    ``rest`` (the others) state, for a message: ``' ' at position 2 is none of them``. A
    rule alone read as wrong for ``"a b"``, which starts with a letter."""
    if not name:
        return "it is empty"
    if not first(name[0]):
        return f"it starts with {name[0]!r}"
    at = next(i for i, c in enumerate(name) if i and not rest(c))
    return f"{name[at]!r} at position {at + 1} is none of them"


#: A relation name Datalog text can write (the lexer's name token): a lowercase ASCII
#: letter, then ASCII letters, digits and ``_``; at most :data:`MAX_RELATION_CHARS`.
_WRITABLE_RELATION = re.compile(r"[a-z][A-Za-z0-9_]*")
_LOWER_ASCII = frozenset("abcdefghijklmnopqrstuvwxyz")
_NAME_ASCII = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") | _LOWER_ASCII
#: The longest relation name a new fact may have.
MAX_RELATION_CHARS = 256


def check_writable_relation(name: str) -> str:
    """A relation name a new fact may have: one the language can name, so that every
    fact written can be queried and retracted in Datalog text. Stricter than
    :func:`check_relation`, which decoding keeps, so that facts an earlier version let
    through (``Up``, ``é``) stay readable and keep syncing."""
    if _WRITABLE_RELATION.fullmatch(name) is None:
        raise InvalidValue(
            f"relation name {name[:40]!r} cannot be written in Datalog: it must start with a"
            " lowercase ASCII letter, then ASCII letters, digits or _"
            f" ({_offender(name, _LOWER_ASCII.__contains__, _NAME_ASCII.__contains__)})"
        )
    if len(name) > MAX_RELATION_CHARS:
        raise InvalidValue(
            f"relation name {name[:40]}… has {len(name)} characters, over the"
            f" {MAX_RELATION_CHARS}-character limit (MAX_RELATION_CHARS)"
        )
    return name


def check_args(args: object, where: str = "fact") -> tuple[Value, ...]:
    """Validate a fact's argument list (tuple or list of values)."""
    if not isinstance(args, tuple | list):
        raise InvalidValue(f"{where}: arguments must be a tuple or list, got {type(args).__name__}")
    return tuple(check_value(v, f"{where} argument {i}") for i, v in enumerate(args))


def format_value(value: Value) -> str:
    """Render a value in Datalog literal syntax (the inverse of the engine's constant parser)."""
    kind = type(value)
    if kind is int:  # the common kinds first, by exact type: ``put`` renders every value
        return int.__repr__(value)  # type: ignore[arg-type]
    if kind is str:
        # ASCII and printable: no control character, so nothing to escape but the quote
        # and the backslash. Other text takes the escaping path: some characters that
        # Python calls printable show as nothing (variation selectors, Hangul fillers).
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:  # type: ignore[union-attr]
            return '"' + value + '"'  # type: ignore[operator]
        return _quote(value)  # type: ignore[arg-type]
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, bytes):
        return 'x"' + value.hex() + '"'
    if isinstance(value, Link):
        return f'cid"{value}"'
    if isinstance(value, float):
        text = repr(value + 0.0)  # -0.0 is stored as 0.0: one value, one rendering
        return text if ("." in text or "e" in text or "inf" in text) else text + ".0"
    return str(value)


#: Argument lists as JSON, the way :func:`args_texts` reads them.
_JSON_ARGS = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, check_circular=False, separators=(", ", ": ")
)


def args_texts(arg_lists: Sequence[Sequence[Value]]) -> list[str] | None:
    """``", ".join(map(format_value, args))`` for each of ``arg_lists``, rendered in one C
    call; or None when some value is one this does not render (bytes, a link, a string
    holding a quote, a backslash, a control character or a bracket): then render them
    with :func:`format_value`.

    The lists are written as one JSON array (``put`` prints every fact it writes: one
    call instead of a Python call per value, ~0.45 against ~1.7 µs a fact). JSON
    writes an int as ``int.__repr__``, a finite float as ``float.__repr__`` (which always
    holds a ``.`` or an ``e``, so :func:`format_value` adds nothing), booleans as
    ``true``/``false``, and a string as itself in double quotes unless it holds a quote,
    a backslash or a control character, which JSON escapes with a backslash. So when
    the JSON text holds no backslash, each value reads exactly as :func:`format_value`
    renders it; and when it holds no more ``[`` and ``]`` than the lists' own, no string
    holds one, so it splits into the lists exactly at ``"], ["`` (ADR 0153)."""
    if not arg_lists:
        return []
    try:
        text = _JSON_ARGS.encode(arg_lists)
    except (TypeError, ValueError):  # bytes, a Link, a non-finite float
        return None
    brackets = len(arg_lists) + 1
    if "\\" in text or text.count("[") != brackets or text.count("]") != brackets:
        return None
    # The characters JSON leaves unescaped that a rendering must escape (isascii is a
    # flag of the string, not a scan).
    if "\x7f" in text or (not text.isascii() and _RAW_IN_JSON.search(text) is not None):
        return None
    if "-0.0" in text and _NEGATIVE_ZERO.search(text) is not None:  # format_value: 0.0
        return None
    return text[2:-2].split("], [")


#: Unicode's format characters (category Cf of Unicode 15; checked against
#: ``unicodedata`` by the tests): zero-width spaces and joiners, bidirectional controls,
#: the byte-order mark, the soft hyphen… A terminal shows none of them, so ``"ab"`` and
#: ``"a\u200bb"``, two values with two CIDs, would print alike.
_FORMAT_CHARS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
)
#: Characters outside category Cf that a terminal shows as nothing or as blank space, so
#: that ``"ab"`` and ``"a\u034fb"``, or ``"a b"`` and ``"a\u00a0b"``, would print alike:
#: Unicode's other default-ignorable code points (the combining grapheme joiner, the
#: Hangul fillers, the Khmer inherent vowels, the Mongolian and the other variation
#: selectors, and the unassigned ones: Unicode 15's DerivedCoreProperties.txt), every
#: space but the ASCII one (category Zs: no-break, en, em, ideographic…), the braille
#: blank, and the noncharacters (U+FDD0-FDEF and the last two code points of each plane).
_BLANK_CHARS = (
    "\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180d\u180f\u2065\u3164\ufe00-\ufe0f\uffa0"
    "\ufff0-\ufff8\U000e0000-\U000e0fff"
    "\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\u2800\ufdd0-\ufdef\ufffe\uffff"
    + "".join(
        f"{chr(plane + 0xFFFE)}-{chr(plane + 0xFFFF)}"
        for plane in range(0x10000, 0x110000, 0x10000)
    )
)
#: What a string literal must escape: the quote, the backslash, and every character a
#: reader of the output would take apart or not see — the C0 and C1 controls and DEL
#: (tab, carriage return, NUL, escape…), the Unicode line and paragraph separators, the
#: format characters and the blank ones — so that a rendered fact is one line of text
#: that reads back as the same value, and two values never look alike.
#: (``_ESCAPED_CLASS``: all but the quote and the backslash.)
_ESCAPED_CLASS = "\x00-\x1f\x7f-\x9f\u2028\u2029" + _FORMAT_CHARS + _BLANK_CHARS
_NEEDS_ESCAPE = re.compile('["\\\\' + _ESCAPED_CLASS + "]")


def escaped_code_points() -> list[tuple[int, int]]:
    """The code point ranges (inclusive) that :func:`format_value` writes escaped in a
    string besides the quote and the backslash (controls, line separators, format and
    blank characters): for a writer that renders strings outside Python (a Spark job's regular
    expression), so that it escapes exactly the same characters."""
    out: list[tuple[int, int]] = []
    chars, i = _ESCAPED_CLASS, 0
    while i < len(chars):
        lo = hi = ord(chars[i])
        if i + 2 < len(chars) and chars[i + 1] == "-":
            hi = ord(chars[i + 2])
            i += 3
        else:
            i += 1
        out.append((lo, hi))
    return out


#: JSON's spelling of the float -0.0 (``float.__repr__``), which :func:`format_value`
#: renders as the ``0.0`` it is stored as; a string holding it only costs the slower path.
_NEGATIVE_ZERO = re.compile(r"-0\.0(?![0-9])")
#: The characters of :data:`_NEEDS_ESCAPE` that JSON writes unescaped.
_RAW_IN_JSON = re.compile("[\x7f-\x9f\u2028\u2029" + _FORMAT_CHARS + _BLANK_CHARS + "]")
_NAMED = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    return named if named is not None else f"\\u{{{ord(char):x}}}"


def _quote(text: str) -> str:
    """``text`` as a string literal the lexer reads back as ``text``."""
    return '"' + _NEEDS_ESCAPE.sub(_escape, text) + '"'
