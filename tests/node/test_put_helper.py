"""``put -f`` on a stopped home reads, checks and encodes the chunks after the first in a
forked helper process (ADR 0147): real ``merklog`` processes, real SQLite homes. What is
stored and printed is what the put gives without the helper, errors keep their exact
message and place, and the helper never outlives the put."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from merklog.node import helperproc
from merklog.node.helperproc import Helper, HelperError

from .conftest import as_printed, put_script, reaped

# The child kills itself (a real SIGKILL) once it has sent the count and one chunk.
KILL_IN_HELPER = (
    "import os, signal\n"
    "real = put._rest_in_helper\n"
    "def dying(*args):\n"
    "    for n, item in enumerate(real(*args)):\n"
    "        if n == 2:\n"
    "            os.kill(os.getpid(), signal.SIGKILL)\n"
    "        yield item\n"
    "put._rest_in_helper = dying\n"
)
CHUNK = 1200
# Values Python's == merges (1, 1.0, true) beside look-alikes, in the spellings the
# line reader takes; -0.0 is normalised by the checks (rendered as 0.0).
VALUES = ["1", "1.0", "true", '"1"', "-0.5", '"x"', "9223372036854775807", "false", "-0.0"]


def _merklog(
    home: Path, *args: str, helper: bool = True, extra: str = ""
) -> subprocess.CompletedProcess:
    env = {**os.environ, "MERKLOG_PUT_HELPER": "1" if helper else "0"}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            put_script("LOCAL_CHUNK_FACTS", extra),
            str(CHUNK),
            "-v",
            "--home",
            str(home),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _init(home: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "init"],
        check=True,
        capture_output=True,
    )


def _helper_pid(stderr: str) -> int | None:
    found = re.search(r"helper process (\d+) reads", stderr)
    return int(found.group(1)) if found else None


def _printed(stdout: str) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in stdout.splitlines() if "\t" in line]


def _count(home: Path, table: str) -> int:
    with sqlite3.connect(home / "store.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork on Linux")


def test_the_helper_stores_and_prints_what_the_put_gives_without_it(tmp_path: Path) -> None:
    """Six chunks of mixed-type facts, repeats across chunks, a value the checks
    normalise (-0.0) and, in the fifth chunk, a spelling the line reader leaves to the
    parser (``x"01"``): the same output lines (CIDs in input order, facts as given, -0.0 as 0.0) and
    the same visible facts with and without the helper, and the helper was used."""
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(5000)]
    lines += lines[1300:1500]  # repeats of chunk 2 in chunk 5
    lines += ['w(1, x"01").', 'w(1, "1").', "w(1, 1).", "w(1, 1.0).", "w(1, true)."]
    lines += [f"u({i})." for i in range(1700)]
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    with_helper, without = tmp_path / "a", tmp_path / "b"
    _init(with_helper)
    _init(without)
    got = _merklog(with_helper, "put", "-f", str(data))
    want = _merklog(without, "put", "-f", str(data), helper=False)
    assert got.returncode == 0 == want.returncode, got.stderr + want.stderr
    pid = _helper_pid(got.stderr)
    assert pid is not None and reaped(pid), got.stderr
    assert _helper_pid(want.stderr) is None
    assert got.stdout == want.stdout
    printed = _printed(got.stdout)
    assert [fact + "." for _cid, fact in printed] == as_printed(lines)
    w_cids = {cid for cid, fact in printed if fact.startswith("w(")}
    assert len(w_cids) == 5  # x"01", "1", 1, 1.0 and true: five values, five CIDs
    for rel in ("v", "w", "u"):
        query = f"{rel}(X, Y)" if rel != "u" else "u(X)"
        rows = [
            json.loads(_merklog(home, "query", "--json", query).stdout)["rows"]
            for home in (with_helper, without)
        ]
        assert sorted(map(json.dumps, rows[0])) == sorted(map(json.dumps, rows[1]))
    assert _count(with_helper, "repl_assert") == _count(without, "repl_assert") == 6705


# Chunks of a quarter of an input from 1,000 lines on (ADR 0194; 20,000 in merklog).
QUARTERS = "put.SPLIT_FROM_LINES = 1000\n"


def test_an_input_cut_in_quarters_is_stored_and_printed_as_one_chunk_gives(
    tmp_path: Path,
) -> None:
    """ADR 0194 in real processes: an input of fewer lines than a chunk, but at least
    ``SPLIT_FROM_LINES``, is written in quarters, the rest read and prepared by the
    helper. Mixed-type values: the output lines and the visible facts are those of the
    same input written as one chunk, read first (no helper)."""
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(1100)]
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    quartered, whole = tmp_path / "a", tmp_path / "b"
    _init(quartered)
    _init(whole)
    got = _merklog(quartered, "put", "-f", str(data), extra=QUARTERS)
    want = _merklog(whole, "put", "-f", str(data))  # 1,100 lines, a chunk of 1,200
    assert got.returncode == 0 == want.returncode, got.stderr + want.stderr
    pid = _helper_pid(got.stderr)
    assert pid is not None and reaped(pid), got.stderr
    assert _helper_pid(want.stderr) is None
    assert got.stdout == want.stdout
    assert [fact + "." for _cid, fact in _printed(got.stdout)] == as_printed(lines)
    rows = [
        json.loads(_merklog(home, "query", "--json", "v(X, Y)").stdout)["rows"]
        for home in (quartered, whole)
    ]
    assert sorted(map(json.dumps, rows[0])) == sorted(map(json.dumps, rows[1]))
    assert _count(quartered, "repl_assert") == _count(whole, "repl_assert") == 1100


def test_a_syntax_error_read_by_the_helper_writes_nothing(tmp_path: Path) -> None:
    """A syntax error in the fourth chunk, found by the helper while the first chunk's
    write waits at its commit: nothing is written, the error names its line and column
    in the whole file, exit 2, no traceback, the helper gone."""
    home = tmp_path / "h"
    _init(home)
    assert _merklog(home, "put", "seen(1).").returncode == 0
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(5000)]
    lines[4000] = "v(4000, )."
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    result = _merklog(home, "put", "-f", str(data))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and not _printed(result.stdout)
    assert "4001:9: expected a term" in result.stderr
    pid = _helper_pid(result.stderr)
    assert pid is not None and reaped(pid)
    assert _count(home, "repl_assert") == 1


def test_a_chunk_the_helper_refuses_stops_the_put_after_the_chunks_before(
    tmp_path: Path,
) -> None:
    """A fact that breaks the program's ``.decl`` in the third chunk: the first two
    chunks are written and printed, then the declaration's one-line error, exit 2; the
    fourth chunk is never written."""
    home = tmp_path / "h"
    _init(home)
    prog = tmp_path / "p.dl"
    prog.write_text(".decl edge(src: int, dst: int).\npath(X, Y) :- edge(X, Y).\n")
    assert _merklog(home, "load", str(prog)).returncode == 0
    lines = [f"edge({i}, {i + 1})." for i in range(4 * CHUNK)]
    lines[2 * CHUNK + 5] = "edge(7, 1.0)."
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    result = _merklog(home, "put", "-f", str(data))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert _helper_pid(result.stderr) is not None
    assert "edge(7, 1.0) does not fit" in result.stderr
    assert [fact + "." for _cid, fact in _printed(result.stdout)] == as_printed(lines[: 2 * CHUNK])
    assert _count(home, "repl_assert") == 2 * CHUNK


@pytest.mark.parametrize("values", [VALUES, VALUES[:-1]], ids=["normalised", "as-is"])
def test_a_helper_killed_mid_put_stops_it_with_one_line(
    tmp_path: Path, values: list[str]
) -> None:
    """The helper is killed (SIGKILL) after it sent its first chunk: the put writes and
    prints the chunks it had, then stops with one line naming the helper, exit 1, no
    traceback, the store intact. Without a value the checks normalise, the helper sends
    a chunk's text after the chunk (ADR 0149) and dies before that text: the put renders
    the chunk itself."""
    home = tmp_path / "h"
    _init(home)
    lines = [f"v({i}, {values[i % len(values)]})." for i in range(4 * CHUNK)]
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    result = _merklog(home, "put", "-f", str(data), extra=KILL_IN_HELPER)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("INFO ")]
    assert errors == ["Error: the put's helper process ended without finishing"], errors
    printed = [fact + "." for _cid, fact in _printed(result.stdout)]
    assert printed == as_printed(lines[: 2 * CHUNK])
    assert _count(home, "repl_assert") == 2 * CHUNK


def test_helper_items_arrive_in_order_and_errors_keep_their_type() -> None:
    """The generator's items in order; an error that pickles is raised as itself, one
    that does not as a HelperError with its message; closing early ends the child."""

    def numbers():
        yield from range(5)
        raise ValueError("bad value at 5")

    with Helper(numbers) as helper:
        got = []
        with pytest.raises(ValueError, match="bad value at 5"):
            for item in helper:
                got.append(item)
    assert got == [0, 1, 2, 3, 4]

    class Local(Exception):
        """Defined in a function: pickle cannot find it by name."""

    def unpicklable():
        yield "one"
        raise Local("kept message")

    with Helper(unpicklable) as helper:
        items = iter(helper)
        assert next(items) == "one"
        with pytest.raises(HelperError, match="kept message"):
            next(items)

    def endless():
        while True:
            yield b"x" * 100_000

    helper = Helper(endless)
    assert next(iter(helper)) == b"x" * 100_000
    helper.close()
    assert reaped(helper.pid)
    helper.close()  # idempotent


def test_no_helper_when_turned_off_or_threads_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERKLOG_PUT_HELPER", "0")
    assert not helperproc.available()
    monkeypatch.delenv("MERKLOG_PUT_HELPER")
    monkeypatch.setattr(helperproc.threading, "active_count", lambda: 2)
    assert not helperproc.available()
    monkeypatch.setattr(helperproc.threading, "active_count", lambda: 1)
    assert helperproc.available()


def test_the_child_ignores_ctrl_c() -> None:
    """SIGINT reaches the whole process group on a terminal: the helper ignores it (the
    writing process decides what an interrupt means) and keeps sending."""

    def slow():
        import time

        yield os.getpid()
        time.sleep(0.5)
        yield "after the interrupt"

    with Helper(slow) as helper:
        items = iter(helper)
        child = next(items)
        os.kill(child, signal.SIGINT)
        assert next(items) == "after the interrupt"


def test_a_helper_ends_with_its_killed_parent_and_frees_the_home_lock(tmp_path: Path) -> None:
    """``kill -9`` of a put left its forked helper running for seconds with the put's open
    files, the home's flock among them: the next command found the home "in use" and
    gave up after 15 s. The helper now dies with its parent, and the lock is free."""
    import fcntl
    import time

    lock = tmp_path / "node.lock"
    script = (
        "import fcntl, os, signal, sys, time\n"
        "from merklog.node.helperproc import Helper\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "def slow():\n"
        "    yield 1\n"
        "    time.sleep(60)  # busy with the next chunk, as a put's helper is for seconds\n"
        "    yield 2\n"
        "helper = Helper(slow)\n"
        "next(iter(helper))\n"
        "print(helper.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    parent = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    child = int(parent.stdout.strip())

    def running() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running()
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while held
    finally:
        os.close(fd)


def test_a_misfit_the_helper_finds_is_named_by_its_line(tmp_path: Path) -> None:
    """A fact that does not fit the program's declarations, in the last quarter of an
    input whose rest the helper prepares (ADR 0194): the error, raised in the helper and
    sent through its pipe, still names the fact, so the put names its ``FILE:LINE:COL``.
    The quarters before it are stored and printed, nothing after it (exit 2)."""
    home = tmp_path / "h"
    _init(home)
    prog = tmp_path / "p.dl"
    prog.write_text(".decl v(n: int, x: any).\n")
    assert _merklog(home, "load", str(prog)).returncode == 0
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(1100)]
    lines[999] = 'v("999", 1).'
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    result = _merklog(home, "put", "-f", str(data), extra=QUARTERS)
    assert result.returncode == 2, result.stderr
    assert _helper_pid(result.stderr) is not None
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{data}:1000:1: v(\"999\", 1) does not fit" in errors[0], errors[0]
    printed = _printed(result.stdout)
    assert [fact + "." for _cid, fact in printed] == as_printed(lines[:825])
    assert _count(home, "repl_assert") == 825
