"""Work done in a forked helper process, with its own interpreter lock:

- :class:`Helper` runs a generator there and yields its items here in order (``put -f``
  on a stopped home reads, checks and encodes its later chunks in one, ADR 0147);
- :class:`Worker` serves one function there, call by call (a running node decodes,
  checks and encodes large ``POST /v1/facts`` bodies in one, ADR 0148).

Why a process: a bulk put's writes and its preparation are both mostly Python, so in
one process they take turns on one interpreter lock, and on a loaded machine the
writes wait for it. A forked child has its own interpreter lock and already holds
everything the work needs (the input's text, the loaded program's declarations), so
nothing but the results is copied: each item is pickled through a pipe.

Only where that is safe: ``os.fork`` on Linux, and only while this process runs one
thread (a lock another thread holds at the fork stays held in the child for good).
``MERKLOG_PUT_HELPER=0`` turns the put's helper off, ``MERKLOG_NODE_HELPER=0`` the
node's worker. The child never touches what it inherited besides computing (no store,
no output) and ends with ``os._exit``: no ``atexit`` handler, finaliser or buffered
output of this process runs twice. It ignores SIGINT (a worker's child SIGTERM too):
stopping is this process's to handle, and ``close()`` ends the child. A worker's child
also ends by itself when this process is gone (its requests pipe reads end-of-file).

An exception the generator or the function raises is raised here where its result
would have been, with its own type and message when it pickles, else as a
:class:`HelperError` carrying its message.
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
from typing import Any, NoReturn

from .errors import NodeError

#: Each message: its length (8 bytes, little-endian), then ``pickle((kind, payload))``.
_LENGTH = struct.Struct("<Q")
_ITEM, _RAISED, _END = 0, 1, 2
#: The pipe's buffer on each side (one item is a chunk's columns and text: megabytes).
_BUFFER = 1 << 20


class HelperError(NodeError):
    """The helper process failed: an error that did not pickle (its message kept), or
    the process ended without a word (killed, out of memory)."""


def available(switch: str = "MERKLOG_PUT_HELPER") -> bool:
    """Whether a helper may fork now (see the module docstring); ``switch`` names the
    environment variable that turns this helper off when it is ``0``."""
    return (
        sys.platform.startswith("linux")
        and hasattr(os, "fork")
        and os.environ.get(switch, "1") != "0"
        and threading.active_count() == 1
    )


class Helper:
    """``produce()`` running in a forked child; iterate to receive its items in order.
    Use as a context manager (or call :meth:`close`): the child is ended and reaped
    whether or not every item was taken."""

    def __init__(self, produce: Callable[[], Iterator[Any]]) -> None:
        read, write = os.pipe()
        _fork_parent()
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


class Worker:
    """``handle(payload)`` served by a forked child, one call at a time: :meth:`call`
    sends a payload and returns the result (or raises the error) ``handle`` gave for
    it. Thread-safe: concurrent callers take turns. Once the child is gone (killed,
    out of memory, closed), every call raises :class:`HelperError` at once, so a
    caller can do the work itself instead."""

    def __init__(self, handle: Callable[[Any], Any], name: str = "helper process") -> None:
        requests_read, requests_write = os.pipe()
        results_read, results_write = os.pipe()
        _fork_parent()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(requests_write)
            os.close(results_read)
            _serve_calls(handle, requests_read, results_write)
        os.close(requests_read)
        os.close(results_write)
        self.pid = pid
        self.name = name
        self._requests = os.fdopen(requests_write, "wb", buffering=_BUFFER)
        self._results = os.fdopen(results_read, "rb", buffering=_BUFFER)
        self._lock = threading.Lock()
        self._gone = False

    @property
    def alive(self) -> bool:
        """False once a call found the child gone, or after :meth:`close`."""
        return not self._gone

    def call(self, payload: Any) -> Any:
        """``handle(payload)`` as computed by the child."""
        with self._lock:
            if self._gone:
                raise HelperError(f"the {self.name} is not running")
            try:
                _send(self._requests, _ITEM, payload)
                head = self._results.read(_LENGTH.size)
                if len(head) < _LENGTH.size:
                    raise EOFError
                (size,) = _LENGTH.unpack(head)
                kind, result = pickle.loads(self._results.read(size))
            except (OSError, EOFError, pickle.UnpicklingError, ValueError):
                self._gone = True  # a pipe broke or closed: the child is gone
                # Reaped now if it has exited, not left a zombie for the node's lifetime.
                with suppress(ChildProcessError):
                    os.waitpid(self.pid, os.WNOHANG)
                raise HelperError(f"the {self.name} ended") from None
        if kind == _RAISED:
            raise result
        return result

    def close(self) -> None:
        """End the child and reap it; idempotent. A call in progress raises
        :class:`HelperError`."""
        if self._gone and self._requests.closed:
            return
        self._gone = True
        with suppress(ProcessLookupError):  # it ended by itself: only reaped here
            os.kill(self.pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        with suppress(OSError):
            self._requests.close()
        with self._lock:  # after any call in progress saw the pipe end
            self._results.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve_calls(handle: Callable[[Any], Any], requests: int, results: int) -> None:
    """A worker child's whole life: answer each request until the requests pipe ends
    (this process closed it, or is gone). Ctrl-C and a service manager's SIGTERM reach
    the whole process group: stopping is the parent's to do."""

    def answer() -> None:
        with (
            os.fdopen(requests, "rb", buffering=_BUFFER) as inbox,
            os.fdopen(results, "wb", buffering=_BUFFER) as out,
        ):
            while len(head := inbox.read(_LENGTH.size)) == _LENGTH.size:
                (size,) = _LENGTH.unpack(head)
                _kind, payload = pickle.loads(inbox.read(size))
                try:
                    result = handle(payload)
                except Exception as exc:  # noqa: BLE001 - every error goes to the caller
                    _send(out, _RAISED, _portable(exc))
                else:
                    _send(out, _ITEM, result)

    _child_life(answer, (signal.SIGINT, signal.SIGTERM))


