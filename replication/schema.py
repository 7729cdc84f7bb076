"""SQLite tables holding replica metadata (blocks themselves live in the BlockStore).

All tables are prefixed ``repl_`` and keyed by a small integer dataset id so
one database (the node's SQLite block store connection) holds many datasets.
The tables *are* the log relations of docs/crdt.md: ``repl_delta`` = delta/4,
``repl_parent`` = parent/2, ``repl_assert`` = asserts/2, ``repl_retract`` = retracts/3.
``repl_assert.killed`` caches "some retract observes this assert", so the visible
set is ``SELECT DISTINCT fact FROM repl_assert WHERE killed = 0``.
``repl_rel_fact`` (and, for a local bulk write, ``repl_rel_range``: one row per id
range) indexes asserted facts by relation and ``repl_index`` records which datasets'
indexes are complete (see :mod:`.relindex`). ``repl_covered`` lists the accepted deltas
whose blocks the replica does not keep because a snapshot covers them: installed from
one (``import-snapshot``) or deleted after one (``prune``); a check of the replica does
not count them as lost (ADR 0183). Older merklogs ignore the table.
``repl_auth_bit``, ``repl_auth_set`` and ``repl_auth_at`` hold, per delta, which
grant/revoke deltas lie in its causal past (:mod:`.authsets`, ADR 0219); they are
derived from the DAG alone and filled as needed, so a file an older merklog wrote to
(which keeps ``repl_auth_memo`` instead, now unused) is read correctly.

Schema version 2 (ADR 0132): a fact is named by a small integer in ``repl_assert`` and
``repl_rel_fact``. ``repl_fact (id, cid)`` (one per database, insert-only) maps each
asserted fact CID to its id once; ids are handed out as facts are first asserted, so a
write's new asserts and index rows append at the end of their B-trees instead of
landing on random pages of CID-keyed trees (each such tree cost ~4 µs a fact and page
rewrites on every commit). The view ``repl_assert_cid`` shows ``repl_assert`` with fact
CIDs, for readers that want them. A version-1 home (fact CIDs in both tables) is
migrated when it is opened (:func:`ensure_schema`).
"""

from __future__ import annotations

import logging
import sqlite3

from .errors import ReplicationError

