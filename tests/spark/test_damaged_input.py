"""A Parquet input whose pages are damaged (its footer intact, so it passes the checks
made before the JVM starts) is one line naming the file, exit 2, like a file that is not
Parquet at all: no Java stack trace, no internal error, no output folder left behind."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from .test_cli import _merklog


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of 2000 facts whose op file's pages (not its footer) are garbled, made
    once for the module (the commands only read it): ``<dir>/ex/ops/…``, home ``<dir>/h``."""
    tmp_path = tmp_path_factory.mktemp("damaged")
    home = tmp_path / "h"
    facts = tmp_path / "facts.dl"
    facts.write_text("".join(f'a({i}, "v{i * 7919}").\n' for i in range(2000)))
    for args in (("init",), ("put", "-f", str(facts)), ("parquet", "export", str(tmp_path / "ex"))):
        done = _merklog("--home", str(home), *args)
        assert done.returncode == 0, done.stderr
    part = next((tmp_path / "ex" / "ops").glob("*.parquet"))
    data = bytearray(part.read_bytes())
    (footer,) = struct.unpack("<I", data[-8:-4])
    for i in range(4, len(data) - 8 - footer):  # every page, past the leading PAR1
        data[i] ^= 0x5A
    part.write_bytes(bytes(data))
    return part


@pytest.mark.parametrize(
    "command",
    [
        ["compact", "{ex}", "--out", "{out}"],  # read in this process (pyarrow) first
        ["compact", "{ex}", "--out", "{out}", "--args-in-spark"],  # read by Spark
        ["analyze", "{prog}", "--input", "{ex}", "--out", "{out}"],  # read by Spark
    ],
    ids=["compact", "compact-args-in-spark", "analyze"],
)
def test_a_damaged_input_is_one_line_naming_it_exit_2(tmp_path, damaged, command):
    made = damaged.parent.parent.parent
    prog = tmp_path / "p.dl"
    prog.write_text("b(X) :- a(X, _).\n")
    out = tmp_path / "out"
    args = [a.format(ex=made / "ex", out=out, prog=prog) for a in command]
    done = _merklog("--home", str(made / "h"), *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error: cannot read {damaged}: the file is damaged ("), lines
    assert "Py4J" not in done.stderr and "internal error" not in done.stderr
    assert not out.exists()  # the folder the command made is gone again
