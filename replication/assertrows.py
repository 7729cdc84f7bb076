"""Inserting ``repl_assert`` rows in bulk: one statement per run of equal-shaped rows.

A local write of 200,000 facts inserts 200,000 ``(ds, fact, delta, killed)`` rows.
Bound one Python tuple per row through ``executemany``, the binding alone (four
parameters adapted per row) cost about as much CPU as SQLite's B-tree insert. Here a
run of rows with the same dataset, ``killed`` flag and CID lengths goes to SQLite as
one blob of ``fact || delta`` records, sorted, and a recursive CTE cuts it into rows
inside SQLite — the technique :mod:`.relindex` uses for its index (ADR 0095, ADR 0110).

``repl_assert`` names a fact by its id in ``repl_fact`` (ADR 0132): a run first gives
its fact CIDs ids (``INSERT OR IGNORE``, in CID order), then inserts its rows with the
ids looked up in that same statement. A local bulk write of facts new to the database
(:func:`insert_new_facts`) knows its ids without a lookup: one insert hands out
consecutive ids, so its assert rows append at the end of their tree and each relation's
facts are one id range of the relation index (ADR 0151).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from itertools import compress
from operator import add, itemgetter

from merklog.store.sqlrun import byte_argsort, run_cte

from . import relindex
from .sqlutil import NUMPY_SORT_MIN, sorted_blob

#: The recursive CTE that cuts blob ``?1``-long into ``?2``-byte records (``run.i`` the
#: offset of each), shared by every statement here.
_RUN = run_cte("?1", "?2")

#: ``?3`` fact CID length, ``?6`` the sorted records: their fact CIDs get ids.
_INSERT_FACTS = (
    _RUN
    + """
INSERT OR IGNORE INTO repl_fact (cid) SELECT substr(?6, i + 1, ?3) FROM run
"""
)

#: ``?1`` blob length, ``?2`` record size, ``?3`` fact CID length, ``?4`` ds,
#: ``?5`` killed, ``?6`` the sorted records; ``?7`` delta CID length. The fact ids are
#: read from ``repl_fact`` (one probe of its CID index per row, pages the ids' insert
#: just touched).
_INSERT_RUN = (
    _RUN
    + """
INSERT INTO repl_assert (ds, fact, delta, killed)
SELECT ?4, f.id, substr(?6, i + 1 + ?3, ?7), ?5
FROM run CROSS JOIN repl_fact AS f WHERE f.cid = substr(?6, i + 1, ?3)
"""
)

#: :data:`_INSERT_RUN` when the run's facts got the consecutive ids ``?8``, ``?8 + 1``, …
#: in record order: no lookup.
_INSERT_RUN_IDS = (
    _RUN
    + """
