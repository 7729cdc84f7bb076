"""``merklog.open``: the one entry point an app needs (re-exported at the package root)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import default_home
from .node import Node

__all__ = ["open"]


def open(  # noqa: A001 - the public name is merklog.open
    home: str | Path | None = None,
    *,
    memory: bool = False,
    settings: Mapping[str, Any] | None = None,
) -> Node:
    """Open a node: its home directory (created with keys, config and dataset on first use)
    or, with ``memory=True``, a throwaway in-memory node that touches no file.

    ``home=None`` means ``$MERKLOG_HOME``, else ``~/.merklog`` (ignored for memory nodes);
    an empty ``home`` raises ``merklog.Error`` (it would make the current directory a home).
    ``settings`` overrides config options by dotted name, e.g. ``{"sync.interval": 5.0}``
    (the same keys as ``merklog --set``); a bad one raises ``merklog.Error``.

    Use it as ``with merklog.open(...) as node:`` (synchronous: writes, queries, one
    epoch per write) or ``async with merklog.open(...) as node:``, which also runs the
    epoch loop, ``@async`` delivery and automatic sync until the block ends.
    """
    overrides = dict(settings or {})
    if memory:
        return Node.memory(overrides)
    where = home if home is not None else default_home()  # Node.open refuses "" (not cwd)
    return Node.open(where, **{k.replace(".", "__"): v for k, v in overrides.items()})
