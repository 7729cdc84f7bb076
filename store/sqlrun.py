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

#: From this many blocks on, :func:`insert_blocks_run` is worth its blobs.
RUN_MIN = 1_000
#: At most this many bytes of block data go into one statement (the bound blobs are
#: copied once by SQLite; its own limit is 1 GB).
RUN_MAX_BYTES = 64 << 20

#: ``?1`` row count, ``?2`` the CIDs back to back (``?3`` bytes each), ``?4`` the block
#: bytes back to back, ``?5`` the ``?1 + 1`` start offsets into ``?4`` as ASCII decimal
#: numbers of width ``?6`` (the last one the end of the last block).
_INSERT_BLOCKS = """
WITH RECURSIVE run(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM run WHERE i + 1 < ?1)
INSERT OR IGNORE INTO blocks (cid, data)
SELECT substr(?2, i * ?3 + 1, ?3),
       substr(?4, start + 1, CAST(substr(?5, (i + 1) * ?6 + 1, ?6) AS INTEGER) - start)
FROM (SELECT i, CAST(substr(?5, i * ?6 + 1, ?6) AS INTEGER) AS start FROM run)
"""


def decimal_blob(numbers: Any) -> tuple[bytes, int]:
    """Non-negative integers (a numpy int64 array, last one the largest) as ASCII
    decimal numbers of one width, zero-padded, back to back; and that width. SQLite's
    ``CAST(substr(…) AS INTEGER)`` reads each back."""
    import numpy as np

    width = len(str(int(numbers[-1]))) if len(numbers) else 1
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((numbers[:, None] // powers) % 10 + 48).astype(np.uint8).tobytes(), width


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
    order = np.argsort(keys, kind="stable")  # one length: numpy's order is byte order
    keys = keys[order]
    ordered = list(map(datas.__getitem__, order.tolist()))
    lengths = np.fromiter(map(len, ordered), dtype=np.int64, count=count)
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
