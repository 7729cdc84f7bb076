"""Where a Spark job's op rows are, and how many there are: read before any Spark code is
imported, since the row count picks the driver JVM's flags and the JVM is started
first (ADR 0158)."""

from __future__ import annotations

from pathlib import Path

from merklog.store.errors import Error


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


class NotAnExport(Error, ValueError):
    """A local input that holds no op rows of a merklog export."""


def input_rows(inputs: list[str | Path]) -> int | None:
    """Op rows in the inputs, from the Parquet footers (None when an input is not local).

    Each local input is checked on the way, before any JVM starts: a folder without
    Parquet files, a file that is not Parquet, or Parquet without the op columns (a
    snapshot given by mistake) raises :class:`NotAnExport` naming it; Spark reported
    these as an internal error and a Java stack trace, or ran on nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    needed = {"dataset", "delta_cid", "op"}  # what every op file has (Spark reads the rest)
    total: int | None = 0
    for item, path in zip(inputs, op_paths(inputs), strict=True):
        if "://" in path:
            total = None
            continue
        p = Path(path)
        summary = _summary_of(Path(str(item)))
        if summary is not None and p == Path(str(item)):
            raise NotAnExport(
                f"{item} has no ops/ folder: the export is incomplete (a copy cut short?);"
                " export the home again"
            )
        files = [p] if p.is_file() else sorted(p.rglob("*.parquet"))
        if not files:
            raise NotAnExport(
                f"{item} holds no Parquet files: not a merklog export (`merklog parquet export`)"
            )
        held = 0  # this input's op rows, from the footers read once here
        for f in files:
            try:
                meta = pq.ParquetFile(f).metadata
            except (OSError, pa.ArrowException) as exc:
                raise NotAnExport(
                    f"{f} is not a Parquet file of a merklog export ({exc})"
                ) from None
            missing = needed - set(meta.schema.names)
            if missing:
                raise NotAnExport(
                    f"{f} is not a merklog export's op file (no column"
                    f" {', '.join(sorted(missing))})"
                )
            held += meta.num_rows
        if total is not None:
            total += held
        if summary is not None:
            _check_whole(item, summary, held)
    return total


def _summary_of(path: Path) -> dict | None:
    """The ``export.json`` of an export directory ``path`` (None: not one, or unreadable,
    which the reading of its files reports)."""
    import json

    try:
        summary = json.loads((path / "export.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def _check_whole(item: str | Path, summary: dict, held: int) -> None:
    """Refuse an export whose ops files hold fewer (or more) rows than its
    ``export.json`` lists: a part file lost on a copy was compacted without a word into a
    snapshot lacking facts, which the homes bootstrapped from it never got back (QA).
    The facts lists are not counted: a fact they lack comes from its assert row
    (ADR 0122). ``held``: the rows its ops files hold."""
    ops = summary.get("ops")
    if isinstance(ops, int) and not isinstance(ops, bool) and held != ops:
        raise NotAnExport(
            f"{item} holds {held:,} of the {ops:,} ops its export.json lists: a part file"
            " is missing or does not belong (a copy cut short?); export the home again"
        )
