"""While a write of an IPFS home waits for its daemon, the other threads read on.

An IPFS home's write commits only once the daemon holds and pinned its blocks
(:mod:`.ipfs_home`), and a daemon that is stopped or slow answers only when the
request's timeout (``store.ipfs_timeout``, 30 s) runs out. The store's lock, which
every reader of the shared SQLite connection takes, was held for that whole wait:
a running node's queries, status, fact pages and peer routes all waited for one
write's daemon (ADR 0180).

:class:`ShipGate` lets go of that lock for the wait. The write's SQLite transaction
stays open on the home's connection, so while it waits the connection belongs to the
writing thread alone, and the :class:`ShippingConnection` runs every other thread's
statements on a second, read-only connection to the same file. That one sees the last
committed state, which no writer can change meanwhile (SQLite has one writer, and
every transaction of this store waits at :meth:`ShipGate.wait` until the write
committed or rolled back). A statement that writes the database there fails at once
(SQLite's read-only error) and runs on the home's connection after that wait.

What this changes for a thread holding the lock: while another thread's write waits
for the daemon, a ``transaction()`` it opens waits, with the lock released, for that
write to end. Reads done under the lock before that point may then be older than the
state the transaction starts from, so a write reads what it depends on inside its
transaction (:class:`~merklog.store.SharedSQLite`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ShippingConnection(sqlite3.Connection):
    """The home's SQLite connection: while ``shipper`` (a thread id) waits for the
    daemon, the statements of every other thread run on ``snapshot``, read-only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shipper: int | None = None
        self.snapshot: sqlite3.Connection | None = None
        #: Returns once no other thread's write waits for the daemon (see ShipGate.wait).
        self.wait: Callable[[], None] = _nothing

    def _elsewhere(self) -> sqlite3.Connection | None:
        """The snapshot if this thread must not use the home's connection now."""
        shipper = self.shipper
        if shipper is None or shipper == threading.get_ident():
            return None
        return self.snapshot

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        other = self._elsewhere()
        if other is not None:
            try:
                return other.execute(sql, parameters)
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_READONLY:
                    raise
            self.wait()
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:  # type: ignore[override]
        other = self._elsewhere()
        if other is not None:
            rows = list(parameters)  # a retry here must not find them half consumed
            try:
                return other.executemany(sql, rows)
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_READONLY:
                    raise
            self.wait()
            parameters = rows
        return super().executemany(sql, parameters)

    def cursor(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:  # type: ignore[override]
        other = self._elsewhere()
        if other is not None:
            return other.cursor(*args, **kwargs)
        return super().cursor(*args, **kwargs)


def _nothing() -> None:
    return None


class ShipGate:
    """Runs a write's wait for the daemon with the store's ``lock`` released (see the
    module docstring); ``conn`` is the store's :class:`ShippingConnection`."""

    def __init__(self, lock: threading.RLock, path: str, busy_timeout: float) -> None:
        self.lock = lock
        self.path = path
        self.busy_timeout = busy_timeout
        self._cond = threading.Condition(lock)
        self._shipper: int | None = None
        self._conn: ShippingConnection | None = None
        self._snapshot: sqlite3.Connection | None = None

    def attach(self, conn: sqlite3.Connection) -> None:
        """Route ``conn``'s statements (a :class:`ShippingConnection`) through this gate."""
        if isinstance(conn, ShippingConnection):
            self._conn = conn
            conn.wait = self.wait

    def wait(self) -> None:
        """Return (holding the lock) once no other thread's write waits for the daemon;
        the lock is released while this waits."""
        me = threading.get_ident()
        with self._cond:
            while self._shipper is not None and self._shipper != me:
                self._cond.wait()

    def ship(self, send: Callable[[], T]) -> T:
        """Run ``send()`` (the daemon request) on a helper thread while this thread, which
        holds the lock and an open transaction, waits with the lock released; return
        what it returned or raise what it raised. Other threads read the last committed
        state meanwhile; their transactions wait until this one ends."""
        done = threading.Event()
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append((True, send()))
            except BaseException as exc:  # handed to the waiting thread
                outcome.append((False, exc))
            finally:
                done.set()
                with self._cond:
                    self._cond.notify_all()

        with self._cond:
            conn = self._conn
            if conn is not None:
                conn.snapshot = self._open_snapshot()
                conn.shipper = threading.get_ident()
            self._shipper = threading.get_ident()
            # A daemon thread: a command interrupted here exits without waiting for the
            # daemon's answer (blocks it stores anyway are harmless, content-addressed).
            threading.Thread(target=run, name="merklog-ipfs-ship", daemon=True).start()
            try:
                self._cond.wait_for(done.is_set)
            finally:
                self._shipper = None
                if conn is not None:
                    conn.shipper = None
                self._cond.notify_all()
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def _open_snapshot(self) -> sqlite3.Connection:
        """The read-only connection other threads read on during a ship (made once)."""
        if self._snapshot is None:
            uri = Path(self.path).absolute().as_uri() + "?mode=ro"
            self._snapshot = sqlite3.connect(
                uri,
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout,
            )
        return self._snapshot

    def close(self) -> None:
        """Close the read-only connection (call with the lock held, no ship running)."""
        if self._snapshot is not None:
            self._snapshot.close()
            self._snapshot = None
        if self._conn is not None:
            self._conn.snapshot = None
