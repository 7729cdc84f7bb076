"""The default block store: one SQLite file, WAL, fsync on every commit.

Layout (see docs/storage.md):

- ``blocks(id INTEGER PRIMARY KEY, cid BLOB UNIQUE, data BLOB)`` — every block,
  found by its binary CIDv1 through the ``cid`` index (ADR 0142: only CIDs go into the
  random-key B-tree; the data is appended to the rowid one);
- ``facts(rel TEXT, cid BLOB, PRIMARY KEY (rel, cid)) WITHOUT ROWID`` — the
  relation → fact-CID index that sources and queries scan;
- ``store_meta(key, value)`` — the schema version.

Other layers (replication, node) keep their own tables in the same file and
write them atomically with blocks through :meth:`SQLiteBlockStore.transaction`,
which nests: only the outermost level commits (inner levels are savepoints).
One connection serves all threads, guarded by a re-entrant lock.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import islice
from operator import attrgetter, itemgetter

import libipld

from .blockstore import BlockStore, SharedSQLite, verify
from .codec import Fact, decode_fact, encode_facts
from .errors import BlockNotFound, CIDMismatch, InvalidBlock, StoreError
from .gcpause import gc_paused
from .link import Link
from .sqlrun import RUN_MIN, insert_blocks_run

log = logging.getLogger(__name__)

#: The file's format version. 2 changes none of this module's tables: the other tables
#: sharing the file (replication's, ADR 0132) changed in a way a merklog reading version
#: 1 would misread, and that merklog refuses a newer version; a version-1 file is
#: marked 2 when it is opened (ADR 0133).
SCHEMA_VERSION = 2

# Per-connection (TEMP, never persisted): a view whose INSTEAD OF trigger stores a fact
# block and its index row, so put_facts binds each fact once instead of twice.
_INGEST = (
    "CREATE TEMP VIEW IF NOT EXISTS fact_ingest (cid, data, rel) AS SELECT NULL, NULL, NULL",
    """CREATE TEMP TRIGGER IF NOT EXISTS fact_ingest_insert INSTEAD OF INSERT ON fact_ingest
    BEGIN
        INSERT OR IGNORE INTO blocks (cid, data) VALUES (NEW.cid, NEW.data);
        INSERT OR IGNORE INTO facts (rel, cid) VALUES (NEW.rel, NEW.cid);
    END""",
)

#: Every block: the data appended to the rowid B-tree, the CID in the index ``UNIQUE``
#: makes (ADR 0142). ``{name}``: ``blocks``, or the table an old file's blocks move to.
_BLOCKS_TABLE = """CREATE TABLE IF NOT EXISTS {name} (
    id INTEGER PRIMARY KEY,
    cid BLOB NOT NULL UNIQUE,
    data BLOB NOT NULL
)"""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS store_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
{_BLOCKS_TABLE.format(name='blocks')};
CREATE TABLE IF NOT EXISTS facts (
    rel TEXT NOT NULL,
    cid BLOB NOT NULL,
    PRIMARY KEY (rel, cid)
) WITHOUT ROWID;
"""


def _rowid_blocks(conn: sqlite3.Connection, path: str) -> None:
    """Move the blocks of a file made before ADR 0142 (``blocks(cid PRIMARY KEY, data)
    WITHOUT ROWID``) into the rowid layout, inside the opening transaction.

    That layout kept each whole block in the CID-keyed B-tree, and a B-tree's interior
    pages hold whole records: a delta block of ~230 KB that became a divider was read
    from its overflow pages by every insert comparing against it (the blocks insert of a
    1M-fact ``put -f`` took 7.1 s of CPU, 3.1 s in this layout). Both layouts have the
    columns ``cid`` and ``data``, so every query reads either and a merklog from before
    reads the new one; the move is a one-time copy (0.9 s for 600,000 blocks)."""
    columns = [r[1] for r in conn.execute("PRAGMA table_info(blocks)")]
    if "id" in columns:
        return
    (count,) = conn.execute("SELECT count(*) FROM blocks").fetchone()
    log.info("moving %d blocks of %s into the rowid layout (ADR 0142)", count, path)
    conn.execute(_BLOCKS_TABLE.format(name="blocks_rowid"))
    conn.execute("INSERT INTO blocks_rowid (cid, data) SELECT cid, data FROM blocks ORDER BY cid")
    conn.execute("DROP TABLE blocks")
    conn.execute("ALTER TABLE blocks_rowid RENAME TO blocks")


