"""merklog: a CRDT replica node with content-addressed storage and incremental Datalog.

The API for apps (see docs/python-api.md)::

    import merklog

    async with merklog.open(memory=True) as node:
        node.load_program("path(X, Y) :- edge(X, Y).")
        node.assert_("edge", 1, 2)
        await node.settled()
        print(node.query("path(1, Y)").rows)

``merklog.open`` returns a :class:`merklog.node.node.Node`; ``merklog.Error`` is the
root of every error merklog raises on purpose.

This module is the package root (installed from ``node/public/``). It imports
nothing of merklog eagerly, so ``import merklog.store`` or ``import merklog.engine``
never loads the node: the names below resolve on first use (PEP 562).

As a library, merklog prints nothing on its own: the ``merklog`` logger has a
``NullHandler``, so an app that configured no logging does not get merklog's warnings
and tracebacks on stderr through Python's last-resort handler (an app that wants them
configures logging, e.g. ``logging.basicConfig()``). The ``merklog`` CLI and
``merklog node run`` configure their own handler (:mod:`merklog.node.logs`).
"""

from __future__ import annotations

import logging
from typing import Any

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["Error", "Fact", "Link", "Node", "open", "serve"]


def __getattr__(name: str) -> Any:
    if name == "open":
        from merklog.node.api import open as open_

        return open_
    if name == "serve":
        from merklog.node.api import serve

        return serve
    if name == "Node":
        from merklog.node.node import Node

        return Node
    if name in ("Error", "Fact", "Link"):
        import merklog.store as store

        return getattr(store, name)
    raise AttributeError(f"module 'merklog' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
