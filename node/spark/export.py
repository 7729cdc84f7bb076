"""Stream a replica's log (one row per op) and its visible facts to Parquet.

Layout of an export directory (readable by Spark, DuckDB and pyarrow alike)::

    DIR/ops/part-00000.parquet …            OPS_SCHEMA, one row per op
    DIR/facts/relation=<rel>/part-0.parquet  FACTS_SCHEMA minus the partition column
    DIR/export.json                         counts, dataset ids, format version

Rows are written in bounded batches, so memory stays flat whatever the log size,
and ``progress(rows_so_far)`` is called after every batch.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from merklog.store import Fact, Link, fact_cid

from .schema import FACTS_SCHEMA, OPS_SCHEMA, encode_args

FORMAT_VERSION = 1
#: The dataset's genesis block (DAG-CBOR), written by replica exports.
GENESIS_FILE = "genesis.cbor"
Progress = Callable[[int], None]


def _text(value: Any) -> str | None:
    """CIDs as base32 text, keys as hex, strings unchanged."""
    if value is None:
        return None
    if isinstance(value, Link):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def op_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Normalise one log row (Links, bytes keys, Fact args) to the OPS_SCHEMA shape."""
    args = row.get("args")
    return {
        "dataset": _text(row["dataset"]),
        "delta_cid": _text(row["delta_cid"]),
        "author": _text(row.get("author")),
        "clock": int(row["clock"]),
        "seq": int(row.get("seq") or 0),
        "parents": [_text(p) for p in row.get("parents") or ()],
        "op_index": int(row.get("op_index") or 0),
        "op": row.get("op") or "none",
        "relation": row.get("relation"),
        "args": encode_args(args) if args is not None else None,
        "fact_cid": _text(row.get("fact_cid")),
        "observed": [_text(o) for o in row["observed"]]
        if row.get("observed") is not None
        else None,
        "key": _text(row.get("key")),
    }


def write_ops(
    rows: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    batch_rows: int = 65_536,
    file_rows: int = 2_000_000,
    progress: Progress | None = None,
) -> int:
    """Write op rows under ``out_dir/ops/``; returns the number of rows written."""
    ops_dir = Path(out_dir) / "ops"
    ops_dir.mkdir(parents=True, exist_ok=True)
    total = in_file = part = 0
    writer: pq.ParquetWriter | None = None
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal writer, in_file, part, total
        if not batch:
            return
        if writer is None:
            writer = pq.ParquetWriter(
                ops_dir / f"part-{part:05d}.parquet", OPS_SCHEMA, compression="zstd"
            )
        writer.write_table(pa.Table.from_pylist(batch, schema=OPS_SCHEMA))
        total += len(batch)
        in_file += len(batch)
        batch.clear()
        if progress:
            progress(total)
        if in_file >= file_rows:
            writer.close()
            writer, in_file, part = None, 0, part + 1

    for row in rows:
        batch.append(op_row(row))
        if len(batch) >= batch_rows:
            flush()
    flush()
    if writer is not None:
        writer.close()
    if total == 0:  # an empty log is still a valid, readable export
        pq.write_table(OPS_SCHEMA.empty_table(), ops_dir / "part-00000.parquet")
    return total


def write_facts(
    facts: Iterable[tuple[Any, Fact]],
    out_dir: str | Path,
) -> dict[str, int]:
    """Write visible facts ``(dataset, Fact)`` grouped per relation; returns counts per relation."""
    by_rel: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for dataset, fact in facts:
        by_rel[fact.rel].append(
            {
                "dataset": _text(dataset),
                "relation": fact.rel,
                "fact_cid": str(fact_cid(fact)),
                "args": encode_args(fact.args),
            }
        )
    base = Path(out_dir) / "facts"
    base.mkdir(parents=True, exist_ok=True)
    schema = FACTS_SCHEMA.remove(FACTS_SCHEMA.get_field_index("relation"))
    for rel, rows in by_rel.items():
        part = base / f"relation={rel}"
        part.mkdir(parents=True, exist_ok=True)
        rows.sort(key=lambda r: r["fact_cid"])
        table = pa.Table.from_pylist(rows, schema=FACTS_SCHEMA).drop(["relation"])
        pq.write_table(table.cast(schema), part / "part-0.parquet", compression="zstd")
    return {rel: len(rows) for rel, rows in by_rel.items()}


def export(
    log_rows: Iterable[Mapping[str, Any]],
    visible: Iterable[tuple[Any, Fact]],
    out_dir: str | Path,
    progress: Progress | None = None,
    batch_rows: int = 65_536,
) -> dict[str, Any]:
    """Export a replica: its log rows and its visible facts; writes and returns the summary."""
    out = Path(out_dir)
    datasets: set[str] = set()

    def tap(rows: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
        for row in rows:
            datasets.add(_text(row["dataset"]) or "")
            yield row

    n_ops = write_ops(tap(log_rows), out, batch_rows=batch_rows, progress=progress)
    counts = write_facts(visible, out)
    summary = {
        "format": "merklog-parquet-export",
        "version": FORMAT_VERSION,
        "ops": n_ops,
        "datasets": sorted(datasets),
        "facts": counts,
    }
    (out / "export.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary
