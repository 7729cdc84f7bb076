"""The CLI's path and name parameters: a ``click.Path`` and a text that refuse an empty
value.

``Path("")`` is ``Path(".")``: given ``--out ''`` (an unset shell variable, say),
``eval`` wrote its results into the current directory and ``parquet export ''``
exported into it. Every path a command takes is a :class:`GivenPath`, so an empty one
is a usage error (exit 2) naming the parameter, as ``--home ''`` is. A peer given by
name or URL is a :class:`GivenText`: ``fsck --repair-from ''`` looked the empty name up
and said "unknown peer ''" (exit 3, not found) for what is a bad argument.
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


class GivenText(click.types.StringParamType):
    """A text parameter whose value must not be empty (or only blanks); ``what`` says
    what to give instead ("name a peer …")."""

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"is empty: {self.what}", param, ctx)
        return super().convert(value, param, ctx)


#: What a peer parameter (a name in ``[peers]`` or a URL) asks for when it is empty.
PEER = GivenText("name a peer of [peers] or give http://HOST:PORT")

__all__ = ["PEER", "GivenPath", "GivenText"]
