"""Writes in flight on a node, so that closing it waits for them instead of pulling the
store from under them.

A write checks, encodes and signs before it takes the store, and its transaction runs on
whichever thread called it (a ``write_async`` runs on a worker thread). ``Node.close``
used to close the store while such a write was on its way: the write died with a raw
``sqlite3.ProgrammingError`` and was lost, or, on a memory node, completed on a closed
node. Every write now runs inside :meth:`InFlight.enter`, and :meth:`InFlight.close`
refuses new ones and waits for those already in, so a write either completes (durable,
as ``node run`` completes a request in flight at shutdown) or is refused with
``merklog.Error`` before it touches anything.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import NodeInputError

#: What a write started after ``close`` raises (a ``merklog.Error``).
CLOSED = "this node is closed: open it again (merklog.open)"


class InFlight:
    """A count of writes in progress, and whether new ones are still taken."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0
        self._closed = False
        self._depth = threading.local()  # a write's nested steps count once

    @property
    def closed(self) -> bool:
        return self._closed

    @contextmanager
    def enter(self) -> Iterator[None]:
        """Run the body as a write in flight; raise NodeInputError if the node is closed.
        A step nested in a write already in (on the same thread) is part of it: it is
        not refused once closing began, so that write still completes."""
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            with self._cond:
                if self._closed:
                    raise NodeInputError(CLOSED)
                self._count += 1
        self._depth.n = depth + 1
        try:
            yield
        finally:
            self._depth.n = depth
            if depth == 0:
                with self._cond:
                    self._count -= 1
                    if self._count == 0:
                        self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """Take no more writes and wait up to ``timeout`` seconds for those in flight;
        True when none is left. Called from within a write (a callback of the epoch a
        plain ``with`` write runs), it does not wait for that write itself."""
        own = 1 if getattr(self._depth, "n", 0) else 0
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._count <= own, timeout)


__all__ = ["CLOSED", "InFlight"]
