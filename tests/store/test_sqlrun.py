"""Blocks stored as one statement (ADR 0143): the same rows as one bound row a block."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.store import encode_fact, make_fact, sqlrun
from merklog.store.sqlite import SQLiteBlockStore
from merklog.store.sqlrun import byte_argsort

_MIXED = (1, 1.0, True, "1", b"\x01", -(2**63), 2**63 - 1, -0.5, "", b"", "é")


def _blocks(n: int, start: int = 0) -> list:
    """``n`` fact blocks of mixed-type values (and lengths from 8 to ~3,000 bytes)."""
    facts = [
        make_fact("v", [_MIXED[i % len(_MIXED)], i, "x" * (i % 3000)])
        for i in range(start, start + n)
    ]
    return [encode_fact(f) for f in facts]


def _rows(path) -> list[tuple[bytes, bytes, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT cid, data, typeof(data) FROM blocks ORDER BY cid").fetchall()
    finally:
        conn.close()


def test_a_run_stores_the_rows_bound_rows_store(tmp_path):
    """One statement and one bound row a block leave the same table: every block byte
    for byte, each CID once (repeats in the call and blocks already stored ignored),
    BLOBs that read back as ``bytes``; the counts say what went in."""
    blocks = _blocks(3000)
    assert len(blocks) >= sqlrun.RUN_MIN
    calls = [blocks[:1000], blocks[500:] + blocks[:10]]  # overlaps: stored once
    stores = {}
    for form in ("run", "rows"):
        store = SQLiteBlockStore(tmp_path / f"{form}.sqlite")
        counts = []
        for call in calls:
            if form == "run":
                counts.append(store.put_encoded(call))
            else:
                counts.append(store._insert_blocks([(c.raw, d) for c, d in call]))
        store.close()
        stores[form] = (counts, _rows(tmp_path / f"{form}.sqlite"))
    assert stores["run"] == stores["rows"]
    counts, rows = stores["run"]
    assert counts == [1000, 2000]
    assert {t for _c, _d, t in rows} == {"blob"}
    assert [(c, d) for c, d, _t in rows] == sorted((c.raw, d) for c, d in blocks)
    store = SQLiteBlockStore(tmp_path / "run.sqlite")
    for cid, data in blocks[::97]:
        assert type(store.get(cid)) is bytes and store.get(cid) == data
    store.close()


def test_a_run_over_the_byte_bound_is_cut_into_several_statements(tmp_path, monkeypatch):
    """Runs are cut at ``RUN_MAX_BYTES`` of data (a block larger than the bound goes
    alone): the stored rows are the same."""
    monkeypatch.setattr(sqlrun, "RUN_MAX_BYTES", 5000)
    statements = []
    blocks = _blocks(1200, start=2000)
    conn = sqlite3.connect(tmp_path / "cut.sqlite")
    conn.execute("CREATE TABLE blocks (id INTEGER PRIMARY KEY, cid BLOB UNIQUE, data BLOB)")
    conn.set_trace_callback(lambda sql: statements.append(sql) if "run(i)" in sql else None)
    assert sqlrun.insert_blocks_run(conn, [c.raw for c, _d in blocks], [d for _c, d in blocks])
    conn.commit()
    conn.close()
    assert len(statements) > 100  # many blocks are over 2,500 bytes
    assert [(c, d) for c, d, _t in _rows(tmp_path / "cut.sqlite")] == sorted(
        (c.raw, d) for c, d in blocks
    )


@pytest.mark.parametrize(
    "change",
    ["few", "two CID lengths", "an empty block", "columns of two lengths"],
)
def test_calls_outside_the_one_statement_form_are_declined(tmp_path, change):
    """Fewer than ``RUN_MIN`` blocks, CIDs of several lengths or an empty block: the
    run declines (False, nothing written) so the caller binds rows."""
    blocks = _blocks(sqlrun.RUN_MIN)
    cids = [c.raw for c, _d in blocks]
    datas = [d for _c, d in blocks]
    if change == "few":
        cids, datas = cids[:-1], datas[:-1]
    elif change == "two CID lengths":
        cids[7] = cids[7] + b"\x00"
    elif change == "an empty block":
        datas[3] = b""
    else:
        datas = datas[:-1]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE blocks (id INTEGER PRIMARY KEY, cid BLOB UNIQUE, data BLOB)")
    assert sqlrun.insert_blocks_run(conn, cids, datas) is False
    assert conn.execute("SELECT count(*) FROM blocks").fetchone() == (0,)


@pytest.mark.parametrize(
    "numbers",
    [[0], [0, 9, 10, 99], [5, 1234567, 10**12], [7] * 3, [10**12, 5, 1234567], [99, 0, 10]],
)
def test_decimal_blob_reads_back_in_sqlite(numbers):
    """In any order (the largest need not be last): each number reads back."""
    digits, width = sqlrun.decimal_blob(np.array(numbers, dtype=np.int64))
    assert width >= len(str(max(numbers))) and len(digits) == width * len(numbers)
    conn = sqlite3.connect(":memory:")
    back = [
        conn.execute(
            "SELECT CAST(substr(?, ?, ?) AS INTEGER)", (digits, k * width + 1, width)
        ).fetchone()[0]
        for k in range(len(numbers))
    ]
    assert back == numbers


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=40).flatmap(
        lambda size: st.tuples(
            st.just(size),
            st.binary(min_size=0, max_size=size),  # a prefix every key shares
            st.lists(st.binary(min_size=size, max_size=size), max_size=60),
            st.lists(st.integers(min_value=0, max_value=59), max_size=10),  # repeats
        )
    )
)
def test_byte_argsort_is_the_stable_byte_order(case: tuple) -> None:
    """CID-like keys (a shared prefix, then random bytes), repeated keys and keys that
    share more than eight bytes after the prefix: always numpy's stable string order."""
    size, prefix, tails, repeats = case
    keys = [(prefix + tail)[:size] for tail in tails]
    keys += [keys[i % len(keys)] for i in repeats] if keys else []
    array = np.frombuffer(b"".join(keys), dtype=f"S{size}") if keys else np.zeros(0, f"S{size}")
    assert byte_argsort(array).tolist() == np.argsort(array, kind="stable").tolist()


