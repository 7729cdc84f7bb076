"""Many rows in one SQLite statement: the rows travel as a few bound blobs and a
recursive CTE cuts them apart inside SQLite.

Python's ``sqlite3`` releases the GIL only while SQLite runs a statement step, and
``executemany`` takes it back between rows to bind the next one. A bulk insert done
row by row therefore holds the GIL for most of its time and leaves no room for another
thread's Python; done as one statement, all of SQLite's work (the B-tree inserts) runs
without it, so ``put -f`` can check and encode its next chunk meanwhile (ADR 0143).
The replication tables' bulk inserts use the same technique (ADR 0095, ADR 0110).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

#: Rows of the inner loop of :func:`run_cte`.
_RUN_WIDTH = 1024


def run_cte(limit: str, step: str) -> str:
    """``WITH RECURSIVE … run(i)``: the rows ``i = 0, step, 2 * step, …`` below
    ``limit`` (SQL expressions, usually parameters), in ascending order; none when
    ``limit`` is 0. A statement appends its own ``INSERT``/``SELECT … FROM run``.

    This is how a run of records bound as one blob is cut into rows inside SQLite. A
    plain recursive CTE (``SELECT i + step FROM run``) costs ~0.42 µs a row in its queue;
    this one recurses only ``limit / 1024`` times and takes the rest from a cross join
    with a 1,024-row table, ~0.22 µs a row, for every row of every bulk insert. The
    ``CROSS JOIN`` keeps the outer table outside, so the rows come in ascending order,
    which the inserts rely on (consecutive ids in record order)."""
    w = _RUN_WIDTH
    return (
        f"WITH RECURSIVE run_lo(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM run_lo"
        f" WHERE k < {w - 1} AND (k + 1) * ({step}) < ({limit})),"
        f" run_hi(j) AS (SELECT 0 UNION ALL SELECT j + {w} FROM run_hi"
        f" WHERE (j + {w}) * ({step}) < ({limit})),"
        f" run(i) AS (SELECT (run_hi.j + run_lo.k) * ({step}) FROM run_hi CROSS JOIN run_lo"
        f" WHERE (run_hi.j + run_lo.k) * ({step}) < ({limit}))"
    )


#: From this many blocks on, :func:`insert_blocks_run` is worth its blobs.
RUN_MIN = 1_000
#: At most this many bytes of block data go into one statement (the bound blobs are
#: copied once by SQLite; its own limit is 1 GB).
RUN_MAX_BYTES = 64 << 20

#: ``?1`` row count, ``?2`` the CIDs back to back (``?3`` bytes each), ``?4`` the block
#: bytes back to back, ``?5`` the ``?1 + 1`` start offsets into ``?4`` as ASCII decimal
#: numbers of width ``?6`` (the last one the end of the last block).
_INSERT_BLOCKS = run_cte("?1", "1") + """
INSERT OR IGNORE INTO blocks (cid, data)
SELECT substr(?2, i * ?3 + 1, ?3),
       substr(?4, start + 1, CAST(substr(?5, (i + 1) * ?6 + 1, ?6) AS INTEGER) - start)
FROM (SELECT i, CAST(substr(?5, i * ?6 + 1, ?6) AS INTEGER) AS start FROM run)
"""


#: :data:`_INSERT_BLOCKS` with each block found where it lies in ``?4``, the blocks as
#: given (not in CID order): ``?5`` holds each row's start offset and length, as ASCII
#: decimal numbers of width ``?6``, ``2 * ?1`` of them.
_INSERT_BLOCKS_AT = run_cte("?1", "1") + """
INSERT OR IGNORE INTO blocks (cid, data)
SELECT substr(?2, i * ?3 + 1, ?3),
       substr(?4, CAST(substr(?5, 2 * i * ?6 + 1, ?6) AS INTEGER) + 1,
              CAST(substr(?5, (2 * i + 1) * ?6 + 1, ?6) AS INTEGER))
