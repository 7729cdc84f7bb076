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
:func:`export_replica`), and ``progress(rows_so_far)`` is called after every batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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

from .cidjoin import lookup, member
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
    ) -> None:
        self.dir = Path(out_dir) / "ops"
        # Every part file says how many deltas the export lacks (MISSING_DELTAS_KEY), so
        # a part file or an ops/ folder given without its export.json is known too.
        self.schema = OPS_FILE_SCHEMA.with_metadata({MISSING_DELTAS_KEY: str(missing_deltas)})
        # An export written over an earlier one replaces its files: a part file of the
        # earlier one left here would be read as this export's (a reader takes every one).
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file_rows = file_rows
        self.progress = progress
        self.total = self._in_file = self._part = 0
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
        if self.total == 0:
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


def _fact_pages(replica: Replica, batch: int = 65_536) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """Every fact block of the replica's block store (whatever dataset asserted it) as
    ``(raw CIDs, datas)`` pages, hash-checked page by page
    (:meth:`~merklog.store.BlockStore.scan_prefixed`: one sequential scan of a SQLite
    store)."""
    for rows in replica.blockstore.scan_prefixed(FACT_PREFIX, batch):
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
    """Writes visible facts under ``DIR/facts/relation=<rel>/part-0.parquet`` in batches."""

    def __init__(self, out_dir: str | Path) -> None:
        self.base = Path(out_dir) / "facts"
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
                    part / "part-0.parquet",
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
    progress: Progress | None = None,
    partition_ops: int = 2_000_000,
) -> dict[str, Any]:
    """Write ``replica``'s log and visible facts as a Parquet export directory; returns the
    summary.

    Three sequential reads, no per-op store query: every fact block (one scan of the
    block store in CID order), the accepted deltas (in causal order), the visible fact
    CIDs (an index scan). Ops get their relation and arguments by a lookup of the fact
    CID (:mod:`.cidjoin`), done per partition of at most ``partition_ops`` ops so memory
    stays bounded; with one partition the ops keep the log's (clock, CID) order. The
    cyclic collector is paused: the reads make many small objects and no cycles.

    The export is written into a staging folder inside ``out_dir`` and moved into place
    only once whole: an export interrupted or failing midway (Ctrl-C, a full disk) leaves
    an earlier export there as it was, and a folder it made itself is removed again."""
    out = Path(out_dir)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    dataset = str(replica.dataset)
    k = max(1, math.ceil(op_count(replica) / partition_ops))
    stage = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        summary = _export_into(replica, out, stage, dataset, k, progress)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if made and not any(out.iterdir()):
            out.rmdir()
    return summary


def _export_into(
    replica: Replica,
    out: Path,
    stage: Path,
    dataset: str,
    k: int,
    progress: Progress | None,
) -> dict[str, Any]:
    """:func:`export_replica`'s work: partitions under ``stage/``, the export under
    ``stage/new``, then moved into ``out`` (see there)."""
    new = stage / "new"
    new.mkdir()
    tmp = stage / "parts"
    tmp.mkdir()
    try:
        with gc_paused():  # many small objects, no cycles
            facts = _Partitions(k, tmp, "facts", _FACT_TABLE)
            for cids, datas in _fact_pages(replica):
                facts.add(fact_page_table(cids, datas), "fact_cid")
            log = _Partitions(k, tmp, "log", _LOG_SCHEMA)
            seen = n_deltas = 0
            for blocks in _block_batches(iter_delta_blocks(replica, batch=64)):
                n_deltas += len(blocks)
                table = log_blocks_table(dataset, blocks)
                log.add(table, "fact_cid")
                seen += table.num_rows
                if progress:
                    progress(seen)
            visible = _Partitions(k, tmp, "visible", pa.schema([("fact_cid", pa.binary())]))
            n_visible = 0
            for cids in iter_visible_cids(replica):
                n_visible += len(cids)
                visible.add(pa.table({"fact_cid": binary_array(cids)}), "fact_cid")
            # deltas accepted but without blocks here: pruned, or covered by a snapshot
            missing = replica.delta_count() - n_deltas
            ops = OpsWriter(new, missing_deltas=missing)
            shown = FactsWriter(new)
            # the visible facts are filtered and written on a second thread while this one joins
            # and writes the ops: both are Arrow C++ work that releases the GIL
            with ThreadPoolExecutor(max_workers=1) as pool:
                for i in range(k):
                    part_facts = facts.read(i)
                    wanted = visible.read(i).column("fact_cid").combine_chunks()
                    pending = pool.submit(_write_visible, shown, dataset, part_facts, wanted)
                    ops.write(with_facts(log.read(i), part_facts))
                    pending.result()
            n_ops = ops.close()
            counts = shown.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if sum(counts.values()) != n_visible:
        raise StoreError(f"{n_visible - sum(counts.values())} visible facts have no block")
    # the genesis block travels with the export so a snapshot can let a fresh peer join
    (new / GENESIS_FILE).write_bytes(replica.genesis.data)
    summary = _summary(new, n_ops, [dataset] if n_ops else [], counts, missing)
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
