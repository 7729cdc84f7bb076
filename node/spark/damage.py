"""A damaged Parquet input of a Spark command, told apart from the other failures.

An input whose footer is intact passes the checks made before the JVM starts
(:mod:`merklog.node.spark.inputs`), and only the reading of its pages fails: in Spark as
``[FAILED_READ_FILE…]`` with a Java stack trace, in this process (pyarrow reads the
inputs' fact lists) as an ``OSError`` naming no file. Both are bad input, reported like a
file that is not Parquet at all: one line naming the file, exit 2.
"""

from __future__ import annotations

import re
from pathlib import Path

from merklog.node.failures import ExitCode, Failure

from .inputs import op_paths

#: Spark's error classes for a file it could not read (the page data, or its footer).
_READ_FAILED = ("FAILED_READ_FILE", "CANNOT_READ_FILE_FOOTER")
_FILE = re.compile(r"(?:reading file|read footer for file|file) (\S+?)\.?(?:\s|$)")
_CAUSE = re.compile(r"^Caused by: [\w.$]+: (.+)$", re.MULTILINE)


class DamagedInput(Failure):
    """An input file that cannot be read (exit 2: bad input)."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, path: str, reason: str) -> None:
        detail = f" ({reason})" if reason else ""
        super().__init__(
            f"cannot read {path}: the file is damaged{detail}; export the replica again"
            " (`merklog parquet export`)"
        )


def _local(url: str) -> str:
    """``file:///a/b`` as ``/a/b``; any other URL as given."""
    if url.startswith("file://"):
        return url[len("file://") :]
    if url.startswith("file:"):
        return url[len("file:") :]
    return url


def _short(reason: str) -> str:
    """One line of at most 160 characters."""
    line = reason.strip().splitlines()[0] if reason.strip() else ""
    return line if len(line) <= 160 else line[:157] + "…"


def spark_damage(exc: BaseException) -> DamagedInput | None:
    """The damaged file a Spark job's failure names, with the innermost Java cause as the
    reason; None for any other failure."""
    text = str(exc)
    starts = [text.find(name) for name in _READ_FAILED if name in text]
    if not starts:
        return None
    found = _FILE.search(text, min(starts))  # the file the error class names, not before
    path = _local(found.group(1)) if found else "an input file"
    causes = _CAUSE.findall(text)
    return DamagedInput(path, _short(causes[-1]) if causes else "")


def local_damage(inputs: list[str]) -> DamagedInput | None:
    """The first local op file of ``inputs`` that pyarrow cannot read in full, or None:
    names the file behind an ``OSError`` of pyarrow, which names none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in op_paths(list(inputs)):
        if "://" in path:
            continue
        p = Path(path)
        for f in [p] if p.is_file() else sorted(p.rglob("*.parquet")):
            try:
                pq.read_table(f)
            except (OSError, pa.ArrowException) as exc:
                return DamagedInput(str(f), _short(str(exc)))
    return None


def raise_damaged_input(exc: BaseException, inputs: list[str]) -> None:
    """Raise :class:`DamagedInput` when ``exc`` (a Spark command's failure) comes from a
    damaged input file; return otherwise."""
    damage = spark_damage(exc)
    if damage is None and isinstance(exc, OSError | ValueError):  # pyarrow's, in-process
        damage = local_damage(inputs)
    if damage is not None:
        raise damage from None