INSERT INTO repl_assert (ds, fact, delta, killed)
SELECT ?4, ?8 + i / ?2, substr(?6, i + 1 + ?3, ?7), ?5 FROM run
"""
)


def insert_asserts(conn: sqlite3.Connection, rows: Iterable[tuple[int, bytes, bytes, int]]) -> int:
    """Insert ``(ds, fact CID, delta CID, killed)`` rows (inside the caller's
    transaction), each run in primary-key order; returns how many rows went in.

    A duplicate ``(ds, fact, delta)`` raises ``sqlite3.IntegrityError`` as a plain
    ``INSERT`` would (nothing of that statement is kept)."""
    rows = rows if isinstance(rows, list) else list(rows)
    runs = _one_run(rows)
    if runs is None:
        runs = _runs(rows)
    count = 0
    for (ds, killed, fact_len, delta_len), records in runs.items():
        if fact_len == 0 or delta_len == 0:  # substr cannot cut empty fields: bind them
            pairs = sorted((r[:fact_len], r[fact_len:]) for r in records)
            conn.executemany(
                "INSERT OR IGNORE INTO repl_fact (cid) VALUES (?)", [(f,) for f, _d in pairs]
            )
            conn.executemany(
                "INSERT INTO repl_assert SELECT ?, id, ?, ? FROM repl_fact WHERE cid = ?",
                [(ds, d, killed, f) for f, d in pairs],
            )
        else:
            _insert_run(conn, ds, killed, records, fact_len, delta_len)
        count += len(records)
    return count


def insert_new_facts(
    conn: sqlite3.Connection,
    ds: int,
    records: list[bytes],
    rels: list[str],
    fact_len: int,
    delta_len: int,
) -> int:
    """Insert a local bulk write's live asserts and relation-index entries (ADR 0127,
    0132, 0151): ``records[k]`` is ``fact || delta`` of a fact of relation ``rels[k]``,
    facts unique.

    The facts get ids in one insert, relation by relation and in CID order within each
    (an in-order pass over the CID index of ``repl_fact`` per relation). When all of
    them are new to the database (the bulk case) the ids are consecutive and known from
    that insert: the assert rows are generated inside SQLite from the first id (they
    append), and each relation's facts are one id range, indexed by one
    ``repl_rel_range`` row. Otherwise the ids are looked up and the index gets a row
    per fact."""
    if not records:
        return 0
    size = fact_len + delta_len
    names = sorted(set(rels))
    if len(records) >= NUMPY_SORT_MIN and all(type(name) is str for name in names):
        import numpy as np

        array = np.frombuffer(b"".join(records), dtype=f"S{size}")
        order = byte_argsort(array)  # equal-length strings: byte order
        code = {name: k for k, name in enumerate(names)}
        codes = np.fromiter(map(code.__getitem__, rels), dtype=np.int32, count=len(records))
        if len(names) > 1:  # (relation, fact CID) order: a stable sort of the CID order
            order = order[np.argsort(codes[order], kind="stable")]
        blob, count = array[order].tobytes(), len(records)
        counts: list[int] | None = np.bincount(codes, minlength=len(names)).tolist()
    else:
        blob, count = sorted_blob(records, size)
        counts = [count] if len(names) == 1 else None  # else not grouped: no ranges
    first = _new_ids(conn, blob, size, fact_len, count)
    if first is None:  # some fact already had an id: look them up
        conn.execute(_INSERT_RUN, (len(blob), size, fact_len, ds, 0, blob, delta_len))
    else:
        conn.execute(_INSERT_RUN_IDS, (len(blob), size, fact_len, ds, 0, blob, delta_len, first))
    if first is not None and counts is not None:
        ranges, lo = [], first
        for name, n in zip(names, counts, strict=True):
            ranges.append((name, lo, lo + n - 1))
            lo += n
        relindex.record_ranges(conn, ds, ranges)
    else:
        for name in names:
            run = records if len(names) == 1 else list(compress(records, map(name.__eq__, rels)))
            run_blob, _count = sorted_blob(run, size)
            _insert_rel_lookup(conn, ds, name, run_blob, size, fact_len)
    return len(records)


def _new_ids(
    conn: sqlite3.Connection, blob: bytes, size: int, fact_len: int, count: int
) -> int | None:
    """Give the sorted records' fact CIDs ids; the first id if all ``count`` were new
    (then they are consecutive, in record order), else None."""
    # Counted with total_changes and last_insert_rowid(): the cursor's rowcount and
    # lastrowid are not kept for a statement that starts with WITH.
    before = conn.total_changes
    conn.execute(_INSERT_FACTS, (len(blob), size, fact_len, None, None, blob))
    if conn.total_changes - before != count:
        return None
    (last,) = conn.execute("SELECT last_insert_rowid()").fetchone()
    first = int(last) - count + 1
    # One insert of a rowid table takes max(rowid) + 1 for each row in turn; check both
    # ends all the same rather than rely on it silently.
    ends = conn.execute(
        "SELECT id, cid FROM repl_fact WHERE id IN (?, ?) ORDER BY id", (first, last)
    ).fetchall()
    want = [blob[:fact_len], blob[len(blob) - size : len(blob) - size + fact_len]]
    if [bytes(c) for _i, c in ends] != (want[:1] if count == 1 else want):
        return None
    return first


def _insert_rel_lookup(
    conn: sqlite3.Connection, ds: int, rel: str, blob: bytes, size: int, fact_len: int
) -> None:
    conn.execute(
        _RUN + " INSERT OR IGNORE INTO repl_rel_fact (ds, rel, fact)"
        " SELECT ?4, ?5, f.id FROM run CROSS JOIN repl_fact AS f"
        " WHERE f.cid = substr(?6, i + 1, ?3) AND "
        + relindex.NOT_IN_RANGE.format(ds="?4", rel="?5", fact="f.id"),
        (len(blob), size, fact_len, ds, rel, blob),
    )


def _insert_run(
    conn: sqlite3.Connection,
    ds: int,
    killed: int,
    records: list[bytes],
    fact_len: int,
    delta_len: int,
) -> None:
    """One run of fixed-size records: ids for its facts (the new ones get theirs), then
    its rows with the ids looked up."""
    size = fact_len + delta_len
    blob, _count = sorted_blob(records, size)  # byte order is (fact, delta) order
    conn.execute(_INSERT_FACTS, (len(blob), size, fact_len, None, None, blob))
    conn.execute(_INSERT_RUN, (len(blob), size, fact_len, ds, killed, blob, delta_len))


def _one_run(rows: list) -> dict[tuple[int, int, int, int], list[bytes]] | None:
    """The runs of ``rows`` when they form one (the bulk case: one dataset, nothing
    killed, CIDs of one length), built with C-level passes (``map``) instead of a Python
    loop per row (ADR 0121); None when they do not."""
    if not rows:
        return {}
    facts = list(map(itemgetter(1), rows))
    deltas = list(map(itemgetter(2), rows))
    shape = (
        set(map(itemgetter(0), rows)),
        set(map(itemgetter(3), rows)),
        set(map(len, facts)),
        set(map(len, deltas)),
    )
    if any(len(values) != 1 for values in shape):
        return None
    ds, killed, fact_len, delta_len = (next(iter(values)) for values in shape)
    if type(ds) is not int or type(killed) is not int:
        return None
    return {(ds, killed, fact_len, delta_len): list(map(add, facts, deltas))}


def _runs(rows: list) -> dict[tuple[int, int, int, int], list[bytes]]:
    """The runs of ``rows``, one row at a time (rows of several shapes)."""
    runs: dict[tuple[int, int, int, int], list[bytes]] = {}
    for ds, fact, delta, killed in rows:
        key = (ds, killed, len(fact), len(delta))
        run = runs.get(key)
        record = fact + delta
        if run is None:
            runs[key] = [record]
        else:
            run.append(record)
    return runs
