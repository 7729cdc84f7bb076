"""SQLiteBlockStore: durability, corruption detection, fact index, nested transactions."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

from merklog.store import BlockNotFound, CIDMismatch, StoreError, encode_fact, make_fact
from merklog.store import sqlite as sqlite_module
from merklog.store.sqlite import SQLiteBlockStore


def edges(n: int, rel: str = "edge") -> list:
    return [make_fact(rel, [i, i + 1, f"n{i}"]) for i in range(n)]


def test_settings_are_durable(sqlite_store):
    conn = sqlite_store.conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: fsync on commit


def test_put_facts_and_index(sqlite_store):
    facts = edges(5) + edges(3, "node")
    cids = sqlite_store.put_facts(facts)
    assert cids == [encode_fact(f)[0] for f in facts]
    assert sqlite_store.relations() == ["edge", "node"]
    assert sqlite_store.count_facts() == 8
    assert sqlite_store.count_facts("edge") == 5
    assert sqlite_store.count_facts("missing") == 0
    assert set(sqlite_store.fact_cids("node")) == set(cids[5:])
    assert dict(sqlite_store.facts("edge")) == dict(zip(cids[:5], facts[:5], strict=True))
    assert dict(sqlite_store.facts()) == dict(zip(cids, facts, strict=True))
    # idempotent: storing the same facts again adds neither blocks nor index rows
    assert sqlite_store.put_facts(facts) == cids
    assert sqlite_store.count_facts() == 8 and len(sqlite_store) == 8


def test_iterators_page_through_large_sets(sqlite_store, monkeypatch):
    monkeypatch.setattr(sqlite_module, "PAGE", 7)
    facts = edges(50)
    cids = sqlite_store.put_facts(facts)
    assert sorted(sqlite_store.fact_cids("edge")) == sorted(cids)
    assert len(list(sqlite_store.facts())) == 50
    assert set(sqlite_store.iter_cids()) == set(cids)
    assert sqlite_store.integrity_check() == []


def test_delete_removes_index_rows(sqlite_store):
    cids = sqlite_store.put_facts(edges(3))
    assert sqlite_store.delete_many(cids[:1]) == 1
    assert sqlite_store.count_facts("edge") == 2
    assert cids[0] not in set(sqlite_store.fact_cids("edge"))
    assert sqlite_store.integrity_check() == []


def test_corrupt_row_is_detected_and_never_returned(sqlite_store):
    cids = sqlite_store.put_facts(edges(3))
    _, other = encode_fact(make_fact("edge", [99, 100, "evil"]))
    sqlite_store.conn.execute("UPDATE blocks SET data = ? WHERE cid = ?", (other, cids[1].raw))
    with pytest.raises(CIDMismatch) as err:
        sqlite_store.get(cids[1])
    assert err.value.expected == cids[1]
    assert sqlite_store.get(cids[0])  # the others are intact
    with pytest.raises(CIDMismatch):
        list(sqlite_store.facts("edge"))
    problems = sqlite_store.integrity_check()
    assert len(problems) == 1 and "CID mismatch" in problems[0]


def test_integrity_check_reports_index_row_without_block(sqlite_store):
    cids = sqlite_store.put_facts(edges(2))
    sqlite_store.conn.execute("DELETE FROM blocks WHERE cid = ?", (cids[0].raw,))
    problems = sqlite_store.integrity_check()
    assert problems == [f"fact index row edge/{cids[0]} has no block"]
    with pytest.raises(BlockNotFound):
        list(sqlite_store.facts("edge"))


def test_nested_transactions_commit_at_outermost(sqlite_store):
    conn = sqlite_store.conn
    conn.execute("CREATE TABLE IF NOT EXISTS other_layer (k TEXT PRIMARY KEY)")
    with sqlite_store.transaction():
        sqlite_store.put_facts(edges(2))
        conn.execute("INSERT INTO other_layer VALUES ('a')")
        with pytest.raises(RuntimeError):
            with sqlite_store.transaction():
                sqlite_store.put_facts(edges(1, "inner"))
                raise RuntimeError("inner fails")
        assert sqlite_store.count_facts("inner") == 0, "inner level rolled back alone"
        # not committed yet: a second connection does not see the outer writes
        other = sqlite3.connect(sqlite_store.path)
        assert other.execute("SELECT count(*) FROM facts").fetchone()[0] == 0
        other.close()
    assert sqlite_store.count_facts() == 2
    assert conn.execute("SELECT count(*) FROM other_layer").fetchone()[0] == 1


def test_failed_outer_transaction_rolls_back_blocks_and_other_tables(sqlite_store):
    conn = sqlite_store.conn
    conn.execute("CREATE TABLE IF NOT EXISTS other_layer (k TEXT PRIMARY KEY)")
    with pytest.raises(RuntimeError):
        with sqlite_store.transaction():
            cids = sqlite_store.put_facts(edges(3))
            sqlite_store.put_many([encode_fact(make_fact("x", [1]))])
            conn.execute("INSERT INTO other_layer VALUES ('a')")
            raise RuntimeError("crash before commit")
    assert len(sqlite_store) == 0 and sqlite_store.count_facts() == 0
    assert not sqlite_store.has(cids[0])
    assert conn.execute("SELECT count(*) FROM other_layer").fetchone()[0] == 0
    assert not sqlite_store.in_transaction


def test_concurrent_writers_share_the_connection(sqlite_store):
    def write(t: int) -> None:
        for b in range(5):
            sqlite_store.put_facts([make_fact("w", [t, b, i]) for i in range(20)])

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sqlite_store.count_facts("w") == 4 * 5 * 20
    assert sqlite_store.integrity_check() == []


def test_refuses_newer_schema(tmp_path):
    path = tmp_path / "s.sqlite"
    SQLiteBlockStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE store_meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        SQLiteBlockStore(path)


def test_version_1_file_is_marked_version_2_with_its_blocks_intact(tmp_path):
    """A file from before ADR 0133 opens, keeps every block, and is marked version 2 so
    a merklog that reads version 1 refuses it instead of misreading the replication
    tables ADR 0132 changed (that merklog's refusal is the newer-version test above)."""
    path = tmp_path / "s.sqlite"
    store = SQLiteBlockStore(path)
    facts = [make_fact("v", [x]) for x in (1, 1.0, True, "1", b"\x01")]
    cids = store.put_facts(facts)
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE store_meta SET value = '1' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    store = SQLiteBlockStore(path)
    assert len(set(cids)) == 5
    # Compared as bytes, never with ==/hash over values (1 == 1.0 == True).
    assert [store.get(c) for c in cids] == [encode_fact(f)[1] for f in facts]
    store.close()
    conn = sqlite3.connect(path)
    (version,) = conn.execute(
        "SELECT value FROM store_meta WHERE key = 'schema_version'"
    ).fetchone()
    conn.close()
    assert version == "2"


def test_a_file_with_cid_keyed_blocks_moves_to_the_rowid_layout_intact(tmp_path):
    """A file from before ADR 0142 (whole blocks in a ``WITHOUT ROWID`` table keyed by
    CID) opens with every block byte for byte - five values Python's == would merge, a
    block large enough for overflow pages - and in the rowid layout, where a CID is still
    stored once and the fact index is untouched."""
    path = tmp_path / "s.sqlite"
    facts = [make_fact("v", [x]) for x in (1, 1.0, True, "1", b"\x01")]
    blocks = [encode_fact(f) for f in facts]
    big = make_fact("blob", [b"\xab" * 300_000])
    blocks.append(encode_fact(big))
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
        INSERT INTO store_meta VALUES ('schema_version', '2');
        CREATE TABLE blocks (cid BLOB PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
        CREATE TABLE facts (rel TEXT NOT NULL, cid BLOB NOT NULL, PRIMARY KEY (rel, cid))
            WITHOUT ROWID;
    """)
    conn.executemany("INSERT INTO blocks VALUES (?, ?)", [(c.raw, d) for c, d in blocks])
    conn.executemany("INSERT INTO facts VALUES ('v', ?)", [(c.raw,) for c, _ in blocks[:5]])
    conn.commit()
    conn.close()

    store = SQLiteBlockStore(path)
    # Compared as bytes, never with ==/hash over values (1 == 1.0 == True).
    assert [store.get(c) for c, _ in blocks] == [d for _, d in blocks]
    assert len({c for c, _ in blocks}) == len(store) == 6
    assert sorted(c.raw for c in store.fact_cids("v")) == sorted(c.raw for c, _ in blocks[:5])
    assert store.put_many(blocks) == 0  # each CID still stored once
    assert store.integrity_check() == []
    columns = [r[1] for r in store.conn.execute("PRAGMA table_info(blocks)")]
    assert columns == ["id", "cid", "data"]
    store.close()
    store = SQLiteBlockStore(path)  # opened again: nothing left to move
    assert [store.get(c) for c, _ in blocks] == [d for _, d in blocks]
    store.close()


WRITER = """
import os, signal, sys
from merklog.store import make_fact
from merklog.store.sqlite import SQLiteBlockStore
store = SQLiteBlockStore(sys.argv[1])
with store.transaction():
    store.put_facts([make_fact("edge", [i, i + 1]) for i in range(1000)])
    store.conn.execute("CREATE TABLE IF NOT EXISTS marks (k TEXT)")
    store.conn.execute("INSERT INTO marks VALUES ('committed')")
with store.transaction():  # never committed: the process dies inside it
    store.put_facts([make_fact("lost", [1])])
    os.kill(os.getpid(), signal.SIGKILL)
"""

READER = """
import sys
from merklog.store.sqlite import SQLiteBlockStore
store = SQLiteBlockStore(sys.argv[1])
facts = dict(store.facts())
assert store.integrity_check() == [], store.integrity_check()
print(store.relations(), len(facts), sorted(f.args for f in facts.values())[-1])
"""


def test_survives_process_restart_and_kill(tmp_path):
    path = str(tmp_path / "restart.sqlite")
    writer = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WRITER), path], capture_output=True, timeout=60
    )
    assert writer.returncode == -9, writer.stderr.decode()
    reader = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(READER), path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reader.returncode == 0, reader.stderr
    assert reader.stdout.strip() == "['edge'] 1000 (999, 1000)"
    with SQLiteBlockStore(path) as store:
        assert store.conn.execute("SELECT k FROM marks").fetchall() == [("committed",)]
        assert store.count_facts("lost") == 0


def test_get_many_batches_in_order_and_verifies(sqlite_store, monkeypatch):
    monkeypatch.setattr(sqlite_module, "_IN_CHUNK", 3)
    facts = edges(10)
    cids = sqlite_store.put_facts(facts)
    wanted = cids[::-1] + cids[:2]  # any order, repeats allowed
    assert [c for c, _ in sqlite_store.get_many(wanted)] == wanted
    assert all(c.verifies(d) for c, d in sqlite_store.get_many(wanted))
    _, other = encode_fact(make_fact("edge", [0, 0, "evil"]))
    sqlite_store.conn.execute("UPDATE blocks SET data = ? WHERE cid = ?", (other, cids[4].raw))
    with pytest.raises(CIDMismatch):
        list(sqlite_store.get_many(cids))
    missing, _ = encode_fact(make_fact("nope", [1]))
    with pytest.raises(BlockNotFound):
        list(sqlite_store.get_many([cids[0], missing]))


def test_set_cache_mb_changes_only_the_page_cache(tmp_path):
    """A bulk writer raises its connection's page cache (ADR 0110); durability stays."""
    store = SQLiteBlockStore(tmp_path / "c.sqlite")
    assert store.conn.execute("PRAGMA cache_size").fetchone()[0] == -128 * 1024
    store.set_cache_mb(512)
    assert store.conn.execute("PRAGMA cache_size").fetchone()[0] == -512 * 1024
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    pages = store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    assert pages == sqlite_module.WAL_CHECKPOINT_PAGES
    cid, data = encode_fact(make_fact("p", [1.0]))
    store.put_many([(cid, data)])
    assert store.get(cid) == data
    store.close()


@pytest.mark.parametrize("page_size", [4096, 16384])
def test_set_wal_checkpoint_mb_counts_pages_of_the_file(tmp_path, page_size):
    """A bulk writer lets the WAL grow (ADR 0152): the limit is given in MiB and set in
    pages of the file's own size (older files have 4 KiB pages); the data stays durable
    and is all in the database after the close."""
    path = tmp_path / "w.sqlite"
    with sqlite3.connect(path) as conn:  # a file made with another page size
        conn.execute(f"PRAGMA page_size={page_size}")
        conn.execute("VACUUM")
    store = SQLiteBlockStore(path)
    store.set_wal_checkpoint_mb(1024)
    assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == (1 << 30) // page_size
    assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    facts = [make_fact("p", [i, float(i), str(i)]) for i in range(3000)]
    cids = store.put_facts(facts)
    store.close()
    assert not (tmp_path / "w.sqlite-wal").exists()  # checkpointed at the close
    again = SQLiteBlockStore(path)
    assert [again.get(c) for c in cids] == [encode_fact(f)[1] for f in facts]
    again.close()


def test_bulk_inserts_store_blobs_read_back_as_bytes(sqlite_store):
    """put_facts, put_encoded and put_many bind CIDs and blocks as bytearrays (ADR 0126):
    SQLite stores BLOBs, reads give ``bytes``, and facts of values Python's ``==`` merges
    (1, 1.0, true) or look-alikes ("1", x"01") stay five blocks."""
    facts = [make_fact("v", [x]) for x in (1, 1.0, True, "1", b"\x01")]
    cids = sqlite_store.put_facts(facts[:2])
    encoded = [encode_fact(f) for f in facts[2:4]]
    assert sqlite_store.put_encoded(encoded) == 2
    assert sqlite_store.put_many([encode_fact(facts[4])]) == 1
    cids += [c for c, _ in encoded] + [encode_fact(facts[4])[0]]
    rows = sqlite_store.conn.execute(
        "SELECT typeof(cid), typeof(data), count(*) FROM blocks GROUP BY 1, 2"
    ).fetchall()
    assert rows == [("blob", "blob", 5)]
    for cid, fact in zip(cids, facts, strict=True):
        data = sqlite_store.get(cid)
        assert type(data) is bytes and data == encode_fact(fact)[1]
    assert sqlite_store.put_encoded(encoded) == 0  # already stored: ignored
