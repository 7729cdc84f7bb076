"""One SQLite connection shared by replicas, outbox and (in production) the block store.

``connect`` opens a file or ``:memory:`` database for replication use;
``transaction`` gives a nestable atomic section that joins the SQLiteBlockStore's
own transaction when the block store shares the connection, so a delta, its
blocks and the visible-state update commit together.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from merklog.store import BlockStore, SharedSQLite

# Keyed by id(conn): connections cannot be weakly referenced; a reused id merely shares a lock.
_locks: dict[int, threading.RLock] = {}
_locks_guard = threading.Lock()
_names = itertools.count()


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open a SQLite database for replication metadata (WAL, full fsync on commit)."""
    conn = sqlite3.connect(os.fspath(path), check_same_thread=False, isolation_level=None)
    if os.fspath(path) != ":memory:":
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def require_autocommit(conn: sqlite3.Connection) -> None:
    """Replication manages transactions itself (SAVEPOINT/RELEASE or the store's
    ``transaction()``); a connection in Python's legacy implicit-BEGIN mode would keep
    writes in a transaction nobody commits."""
    if conn.isolation_level is not None:
        raise ValueError(
            "replication needs a SQLite connection in autocommit mode"
            " (sqlite3.connect(..., isolation_level=None)); use merklog.replication.connect"
        )


def _shared(conn: sqlite3.Connection, blockstore: Any) -> SharedSQLite | None:
    """The block store's shared SQLite offer if it is this very connection."""
    if not isinstance(blockstore, BlockStore):
        return None
    shared = blockstore.shared_sqlite()
    return shared if shared is not None and shared.conn is conn else None


def conn_lock(conn: sqlite3.Connection, blockstore: Any = None) -> threading.RLock:
    """The re-entrant lock serialising use of ``conn`` (the block store's own if it shares it)."""
    shared = _shared(conn, blockstore)
    if shared is not None:
        return shared.lock
    with _locks_guard:
        lock = _locks.get(id(conn))
        if lock is None:
            lock = _locks[id(conn)] = threading.RLock()
        return lock


@contextmanager
def transaction(conn: sqlite3.Connection, blockstore: Any = None) -> Iterator[None]:
    """Nestable atomic section on ``conn``: all or nothing, durable on the outermost exit.

    Holds the connection's lock throughout: its savepoints are one stack for every
    thread, and another thread's savepoint opened inside this one was released with it
    (an epoch saving its state while a write ran on a memory node: "no such savepoint")."""
    shared = _shared(conn, blockstore)
    if shared is not None:
        with shared.transaction():
            yield
        return
    name = f"repl_sp{next(_names)}"
    with conn_lock(conn):
        conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            conn.execute(f"ROLLBACK TO {name}")
            conn.execute(f"RELEASE {name}")
            raise
        conn.execute(f"RELEASE {name}")


