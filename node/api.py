"""``merklog.open``: the one entry point an app needs (re-exported at the package root)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from merklog.store.errors import Error

from .config import Config, ConfigError, default_home
from .errors import NodeInputError
from .failures import Failure, classify
from .node import Node

__all__ = ["open", "serve"]


def open(  # noqa: A001 - the public name is merklog.open
    home: str | Path | None = None,
    *,
    memory: bool = False,
    settings: Mapping[str, Any] | None = None,
) -> Node:
    """Open a node: its home directory (created with keys, config and dataset on first use)
    or, with ``memory=True``, a throwaway in-memory node that touches no file.

    ``home=None`` means ``$MERKLOG_HOME``, else ``~/.merklog``; a memory node has no home
    (a ``home`` with ``memory=True`` raises ``merklog.Error``), and an empty ``home``
    raises it too (it would make the current directory a home). ``settings`` is a mapping
    that overrides config options by dotted name, e.g. ``{"sync.interval": 5.0}`` (the
    same keys as ``merklog --set``); a bad one raises ``merklog.Error`` (``ConfigError``).

    Use it as ``with merklog.open(...) as node:`` (synchronous: writes, queries, one
    epoch per write) or ``async with merklog.open(...) as node:``, which also runs the
    epoch loop, ``@async`` delivery and automatic sync until the block ends.
    """
    if not isinstance(memory, bool):  # memory="no" opened a memory node (QA)
        raise NodeInputError(f"memory: expected True or False, got {memory!r}")
    overrides, config = _settings(settings)
    if memory:
        if home is not None:
            raise NodeInputError(
                "a memory node has no home: pass a home or memory=True, not both"
                f" (home={str(home)!r})"
            )
        _refuse_store_settings(overrides)
        return Node.memory(overrides)
    if config.get("store.backend") == "memory":
        where = (
            "settings: store.backend"
            if "store.backend" in overrides
            else "MERKLOG_STORE_BACKEND=memory: store.backend"
        )
        raise ConfigError(
            f"{where} is memory, which keeps nothing of a home: each open would start a new,"
            " empty dataset; use merklog.open(memory=True) for a throwaway node, or leave"
            " store.backend unset (sqlite) for a home"
        )
    where = home if home is not None else default_home()  # Node.open refuses "" (not cwd)
    try:
        return Node.open(where, **{k.replace(".", "__"): v for k, v in overrides.items()})
    except (OSError, sqlite3.Error) as exc:
        if isinstance(exc, Error):
            raise
        # A read-only file system raised a bare OSError here where the CLI says what to
        # do (QA): the same words, as a merklog.Error.
        _code, message = classify(exc, Path(where))
        raise Failure(message) from exc


#: Settings of the store a memory node has none of: it keeps its blocks in memory and
#: makes a fresh dataset, so these were silently ignored (a memory node given a dataset's
#: ``dataset.id`` replicated another dataset, which its first sync was refused).
_NOT_FOR_MEMORY = ("dataset.id", "store.path", "store.backend")


def _refuse_store_settings(overrides: Mapping[str, Any]) -> None:
    """ConfigError for a setting of ``_NOT_FOR_MEMORY`` given to a memory node
    (``store.backend`` may say ``memory``, which it is)."""
    for key in _NOT_FOR_MEMORY:
        value = overrides.get(key)
        if value is None or (key == "store.backend" and value == "memory"):
            continue
        raise ConfigError(
            f"settings: {key}={value!r} is not for a memory node, which keeps its blocks in"
            " memory and makes a fresh dataset; open a home (merklog.open(home)) for a"
            " store on disk or another dataset"
        )


def _settings(settings: Any) -> tuple[dict[str, Any], Config]:
    """``settings`` as a dict of checked options (``ConfigError`` naming "settings" for a
    bad one, before anything is created), with the configuration they make without a
    home file (environment included): a mapping of dotted option names to values. A
    non-string key raised a raw AttributeError, and a list of pairs was taken as no
    settings at all."""
    if settings is None:
        return {}, Config.load(None)
    if not isinstance(settings, Mapping):
        raise ConfigError(
            "settings: expected a mapping of option names to values, such as"
            f' {{"sync.interval": 5.0}}, got {type(settings).__name__}'
        )
    for key in settings:
        if not isinstance(key, str):
            raise ConfigError(
                f"settings: an option name is a dotted string such as 'sync.interval', got {key!r}"
            )
    overrides = dict(settings)
    return overrides, Config.load(None, overrides, overrides_from="settings")


@asynccontextmanager
async def serve(node: Node, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``node``'s HTTP API, the one ``merklog node run`` serves, for the ``async
    with`` block: peers sync with it (``merklog sync URL``, ``init --join URL``), browser
    apps and scripts use ``/v1`` with the home's tokens, and ``merklog`` commands on the
    home go through it instead of waiting for the home's lock. Yields the URL it listens
    on (``port=0``: any free port); when the block ends it stops listening, answers the
    writes in flight and closes every connection (the node keeps running)::

        async with merklog.open(home) as node, merklog.serve(node) as url:
            ...

    The node must be running (inside ``async with merklog.open(...)``), so that the
    epochs answer the writes it receives, and have a home: a memory node has no tokens
    to serve with. ``merklog.Error`` otherwise, or when the address cannot be bound."""
    from .server import start_serving

    if not isinstance(node, Node):  # serve(5) raised a bare AttributeError
        raise NodeInputError(
            f"serve: expected a node from merklog.open(...), got {type(node).__name__}"
        )
    node._require_open()  # a closed node was told to run in `async with`
    if node.served_url is not None:
        # A second serve's end deleted the home's run file while the first still served:
        # commands on the home then waited 15 s for its lock and failed (QA).
        raise NodeInputError(
            f"this node is served already, at {node.served_url}: one serve per node (its"
            " home's run file names one URL); use that URL"
        )
    if node.home is None:
        raise NodeInputError(
            "a memory node cannot serve: it has no home, so no tokens to authenticate"
            " with; open a home (merklog.open(home)) to serve it"
        )
    if not node.tasks.running:
        raise NodeInputError(
            "serve a running node: use it inside `async with merklog.open(...) as node:`"
            " (a node opened with `with` or no block runs no epoch loop to answer writes)"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        # -1 and 70000 raised a bare OverflowError from bind()
        raise ConfigError(f"cannot serve on port {port!r}: a port is an integer from 0 to 65535")
    try:
        serving = await start_serving(node, host, port, manage_node=False)
    except OSError as exc:
        raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    node.served_url = serving.url
    try:
        yield serving.url
    finally:
        node.served_url = None
        await serving.close()
