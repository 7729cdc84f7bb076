"""Inserting ``repl_assert`` rows in bulk: one statement per run of equal-shaped rows.

A local write of 200,000 facts inserts 200,000 ``(ds, fact, delta, killed)`` rows.
Bound one Python tuple per row through ``executemany``, the binding alone (four
parameters adapted per row) cost about as much CPU as SQLite's B-tree insert. Here a
run of rows with the same dataset, ``killed`` flag and CID lengths goes to SQLite as
one blob of ``fact || delta`` records, sorted (so the insert walks the primary key
``(ds, fact, delta)`` in order), and a recursive CTE cuts it into rows inside SQLite —
the technique :mod:`.relindex` uses for its index (ADR 0095, ADR 0110).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from operator import add, itemgetter

from .sqlutil import sorted_blob

#: ``?1`` blob length, ``?2`` record size, ``?3`` fact CID length, ``?4`` ds,
#: ``?5`` killed, ``?6`` the sorted records; ``?7`` delta CID length.
_INSERT_RUN = """
WITH RECURSIVE run(i) AS (SELECT 0 UNION ALL SELECT i + ?2 FROM run WHERE i + ?2 < ?1)
INSERT INTO repl_assert (ds, fact, delta, killed)
SELECT ?4, substr(?6, i + 1, ?3), substr(?6, i + 1 + ?3, ?7), ?5 FROM run
"""


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
            conn.executemany(
                "INSERT INTO repl_assert VALUES (?, ?, ?, ?)",
                [(ds, r[:fact_len], r[fact_len:], killed) for r in sorted(records)],
            )
        else:
            # Fixed-size records: byte order is (fact, delta) order.
            blob, _count = sorted_blob(records, fact_len + delta_len)
            conn.execute(
                _INSERT_RUN,
                (len(blob), fact_len + delta_len, fact_len, ds, killed, blob, delta_len),
            )
        count += len(records)
    return count


def insert_records(
    conn: sqlite3.Connection,
    ds: int,
    records: list[bytes],
    fact_len: int,
    delta_len: int,
) -> int:
    """Insert live (``killed`` 0) ``repl_assert`` rows given as ``fact || delta`` records,
    every fact CID ``fact_len`` and every delta CID ``delta_len`` bytes long (both > 0):
    one sorted blob, cut by SQLite, as :func:`insert_asserts` does for such a run. A
    local bulk write builds the records column-wise (ADR 0127)."""
    if not records:
        return 0
    blob, _count = sorted_blob(records, fact_len + delta_len)
    conn.execute(_INSERT_RUN, (len(blob), fact_len + delta_len, fact_len, ds, 0, blob, delta_len))
    return len(records)


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
