"""Source positions (``line:col``), shared by the AST and the engine's errors.

Its own module so that :mod:`merklog.engine.errors` needs nothing else of the engine:
every engine module, down to :mod:`merklog.engine.values`, can raise an
:class:`~merklog.engine.errors.EngineError` without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pos:
    """A 1-based source position."""

    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.line}:{self.col}"


NOPOS = Pos(0, 0)


def pos_at(text: str | bytes, at: int) -> Pos:
    """The position of index ``at`` of ``text``, its column counted in characters as the
    lexer counts them. For bytes, ``text[:at]`` must be UTF-8 (``at`` is where a
    decode failed): a column counted in bytes put a message about the first bad byte
    of ``"é" \xff`` one column further right than the lexer's columns of the same line."""
    if isinstance(text, bytes):
        start = text.rfind(b"\n", 0, at) + 1
        line = text.count(b"\n", 0, at) + 1
        return Pos(line, len(text[start:at].decode("utf-8")) + 1)
    start = text.rfind("\n", 0, at) + 1
    return Pos(text.count("\n", 0, at) + 1, at - start + 1)


__all__ = ["NOPOS", "Pos", "pos_at"]
