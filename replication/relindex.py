"""The per-relation index of a replica's asserted facts: ``GET /v1/facts?rel=`` pages
that cost O(page) whatever the other relations hold (ADR 0095).

``repl_rel_fact(ds, rel, fact)`` (``fact`` the fact's ``repl_fact`` id, ADR 0132)
holds one row per fact some accepted delta of the
dataset asserts (or a bootstrap installed), written in the transaction that records
the assert (``ORSet._apply_asserts``, ``install_snapshot_state``). It is insert-only:
a page of relation ``R`` walks ``R``'s rows from the cursor and keeps the facts that
are visible now (one primary-key probe of ``repl_assert`` each), so retracted facts of
``R`` are skipped at read time and facts of other relations are never touched.

Homes made before the index existed are backfilled once when the replica opens
(:func:`ensure_index`): every asserted fact's block is read for its relation name.
``repl_index`` records which datasets have a complete index; a block that cannot be
read (missing or corrupted, see ``merklog fsck``) leaves the dataset unmarked, so the
backfill runs again at the next open, after a repair.

A local bulk write gives its new facts consecutive ids, relation by relation
(:func:`~.assertrows.insert_new_facts`), so each relation's facts of that write are one
id range: it is recorded as one ``repl_rel_range(ds, rel, lo, hi)`` row instead of
``hi - lo + 1`` rows of ``repl_rel_fact`` (ADR 0151: those rows cost ~1.2 µs a fact, a
sixth of the writer's time). A fact is in the index of ``(ds, rel)`` when it has a row
or lies in a range; :func:`record` adds no row for a fact a range already holds, so the
two never overlap. The view ``repl_rel_member`` shows both as rows.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence
from itertools import compress
from operator import itemgetter

import libipld

from merklog.store import BlockNotFound, BlockStore, CIDMismatch, Link
from merklog.store.sqlrun import run_cte

from .blocks import fast_link
from .sqlutil import sorted_blob

log = logging.getLogger(__name__)

#: The name of this index in ``repl_index`` (a dataset listed there is complete).
INDEX = "rel_fact"
#: Asserted facts read per backfill batch.
BACKFILL_BATCH = 10_000
#: How a canonical dag-cbor fact block ``{"rel": …, "args": …}`` starts: a 2-entry map
#: whose first key is ``"rel"`` (dag-cbor sorts keys by length first).
REL_KEY = b"\xa2crel"

#: SQL true when fact id ``{fact}`` lies in no range of ``repl_rel_range`` for dataset
#: ``{ds}`` and relation ``{rel}`` (SQL expressions): one descending probe of the
#: range key finds the last range starting at or before it.
NOT_IN_RANGE = (
    "coalesce((SELECT g.hi FROM repl_rel_range AS g WHERE g.ds = {ds} AND g.rel = {rel}"
    " AND g.lo <= {fact} ORDER BY g.lo DESC LIMIT 1), 0) < {fact}"
)

#: One statement per (dataset, relation) run: the run's CIDs (all ``?2`` bytes long) come
#: as one concatenated blob ``?5`` and a recursive CTE cuts it into rows inside SQLite.
#: Binding one Python row per fact cost about three times as much CPU (0.19 s against
#: 0.07 s per 100,000 rows), and this insert sits on every write path.
#: The index names a fact by its ``repl_fact`` id (ADR 0132): every fact indexed here has
#: an assert, so it has an id, looked up in the same statement.
_INSERT_RUN = f"""
{run_cte("?1", "?2")}
INSERT OR IGNORE INTO repl_rel_fact (ds, rel, fact)
SELECT ?3, ?4, f.id FROM run CROSS JOIN repl_fact AS f WHERE f.cid = substr(?5, i + 1, ?2)
AND {NOT_IN_RANGE.format(ds="?3", rel="?4", fact="f.id")}
"""


def record_ranges(
    conn: sqlite3.Connection, ds: int, ranges: Iterable[tuple[str, int, int]]
) -> None:
    """Index ``(relation, lo, hi)``: the facts with ids ``lo`` to ``hi`` (inclusive) are
    of that relation and asserted in dataset ``ds`` (inside the caller's transaction).
    The ids must be new to the index: a local write's consecutive new ids."""
    conn.executemany(
        "INSERT INTO repl_rel_range (ds, rel, lo, hi) VALUES (?, ?, ?, ?)",
        [(ds, rel, lo, hi) for rel, lo, hi in ranges],
    )


def record(conn: sqlite3.Connection, rows: Iterable[tuple[int, str, bytes]]) -> None:
    """Index ``(ds, relation, raw fact CID)`` rows (inside the caller's transaction): one
    insert per relation, its CIDs in key order (an in-order pass over the index pages)."""
    rows = rows if isinstance(rows, list) else list(rows)
    runs = _few_runs(rows)
    if runs is None:
        runs = {}
        for ds, rel, raw in rows:
            key = (ds, rel, len(raw))
            run = runs.get(key)
            if run is None:
                runs[key] = [raw]
            else:
                run.append(raw)
    for (ds, rel, size), raws in runs.items():
        blob, _count = sorted_blob(raws, size)
        conn.execute(_INSERT_RUN, (len(blob), size, ds, rel, blob))


#: Up to this many relations in one write, :func:`record` splits its rows by relation
#: with one C-level pass per relation instead of one Python step per row (ADR 0121).
_FEW_RELATIONS = 16


def _few_runs(rows: list) -> dict[tuple[int, str, int], list[bytes]] | None:
    """:func:`record`'s runs when ``rows`` hold one dataset, CIDs of one length and at
    most ``_FEW_RELATIONS`` relations (the bulk case), else None."""
    if not rows:
        return {}
    datasets = set(map(itemgetter(0), rows))
    rels = list(map(itemgetter(1), rows))
    raws = list(map(itemgetter(2), rows))
    names = set(rels)
    sizes = set(map(len, raws))
    if len(datasets) != 1 or len(sizes) != 1 or len(names) > _FEW_RELATIONS:
        return None
    if not all(type(name) is str for name in names):
        return None
    (ds,), (size,) = datasets, sizes
    if len(names) == 1:
        return {(ds, rels[0], size): raws}
    return {(ds, name, size): list(compress(raws, map(name.__eq__, rels))) for name in names}


def mark_complete(conn: sqlite3.Connection, ds: int) -> None:
    """Record that dataset ``ds``'s index holds every asserted fact (a new dataset's
    empty index, or a finished backfill)."""
    conn.execute("INSERT OR IGNORE INTO repl_index (ds, name) VALUES (?, ?)", (ds, INDEX))


def fact_relation(data: bytes) -> str | None:
    """The relation name of a fact block, or None if ``data`` is not one.

    Canonical blocks are read from their first bytes (``a2 63 "rel"`` then the name as a
    CBOR text string); anything else is decoded."""
    if data.startswith(REL_KEY) and len(data) > 6:
        head = data[5]
        if 0x60 <= head <= 0x77:
            start, size = 6, head - 0x60
        elif head == 0x78:
            start, size = 7, data[6]
        elif head == 0x79 and len(data) > 8:
            start, size = 8, int.from_bytes(data[6:8], "big")
        else:
            start, size = 0, -1
        if size >= 0 and start + size <= len(data):
            try:
                return data[start : start + size].decode("utf-8")
            except UnicodeDecodeError:
                return None
    try:
        obj = libipld.decode_dag_cbor(data)
    except Exception:  # not decodable: not a fact
        return None
    if isinstance(obj, dict) and set(obj) == {"rel", "args"} and isinstance(obj["rel"], str):
        return obj["rel"]
    return None


def ensure_index(conn: sqlite3.Connection, blockstore: BlockStore, ds: int) -> int:
    """Backfill dataset ``ds``'s index unless it is complete (inside the caller's
    transaction); returns how many facts were indexed."""
    done = conn.execute(
        "SELECT 1 FROM repl_index WHERE ds = ? AND name = ?", (ds, INDEX)
    ).fetchone()
    if done is not None:
        return 0
    sql = (
        "SELECT DISTINCT a.fact, f.cid FROM repl_assert a JOIN repl_fact f ON f.id = a.fact"
        " WHERE a.ds = ? AND a.fact > ? ORDER BY a.fact LIMIT ?"
    )
    after = 0
    indexed = unreadable = 0
    while True:
        got = conn.execute(sql, (ds, after, BACKFILL_BATCH)).fetchall()
        if not got:
            break
        rows, bad = _relations(blockstore, [fast_link(bytes(r[1])) for r in got])
        record(conn, ((ds, rel, cid.raw) for cid, rel in rows))
        indexed += len(rows)
        unreadable += bad
        if len(got) < BACKFILL_BATCH:
            break
        after = int(got[-1][0])
    if unreadable:
        log.warning(
            "%d asserted fact block(s) could not be read while indexing facts by relation;"
            " run `merklog fsck --repair-from PEER` (the index is completed at the next open)",
            unreadable,
        )
    else:
        mark_complete(conn, ds)
    if indexed:
        log.info("indexed %d facts by relation (once, for a home made before that index)", indexed)
    return indexed


def _relations(blockstore: BlockStore, cids: Sequence[Link]) -> tuple[list[tuple[Link, str]], int]:
    """``(cid, relation)`` of each readable fact block, and how many could not be read."""
    out: list[tuple[Link, str]] = []
    try:
        blocks = list(blockstore.get_many(cids))
    except (BlockNotFound, CIDMismatch):
        blocks = []
        for cid in cids:  # one bad block: read the others one by one
            try:
                blocks.append((cid, blockstore.get(cid)))
            except (BlockNotFound, CIDMismatch):
                continue
    bad = len(cids) - len(blocks)
    for cid, data in blocks:
        rel = fact_relation(data)
        if rel is None:
            bad += 1
        else:
            out.append((cid, rel))
    return out, bad