def test_byte_argsort_sorts_cids_by_their_digests() -> None:
    import hashlib

    cids = [
        bytes([1, 0x71, 0x12, 0x20]) + hashlib.sha256(bytes([i % 251, i // 251])).digest()
        for i in range(20_000)
    ]
    array = np.frombuffer(b"".join(cids), dtype="S36")
    order = byte_argsort(array)
    assert [cids[i] for i in order] == sorted(cids)


@pytest.mark.parametrize(
    ("limit", "step"),
    [
        (0, 1),
        (1, 1),
        (5, 1),
        (1023, 1),
        (1024, 1),
        (1025, 1),
        (2048 + 7, 1),
        (3 * 1024, 1),
        (72, 72),
        (72 * 1024, 72),
        (72 * 1025, 72),
        (72 * 5000, 72),
        (36 * 3, 36),
    ],
)
def test_run_cte_gives_every_offset_below_the_limit_once_in_ascending_order(limit, step):
    conn = sqlite3.connect(":memory:")
    sql = sqlrun.run_cte("?1", "?2") + " SELECT i FROM run"
    got = [i for (i,) in conn.execute(sql, (limit, step))]
    assert got == list(range(0, limit, step))


def test_run_cte_keeps_record_order_in_an_insert_of_consecutive_ids():
    """The bulk inserts rely on rows arriving in ascending order: a rowid table filled
    from the run numbers its rows in record order."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, rec BLOB UNIQUE NOT NULL)")
    records = [i.to_bytes(4, "big") for i in range(5000)]
    blob = b"".join(records)
    conn.execute(
        sqlrun.run_cte("?1", "?2") + " INSERT INTO t (rec) SELECT substr(?3, i + 1, ?2) FROM run",
        (len(blob), 4, blob),
    )
    assert [bytes(r) for (r,) in conn.execute("SELECT rec FROM t ORDER BY id")] == records
