"""Where a Spark job's op rows are, and how many there are: read before any Spark code is
imported, since the row count picks the driver JVM's flags and the JVM is started
first (ADR 0158)."""

from __future__ import annotations

from pathlib import Path


def op_paths(inputs: list[str | Path]) -> list[str]:
    """The op-row Parquet paths of ``inputs``: an export directory's ``ops/`` folder, any
    other path or URL as given."""
    paths = []
    for item in inputs:
        text = str(item)
        if "://" not in text and (Path(text) / "ops").is_dir():
            text = str(Path(text) / "ops")
        paths.append(text)
    return paths


def input_rows(inputs: list[str | Path]) -> int | None:
    """Op rows in the inputs, from the Parquet footers (None when an input is not local)."""
    import pyarrow.parquet as pq

    total = 0
    for path in op_paths(inputs):
        if "://" in path:
            return None
        p = Path(path)
        files = [p] if p.is_file() else sorted(p.rglob("*.parquet"))
        for f in files:
            total += pq.ParquetFile(f).metadata.num_rows
    return total
