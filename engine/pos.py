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

__all__ = ["NOPOS", "Pos"]
