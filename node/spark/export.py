"""Stream a replica's log (one row per op) and its visible facts to Parquet.

Layout of an export directory (readable by Spark, DuckDB and pyarrow alike)::

    DIR/ops/part-00000.parquet …            OPS_SCHEMA, one row per op, and the 64-bit
                                            keys of its CIDs (OPS_FILE_SCHEMA, ADR 0131)
    DIR/facts/relation=<rel>/part-0.parquet  FACTS_SCHEMA minus the partition column
                                            (each visible fact once, in log order)
    DIR/export.json                         counts, dataset ids, format version
    DIR/genesis.cbor                        the dataset's genesis block (replica exports)

A replica is exported column-wise, without Python work per op or per value: fact
blocks are parsed by :mod:`.factcols`, delta blocks sliced by op shape by
:mod:`.deltacols` (signatures were checked at acceptance and are not checked
again; hashes are), ops joined with their facts by :mod:`.cidjoin`. CIDs stay raw
bytes throughout. Memory is bounded by a partition of the log (see
:func:`export_replica`). A replica export reports its progress by stage and from every
process that writes it (:data:`StageProgress`); the generic :func:`export` calls
``progress(rows_so_far)`` after every batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from merklog.replication.bulk import iter_delta_blocks, iter_visible_cids, op_count
from merklog.replication.replica import Replica
from merklog.store import Fact, Link, StoreError, fact_cid, verify
from merklog.store.gcpause import gc_paused

from .cidjoin import lookup, member, shares
from .cidkeys import KEY_FIELDS, with_keys
from .deltacols import delta_columns, log_columns
from .factcols import (
    FACT_PREFIX,
    binary_array,
    fact_columns,
    indices,
    int_values,
    repeat_string,
    valid_mask,
)
from .schema import ARGS_TYPE, FACTS_SCHEMA, OPS_SCHEMA, args_array, encode_args, str_array

FORMAT_VERSION = 2
#: The dataset's genesis block (DAG-CBOR), written by replica exports.
GENESIS_FILE = "genesis.cbor"
Progress = Callable[[int], None]
#: ``progress(stage, added)``: ``added`` more units of ``stage`` of a replica export are
#: done, in any of its processes: ``"deltas"`` (ops decoded from the accepted deltas, read
#: once), ``"facts"`` (fact blocks read), ``"ops"`` (op rows written). Called from
#: several threads.
StageProgress = Callable[[str, int], None]
#: Dictionary pages only where values repeat (CID columns are all distinct: a dictionary
#: there costs ~35% more write time for nothing). Min/max statistics only on the columns
#: a reader filters on: on CIDs, keys and lists they cost ~18% of the write (0.13 s of
#: CPU per million ops) and prune nothing, as digests are spread uniformly.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "use_dictionary": ["dataset", "op", "relation"],
    "write_statistics": ["dataset", "clock", "seq", "op_index", "op", "relation"],
}
_FACT_FILE_SCHEMA = FACTS_SCHEMA.remove(FACTS_SCHEMA.get_field_index("relation"))


def _cid(value: Any) -> bytes | None:
    """A CID as raw binary (Links, raw bytes, or base32 text)."""
    if value is None:
        return None
    if isinstance(value, Link):
        return value.raw
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return Link.parse(str(value)).raw


def _key(value: Any) -> bytes | None:
    """A public key as bytes (bytes, or hex text)."""
    if value is None or isinstance(value, bytes):
        return value
    return bytes.fromhex(str(value))


def op_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Normalise one generic log row (Links or text CIDs, Fact args) to the OPS_SCHEMA shape."""
    args = row.get("args")
    return {
        "dataset": str(row["dataset"]),
        "delta_cid": _cid(row["delta_cid"]),
        "author": _key(row.get("author")),
        "clock": int(row["clock"]),
        "seq": int(row.get("seq") or 0),
        "parents": [_cid(p) for p in row.get("parents") or ()],
        "op_index": int(row.get("op_index") or 0),
        "op": row.get("op") or "none",
        "relation": row.get("relation"),
        "args": encode_args(args) if args is not None else None,
        "fact_cid": _cid(row.get("fact_cid")),
        "observed": [_cid(o) for o in row["observed"]] if row.get("observed") is not None else None,
        "key": _key(row.get("key")),
    }