FROM run
"""


#: "0000" … "9999" (a numpy ``S4`` array, made on first use): :func:`decimal_blob` writes
#: four digits at a time.
_FOUR_DIGITS: Any = None


def decimal_blob(numbers: Any) -> tuple[bytes, int]:
    """Non-negative integers (a numpy int64 array) as ASCII decimal numbers of one
    width (a multiple of four), zero-padded, back to back; and that width. SQLite's
    ``CAST(substr(…) AS INTEGER)`` reads each back. Written four digits at a time from
    a table: two table lookups per number for numbers below 10**8."""
    import numpy as np

    global _FOUR_DIGITS
    if _FOUR_DIGITS is None:
        table = "".join(f"{i:04d}" for i in range(10_000)).encode()
        _FOUR_DIGITS = np.frombuffer(table, dtype="S4")
    largest = int(numbers.max()) if len(numbers) else 0
    groups = (len(str(largest)) + 3) // 4
    out = np.empty((len(numbers), groups), dtype="S4")
    rest = np.asarray(numbers, dtype=np.int64)
    for group in range(groups - 1, -1, -1):
        out[:, group] = _FOUR_DIGITS[rest % 10_000]
        rest = rest // 10_000
    return out.tobytes(), 4 * groups


def byte_argsort(keys: Any) -> Any:
    """``np.argsort(keys, kind="stable")`` of a numpy array of equal-length byte strings
    (``S{n}``), mostly without comparing whole strings (ADR 0146).

    CIDs of one kind share their first bytes (multicodec and multihash headers) and
    their digests are uniform, so the eight bytes after the prefix all of them share
    order them as a 64-bit integer sort does: ~4x less CPU than numpy's string sort
    (0.017 against 0.071 s for 200,000 CIDs). That order is taken only when those
    integers come out strictly increasing, where it is the one byte order there is;
    otherwise (equal strings, or two that share those eight bytes too) the string sort
    decides, so the result is always exactly the stable byte order."""
    import numpy as np

    count, size = len(keys), keys.dtype.itemsize
    if count < 2:
        return np.arange(count)
    rows = np.ascontiguousarray(keys).view(np.uint8).reshape(count, size)
    prefix = 0
    while prefix < size and bool((rows[:, prefix] == rows[0, prefix]).all()):
        prefix += 1
    if prefix + 8 > size:
        return np.argsort(keys, kind="stable")
    window = np.ascontiguousarray(rows[:, prefix : prefix + 8]).view(">u8").ravel()
    window = window.astype(np.uint64)
    order = np.argsort(window, kind="stable")
    ordered = window[order]
    if bool((ordered[1:] > ordered[:-1]).all()):
        return order
    return np.argsort(keys, kind="stable")


def insert_blocks_run(
    conn: sqlite3.Connection, cids: Sequence[bytes], datas: Sequence[bytes]
) -> bool:
    """``INSERT OR IGNORE`` the blocks ``(cids[k], datas[k])`` into ``blocks`` in CID
    order, a statement per ``RUN_MAX_BYTES`` of data; False (nothing done) when they do
    not fit the one-statement form: fewer than ``RUN_MIN``, CIDs of several lengths, or
    an empty block. Inside the caller's transaction; a repeated CID is stored once."""
    count = len(cids)
    if count < RUN_MIN or count != len(datas):
        return False
    size = len(cids[0])
    if size == 0 or set(map(len, cids)) != {size} or not all(datas):
        return False
    import numpy as np

    keys = np.frombuffer(b"".join(cids), dtype=f"S{size}")
    order = byte_argsort(keys)  # one length: numpy's order is byte order
    keys = keys[order]
    lengths = np.fromiter(map(len, datas), dtype=np.int64, count=count)
    if int(lengths.sum()) <= RUN_MAX_BYTES:
        # One statement: the blocks go as given, each row reads its block at its offset,
        # so no list of the blocks in CID order is built here (~0.3 µs a block).
        pairs = np.empty(2 * count, dtype=np.int64)
        pairs[0::2] = (np.cumsum(lengths) - lengths)[order]
        pairs[1::2] = lengths[order]
        digits, width = decimal_blob(pairs)
        conn.execute(
            _INSERT_BLOCKS_AT, (count, keys.tobytes(), size, b"".join(datas), digits, width)
        )
        return True
    ordered = list(map(datas.__getitem__, order.tolist()))
    lengths = lengths[order]
    start = 0
    while start < count:
        fits = int(np.searchsorted(np.cumsum(lengths[start:]), RUN_MAX_BYTES, "right"))
        end = start + max(1, fits)
        offsets = np.concatenate(([0], np.cumsum(lengths[start:end])))
        digits, width = decimal_blob(offsets)
        conn.execute(
            _INSERT_BLOCKS,
            (
                end - start,
                keys[start:end].tobytes(),
                size,
                b"".join(ordered[start:end]),
                digits,
                width,
            ),
        )
        start = end
    return True
