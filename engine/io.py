"""Sources, sinks and fact files: how tuples enter and leave an evaluation.

Seed 000 §1.3.5/§1.3.6: a *source* introduces tuples at the start of each epoch
(as a delta: inserts and deletes), a *sink* receives the derived tuples at its
end. Both are small Python protocols so the node can plug in replicated facts,
inbox messages, live-query subscribers or user callbacks.

Files: ``<rel>.facts`` holds one tuple per line, fields separated by tabs;
``<rel>.csv`` is written the same way, sorted, without a header (Soufflé's
conventions, so existing Soufflé fact directories work unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from merklog.store import Fact, Link, Value

from .rows import RowSet, engine_rows
from .values import from_engine

if TYPE_CHECKING:
    from .program import EpochResult

Row = tuple[Any, ...]


@runtime_checkable
class Source(Protocol):
    """Introduces tuples at the start of each epoch."""

    def poll(self, epoch: int) -> tuple[Iterable[Fact], Iterable[Fact]]:
        """``(inserts, deletes)`` to apply to the source's persistent EDB at ``epoch``."""
        ...


@runtime_checkable
class Sink(Protocol):
    """Receives each epoch's outcome (relations, deltas, @async outbox) at its end."""

    def emit(self, result: EpochResult) -> None:
        """Called once per epoch, after every stratum reached its fixpoint."""
        ...


class ListSource:
    """A source replaying a fixed list of ``(inserts, deletes)`` per epoch (tests, scripts)."""

    def __init__(self, changes: Sequence[tuple[Iterable[Fact], Iterable[Fact]]]) -> None:
        self.changes = [(list(ins), list(dels)) for ins, dels in changes]

    def poll(self, epoch: int) -> tuple[Iterable[Fact], Iterable[Fact]]:
        if epoch < len(self.changes):
            return self.changes[epoch]
        return (), ()


class CollectingSink:
    """A sink that keeps every epoch result it receives, in order."""

    def __init__(self) -> None:
        self.results: list[EpochResult] = []

    def emit(self, result: EpochResult) -> None:
        self.results.append(result)


class CallbackSink:
    """A sink calling ``fn(result)`` at the end of each epoch."""

    def __init__(self, fn: Callable[[EpochResult], None]) -> None:
        self.fn = fn

    def emit(self, result: EpochResult) -> None:
        self.fn(result)


# ----------------------------------------------------------------------------- field codecs


def parse_field(text: str, column_type: str = "any") -> Value:
    """One TSV field as a value: typed per ``.decl`` (Soufflé), else int, float or string."""
    if column_type in ("number", "unsigned"):
        return int(text)
    if column_type == "float":
        value = float(text)
        return value if value != 0.0 else 0.0
    if column_type == "symbol":
        return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value):
        return text
    return value if value != 0.0 else 0.0


def format_field(value: Value) -> str:
    """One value (plain or engine form) as a TSV field: strings raw, booleans
    ``true``/``false``, bytes as hex, floats always with a fraction or exponent
    (``1.0``, ``1e+16``) so they read back as floats and never merge with ints."""
    value = from_engine(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Link):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def read_facts_file(path: Path, column_types: Sequence[str] | None = None) -> list[Row]:
    """The tuples of one ``<rel>.facts`` file (empty lines skipped)."""
    rows: list[Row] = []
    with open(path, encoding="utf-8", newline="") as fh:
        for line in fh:
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if column_types is not None:
                if len(fields) != len(column_types):
                    raise ValueError(
                        f"{path}: line {len(rows) + 1}: {len(fields)} fields, "
                        f"expected {len(column_types)}"
                    )
                rows.append(
                    tuple(parse_field(f, t) for f, t in zip(fields, column_types, strict=True))
                )
            else:
                rows.append(tuple(parse_field(f) for f in fields))
    return rows


def read_facts_dir(
    directory: Path,
    relations: Iterable[str] | None = None,
    column_types: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[Row]]:
    """``<rel>.facts`` files of a directory: only ``relations`` when given (missing = empty)."""
    directory = Path(directory)
    types = column_types or {}
    out: dict[str, list[Row]] = {}
    if relations is None:
        names = sorted(p.stem for p in directory.glob("*.facts"))
    else:
        names = list(relations)
    for name in names:
        path = directory / f"{name}.facts"
        out[name] = read_facts_file(path, types.get(name)) if path.exists() else []
    return out


def write_csv(path: Path, rows: Iterable[Row]) -> None:
    """Write tuples tab-separated, one per line, sorted, no header.

    ``rows`` may be a :class:`~merklog.engine.rows.RowSet` (its engine rows are
    used, so ``1`` and ``1.0`` stay two lines) or any iterable of rows."""
    from .batch import sort_rows

    engine = rows.engine if isinstance(rows, RowSet) else engine_rows(rows)
    lines = ["\t".join(format_field(v) for v in row) for row in sort_rows(engine)]
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
