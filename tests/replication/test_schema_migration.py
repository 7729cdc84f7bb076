"""A home made with the version-1 replication tables (fact CIDs as keys of
``repl_assert`` and ``repl_rel_fact``) is migrated to integer fact ids when it opens
(ADR 0132): the same visible facts (mixed types stay five facts), heads, relation
pages, retracts that observe the old asserts, and sync with a peer afterwards."""

from __future__ import annotations

import pytest

from merklog.replication.errors import ReplicationError
from merklog.replication.identity import Identity
from merklog.replication.paging import visible_after, visible_of_relation_after
from merklog.replication.replica import Replica
from merklog.replication.schema import SCHEMA_VERSION, schema_version
from merklog.store import encode_facts, fact_cid, make_fact
from merklog.store.sqlite import SQLiteBlockStore

from .repl_support import pull

#: Five values Python's == would merge: five facts, five CIDs.
MIXED = [1, 1.0, True, "1", b"\x01"]

#: The replication tables as merklog wrote them before ADR 0132 (schema version 1).
OLD_DDL = """
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


def _old_home(tmp_path, source: Replica) -> SQLiteBlockStore:
    """A store file with the version-1 tables, holding ``source``'s rows inserted through
    that DDL (fact CIDs in ``repl_assert`` and ``repl_rel_fact``), as an old merklog left it."""
    store = SQLiteBlockStore(tmp_path / "old.sqlite")
    conn, src = store.conn, source.conn
    for statement in OLD_DDL.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO blocks (cid, data) VALUES (?, ?)", src.execute("SELECT cid, data FROM blocks")
    )
    for table in (
        "repl_dataset",
        "repl_delta",
        "repl_parent",
        "repl_head",
        "repl_retract",
        "repl_auth",
        "repl_index",
    ):
        rows = src.execute(f"SELECT * FROM {table}").fetchall()
        if rows:
            marks = ",".join("?" * len(rows[0]))
            conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    conn.executemany(
        "INSERT INTO repl_assert (ds, fact, delta, killed) VALUES (?, ?, ?, ?)",
        src.execute("SELECT ds, fact, delta, killed FROM repl_assert_cid"),
    )
    conn.executemany(
        "INSERT INTO repl_rel_fact (ds, rel, fact) VALUES (?, ?, ?)",
        src.execute(
            "SELECT r.ds, r.rel, f.cid FROM repl_rel_fact r JOIN repl_fact f ON f.id = r.fact"
        ),
    )
    conn.execute("COMMIT")
    assert schema_version(conn) == 1
    assert conn.execute("SELECT typeof(fact) FROM repl_assert LIMIT 1").fetchone() == ("blob",)
    return store


def test_a_version_1_home_is_migrated_when_it_opens(tmp_path) -> None:
    owner = Identity.generate()
    src_store = SQLiteBlockStore(tmp_path / "src.sqlite")
    source = Replica.create(src_store.conn, src_store, owner, "d")
    facts = [make_fact("p", [x]) for x in MIXED] + [make_fact("q", [x, "y"]) for x in MIXED]
    source.assert_facts(facts[:6])
    source.assert_facts(facts[6:] + [make_fact("big", [i]) for i in range(700)])
    source.retract_facts([make_fact("p", [True]), make_fact("q", ["1", "y"])])
    source.assert_facts([make_fact("p", [True])])  # asserted again: a live and a dead assert

    store = _old_home(tmp_path, source)
    migrated = Replica.open(store.conn, store, owner, source.dataset)
    conn = migrated.conn
    assert schema_version(conn) == SCHEMA_VERSION == 3
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert {r[0] for r in conn.execute("SELECT DISTINCT typeof(fact) FROM repl_assert")} == {
        "integer"
    }
    assert {r[0] for r in conn.execute("SELECT DISTINCT typeof(fact) FROM repl_rel_fact")} == {
        "integer"
    }
    assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name LIKE '%_v1'").fetchall()
    # Facts, asserts, heads and pages as before.
    assert migrated.visible_facts() == source.visible_facts()
    assert len([c for c in map(fact_cid, facts) if c in migrated.visible_cids()]) == 9
    assert migrated.relations() == source.relations()
    assert migrated.heads() == source.heads()
    assert visible_after(migrated, None, 10_000) == sorted(source.visible_cids())
    for rel in ("p", "q", "big"):
        page = visible_of_relation_after(migrated, rel, None, 10_000)
        assert sorted(page) == sorted(visible_of_relation_after(source, rel, None, 10_000))
    # A second open finds the current version and changes nothing.
    again = Replica.open(store.conn, store, owner, source.dataset)
    assert again.visible_facts() == source.visible_facts()

    # put of a visible fact adds no assert; a retract observes every live old assert.
    assert migrated.assert_facts([make_fact("p", [1])]) == []
    live = migrated._live_asserts(fact_cid(make_fact("p", [True])))
    assert live == source._live_asserts(fact_cid(make_fact("p", [True])))
    (retract,) = migrated.retract_facts([make_fact("p", [True]), make_fact("p", ["1"])])
    assert fact_cid(make_fact("p", [True])) not in migrated.visible_cids()
    assert fact_cid(make_fact("p", [1])) in migrated.visible_cids()
    migrated.assert_facts([make_fact("new", [x]) for x in MIXED])

    # Sync both ways with the unmigrated-from source and a fresh peer.
    assert pull(source, migrated) == 2
    assert source.visible_facts() == migrated.visible_facts()
    peer_store = SQLiteBlockStore(tmp_path / "peer.sqlite")
    peer = Replica.open(
        peer_store.conn, peer_store, Identity.generate(), source.dataset, source.genesis.data
    )
    pull(peer, migrated)
    assert peer.visible_facts() == migrated.visible_facts()
    assert peer.heads() == migrated.heads() and peer.has_delta(retract)
    assert len(visible_of_relation_after(peer, "new", None, 100)) == 5


def test_a_newer_schema_is_refused(tmp_path) -> None:
    store = SQLiteBlockStore(tmp_path / "s.sqlite")
    Replica.create(store.conn, store, Identity.generate(), "d")
    store.conn.execute("UPDATE repl_meta SET value = '4' WHERE key = 'schema_version'")
    with pytest.raises(ReplicationError, match="schema version 4"):
        Replica.create(store.conn, store, Identity.generate(), "e")


def test_two_datasets_in_one_file_share_fact_ids_and_nothing_else(tmp_path) -> None:
    """``repl_fact`` is one per file (ADR 0132): a second dataset asserting facts the first
    already gave ids (a bulk call, mixed types) reuses them; visibility, retracts and
    relation pages stay per dataset."""
    store = SQLiteBlockStore(tmp_path / "two.sqlite")
    one = Replica.create(store.conn, store, Identity.generate(), "one")
    two = Replica.create(store.conn, store, Identity.generate(), "two")
    shared = [make_fact(f"r{i % 2}", [i, MIXED[i % 5]]) for i in range(1500)]
    own = [make_fact("r0", [i, "two"]) for i in range(600)]
    one.write_asserts(shared, encode_facts(shared))  # new ids, ranks per relation
    theirs = shared[500:] + own
    two.write_asserts(theirs, encode_facts(theirs))  # 1,000 ids known: looked up
    one.retract_facts(shared[500:700])
    (ids,) = store.conn.execute("SELECT count(*) FROM repl_fact").fetchone()
    assert ids == len(shared) + len(own)
    assert one.visible_cids() == {fact_cid(f) for f in shared[:500] + shared[700:]}
    assert two.visible_cids() == {fact_cid(f) for f in shared[500:] + own}
    for replica, facts in ((one, shared[:500] + shared[700:]), (two, shared[500:] + own)):
        for rel in ("r0", "r1"):
            page = visible_of_relation_after(replica, rel, None, 10_000)
            want = {fact_cid(f) for f in facts if f.rel == rel}
            assert len(page) == len(want) and set(page) == want
        assert visible_after(replica, None, 10_000) == sorted(replica.visible_cids())


def test_a_version_2_home_gets_relation_ranges_when_it_opens(tmp_path) -> None:
    """Version 2 had no ``repl_rel_range`` (ADR 0151): opening adds it empty and marks the
    file 3; the old rows still page, and the next bulk write adds ranges beside them."""
    owner = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "v2.sqlite")
    replica = Replica.create(store.conn, store, owner, "d")
    old = [make_fact("p", [x]) for x in MIXED]
    replica.assert_facts(old)  # rows only
    with store.transaction() as conn:
        conn.execute("DROP VIEW repl_rel_member")
        conn.execute("DROP TABLE repl_rel_range")
        conn.execute("UPDATE repl_meta SET value = '2' WHERE key = 'schema_version'")
    assert schema_version(store.conn) == 2
    reopened = Replica.open(store.conn, store, owner, replica.dataset)
    assert schema_version(store.conn) == 3
    assert sorted(visible_of_relation_after(reopened, "p", None, 100)) == sorted(map(fact_cid, old))
    bulk = [make_fact("p", [i, MIXED[i % 5]]) for i in range(1000)]
    reopened.write_asserts(bulk, encode_facts(bulk))
    assert store.conn.execute("SELECT count(*) FROM repl_rel_range").fetchone()[0] == 1
    page = visible_of_relation_after(reopened, "p", None, 10_000)
    assert sorted(page[:5]) == sorted(map(fact_cid, old))  # the old rows' ids come first
    assert sorted(page[5:]) == sorted(map(fact_cid, bulk))
