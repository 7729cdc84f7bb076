"""Tokeniser shared by the merklog (Dialog) parser, the Soufflé frontend and the
conformance adapter.

One compiled regular expression scans the text; positions are kept as offsets
and turned into 1-based ``line:col`` only when a token is reported (``Source``),
so lexing 100k inline facts stays cheap.

Token kinds: ``INT FLOAT STRING BYTES CID`` (values already decoded), ``NAME``
(identifier starting with a lowercase letter), ``VAR`` (uppercase initial or
``_x``), ``WILD`` (``_``), ``DIRECTIVE`` (``.decl`` …), ``OP`` (punctuation,
value = its text, with ``:−`` (U+2212) normalised to ``:-``) and ``EOF``, whose value
is the offset just after the last token (where something missing at the end belongs).

Comments: ``// …`` and ``/* … */`` everywhere; ``% …`` too, except that a ``%``
directly after a term (a number, identifier, string or ``)``) is the modulo
operator -- so write ``X % 2`` freely and start ``%`` comments after ``.`` or
``,`` or on their own line.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from merklog.store import MAX_RELATION_CHARS, Link

from .errors import ParseError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: A digit 1-9 before any exponent: the literal is not zero.
_NONZERO_MANTISSA = re.compile(r"^[^eE]*[1-9]")
#: The same as a regex over a text column (pyarrow).
NONZERO_MANTISSA_TEXT = _NONZERO_MANTISSA.pattern
#: Float text that may be read as 0.0 although it is not zero: an exponent of -100 or
#: less, or hundreds of zeros after the point.
_MAY_UNDERFLOW = re.compile(r"[eE]-0*[1-9][0-9]{2,}|\.0{200,}")
_MAY_UNDERFLOW_BYTES = re.compile(_MAY_UNDERFLOW.pattern.encode())
_ZEROS = "." + "0" * 200


def may_underflow(text: str | bytes) -> bool:
    """Whether ``text`` may hold a float literal that reads as 0.0 although it is not
    zero (``1e-400``): readers that convert many floats at once (``json.loads``) check
    their input with this, and only then read its floats one by one. Substring tests
    first (C speed): the regex alone cost 0.1 s on a 5 MB input."""
    if isinstance(text, bytes):
        if b"e-" in text or b"E-" in text or _ZEROS.encode() in text:
            return _MAY_UNDERFLOW_BYTES.search(text) is not None
        return False
    if "e-" in text or "E-" in text or _ZEROS in text:
        return _MAY_UNDERFLOW.search(text) is not None
    return False


def float_in_range(text: str) -> float | None:
    """The float literal ``text`` as a float, or None when it is out of range: too large
    (``1e999``, infinite) or so small that it rounds to zero although it is not zero
    (``1e-400``). Either would store another value than the one written; the
    smallest subnormal, ``5e-324``, is in range."""
    value = float(text)
    if value in (float("inf"), float("-inf")) or value != value:
        return None
    if value == 0.0 and _NONZERO_MANTISSA.match(text.strip()):
        return None
    return value


_TOKEN = re.compile(
    r"""
    (?:[ \t\r\n\f\ufeff]+|//[^\n]*|/\*(?:[^*]|\*(?!/))*\*/)*
    (?:
    (?P<op>\.\.\.|:-|:\u2212|:=|==|!=|<=|>=|[-+*%<>=!(),:;@{}\[\]$|&^~]|/(?![/*])|\.(?![a-z]))
  | (?P<end>\Z)
  | (?P<unterminated>/\*)
  | (?P<bytes>x"[^"\n]*")
  | (?P<cid>cid"[^"\n]*")
  | (?P<float>[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)
  | (?P<int>0[xX][0-9a-fA-F]+|0[bB][01]+|[0-9]+)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<badstring>")
  | (?P<directive>(?<![^\s\ufeff])\.[a-z][a-z_]*)
  | (?P<name>[a-z][A-Za-z0-9_]*)
  | (?P<var>[A-Z][A-Za-z0-9_]*|_[A-Za-z0-9_]+)
  | (?P<wild>_)
  | (?P<dot>\.)
    )
    """,
    re.VERBOSE,
)

_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "0": "\0",
    "\\": "\\",
    '"': '"',
    "'": "'",
}
#: Longer integer literals are out of every dialect's range whatever their digits (int64
#: takes 20 characters in decimal, 66 in binary with its ``0b``, leading zeros aside).
_INT_LITERAL_MAX_CHARS = 200

_ESCAPE_RE = re.compile(r"\\(u\{[0-9a-fA-F]{1,6}\}|u[0-9a-fA-F]{4}|.)")
#: A lone surrogate: text decoded from JSON (``"\\ud800"``) may hold one, but no UTF-8
#: (so no DAG-CBOR block, no stored program) does.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: What a lone surrogate is told, as the typed JSON form tells it (``check_value``).
_SURROGATE_WHY = "a lone surrogate (strings must be valid Unicode)"
_SURROGATE_HINT = "a character beyond U+FFFF is one code point: write it, or \\u{1F600}"

# Kinds after which a ``%`` is the modulo operator, not a comment.
_TERM_END = frozenset({"INT", "FLOAT", "STRING", "VAR", "NAME", "WILD", "BYTES", "CID"})


@dataclass(slots=True)
class Token:
    kind: str
    value: object
    offset: int


class Source:
    """The program text plus a line index, to turn offsets into ``(line, col)``."""

    __slots__ = ("text", "_starts")

    def __init__(self, text: str) -> None:
        self.text = text
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def linecol(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._starts, offset)
        return line, offset - self._starts[line - 1] + 1

    def error(self, offset: int, message: str, hint: str | None = None) -> ParseError:
        line, col = self.linecol(offset)
        return ParseError(message, line, col, hint)


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (which the lexer refuses where it is).
    UTF-8 encodes every other code point, and CPython's encoder is ~6x faster than a
    search for the surrogate range (40 against 260 ms over 32 MB of non-ASCII facts)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _decode_string(src: Source, raw: str, offset: int) -> str:
    body = raw[1:-1]
    if not body.isascii() and (bad := _SURROGATE.search(body)):
        raise src.error(
            offset + 1 + bad.start(),
            f"string holds {bad.group()!r}, {_SURROGATE_WHY}",
            _SURROGATE_HINT,
        )
    if "\\" not in body:
        return body

    def repl(m: re.Match[str]) -> str:
        esc = m.group(1)
        if esc == "u":  # neither \u{1-6 hex digits} nor \u and 4 hex digits
            raise src.error(
                offset + 1 + m.start(),
                "malformed unicode escape \\u in string",
                "write \\u{hex} with 1 to 6 hex digits, or \\u and exactly 4",
            )
        if esc.startswith("u"):
            code = int(esc[2:-1] if esc.startswith("u{") else esc[1:], 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise src.error(offset + 1 + m.start(), f"invalid unicode escape \\{esc}")
            return chr(code)
        if esc in _ESCAPES:
            return _ESCAPES[esc]
        raise src.error(
            offset + 1 + m.start(),
            f"unknown escape \\{esc} in string",
            'use \\n \\t \\r \\0 \\\\ \\" or \\u{hex}',
        )

    return _ESCAPE_RE.sub(repl, body)


def tokenize(text: str, src: Source | None = None) -> list[Token]:
    """Split ``text`` into tokens (ending with an ``EOF`` token); raises ParseError."""
    src = src or Source(text)
    out: list[Token] = []
    append = out.append
    match = _TOKEN.match
    pos = 0
    n = len(text)
    last = ""
    while pos < n:
        m = match(text, pos)
        if m is None:
            while text[pos] in " \t\r\n\f":
                pos += 1
            raise src.error(pos, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        pos = m.end()
        if kind == "op" or kind == "dot":
            value = m.group(kind)
            start = m.start(kind)
            if value == "%" and last not in _TERM_END and last != ")":
                nl = text.find("\n", start)
                pos = n if nl < 0 else nl
                continue
            if value == ":\u2212":
                value = ":-"
            append(Token("OP", value, start))
            last = value
            continue
        if kind == "end":
            break
        value = m.group(kind)
        start = m.start(kind)
        if kind == "name":
            if len(value) > MAX_RELATION_CHARS:  # no fact of it could be written
                raise src.error(
                    start,
                    f"a name of {len(value)} characters, over the {MAX_RELATION_CHARS}-character"
                    " limit (MAX_RELATION_CHARS)",
                )
            append(Token("NAME", value, start))
            last = "NAME"
            continue
        if kind == "var":
            append(Token("VAR", value, start))
            last = "VAR"
            continue
        if kind == "int":
            if len(value) > _INT_LITERAL_MAX_CHARS:  # int() refuses 4,300 digits and more
                raise src.error(
                    start,
                    f"integer literal of {len(value)} characters is out of range",
                    "integers are 64-bit (32-bit in the Soufflé dialect)",
                )
            if value[:2] in ("0x", "0X"):
                number = int(value[2:], 16)
            elif value[:2] in ("0b", "0B"):
                number = int(value[2:], 2)
            else:
                number = int(value)
            # Range is checked by the parser, after a possible unary minus.
            append(Token("INT", number, start))
            last = "INT"
            continue
        if kind == "string":
            append(Token("STRING", _decode_string(src, value, start), start))
            last = "STRING"
            continue
        if kind == "float":
            number = float_in_range(value)
            if number is None:
                shown = value if len(value) <= 40 else f"{value[:36]}… ({len(value)} characters)"
                raise src.error(
                    start,
                    f"float literal {shown} is out of range (a 64-bit double cannot hold it"
                    " as written)",
                )
            append(Token("FLOAT", number, start))
        elif kind == "wild":
            append(Token("WILD", "_", start))
        elif kind == "bytes":
            try:
                data = bytes.fromhex(value[2:-1])
            except ValueError:
                raise src.error(
                    start,
                    f"invalid bytes literal {value}",
                    'write an even number of hex digits: x"00ff"',
                ) from None
            append(Token("BYTES", data, start))
        elif kind == "cid":
            try:
                link = Link.parse(value[4:-1])
            except Exception as exc:  # noqa: BLE001 - any decoding failure is a bad literal
                raise src.error(
                    start, f"invalid CID literal {value}: {exc}", 'write cid"bafy…" (CIDv1, base32)'
                ) from None
            append(Token("CID", link, start))
        elif kind == "directive":
            append(Token("DIRECTIVE", value, start))
        elif kind == "badstring":
            raise src.error(start, "unterminated string literal", 'close the string with "')
        elif kind == "unterminated":
            raise src.error(start, "unterminated /* comment", "close the comment with */")
        last = kind.upper()
    if not text.isascii() and (bad := _SURROGATE.search(text)):  # in a comment
        raise src.error(
            bad.start(), f"text holds {bad.group()!r}, {_SURROGATE_WHY}", _SURROGATE_HINT
        )
    # The end of the last token: a parse error "found end of input" points there (right
    # after `!s(X)` that lacks its `.`), not at the start of the line after the text.
    last_end = 0
    if out:
        final = out[-1]
        last_end = _TOKEN.match(text, final.offset).end() if final.offset < n else n
    append(Token("EOF", last_end, n))
    return out