log = logging.getLogger(__name__)

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
CREATE TABLE IF NOT EXISTS repl_fact (id INTEGER PRIMARY KEY, cid BLOB UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS repl_assert (
    ds INTEGER NOT NULL, fact INTEGER NOT NULL, delta BLOB NOT NULL, killed INTEGER NOT NULL,
    PRIMARY KEY (ds, fact, delta)
) WITHOUT ROWID;
CREATE VIEW IF NOT EXISTS repl_assert_cid (ds, fact, delta, killed) AS
    SELECT a.ds, f.cid, a.delta, a.killed FROM repl_assert a JOIN repl_fact f ON f.id = a.fact;
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
CREATE INDEX IF NOT EXISTS repl_auth_clock ON repl_auth (ds, clock);
CREATE TABLE IF NOT EXISTS repl_auth_bit (
    ds INTEGER NOT NULL, delta BLOB NOT NULL, bit INTEGER NOT NULL, PRIMARY KEY (ds, delta)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_auth_set (
    id INTEGER PRIMARY KEY, ds INTEGER NOT NULL, bits BLOB NOT NULL, UNIQUE (ds, bits)
);
CREATE TABLE IF NOT EXISTS repl_auth_at (
    ds INTEGER NOT NULL, delta BLOB NOT NULL, aset INTEGER NOT NULL, PRIMARY KEY (ds, delta)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_peer (
    ds INTEGER NOT NULL, peer TEXT NOT NULL, heads BLOB NOT NULL, PRIMARY KEY (ds, peer)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, cid BLOB UNIQUE NOT NULL, dest TEXT NOT NULL,
    data BLOB NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_try REAL NOT NULL DEFAULT 0,
    delivered REAL, last_error TEXT, refused_since REAL, dropped REAL
);
CREATE INDEX IF NOT EXISTS repl_outbox_due ON repl_outbox (delivered, next_try);
CREATE TABLE IF NOT EXISTS repl_inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, cid BLOB UNIQUE NOT NULL, sender BLOB NOT NULL,
    rel TEXT NOT NULL, data BLOB NOT NULL, received REAL NOT NULL, consumed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS repl_inbox_pending ON repl_inbox (consumed, id);
CREATE TABLE IF NOT EXISTS repl_rel_fact (
    ds INTEGER NOT NULL, rel TEXT NOT NULL, fact INTEGER NOT NULL, PRIMARY KEY (ds, rel, fact)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_rel_range (
    ds INTEGER NOT NULL, rel TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
    PRIMARY KEY (ds, rel, lo)
) WITHOUT ROWID;
CREATE VIEW IF NOT EXISTS repl_rel_member (ds, rel, fact) AS
    SELECT ds, rel, fact FROM repl_rel_fact
    UNION ALL
    SELECT g.ds, g.rel, f.id FROM repl_rel_range g JOIN repl_fact f ON f.id BETWEEN g.lo AND g.hi;
CREATE TABLE IF NOT EXISTS repl_index (
    ds INTEGER NOT NULL, name TEXT NOT NULL, PRIMARY KEY (ds, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repl_covered (
    ds INTEGER NOT NULL, cid BLOB NOT NULL, PRIMARY KEY (ds, cid)
) WITHOUT ROWID;
"""

#: The layout :data:`SCHEMA` creates (recorded in ``repl_meta``); 1 is the CID-keyed one.
#: 3 adds ``repl_rel_range`` (ADR 0151): a merklog that knows only 2 would page a
#: relation without the facts its ranges hold, so it must refuse the file. 2 -> 3 only
#: creates the (empty) table.
SCHEMA_VERSION = 3

#: Version 1 -> 2, inside one savepoint: the fact CIDs of ``repl_assert`` get ids in CID
#: order, then both tables are copied keyed by id (ADR 0132).
_MIGRATE_1_TO_2 = """
ALTER TABLE repl_assert RENAME TO repl_assert_v1;
ALTER TABLE repl_rel_fact RENAME TO repl_rel_fact_v1;
CREATE TABLE repl_fact (id INTEGER PRIMARY KEY, cid BLOB UNIQUE NOT NULL);
INSERT INTO repl_fact (cid) SELECT DISTINCT fact FROM repl_assert_v1 ORDER BY fact;
CREATE TABLE repl_assert (
    ds INTEGER NOT NULL, fact INTEGER NOT NULL, delta BLOB NOT NULL, killed INTEGER NOT NULL,
    PRIMARY KEY (ds, fact, delta)
) WITHOUT ROWID;
INSERT INTO repl_assert (ds, fact, delta, killed)
    SELECT a.ds, f.id, a.delta, a.killed FROM repl_assert_v1 a JOIN repl_fact f ON f.cid = a.fact
    ORDER BY a.ds, f.id, a.delta;
CREATE TABLE repl_rel_fact (
    ds INTEGER NOT NULL, rel TEXT NOT NULL, fact INTEGER NOT NULL, PRIMARY KEY (ds, rel, fact)
) WITHOUT ROWID;
INSERT INTO repl_rel_fact (ds, rel, fact)
    SELECT r.ds, r.rel, f.id FROM repl_rel_fact_v1 r JOIN repl_fact f ON f.cid = r.fact
    ORDER BY r.ds, r.rel, f.id;
DROP TABLE repl_assert_v1;
DROP TABLE repl_rel_fact_v1;
"""


#: Columns added to existing tables without a new schema version (ADR 0176): an older
#: merklog names its own columns in every statement on these tables and never sees these
#: (it would count a dropped ``@async`` message as pending and retry it, nothing worse).
_ADDED_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "repl_outbox": (("refused_since", "REAL"), ("dropped", "REAL")),
}


def _add_columns(conn: sqlite3.Connection) -> None:
    """Add the columns of :data:`_ADDED_COLUMNS` a table made by an older merklog lacks."""
    for table, columns in _ADDED_COLUMNS.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for name, kind in columns:
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def schema_version(conn: sqlite3.Connection) -> int:
    """The replication layout of this database: 0 none yet, 1 CID-keyed, 2 id-keyed, 3
    with relation ranges."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'repl_%'")}
    if "repl_meta" in names:
        row = conn.execute("SELECT value FROM repl_meta WHERE key = 'schema_version'").fetchone()
        if row is not None:
            return int(row[0])
    return 1 if "repl_assert" in names else 0


def stored_datasets(conn: sqlite3.Connection) -> list[bytes]:
    """The genesis CIDs (raw) of the datasets this database holds a replica of, in the
    order they were first opened; none when it has no replication tables yet. Reads
    only: a home whose config.toml went missing is asked what its store still holds."""
    names = {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name = 'repl_dataset'")
    }
    if not names:
        return []
    return [bytes(r[0]) for r in conn.execute("SELECT cid FROM repl_dataset ORDER BY ds")]


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the replication tables if missing and migrate an older layout (idempotent;
    atomic: one savepoint, inside the caller's transaction if there is one)."""
    version = schema_version(conn)
    if version == SCHEMA_VERSION:
        _run(conn, SCHEMA)  # a table dropped by hand comes back empty, as before
        _add_columns(conn)
        return
    if version > SCHEMA_VERSION:
        raise ReplicationError(
            f"the replication tables have schema version {version}, newer than this"
            f" merklog understands ({SCHEMA_VERSION})"
        )
    conn.execute("SAVEPOINT repl_schema")
    try:
        if version == 1:
            log.info("migrating the replication tables to integer fact ids (once, ADR 0132)")
            _run(conn, _MIGRATE_1_TO_2)
        _run(conn, SCHEMA)
        _add_columns(conn)
        conn.execute(
            "INSERT OR REPLACE INTO repl_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
    except BaseException:
        conn.execute("ROLLBACK TO repl_schema")
        conn.execute("RELEASE repl_schema")
        raise
    conn.execute("RELEASE repl_schema")


def _run(conn: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)