def _serve(produce: Callable[[], Iterator[Any]], fd: int) -> None:
    """The child's whole life: send ``produce()``'s items, then its end or its error."""

    def send_all() -> None:
        with os.fdopen(fd, "wb", buffering=_BUFFER) as out:
            try:
                for item in produce():
                    _send(out, _ITEM, item)
            except BaseException as exc:  # noqa: BLE001 - every error goes to the parent
                _send(out, _RAISED, _portable(exc))
            else:
                _send(out, _END, None)

    _child_life(send_all, (signal.SIGINT,))


def _child_life(work: Callable[[], None], ignored: tuple[int, ...]) -> NoReturn:
    """Run a forked child's ``work`` with the ``ignored`` signals ignored, then end it with
    ``os._exit``: status 0, or 1 if ``work`` raised (the parent is gone: a broken pipe)."""
    code = 0
    try:
        _die_with_parent()
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)
        work()
    except BaseException:  # noqa: BLE001 - nothing to tell anyone: just end
        code = 1
    finally:
        os._exit(code)


#: The pid of the process about to fork (read by the child: was it already gone?).
_parent_pid = 0
#: ``prctl`` option: the signal a process gets when the thread that forked it ends.
_PR_SET_PDEATHSIG = 1


def _fork_parent() -> None:
    global _parent_pid
    _parent_pid = os.getpid()


def _die_with_parent() -> None:
    """End this child with its parent, even on ``kill -9`` of the parent: the child
    shares the parent's open files, the home's lock among them (a flock is released
    when every descriptor of it is closed), so a helper outliving a killed ``put`` kept
    the home locked and the next command waiting (Linux ``PR_SET_PDEATHSIG``)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the child ends at its pipe's EOF instead
        return
    if os.getppid() != _parent_pid:  # the parent died before prctl took effect
        os._exit(1)


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


__all__ = ["Helper", "HelperError", "Worker", "available"]
