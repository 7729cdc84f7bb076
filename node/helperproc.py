"""A generator run in a forked helper process, its items received here in order
(``put -f`` on a stopped home reads, checks, encodes and renders its later chunks in
one, ADR 0147).

Why a process: a bulk put's writes and its preparation are both mostly Python, so in
one process they take turns on one interpreter lock, and on a loaded machine the
writes wait for it. A forked child has its own interpreter lock and already holds
everything the work needs (the input's text, the loaded program's declarations), so
nothing but the results is copied: each item is pickled through a pipe.

Only where that is safe: ``os.fork`` on Linux, and only while this process runs one
thread (a lock another thread holds at the fork stays held in the child for good).
``MERKLOG_PUT_HELPER=0`` turns it off. The child never touches what it inherited
besides computing (no store, no output) and ends with ``os._exit``: no ``atexit``
handler, finaliser or buffered output of this process runs twice. It ignores SIGINT:
Ctrl-C is this process's to handle, and :meth:`Helper.close` ends the child.

An exception the generator raises is raised here where the item would have been, with
its own type and message when it pickles, else as a :class:`HelperError` carrying its
message.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any

from .errors import NodeError

#: Each message: its length (8 bytes, little-endian), then ``pickle((kind, payload))``.
_LENGTH = struct.Struct("<Q")
_ITEM, _RAISED, _END = 0, 1, 2
#: The pipe's buffer on each side (one item is a chunk's columns and text: megabytes).
_BUFFER = 1 << 20


class HelperError(NodeError):
    """The helper process failed: an error that did not pickle (its message kept), or
    the process ended without a word (killed, out of memory)."""


def available() -> bool:
    """Whether :class:`Helper` may fork now (see the module docstring)."""
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "fork")
        and os.environ.get("MERKLOG_PUT_HELPER", "1") != "0"
        and threading.active_count() == 1
    )


class Helper:
    """``produce()`` running in a forked child; iterate to receive its items in order.
    Use as a context manager (or call :meth:`close`): the child is ended and reaped
    whether or not every item was taken."""

    def __init__(self, produce: Callable[[], Iterator[Any]]) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read)
            _serve(produce, write)
        os.close(write)
        self.pid = pid
        self._pipe = os.fdopen(read, "rb", buffering=_BUFFER)
        self._done = False

    def __iter__(self) -> Iterator[Any]:
        while not self._done:
            kind, payload = self._receive()
            if kind == _ITEM:
                yield payload
                continue
            self._done = True
            if kind == _RAISED:
                raise payload

    def _receive(self) -> tuple[int, Any]:
        head = self._pipe.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            self._done = True
            raise HelperError("the put's helper process ended without finishing")
        (size,) = _LENGTH.unpack(head)
        return pickle.loads(self._pipe.read(size))

    def close(self) -> None:
        """End the child (if it still runs) and reap it; idempotent."""
        if self._pipe.closed:
            return
        self._done = True
        with suppress(ProcessLookupError):  # it ended by itself: only reaped here
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self._pipe.close()

    def __enter__(self) -> Helper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(produce: Callable[[], Iterator[Any]], fd: int) -> None:
    """The child's whole life: send ``produce()``'s items, then its end or its error."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with os.fdopen(fd, "wb", buffering=_BUFFER) as out:
            try:
                for item in produce():
                    _send(out, _ITEM, item)
            except BaseException as exc:  # noqa: BLE001 - every error goes to the parent
                _send(out, _RAISED, _portable(exc))
            else:
                _send(out, _END, None)
    except BaseException:  # noqa: BLE001 - the parent is gone (broken pipe): just end
        code = 1
    finally:
        os._exit(code)


def _send(out: Any, kind: int, payload: Any) -> None:
    data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LENGTH.pack(len(data)))
    out.write(data)
    out.flush()  # the reader waits for this item now, not when the next one is ready


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip, else a HelperError with its message."""
    try:
        back = pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - an exception type that does not pickle
        return HelperError(str(exc))
    return back if type(back) is type(exc) and str(back) == str(exc) else HelperError(str(exc))


__all__ = ["Helper", "HelperError", "available"]