class OpsWriter:
    """Appends op record batches under ``DIR/ops/``, starting a new file every ``file_rows``."""

    def __init__(
        self,
        out_dir: str | Path,
        file_rows: int = 2_000_000,
        progress: Progress | None = None,
        missing_deltas: int = 0,
        *,
        first_part: int = 0,
        replace: bool = True,
        placeholder: bool = True,
    ) -> None:
        """``first_part``: the number of the first part file (the processes of one export
        number theirs apart); ``replace=False`` leaves the files already in ``ops/``;
        ``placeholder=False``: :meth:`close` writes no empty file for an empty log."""
        self.dir = Path(out_dir) / "ops"
        # Every part file says how many deltas the export lacks (MISSING_DELTAS_KEY), so
        # a part file or an ops/ folder given without its export.json is known too.
        self.schema = OPS_FILE_SCHEMA.with_metadata({MISSING_DELTAS_KEY: str(missing_deltas)})
        # An export written over an earlier one replaces its files: a part file of the
        # earlier one left here would be read as this export's (a reader takes every one).
        if replace:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file_rows = file_rows
        self.progress = progress
        self.placeholder = placeholder
        self.total = self._in_file = 0
        self._part = first_part
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        """Append a table of OPS_SCHEMA rows."""
        if not table.num_rows:
            return
        if self._writer is None:
            path = self.dir / f"part-{self._part:05d}.parquet"
            self._writer = pq.ParquetWriter(path, self.schema, **PARQUET_OPTIONS)
        self._writer.write_table(with_keys(table), row_group_size=1 << 20)
        self.total += table.num_rows
        self._in_file += table.num_rows
        if self.progress:
            self.progress(self.total)
        if self._in_file >= self.file_rows:
            self._writer.close()
            self._writer, self._in_file, self._part = None, 0, self._part + 1

    def close(self) -> int:
        """Finish the last file; an empty log still gives one readable (empty) file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.total == 0 and self.placeholder:
            pq.write_table(self.schema.empty_table(), self.dir / "part-00000.parquet")
        return self.total


#: The ops files' schema: OPS_SCHEMA and the 64-bit keys of its CID columns (ADR 0131).
OPS_FILE_SCHEMA = pa.schema([*OPS_SCHEMA, *KEY_FIELDS])
#: Key of each ops file's Parquet metadata: the accepted deltas the export lacks (as
#: ``missing_deltas`` of export.json: pruned, or covered by an installed snapshot).
MISSING_DELTAS_KEY = b"merklog.missing_deltas"
_FACT_TABLE = pa.schema([("fact_cid", pa.binary()), ("relation", pa.string()), ("args", ARGS_TYPE)])
#: OPS_SCHEMA without the fact columns a join fills in.
_LOG_SCHEMA = pa.schema([f for f in OPS_SCHEMA if f.name not in ("relation", "args")])


def fact_table(facts: Sequence[tuple[bytes, str, Sequence[Any]]]) -> pa.Table:
    """Distinct facts ``(raw CID, relation, args)`` as columns fact_cid, relation, args."""
    return pa.Table.from_arrays(
        [
            pa.array([f[0] for f in facts], pa.binary()),
            str_array([f[1] for f in facts]),
            args_array([f[2] for f in facts]),
        ],
        schema=_FACT_TABLE,
    )


def log_blocks_table(dataset: str, blocks: Sequence[tuple[bytes, bytes]]) -> pa.Table:
    """One row per op of hash-checked delta blocks ``(raw CID, data)``, decoded column-wise
    (:mod:`.deltacols`)."""
    deltas = [delta_columns(data) for _cid, data in blocks]
    return log_columns(dataset, [cid for cid, _data in blocks], deltas, _LOG_SCHEMA)


_PREFIX_U8 = np.frombuffer(b"\x01\x71\x12\x20", np.uint8)  # CIDv1, dag-cbor, sha2-256


_DIGEST = methodcaller("digest")


def _checked(cids: list[bytes], datas: list[bytes]) -> None:
    """Raise unless every block hashes to its CID. A page of dag-cbor/sha2-256 CIDs is
    checked at once: the digests (hashlib, iterated in C) are joined and compared with
    the CIDs' digest bytes as one numpy comparison; any other page, or a mismatch, goes
    block by block through the store's generic check, which names the bad block.
    Signatures are not checked again: the replica checked them when it accepted the
    deltas."""
    raw = b"".join(cids)
    if bool((np.fromiter(map(len, cids), np.int64, len(cids)) == 36).all()):
        table = np.frombuffer(raw, np.uint8).reshape(len(cids), 36)
        digests = np.frombuffer(b"".join(map(_DIGEST, map(hashlib.sha256, datas))), np.uint8)
        if bool((table[:, :4] == _PREFIX_U8).all()) and np.array_equal(
            table[:, 4:].reshape(-1), digests
        ):
            return
    for cid, data in zip(cids, datas, strict=True):
        verify(Link(cid), data, "block store")


def _fact_pages(
    replica: Replica, share: Share, batch: int = 65_536
) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Every fact block of the replica's block store (whatever dataset asserted it) whose
    CID is in the ``share`` as ``(raw CIDs, datas)`` pages, hash-checked page by page
    (:meth:`~merklog.store.BlockStore.scan_prefixed`: one sequential scan of a SQLite
    store)."""
    for rows in replica.blockstore.scan_prefixed(FACT_PREFIX, batch, share.lo, share.hi):
        cids, datas = [r[0] for r in rows], [r[1] for r in rows]
        _checked(cids, datas)
        yield cids, datas


