"""SQLite tables holding replica metadata (blocks themselves live in the BlockStore).

All tables are prefixed ``repl_`` and keyed by a small integer dataset id so
one database (the node's SQLite block store connection) holds many datasets.
The tables *are* the log relations of docs/crdt.md: ``repl_delta`` = delta/4,
``repl_parent`` = parent/2, ``repl_assert`` = asserts/2, ``repl_retract`` = retracts/3.
``repl_assert.killed`` caches "some retract observes this assert", so the visible
set is ``SELECT DISTINCT fact FROM repl_assert WHERE killed = 0``.
``repl_rel_fact`` indexes asserted facts by relation and ``repl_index`` records which
datasets' indexes are complete (see :mod:`.relindex`).
"""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS repl_dataset (
    ds INTEGER PRIMARY KEY, cid BLOB UNIQUE NOT NULL, owner BLOB NOT NULL, name TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS repl_delta (
    ds INTEGER NOT NULL, cid BLOB NOT NULL, author BLOB NOT NULL, seq INTEGER NOT NULL,
    clock INTEGER NOT NULL, nops INTEGER NOT NULL, size INTEGER NOT NULL,
    PRIMARY KEY (ds, cid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS repl_delta_clock ON repl_delta (ds, clock);
CREATE INDEX IF NOT EXISTS repl_delta_author ON repl_delta (ds, author, seq);
CREATE TABLE IF NOT EXISTS repl_parent (
    ds INTEGER NOT NULL, child BLOB NOT NULL, parent BLOB NOT NULL,
    PRIMARY KEY (ds, child, parent)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS repl_parent_parent ON repl_parent (ds, parent);
CREATE TABLE IF NOT EXISTS repl_head (
    ds INTEGER NOT NULL, cid BLOB NOT NULL, PRIMARY KEY (ds, cid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_assert (
    ds INTEGER NOT NULL, fact BLOB NOT NULL, delta BLOB NOT NULL, killed INTEGER NOT NULL,
    PRIMARY KEY (ds, fact, delta)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_retract (
    ds INTEGER NOT NULL, fact BLOB NOT NULL, observed BLOB NOT NULL, delta BLOB NOT NULL,
    PRIMARY KEY (ds, fact, observed, delta)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS repl_retract_delta ON repl_retract (ds, delta);
CREATE INDEX IF NOT EXISTS repl_retract_observed ON repl_retract (ds, observed);
CREATE TABLE IF NOT EXISTS repl_auth (
    ds INTEGER NOT NULL, key BLOB NOT NULL, delta BLOB NOT NULL, clock INTEGER NOT NULL,
    is_grant INTEGER NOT NULL, PRIMARY KEY (ds, key, delta)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_auth_memo (
    ds INTEGER NOT NULL, key BLOB NOT NULL, delta BLOB NOT NULL, op BLOB NOT NULL,
    PRIMARY KEY (ds, key, delta)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_peer (
    ds INTEGER NOT NULL, peer TEXT NOT NULL, heads BLOB NOT NULL, PRIMARY KEY (ds, peer)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, cid BLOB UNIQUE NOT NULL, dest TEXT NOT NULL,
    data BLOB NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_try REAL NOT NULL DEFAULT 0,
    delivered REAL, last_error TEXT
);
CREATE INDEX IF NOT EXISTS repl_outbox_due ON repl_outbox (delivered, next_try);
CREATE TABLE IF NOT EXISTS repl_inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, cid BLOB UNIQUE NOT NULL, sender BLOB NOT NULL,
    rel TEXT NOT NULL, data BLOB NOT NULL, received REAL NOT NULL, consumed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS repl_inbox_pending ON repl_inbox (consumed, id);
CREATE TABLE IF NOT EXISTS repl_rel_fact (
    ds INTEGER NOT NULL, rel TEXT NOT NULL, fact BLOB NOT NULL, PRIMARY KEY (ds, rel, fact)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_index (
    ds INTEGER NOT NULL, name TEXT NOT NULL, PRIMARY KEY (ds, name)
) WITHOUT ROWID;
"""


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the replication tables if missing (idempotent)."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
