"""Who owns a home directory right now: the running node or a one-shot CLI command.

A running node holds an exclusive ``flock`` on ``HOME/node.lock`` for its whole
life and writes ``HOME/node.json`` (pid and URL). A CLI command first tries to
take the same lock without blocking:

- it gets the lock → no node is running; the command opens the store directly and
  keeps the lock until it is done, so a node cannot start underneath it;
- the lock is taken → a node is running; the command talks to it over HTTP with
  the local API token, so every write goes through the one process that signs
  deltas and feeds the epoch loop (two writers signing with the same key could
  otherwise reuse a sequence number).

The kernel drops the lock when its holder dies, even on ``kill -9``, so a stale
``node.json`` is never mistaken for a live node.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import NodeError
from .files import private_dir, tighten_home, write_private

LOCK_FILE = "node.lock"
RUN_FILE = "node.json"


class HomeBusy(NodeError, RuntimeError):
    """Another process holds the home directory's lock."""


#: The homes whose lock this process holds (resolved paths): a second open of one from
#: the same process is told so, not that another process has it.
_HELD: set[str] = set()


def _key(home: Path) -> str:
    return os.path.realpath(home)


@dataclass
class HomeLock:
    """An exclusive lock on a home directory (released by ``release`` or process death)."""

    path: Path
    fd: int

    @classmethod
    def try_acquire(cls, home: Path) -> HomeLock | None:
        """The lock if free, else None (never blocks). Tightens the home on the way: the
        directory 0700, its secret and store files 0600 (:func:`~.files.tighten_home`)."""
        private_dir(home)
        tighten_home(home)
        path = home / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        _HELD.add(_key(home))
        return cls(path, fd)

    @classmethod
    def acquire(cls, home: Path) -> HomeLock:
        """The lock, or HomeBusy naming the holder: the running node (its run file names
        its pid and URL), else another process that holds the home without serving it.
        That one was called "a merklog node … already running" too, when it was an app's
        ``merklog.open`` or another command."""
        lock = cls.try_acquire(home)
        if lock is None:
            info = read_runfile(home)
            if info:
                raise HomeBusy(
                    f"a merklog node is already running on {home} (pid {info['pid']},"
                    f" {info['url']})"
                )
            if _key(home) in _HELD:  # it said "another process" of an app's own second open
                raise HomeBusy(
                    f"{home} is open already in this process (a node from merklog.open not"
                    " yet closed): use that node, or close it before opening the home again"
                )
            raise HomeBusy(
                f"{home} is in use by another process (another merklog command, or an app"
                " that opened it with merklog.open); try again when it has ended"
            )
        return lock

    @classmethod
    def acquire_for_node(cls, home: Path, timeout: float = 30.0) -> HomeLock:
        """The lock for a node about to serve ``home``: HomeBusy if another node serves it,
        but a one-shot CLI command holding the lock (no run file) is waited for."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            lock = cls.try_acquire(home)
            if lock is not None:
                return lock
            if read_runfile(home) is not None or time.monotonic() > deadline:
                return cls.acquire(home)  # raises HomeBusy naming the holder
            time.sleep(0.05)

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
            _HELD.discard(_key(self.path.parent))


def write_runfile(home: Path, url: str) -> None:
    """Record the running node's pid and URL (atomic rename)."""
    write_private(home / RUN_FILE, json.dumps({"pid": os.getpid(), "url": url}).encode())


def read_runfile(home: Path) -> dict | None:
    try:
        return json.loads((home / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None


def remove_runfile(home: Path) -> None:
    try:
        (home / RUN_FILE).unlink()
    except FileNotFoundError:
        pass


def running_node_url(home: Path) -> str | None:
    """The URL of the node running on ``home``, or None if none is (lock is free)."""
    lock = HomeLock.try_acquire(home)
    if lock is not None:
        lock.release()
        return None
    info = read_runfile(home)
    return info["url"] if info else None