def fact_page_table(cids: list[bytes], datas: list[bytes]) -> pa.Table:
    """Fact blocks as a :func:`fact_table`, decoded column-wise (:mod:`.factcols`)."""
    order, relations, args = fact_columns(datas)
    raw = binary_array(cids)
    if not np.array_equal(order, np.arange(len(cids))):
        raw = raw.take(indices(order.astype(np.int64)))
    return pa.Table.from_arrays([raw, relations, args], schema=_FACT_TABLE)


def with_facts(log: pa.Table, facts: pa.Table) -> pa.Table:
    """OPS_SCHEMA rows: ``log`` rows with relation and args joined from ``facts`` by fact
    CID (null where the store lacks the fact: a retract of a fact never received)."""
    where = lookup(
        log.column("fact_cid").combine_chunks(), facts.column("fact_cid").combine_chunks()
    )
    extra = {
        "relation": facts.column("relation").take(where),
        "args": facts.column("args").take(where),
    }
    columns = [extra[f.name] if f.name in extra else log.column(f.name) for f in OPS_SCHEMA]
    return pa.Table.from_arrays(columns, schema=OPS_SCHEMA)


def _digest_byte(column: pa.Array) -> np.ndarray:
    """Byte 4 of every value of a binary column - the first digest byte of a CIDv1
    dag-cbor/sha2-256 CID, uniform, and non-decreasing along CIDs in sorted order - or 0
    for null or shorter values."""
    if column.offset:
        column = pa.concat_arrays([column])  # a copy that starts at offset 0
    bufs = column.buffers()
    offsets = np.frombuffer(bufs[1], np.int32, len(column) + 1)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(1, np.uint8)
    at = np.minimum(offsets[:-1] + 4, max(len(data) - 1, 0))
    byte = data[at] if len(data) else np.zeros(len(column), np.uint8)
    short = offsets[1:] - offsets[:-1] <= 4
    if column.null_count:
        short |= ~valid_mask(column)
    return np.where(short, 0, byte).astype(np.int64)


class _Partitions:
    """Tables split into ``k`` partitions by the first digest byte of a CID column (byte
    ranges, so CID-sorted input - the facts, the visible CIDs - splits into slices, no
    copy): kept in memory when ``k == 1``, else spilled to Arrow IPC files under ``tmp``
    (a Grace hash join, so a join of the log with the facts needs memory for one
    partition only)."""

    def __init__(self, k: int, tmp: Path, name: str, schema: pa.Schema) -> None:
        self.k, self.schema = k, schema
        self.paths = [tmp / f"{name}-{i}.arrow" for i in range(k)]
        self.tables: list[list[pa.Table]] = [[] for _ in range(k)]
        self.writers: dict[int, Any] = {}

    def add(self, table: pa.Table, key: str) -> None:
        if self.k == 1:
            self.tables[0].append(table)
            return
        parts = _digest_byte(table.column(key).combine_chunks()) * self.k // 256
        if bool((parts[1:] >= parts[:-1]).all()):  # sorted: each partition is a slice
            bounds = np.searchsorted(parts, np.arange(self.k + 1)).tolist()
            subs = [table.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(self.k)]
        else:
            subs = [table.take(indices(np.nonzero(parts == i)[0])) for i in range(self.k)]
        for i, sub in enumerate(subs):
            if sub.num_rows:
                if i not in self.writers:
                    self.writers[i] = pa.ipc.new_file(self.paths[i], self.schema)
                self.writers[i].write_table(sub)

    def read(self, i: int) -> pa.Table:
        if self.k == 1:
            tables, self.tables[0] = self.tables[0], []
            return pa.concat_tables(tables) if tables else self.schema.empty_table()
        writer = self.writers.pop(i, None)
        if writer is None:
            return self.schema.empty_table()
        writer.close()
        with pa.memory_map(str(self.paths[i])) as source:
            table = pa.ipc.open_file(source).read_all()
        self.paths[i].unlink()
        return table