#: WAL pages (16 KiB each) after which a commit checkpoints them into the database.
WAL_CHECKPOINT_PAGES = 16384
#: Page size of new store files.
PAGE_SIZE = 16384
#: Rows fetched per page by the iterators: constant memory, lock not held between pages.
PAGE = 10_000
#: Parameters per ``IN (...)`` query (SQLite's default limit is far above this).
_IN_CHUNK = 500


class SQLiteBlockStore(BlockStore):
    """A durable, verifying block store plus fact index in a single SQLite file."""

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, cache_mb: int = 128
    ) -> None:
        self.path = os.fspath(path)
        self.lock = threading.RLock()
        self._depth = 0
        self.conn = self._connect(busy_timeout)
        try:
            self._open(cache_mb)
        except BaseException:
            self.conn.close()
            raise

    def _connect(self, busy_timeout: float) -> sqlite3.Connection:
        """The store's one connection (a subclass may give it another factory)."""
        return sqlite3.connect(
            self.path,
            isolation_level=None,  # autocommit; transaction() issues BEGIN/COMMIT itself
            check_same_thread=False,
            timeout=busy_timeout,
        )

    def _open(self, cache_mb: int) -> None:
        """Set the connection up and create (or check) the schema."""
        with self.lock:
            # 16 KiB pages (new files only): ingest into the random-key B-trees costs ~20%
            # less CPU than with 4 KiB pages (bench/ingest.py), reads are unaffected.
            self.conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal" and self.path != ":memory:":
                raise StoreError(f"{self.path}: SQLite refused WAL journal mode ({mode})")
            self.conn.execute("PRAGMA synchronous=FULL")
            # Page cache (allocated as used): bulk ingest into random-key B-trees needs it.
            self.conn.execute(f"PRAGMA cache_size={-1024 * int(cache_mb)}")
            self.conn.execute("PRAGMA temp_store=MEMORY")
            # Checkpoint every ~256 MB of WAL rather than ~4 MB: a page rewritten by several
            # write transactions is then copied back to the database once, not once per
            # transaction (a 20k-fact write dirties most leaves of three random-key B-trees;
            # 2,500 pages checkpointed after nearly every one, ADR 0110).
            self.conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            with self.transaction():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
                row = self.conn.execute(
                    "SELECT value FROM store_meta WHERE key = 'schema_version'"
                ).fetchone()
                if row is None:
                    self.conn.execute(
                        "INSERT INTO store_meta VALUES ('schema_version', ?)",
                        (str(SCHEMA_VERSION),),
                    )
                elif int(row[0]) > SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path}: store schema version {row[0]} is newer than this "
                        f"merklog understands ({SCHEMA_VERSION})"
                    )
                elif int(row[0]) < SCHEMA_VERSION:
                    self.conn.execute(
                        "UPDATE store_meta SET value = ? WHERE key = 'schema_version'",
                        (str(SCHEMA_VERSION),),
                    )
                _rowid_blocks(self.conn, self.path)
                for statement in _INGEST:
                    self.conn.execute(statement)

    # ------------------------------------------------------------ transactions

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Run a block atomically; nests (inner levels are savepoints, the outermost commits).

        The lock is held for the whole block, so other threads wait rather than
        see or join a half-done transaction.
        """
        with self.lock:
            depth = self._depth
            if depth == 0:
                self.conn.execute("BEGIN IMMEDIATE")
            else:
                self.conn.execute(f"SAVEPOINT sp{depth}")
            self._depth = depth + 1
            try:
                yield self.conn
            except BaseException:
                self._depth = depth
                if depth == 0:
                    if self.conn.in_transaction:  # SQLite may already have rolled back
                        self.conn.execute("ROLLBACK")
                else:
                    self.conn.execute(f"ROLLBACK TO sp{depth}")
                    self.conn.execute(f"RELEASE sp{depth}")
                raise
            self._depth = depth
            if depth == 0:
                self.conn.execute("COMMIT")
            else:
                self.conn.execute(f"RELEASE sp{depth}")

    def shared_sqlite(self) -> SharedSQLite:
        """This store's connection, lock and transaction, for tables kept beside the blocks."""
        return SharedSQLite(self.conn, self.lock, self.transaction, "blocks")

    def set_cache_mb(self, cache_mb: int) -> None:
        """Set this connection's page cache limit in MiB (pages are allocated as used).

        A bulk writer in a short-lived process (``merklog put -f`` on a stopped home)
        raises it: a write walks three random-key B-trees larger than the default
        cache at 1M facts, and re-reading evicted pages cost ~9% of its CPU (ADR 0110).
        A long-running node keeps the default."""
        with self.lock:
            self.conn.execute(f"PRAGMA cache_size={-1024 * int(cache_mb)}")

    def set_wal_checkpoint_mb(self, wal_mb: int) -> None:
        """Checkpoint this connection's WAL once it holds ``wal_mb`` MiB, not
        ``WAL_CHECKPOINT_PAGES`` pages.

        A bulk writer in a short-lived process (``merklog put -f`` on a stopped home)
        raises it: its commits rewrite most leaves of the random-key B-trees, so a
        checkpoint during the write copies pages that later commits rewrite again, and
        the connection's close checkpoints anyway. At 1M facts the WAL reaches ~520 MB
        and the 256 MB default checkpointed once mid-write (ADR 0152). The WAL file
        takes that much disk until the close."""
        with self.lock:
            (page_size,) = self.conn.execute("PRAGMA page_size").fetchone()
            pages = max(1, (int(wal_mb) << 20) // int(page_size))
            self.conn.execute(f"PRAGMA wal_autocheckpoint={pages}")

    @property
    def in_transaction(self) -> bool:
        """True while a transaction() block is open (on any thread holding the lock)."""
        return self._depth > 0

    # ------------------------------------------------------------ blocks

    def put_many(self, blocks: Iterable[tuple[Link, bytes]]) -> int:
        rows = [(cid.raw, verify(cid, bytes(data), "put")) for cid, data in blocks]
        return self._insert_blocks(rows)

    def put_encoded(self, blocks: list[tuple[Link, bytes]]) -> int:
        """Blocks whose CIDs were computed from these bytes in this process: stored
        without the re-hash ``put_many`` does, in CID order. Many blocks go in as one
        statement, which runs without the GIL (:mod:`.sqlrun`, ADR 0143)."""
        if len(blocks) >= RUN_MIN:
            cids = list(map(_raw_of, map(_first, blocks)))
            with self.transaction() as conn:
                before = conn.total_changes
                if insert_blocks_run(conn, cids, list(map(_second, blocks))):
                    return conn.total_changes - before
        return self._insert_blocks([(cid.raw, data) for cid, data in blocks])

    def _insert_blocks(self, rows: list[tuple[bytes, bytes]]) -> int:
        if not rows:
            return 0
        rows.sort(key=_first)
        # Bound as bytearrays: the sqlite3 module binds a bytearray directly but sends each
        # ``bytes`` parameter through its adapter lookup (a tuple key, a dict probe and two
        # attribute lookups), which cost more than the copy (ADR 0126).
        bound = zip(
            map(bytearray, map(_first, rows)), map(bytearray, map(_second, rows)), strict=True
        )
        with self.transaction() as conn:
            before = conn.total_changes
            conn.executemany("INSERT OR IGNORE INTO blocks (cid, data) VALUES (?, ?)", bound)
            return conn.total_changes - before

    def get(self, cid: Link) -> bytes:
        with self.lock:
            row = self.conn.execute("SELECT data FROM blocks WHERE cid = ?", (cid.raw,)).fetchone()
        if row is None:
            raise BlockNotFound(cid)
        return verify(cid, row[0], f"sqlite {self.path}")

    def get_many(self, cids: Iterable[Link]) -> Iterator[tuple[Link, bytes]]:
        """Verified blocks in the order asked, read in ``IN (...)`` batches of 500."""
        it = iter(cids)
        while chunk := list(islice(it, _IN_CHUNK)):
            raws = list({c.raw: None for c in chunk})
            marks = ",".join("?" * len(raws))
            with self.lock:
                found = dict(
                    self.conn.execute(
                        f"SELECT cid, data FROM blocks WHERE cid IN ({marks})", raws
                    ).fetchall()
                )
            for cid in chunk:
                data = found.get(cid.raw)
                if data is None:
                    raise BlockNotFound(cid)
                yield cid, verify(cid, data, f"sqlite {self.path}")

    def has(self, cid: Link) -> bool:
        with self.lock:
            row = self.conn.execute("SELECT 1 FROM blocks WHERE cid = ?", (cid.raw,)).fetchone()
        return row is not None

    def _select_in(self, columns: str, cids: Iterable[Link]) -> Iterator[tuple[Link, tuple]]:
        """``SELECT cid, {columns} FROM blocks`` for the stored ones of ``cids``, asked in
        chunks of ``_IN_CHUNK``: each row as (its CID, the other columns)."""
        it = iter(cids)
        while chunk := list(islice(it, _IN_CHUNK)):
            by_raw = {c.raw: c for c in chunk}
            marks = ",".join("?" * len(by_raw))
            with self.lock:
                rows = self.conn.execute(
                    f"SELECT cid, {columns} FROM blocks WHERE cid IN ({marks})", list(by_raw)
                ).fetchall()
            for raw, *rest in rows:
                yield by_raw[bytes(raw)], tuple(rest)

    def has_many(self, cids: Iterable[Link]) -> set[Link]:
        return {cid for cid, _ in self._select_in("1", cids)}

    def sizes(self, cids: Iterable[Link]) -> dict[Link, int]:
        """Stored sizes from ``length(data)``, which SQLite answers from the record
        header without reading a large block's overflow pages."""
        return {cid: int(size) for cid, (size,) in self._select_in("length(data)", cids)}

    def iter_cids(self) -> Iterator[Link]:
        for (raw,) in self._pages("SELECT cid FROM blocks WHERE cid > ? ORDER BY cid LIMIT ?"):
            yield Link._trusted(raw)

    def scan_prefixed(
        self, prefix: bytes, batch: int = 65_536, lo: bytes = b"", hi: bytes | None = None
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        """Every block whose data starts with ``prefix`` and whose raw CID lies in
        ``[lo, hi)``, as ``(raw CID, data)`` pages of at most ``batch`` in CID order: one
        keyset-paginated scan of the CID index, the lock held per page.

        For bulk readers (the Parquet export reads every fact block this way, ~25x
        cheaper per block than lookups by CID). Blocks are *not* re-hashed here: the
        caller checks a whole page at once (see ``merklog.node.spark.export``)."""
        upper = "" if hi is None else " AND cid < ?2"  # bounds the index search uses
        sql = (
            "SELECT cid, data FROM blocks WHERE cid {} ?1" + upper
            + " AND substr(data, 1, ?3) = ?4 ORDER BY cid LIMIT ?5"
        )
        query, start = sql.format(">="), lo  # the first page from lo on, then after the last
        while True:
            with self.lock:
                rows = self.conn.execute(query, (start, hi, len(prefix), prefix, batch)).fetchall()
            if rows:
                yield rows
            if len(rows) < batch:
                return
            query, start = sql.format(">"), rows[-1][0]

    def file_for_readers(self) -> str | None:
        return self.path

    def _pages(self, sql: str, *params: object) -> Iterator[tuple]:
        """Keyset pagination on a query whose last parameter pair is (after cid, limit)."""
        after = b""
        while True:
            with self.lock:
                rows = self.conn.execute(sql, (*params, after, PAGE)).fetchall()
            yield from rows
            if len(rows) < PAGE:
                return
            after = rows[-1][0]

    def delete_many(self, cids: Iterable[Link]) -> int:
        removed = 0
        with self.transaction() as conn:
            for cid in cids:
                row = conn.execute("SELECT data FROM blocks WHERE cid = ?", (cid.raw,)).fetchone()
                if row is None:
                    continue
                conn.execute("DELETE FROM blocks WHERE cid = ?", (cid.raw,))
                removed += 1
                rel = _fact_relation(row[0])
                if rel is not None:
                    conn.execute("DELETE FROM facts WHERE rel = ? AND cid = ?", (rel, cid.raw))
        return removed

    def __len__(self) -> int:
        with self.lock:
            return self.conn.execute("SELECT count(*) FROM blocks").fetchone()[0]

    # ------------------------------------------------------------ facts

    def put_facts(self, facts: Iterable[Fact]) -> list[Link]:
        """Store fact blocks and their relation index rows in one transaction; return the CIDs.

        Facts must be valid (built with ``make_fact`` or decoded); the CIDs are
        computed here, so the blocks are right by construction.
        """
        facts = facts if isinstance(facts, list | tuple) else list(facts)
        with gc_paused():
            encoded = encode_facts(facts)
            cids = [cid for cid, _ in encoded]
            if not cids:
                return cids
            # CID order turns random B-tree inserts into one in-order pass over the pages.
            rows = sorted(
                [
                    (cid.raw, data, fact.rel)
                    for fact, (cid, data) in zip(facts, encoded, strict=True)
                ],
                key=_first,
            )
        # CID and block bound as bytearrays (see _insert_blocks).
        bound = zip(
            map(bytearray, map(_first, rows)),
            map(bytearray, map(_second, rows)),
            map(_third, rows),
            strict=True,
        )
        with self.transaction() as conn:
            # One bound row per fact; the trigger writes block and index row inside SQLite.
            conn.executemany(
                "INSERT INTO temp.fact_ingest (cid, data, rel) VALUES (?, ?, ?)", bound
            )
        return cids

    def fact_cids(self, rel: str) -> Iterator[Link]:
        """CIDs of the stored facts of one relation (index only: no block is read)."""
        sql = "SELECT cid FROM facts WHERE rel = ? AND cid > ? ORDER BY cid LIMIT ?"
        after = b""
        while True:
            with self.lock:
                rows = self.conn.execute(sql, (rel, after, PAGE)).fetchall()
            for (raw,) in rows:
                yield Link._trusted(raw)
            if len(rows) < PAGE:
                return
            after = rows[-1][0]

    def facts(self, rel: str | None = None) -> Iterator[tuple[Link, Fact]]:
        """Stored facts (all, or of one relation), each block verified and decoded."""
        rels = [rel] if rel is not None else self.relations()
        sql = (
            "SELECT f.cid, b.data FROM facts f LEFT JOIN blocks b ON b.cid = f.cid "
            "WHERE f.rel = ? AND f.cid > ? ORDER BY f.cid LIMIT ?"
        )
        for name in rels:
            after = b""
            while True:
                with self.lock:
                    rows = self.conn.execute(sql, (name, after, PAGE)).fetchall()
                for raw, data in rows:
                    cid = Link._trusted(raw)
                    if data is None:
                        raise BlockNotFound(cid)
                    verify(cid, data, f"sqlite {self.path}")
                    fact = decode_fact(data)
                    if fact.rel != name:
                        raise InvalidBlock(
                            f"fact {cid} is indexed under {name!r}, not {fact.rel!r}"
                        )
                    yield cid, fact
                if len(rows) < PAGE:
                    break
                after = rows[-1][0]

    def relations(self) -> list[str]:
        """Names of the relations having at least one stored fact, sorted."""
        # Skip-scan over the (rel, cid) primary key: O(relations · log n), not a full scan.
        sql = """
            WITH RECURSIVE r(rel) AS (
                SELECT min(rel) FROM facts
                UNION ALL
                SELECT (SELECT min(rel) FROM facts WHERE rel > r.rel) FROM r
                WHERE r.rel IS NOT NULL
            )
            SELECT rel FROM r WHERE rel IS NOT NULL
        """
        with self.lock:
            return [row[0] for row in self.conn.execute(sql)]

    def count_facts(self, rel: str | None = None) -> int:
        """Number of indexed facts (of one relation, or of all)."""
        with self.lock:
            if rel is None:
                return self.conn.execute("SELECT count(*) FROM facts").fetchone()[0]
            return self.conn.execute("SELECT count(*) FROM facts WHERE rel = ?", (rel,)).fetchone()[
                0
            ]

    # ------------------------------------------------------------ maintenance

    def integrity_check(self) -> list[str]:
        """Problems found (empty list = healthy): SQLite's own check, every block re-hashed,
        every fact index row backed by a block of that relation."""
        problems: list[str] = []
        with self.lock:
            rows = self.conn.execute("PRAGMA integrity_check").fetchall()
        if [r[0] for r in rows] != ["ok"]:
            problems.extend(f"sqlite: {r[0]}" for r in rows)
            return problems
        sql = "SELECT cid, data FROM blocks WHERE cid > ? ORDER BY cid LIMIT ?"
        for raw, data in self._pages(sql):
            try:
                cid = Link(raw)
                verify(cid, data, "integrity check")
            except (CIDMismatch, ValueError) as exc:
                problems.append(f"block {raw.hex()}: {exc}")
        orphan_sql = (
            "SELECT f.rel, f.cid FROM facts f LEFT JOIN blocks b ON b.cid = f.cid "
            "WHERE b.cid IS NULL LIMIT 1000"
        )
        with self.lock:
            orphans = self.conn.execute(orphan_sql).fetchall()
        problems.extend(
            f"fact index row {rel}/{Link._trusted(raw)} has no block" for rel, raw in orphans
        )
        return problems

    def close(self) -> None:
        with self.lock:
            if self._depth:
                raise StoreError("cannot close the store inside an open transaction")
            self.conn.close()

    def __repr__(self) -> str:
        return f"SQLiteBlockStore({self.path!r})"


_first = itemgetter(0)
_second = itemgetter(1)
_raw_of = attrgetter("raw")
_third = itemgetter(2)


def _fact_relation(data: bytes) -> str | None:
    """The relation of a fact block, or None for any other block."""
    try:
        obj = libipld.decode_dag_cbor(data)
    except Exception:  # not decodable: not a fact either
        return None
    if isinstance(obj, dict) and set(obj) == {"rel", "args"} and isinstance(obj["rel"], str):
        return obj["rel"]
    return None
