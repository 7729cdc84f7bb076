"""The CLI's path parameters: a ``click.Path`` that refuses an empty name.

``Path("")`` is ``Path(".")``: given ``--out ''`` (an unset shell variable, say),
``eval`` wrote its results into the current directory and ``parquet export ''``
exported into it. Every path a command takes is a :class:`GivenPath`, so an empty one
is a usage error (exit 2) naming the parameter, as ``--home ''`` is.
"""

from __future__ import annotations

from typing import Any

import click


class GivenPath(click.Path):
    """``click.Path`` whose value must not be empty (or only blanks)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("is empty: name a file or directory", param, ctx)
        return super().convert(value, param, ctx)


__all__ = ["GivenPath"]