def facts_tables(
    dataset: str, facts: pa.Table, rows: np.ndarray | None = None
) -> dict[str, pa.Table]:
    """Facts (a :func:`fact_table`), or its ``rows`` only, as one FACTS_SCHEMA-minus-relation
    table per relation, each in the facts' order: one ``take`` of the rows sorted by
    relation, then a slice per relation."""
    encoded = facts.column("relation").combine_chunks().dictionary_encode()
    codes = int_values(encoded.indices)
    names = encoded.dictionary.to_pylist()
    if rows is None:
        rows = np.arange(facts.num_rows)
    codes = codes[rows]
    if len(names) > 1:
        rows = rows[np.argsort(codes, kind="stable")]
    if len(rows) != facts.num_rows or len(names) > 1:
        facts = facts.take(indices(rows.astype(np.int64)))
    out = {}
    start = 0
    for rel, count in zip(names, np.bincount(codes, minlength=len(names)).tolist(), strict=True):
        if count:
            part = facts.slice(start, count)
            out[rel] = pa.Table.from_arrays(
                [repeat_string(dataset, count), part.column("fact_cid"), part.column("args")],
                schema=_FACT_FILE_SCHEMA,
            )
            start += count
    return out


class FactsWriter:
    """Writes visible facts under ``DIR/facts/relation=<rel>/part-<part>.parquet`` in
    batches (``replace=False`` leaves the relations already there: another process's)."""

    def __init__(self, out_dir: str | Path, part: int = 0, *, replace: bool = True) -> None:
        self.base = Path(out_dir) / "facts"
        self.part = part
        if replace:
            shutil.rmtree(self.base, ignore_errors=True)  # an earlier export's relations: gone
        self.base.mkdir(parents=True, exist_ok=True)
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.counts: dict[str, int] = {}

    def write(self, dataset: str, facts: pa.Table, rows: np.ndarray | None = None) -> None:
        """Append a :func:`fact_table` of visible facts (or only its ``rows``)."""
        for rel, table in facts_tables(dataset, facts, rows).items():
            writer = self.writers.get(rel)
            if writer is None:
                part = self.base / f"relation={rel}"
                part.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(
                    part / f"part-{self.part}.parquet",
                    _FACT_FILE_SCHEMA,
                    compression="zstd",
                    write_statistics=["dataset"],
                )
                self.writers[rel] = writer
            writer.write_table(table)
            self.counts[rel] = self.counts.get(rel, 0) + table.num_rows

    def close(self) -> dict[str, int]:
        for writer in self.writers.values():
            writer.close()
        return dict(self.counts)


