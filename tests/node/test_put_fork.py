"""``put -f`` on a stopped home with a forked encoder/printer (ADR 0138), run as real
``merklog`` processes on real homes: the output is the one-process path's, byte for
byte; a rejected chunk stops the put after the chunks before it; a killed child or a
Ctrl-C ends the command with one line and no traceback, no child left behind, the
store intact and every printed CID durable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from .conftest import init_home

# Values Python's == merges (1, 1.0, true) beside look-alikes ("1", x"01").
VALUES = ["1", "1.0", "true", '"1"', 'x"01"', "-0.0", '"é"']

#: ``merklog`` with put's chunk sizes set from the environment (a small input then takes
#: the forked path in many chunks, as 1M facts do with the real sizes).
WRAPPER = """
import os, sys
from merklog.node.commands import put
put.FORK_FACTS = int(os.environ["FORK_FACTS"])
put.FORK_FIRST_FACTS = int(os.environ["FORK_FIRST"])
put.LOCAL_CHUNK_FACTS = int(os.environ["CHUNK"])
from merklog.node.cli import main
sys.argv[0] = "merklog"
main()
"""


def _env(fork: int, first: int = 3, chunk: int = 7) -> dict[str, str]:
    return {
        **os.environ,
        "FORK_FACTS": str(fork),
        "FORK_FIRST": str(first),
        "CHUNK": str(chunk),
    }


def _cmd(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", WRAPPER, "--home", str(home), *args]


def _put(home: Path, data: Path, fork: int, **kw: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        _cmd(home, "put", "-f", str(data)), capture_output=True, env=_env(fork, **kw), timeout=120
    )


def _merklog(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _facts(path: Path, n: int, extra: list[str] | None = None) -> list[str]:
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(n)]
    lines[10:10] = lines[:4]  # repeats inside the input
    lines += extra or []
    path.write_text("\n".join(lines) + "\n")
    return lines


def _printed(out: bytes) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in out.decode().splitlines()]


def _stored(home: Path) -> set[str]:
    done = _merklog(home, "ls", "v")
    if done.returncode == 3 and "no visible facts" in done.stderr:
        return set()
    assert done.returncode == 0, done.stderr
    return {line.split("\t")[0] for line in done.stdout.splitlines() if "\t" in line}


def _heads_and_count(home: Path) -> tuple:
    status = json.loads(_merklog(home, "status", "--json").stdout)
    return status["heads"], status["facts"]


def test_forked_put_prints_what_one_process_prints(tmp_path: Path) -> None:
    data = tmp_path / "facts.dl"
    lines = _facts(data, 103)
    forked, serial = tmp_path / "forked", tmp_path / "serial"
    init_home(forked)
    init_home(serial)
    a = _put(forked, data, fork=10)  # 3, then chunks of 7: 17 chunks, 17 transactions
    b = _put(serial, data, fork=10**9)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout  # byte-identical, in input order
    assert [f + "." for _c, f in _printed(a.stdout)] == lines
    assert _stored(forked) == _stored(serial) == {c for c, _f in _printed(a.stdout)}
    # Again: every fact is visible already, so the output is the same and nothing is added.
    before = _heads_and_count(forked)
    again = _put(forked, data, fork=10)
    assert again.returncode == 0 and again.stdout == a.stdout
    assert _heads_and_count(forked) == before  # no new delta
    assert _merklog(forked, "fsck").returncode == 0


def test_forked_put_stops_at_a_rejected_chunk(tmp_path: Path) -> None:
    home = tmp_path / "h"
    init_home(home)
    prog = tmp_path / "p.dl"
    prog.write_text(".decl v(k: int, x: any).\n.decl edge(src: int, dst: int).\n")
    assert _merklog(home, "load", str(prog)).returncode == 0
    data = tmp_path / "facts.dl"
    lines = [f"edge({i}, {i + 1})." for i in range(30)]
    lines[12] = "edge(7, 1.0)."  # the third chunk: [0..3) [3..10) [10..17)
    data.write_text("\n".join(lines) + "\n")
    done = _put(home, data, fork=10)
    assert done.returncode == 2, done.stderr
    err = done.stderr.decode()
    assert "edge(7, 1.0) does not fit" in err and "Traceback" not in err
    assert [f + "." for _c, f in _printed(done.stdout)] == lines[:10]
    listed = _merklog(home, "ls", "edge")
    assert len(listed.stdout.splitlines()) == 10


def test_forked_put_stops_at_a_fact_over_the_size_limit(tmp_path: Path) -> None:
    from merklog.replication.limits import MAX_FACT_BYTES

    home = tmp_path / "h"
    init_home(home)
    data = tmp_path / "facts.dl"
    lines = _facts(data, 20)
    big = f'v(999, "{"a" * MAX_FACT_BYTES}").'
    lines[13:13] = [big]  # the third chunk
    data.write_text("\n".join(lines) + "\n")
    done = _put(home, data, fork=10)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    printed = _printed(done.stdout)
    assert [f + "." for _c, f in printed] == lines[:10]
    assert _stored(home) == {c for c, _f in printed}


def _children(proc: subprocess.Popen, timeout: float = 60.0) -> list[psutil.Process]:
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = parent.children()
        if kids:
            return kids
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    raise AssertionError("put never forked its encoder")


def _start(home: Path, data: Path, out: Path) -> subprocess.Popen:
    with out.open("wb") as sink:
        return subprocess.Popen(
            _cmd(home, "put", "-f", str(data)),
            stdout=sink,
            stderr=subprocess.PIPE,
            env=_env(fork=1000, first=500, chunk=2000),
            start_new_session=True,  # a terminal's foreground group: Ctrl-C reaches both
        )


def _wait_for_output(out: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while out.stat().st_size == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def test_killed_child_ends_put_with_one_line_and_durable_output(tmp_path: Path) -> None:
    home = tmp_path / "h"
    init_home(home)
    data = tmp_path / "facts.dl"
    _facts(data, 60_000)
    out = tmp_path / "out.txt"
    proc = _start(home, data, out)
    (child,) = _children(proc)
    _wait_for_output(out, proc)  # a chunk or more committed and printed
    child.kill()
    _stdout, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 1, text
    assert "the encoding process ended (killed by signal 9)" in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1
    printed = {c for c, _f in _printed(out.read_bytes())}
    assert printed and printed <= _stored(home)  # every printed CID is durable
    assert _merklog(home, "fsck").returncode == 0


def test_ctrl_c_leaves_no_child_and_no_traceback(tmp_path: Path) -> None:
    home = tmp_path / "h"
    init_home(home)
    data = tmp_path / "facts.dl"
    _facts(data, 60_000)
    out = tmp_path / "out.txt"
    proc = _start(home, data, out)
    (child,) = _children(proc)
    _wait_for_output(out, proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
    _stdout, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode != 0 and "Traceback" not in text, text
    with pytest.raises(psutil.NoSuchProcess):
        child.wait(timeout=10)
        child.status()
    printed = {c for c, _f in _printed(out.read_bytes())}
    assert printed <= _stored(home)
    assert _merklog(home, "fsck").returncode == 0


def test_syntax_error_anywhere_writes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "h"
    init_home(home)
    data = tmp_path / "facts.dl"
    lines = _facts(data, 40)
    lines[33] = "v(33, ."
    data.write_text("\n".join(lines) + "\n")
    done = _put(home, data, fork=10)
    assert done.returncode == 2 and done.stdout == b""
    assert "34:" in done.stderr.decode()  # LINE:COL of lines[33]
    assert _stored(home) == set()