def _summary(
    out: Path, n_ops: int, datasets: Iterable[str], counts: dict[str, int], missing: int = 0
) -> dict:
    """``export.json``; ``missing_deltas`` (only when not 0): accepted deltas whose blocks
    the replica no longer holds (pruned, or covered by the snapshot it was bootstrapped
    from), so the ops do not account for every visible fact."""
    summary: dict[str, Any] = {
        "format": "merklog-parquet-export",
        "version": FORMAT_VERSION,
        "ops": n_ops,
        "datasets": sorted(set(datasets)),
        "facts": counts,
    }
    if missing:
        summary["missing_deltas"] = missing
    (out / "export.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


def _write_visible(shown: FactsWriter, dataset: str, facts: pa.Table, wanted: pa.Array) -> None:
    """Append the facts whose CID is in ``wanted`` (the visible ones) to ``shown``."""
    visible = member(facts.column("fact_cid").combine_chunks(), wanted)
    shown.write(dataset, facts, np.nonzero(visible)[0])


def _block_batches(
    batches: Iterable[list[tuple[bytes, bytes]]], size: int = 4 << 20
) -> Iterator[list[tuple[bytes, bytes]]]:
    """Regroup delta block batches so each holds about ``size`` bytes of blocks (~70k ops):
    deltas carry 1 to 4096 ops, and a record batch per few ops would cost more than it
    carries."""
    out: list[tuple[bytes, bytes]] = []
    n = 0
    for batch in batches:
        for block in batch:
            out.append(block)
            n += len(block[1])
            if n >= size:
                yield out
                out, n = [], 0
    if out:
        yield out


def export_replica(
    replica: Replica,
    out_dir: str | Path,
    progress: StageProgress | None = None,
    partition_ops: int = 2_000_000,
    workers: int | None = None,
) -> dict[str, Any]:
    """Write ``replica``'s log and visible facts as a Parquet export directory; returns the
    summary.

    Three sequential reads, no per-op store query: every fact block (one scan of the
    block store in CID order), the accepted deltas (in causal order), the visible fact
    CIDs (an index scan). Ops get their relation and arguments by a lookup of the fact
    CID (:mod:`.cidjoin`), done per partition of at most ``partition_ops`` ops so memory
    stays bounded; with one partition and one process the ops keep the log's (clock, CID)
    order. The cyclic collector is paused: the reads make many small objects and no
    cycles.

    ``workers`` processes share the work by fact CID range (:mod:`.exportshare`, ADR
    0191): each reads the fact blocks and visible CIDs of its range and the ops whose
    fact is in it, and writes its own part files. None takes ``MERKLOG_EXPORT_WORKERS``
    if set, else one per CPU (at most :data:`MAX_WORKERS`) for a log of
    :data:`PARALLEL_MIN_OPS` ops or more, and one below; a store no other process can read
    (:meth:`~merklog.store.BlockStore.file_for_readers`) is exported by this process alone.

    The export is written into a staging folder inside ``out_dir`` and moved into place
    only once whole: an export interrupted or failing midway (Ctrl-C, a full disk) leaves
    an earlier export there as it was, and a folder it made itself is removed again.

    ``progress``: see :data:`StageProgress` (a worker process's from a pipe of its own)."""
    if workers is None:
        workers = _workers_setting()
    out = Path(out_dir)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    n_ops = op_count(replica)
    k = max(1, math.ceil(n_ops / partition_ops))
    if replica.blockstore.file_for_readers() is None:
        workers = 1
    elif workers is None:
        workers = _cpus() if n_ops >= PARALLEL_MIN_OPS else 1
    stage = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        summary = _export_into(replica, out, stage, k, progress, max(1, workers))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if made and not any(out.iterdir()):
            out.rmdir()
    return summary


#: A log of at least this many ops is exported by several processes (below it, their
#: start, ~0.4 s each, costs more than they save).
PARALLEL_MIN_OPS = 200_000
#: At most this many processes share one export.
MAX_WORKERS = 4


#: Environment variable: how many processes an export uses, whatever the log's size
#: (``1``: this process alone).
WORKERS_ENV = "MERKLOG_EXPORT_WORKERS"


def _workers_setting() -> int | None:
    """``MERKLOG_EXPORT_WORKERS`` as a count, None when unset or empty."""
    text = os.environ.get(WORKERS_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise StoreError(f"{WORKERS_ENV} must be a whole number from 1 to 64, not {text!r}")
    return int(text)


def _cpus() -> int:
    """The CPUs this process may run on (at most :data:`MAX_WORKERS`)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, n))


@dataclass(frozen=True)
class Share:
    """One process's part of an export: the fact CIDs in ``[lo, hi)`` (bytewise, ``hi``
    None: no upper end), written as ops part files from ``worker * 10_000`` on and facts
    files ``part-<worker>.parquet``. Ops without a fact CID go to worker 0."""

    worker: int
    lo: bytes
    hi: bytes | None
    bounds: tuple[bytes, ...]  # every worker's lower end but the first


def shares_of(workers: int) -> list[Share]:
    """The CID range split ``workers`` ways by the first digest byte of CIDv1
    dag-cbor/sha2-256 CIDs (uniform: the shares' fact counts are in proportion to their
    ranges); a CID of another kind falls into one share by its bytes. Equal ranges:
    this process also reads the deltas for every share, which about makes up for a
    worker's later start (a fresh interpreter) and cold reads (measured with two on a
    1M-op replica: a quarter more of the range here was slower, a tenth or a fifth less
    no faster)."""
    bounds = tuple(FACT_CID_HEAD + bytes([256 * i // workers]) for i in range(1, workers))
    return [share_at(w, bounds) for w in range(workers)]


def share_at(worker: int, bounds: tuple[bytes, ...]) -> Share:
    """Share number ``worker`` of the split at ``bounds`` (see :func:`shares_of`)."""
    los, his = (b"", *bounds), (*bounds, None)
    return Share(worker, los[worker], his[worker], bounds)


#: The first bytes of every fact CID this merklog writes: CIDv1, dag-cbor, sha2-256, 32.
FACT_CID_HEAD = bytes(_PREFIX_U8)


@dataclass
class ShareResult:
    """What one process of an export wrote."""

    ops: int
    facts: dict[str, int]
    visible: int
    deltas: int
    missing: int


@dataclass
class ShareLog:
    """A share's ops (log rows without relation and arguments), partitioned, and how many
    deltas the whole log has (every share's count: the deltas are read once)."""

    parts: _Partitions
    deltas: int


def log_for_shares(
    replica: Replica,
    shares: Sequence[Share],
    tmp: Path,
    k: int,
    elsewhere: Callable[[Share], Path],
    progress: StageProgress | None = None,
) -> ShareLog:
    """Read and decode every accepted delta once: the first share's ops partitioned under
    ``tmp``, every other share's written to the Arrow IPC file ``elsewhere(share)`` for
    its process (:func:`share_log_from_file`)."""
    dataset = str(replica.dataset)
    first, *rest = shares
    log = _Partitions(k, tmp, "log", _LOG_SCHEMA)
    files = {s.worker: pa.ipc.new_file(elsewhere(s), _LOG_SCHEMA) for s in rest}
    seen = n_deltas = 0
    try:
        for blocks in _block_batches(iter_delta_blocks(replica, batch=64)):
            n_deltas += len(blocks)
            table = log_blocks_table(dataset, blocks)
            seen += table.num_rows
            if not rest:
                log.add(table, "fact_cid")
            else:
                owner = shares_column(table, first.bounds)
                log.add(_rows(table, owner, first.worker), "fact_cid")
                for s in rest:
                    files[s.worker].write_table(_rows(table, owner, s.worker))
            if progress:
                progress("deltas", table.num_rows)
    finally:
        for writer in files.values():
            writer.close()
    return ShareLog(log, n_deltas)


def shares_column(table: pa.Table, bounds: Sequence[bytes]) -> np.ndarray:
    """The share of every row of ``table`` by its ``fact_cid`` (see :class:`Share`)."""
    return shares(table.column("fact_cid").combine_chunks(), bounds)


def _rows(table: pa.Table, owner: np.ndarray, worker: int) -> pa.Table:
    mine = owner == worker
    if bool(mine.all()):
        return table
    return table.take(indices(np.nonzero(mine)[0]))


def share_log_from_file(path: Path, deltas: int, tmp: Path, k: int) -> ShareLog:
    """A share's ops from the file :func:`log_for_shares` wrote for it."""
    log = _Partitions(k, tmp, "log", _LOG_SCHEMA)
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    if table.num_rows:
        log.add(table, "fact_cid")
    return ShareLog(log, deltas)


def export_share(
    replica: Replica,
    new: Path,
    tmp: Path,
    k: int,
    share: Share,
    log: Callable[[], ShareLog],
    progress: StageProgress | None = None,
) -> ShareResult:
    """Write ``share``'s ops and visible facts under ``new`` (partitions spilled under
    ``tmp``): :func:`export_replica`'s work for one process. The share's fact blocks and
    visible CIDs are read here, then its ops are asked of ``log`` (in a worker process
    they come from the exporting process, which may still be reading them). ``progress``
    hears of its fact blocks read and op rows written (:data:`StageProgress`)."""
    tell = progress or _no_progress
    dataset = str(replica.dataset)
    with gc_paused():  # many small objects, no cycles
        facts = _Partitions(k, tmp, "facts", _FACT_TABLE)
        for cids, datas in _fact_pages(replica, share):
            facts.add(fact_page_table(cids, datas), "fact_cid")
            tell("facts", len(cids))
        visible = _Partitions(k, tmp, "visible", pa.schema([("fact_cid", pa.binary())]))
        n_visible = 0
        for cids in iter_visible_cids(replica, lo=share.lo, hi=share.hi):
            n_visible += len(cids)
            visible.add(pa.table({"fact_cid": binary_array(cids)}), "fact_cid")
        ops_log = log()
        # deltas accepted but without blocks here: pruned, or covered by a snapshot
        missing = replica.delta_count() - ops_log.deltas
        ops = OpsWriter(
            new,
            missing_deltas=missing,
            first_part=share.worker * 10_000,
            replace=False,
            placeholder=False,
        )
        shown = FactsWriter(new, share.worker, replace=False)
        # the visible facts are filtered and written on a second thread while this one joins
        # and writes the ops: both are Arrow C++ work that releases the GIL
        with ThreadPoolExecutor(max_workers=1) as pool:
            for i in range(k):
                part_facts = facts.read(i)
                wanted = visible.read(i).column("fact_cid").combine_chunks()
                pending = pool.submit(_write_visible, shown, dataset, part_facts, wanted)
                written = with_facts(ops_log.parts.read(i), part_facts)
                ops.write(written)
                tell("ops", written.num_rows)
                pending.result()
        return ShareResult(ops.close(), shown.close(), n_visible, ops_log.deltas, missing)


def _no_progress(stage: str, added: int) -> None:
    """A :data:`StageProgress` that tells no one."""


class ShareProcess:
    """One share of an export written by a worker process, ``python -m
    merklog.node.spark.exportshare`` (a fresh interpreter: a forked one would inherit
    this one's SQLite connection, which SQLite forbids using across ``fork``). It
    starts at once and reads its fact blocks and visible CIDs; its ops come from this
    process, which reads the deltas once for every share: :meth:`send_log` says they are
    in the file :attr:`log_file`. :meth:`result` waits for it, :meth:`stop` ends it if
    still running.

    The request goes as a JSON argument, the log's readiness as a line on its stdin
    (end of file without one: this process gave up), the answer comes back pickled on
    its stdout: the share's :class:`ShareResult`, or the exception it raised, raised
    here with its own type (a :class:`~merklog.store.CIDMismatch` stays one)."""

    def __init__(
        self,
        replica: Replica,
        stage: Path,
        k: int,
        share: Share,
        progress: StageProgress | None = None,
    ) -> None:
        self.worker = share.worker
        self.log_file = stage / f"log-{share.worker}.arrow"
        tmp = stage / f"parts-{share.worker}"
        tmp.mkdir()
        request = {
            "store": replica.blockstore.file_for_readers(),
            "dataset": str(replica.dataset),
            "new": str(stage / "new"),
            "tmp": str(tmp),
            "log": str(self.log_file),
            "k": k,
            "worker": share.worker,
            "bounds": [b.hex() for b in share.bounds],
        }
        # Its progress comes back as "STAGE COUNT" lines on a pipe of its own, relayed
        # by a thread of this process; stdout carries only its answer.
        heard, told = os.pipe() if progress is not None else (None, None)
        request["progress_fd"] = told
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "merklog.node.spark.exportshare", json.dumps(request)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=() if told is None else (told,),
            )
        except OSError as exc:  # no interpreter to run, no memory or process left
            if heard is not None:
                os.close(heard)
            raise StoreError(
                f"cannot start export worker {self.worker}: {exc.strerror or exc}"
                f" ({WORKERS_ENV}=1 exports in this process alone)"
            ) from None
        finally:
            if told is not None:
                os.close(told)  # the worker's copy stays open: end of file once it ends
        self._relay: threading.Thread | None = None
        if heard is not None and progress is not None:
            self._relay = threading.Thread(
                target=_relay_progress, args=(heard, progress), daemon=True
            )
            self._relay.start()

    def send_log(self, deltas: int) -> None:
        """Tell the process its ops are in :attr:`log_file` (``deltas``: the log's count)."""
        stdin, self.proc.stdin = self.proc.stdin, None
        if stdin is None:
            return
        with suppress(BrokenPipeError), stdin:  # a process already gone: result() says why
            stdin.write(json.dumps({"deltas": deltas}).encode() + b"\n")

    def result(self) -> ShareResult:
        """The share's result once the process ends; its error raised here if it failed."""
        out, err = self.proc.communicate()
        self._heard_all()
        try:
            kind, payload = pickle.loads(out)
        except Exception:  # it died before answering: killed, out of memory, no Python
            why = err.decode(errors="replace").strip().splitlines()
            raise StoreError(
                f"export worker {self.worker} ended without a result (exit status"
                f" {self.proc.returncode}{': ' + why[-1] if why else ''})"
            ) from None
        if kind == "raised":
            raise payload
        return ShareResult(**payload)

    def stop(self) -> None:
        """End the process if it still runs (this export failed or was interrupted)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.stdin = None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()
        self._heard_all()

    def _heard_all(self) -> None:
        """Wait for the relay of its progress (at end of file, now that it has ended)."""
        if self._relay is not None:
            self._relay.join(10)


def _relay_progress(fd: int, progress: StageProgress) -> None:
    """Pass each ``STAGE COUNT`` line a worker writes on ``fd`` to ``progress``."""
    with os.fdopen(fd, "rb") as lines:
        for line in lines:
            stage, _, count = line.decode("ascii", "replace").partition(" ")
            if count.strip().isdigit():
                progress(stage, int(count))


def _export_into(
    replica: Replica,
    out: Path,
    stage: Path,
    k: int,
    progress: Progress | None,
    workers: int,
) -> dict[str, Any]:
    """:func:`export_replica`'s work: each share's under ``stage/new`` (the first here,
    the others in worker processes, all from one read of the deltas here), then moved
    into ``out`` (see there)."""
    new = stage / "new"
    (new / "ops").mkdir(parents=True)
    (new / "facts").mkdir()
    every = shares_of(workers)
    others: list[ShareProcess] = []
    try:
        for share in every[1:]:
            others.append(ShareProcess(replica, stage, k, share, progress))
        tmp = stage / "parts-0"
        tmp.mkdir()
        files = {o.worker: o.log_file for o in others}
        log = log_for_shares(replica, every, tmp, k, lambda s: files[s.worker], progress)
        for other in others:
            other.send_log(log.deltas)
        results = [export_share(replica, new, tmp, k, every[0], lambda: log, progress)]
        results += [other.result() for other in others]
    finally:
        for other in others:
            other.stop()
    n_ops = sum(r.ops for r in results)
    counts: dict[str, int] = {}
    for r in results:
        for rel, n in r.facts.items():
            counts[rel] = counts.get(rel, 0) + n
    n_visible, missing = sum(r.visible for r in results), results[0].missing
    if n_ops == 0:  # an empty log still gives one readable (empty) ops file
        OpsWriter(new, missing_deltas=missing, replace=False).close()
    if sum(counts.values()) != n_visible:
        raise StoreError(f"{n_visible - sum(counts.values())} visible facts have no block")
    # the genesis block travels with the export so a snapshot can let a fresh peer join
    (new / GENESIS_FILE).write_bytes(replica.genesis.data)
    dataset = str(replica.dataset)
    summary = _summary(new, n_ops, [dataset] if n_ops else [], dict(sorted(counts.items())), missing)
    # Whole now: move it into place, export.json last (an earlier export's folders are
    # moved aside into the staging folder, which the caller removes).
    for name in ("ops", "facts"):
        if (out / name).exists():
            (out / name).rename(stage / f"old-{name}")
        (new / name).rename(out / name)
    os.replace(new / GENESIS_FILE, out / GENESIS_FILE)
    os.replace(new / "export.json", out / "export.json")
    return summary


def write_ops(
    rows: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    batch_rows: int = 65_536,
    file_rows: int = 2_000_000,
    progress: Progress | None = None,
) -> int:
    """Write generic log rows (see :func:`op_row`) under ``out_dir/ops/``; returns the count."""
    writer = OpsWriter(out_dir, file_rows=file_rows, progress=progress)
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(op_row(row))
        if len(batch) >= batch_rows:
            writer.write(pa.Table.from_pylist(batch, schema=OPS_SCHEMA))
            batch.clear()
    writer.write(pa.Table.from_pylist(batch, schema=OPS_SCHEMA))
    return writer.close()


def export(
    log_rows: Iterable[Mapping[str, Any]],
    visible: Iterable[tuple[Any, Fact]],
    out_dir: str | Path,
    progress: Progress | None = None,
    batch_rows: int = 65_536,
) -> dict[str, Any]:
    """Export generic log rows and ``(dataset, Fact)`` visible facts (simulations, tests)."""
    out = Path(out_dir)
    datasets: set[str] = set()

    def tap(rows: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
        for row in rows:
            datasets.add(str(row["dataset"]))
            yield row

    (out / GENESIS_FILE).unlink(missing_ok=True)  # an earlier replica export's: not this one's
    n_ops = write_ops(tap(log_rows), out, batch_rows=batch_rows, progress=progress)
    by_ds: dict[str, dict[bytes, Fact]] = {}
    for dataset, fact in visible:
        by_ds.setdefault(str(dataset), {})[fact_cid(fact).raw] = fact
    facts = FactsWriter(out)
    for dataset, items in sorted(by_ds.items()):
        facts.write(dataset, fact_table([(c, f.rel, f.args) for c, f in sorted(items.items())]))
    return _summary(out, n_ops, datasets, facts.close())
