"""A full disk (and a store this user cannot write) is reported as what it is: exit 6 /
HTTP 507 "no space left on the device" (exit 1 for a read-only store), never a damaged
store with advice to move it away, never a peer or node that cannot be reached.

A real full disk needs root (a small tmpfs): the subprocesses here get the fault from
``tests/node/diskfull/sitecustomize.py`` (the failing SQLite writes and what
``os.statvfs`` says), or from a file size limit (``RLIMIT_FSIZE``: writes past it fail
for real with EFBIG, which SQLite reports as ``disk I/O error``)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from merklog.node.failures import ExitCode, classify, exit_code_for_status
from merklog.node.middleware import _FAILURE_STATUS

from .conftest import Cli
from .test_cli_errors import assert_fails
from .test_cli_errors import merklog as output_to

FAULTS = Path(__file__).parent / "diskfull"


def fault_env(**faults: str) -> dict[str, str]:
    """The environment of a subprocess whose disk fails as ``faults`` say (see
    diskfull/sitecustomize.py): ``flag``, ``on`` or ``statvfs``."""
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}
    for name, value in faults.items():
        key = "STATVFS_FULL" if name == "statvfs" else f"FULL_{name.upper()}"
        env[f"MERKLOG_TEST_{key}"] = value
    return env


def merklog(
    home: Path, *args: str, env: dict | None = None, fsize: int | None = None
) -> subprocess.CompletedProcess:
    """``merklog --home HOME ARGS`` as a subprocess; ``fsize``: its file size limit."""

    def limit() -> None:
        if fsize is not None:
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, hard))

    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
        stdin=subprocess.DEVNULL,
        preexec_fn=limit,
    )


def test_a_running_node_answers_a_full_disk_507_and_the_cli_exits_6(
    tmp_path: Path, node_factory
) -> None:
    """It answered 500 "internal error" with a logged traceback, and the CLI exited 1."""
    home = tmp_path / "home"
    run = Cli(home)
    run("init")
    run("put", "edge(1, 2).")
    flag = tmp_path / "disk-is-full"
    node = node_factory(home, env=fault_env(flag=str(flag))).start()
    flag.touch()

    status, body = node.request("POST", "/v1/facts", {"assert": "edge(2, 3)."})
    assert status == 507, body
    assert body["error"] == "disk full" and "no space left on the device" in body["detail"]
    assert_fails(merklog(home, "put", "edge(2, 3)."), ExitCode.DISK_FULL, "no space left")
    assert "Traceback" not in node.stderr_text and "failed" not in node.stderr_text

    flag.unlink()  # space freed: writes work again, nothing of the failed ones is kept
    assert merklog(home, "put", "edge(3, 4).").returncode == 0
    facts = merklog(home, "ls").stdout
    assert "edge(3, 4)" in facts and "edge(2, 3)" not in facts


def test_put_through_a_node_on_a_full_disk_exits_6_keeping_what_it_printed(
    tmp_path: Path, node_factory
) -> None:
    """A put through the node stops at a full disk with exit 6 (it was exit 1 "internal
    error"): the lines it printed are a prefix of the input, all of them stored. (The
    requests in flight after the failed one may be stored unprinted: docs/operations.md.)"""
    home = tmp_path / "home"
    Cli(home)("init")
    fired = tmp_path / "fault.log"  # which write met the injected failure, and where
    node_factory(home, env={**fault_env(first="1"), "MERKLOG_TEST_FULL_LOG": str(fired)}).start()
    source = tmp_path / "facts.dl"
    lines = [f"edge({i}, {i})." for i in range(400)]
    source.write_text("\n".join(lines) + "\n")
    # node.max_body 1024: this put sends requests of at most 256 bytes (~20 facts).
    done = merklog(home, "--set", "node.max_body=1024", "put", "-f", str(source))
    where = fired.read_text() if fired.exists() else "(the failure was never injected)"
    assert done.returncode == ExitCode.DISK_FULL, (done.returncode, done.stderr, where)
    assert_fails(done, ExitCode.DISK_FULL, "no space left")
    printed = [line.split("\t")[1] + "." for line in done.stdout.splitlines()]
    stored = {line.split("\t")[1] + "." for line in merklog(home, "ls").stdout.splitlines()}
    assert printed == lines[: len(printed)] and set(printed) <= stored


def _joined(tmp_path: Path, node_factory) -> tuple[Cli, Cli]:
    """``a`` (running, holding a fact) and ``b``, which joined from it and never synced;
    ``a`` lets ``b`` sync."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    a("put", "edge(1, 2).")
    joined = b("init", "--join", na.url, "--token", na.read_token).output
    key = re.search(r"key hex\s+([0-9a-f]{64})", joined).group(1)
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", key)
    return a, b


def test_a_full_disk_during_sync_on_a_stopped_home_is_no_unreachable_peer(
    tmp_path: Path, node_factory, monkeypatch
) -> None:
    """It said "peer unreachable … Start that node" (exit 4): the peer was fine."""
    from merklog.store.sqlite import SQLiteBlockStore

    _a, b = _joined(tmp_path, node_factory)

    def failing(method):  # the disk fills once blocks come from the peer (not as it opens)
        def put(self, blocks):
            blocks = list(blocks)
            if len(blocks) > 1:
                raise sqlite3.OperationalError("database or disk is full")
            return method(self, blocks)

        return put

    for name in ("put_many", "put_encoded"):
        monkeypatch.setattr(SQLiteBlockStore, name, failing(getattr(SQLiteBlockStore, name)))
    for args in (("sync", "origin"), ("put", "mine(1).")):  # put: syncs first (joined)
        result = b(*args, ok=False)
        assert result.exit_code == ExitCode.DISK_FULL, result.output
        assert "no space left" in result.output and "reach" not in result.output
    assert not (b.home / "peersync.json.tmp").exists()

    # The full disk fails the peer history's save too: the failure is said on its one
    # Error line; a WARNING "could not save …/peersync.json" beside it repeated it.
    from merklog.node import peersync

    def no_space(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(peersync, "write_private", no_space)
    result = b("sync", "origin", ok=False)
    assert result.exit_code == ExitCode.DISK_FULL, result.output
    assert "could not save" not in result.output, result.output


def test_a_full_disk_during_sync_through_a_node_is_no_unreachable_peer(
    tmp_path: Path, node_factory
) -> None:
    """A running node answered 502 "peer unreachable" (POST /v1/sync, `merklog sync`:
    exit 4) and, for a joined node's first write, 503 "Start that node"."""
    _a, b = _joined(tmp_path, node_factory)
    flag = tmp_path / "disk-is-full"
    nb = node_factory(b.home, env=fault_env(flag=str(flag))).start()
    flag.touch()
    status, body = nb.request("POST", "/v1/facts", {"assert": "mine(1)."})
    assert status == 507 and body["error"] == "disk full", body
    status, body = nb.request("POST", "/v1/sync", {"url": "origin"})
    assert status == 507 and body["error"] == "disk full", body
    assert_fails(merklog(b.home, "sync", "origin"), ExitCode.DISK_FULL, "no space left")
    flag.unlink()
    status, body = nb.request("POST", "/v1/sync", {"url": "origin"})
    assert status == 200, body


def test_opening_a_home_on_a_full_disk_is_no_damaged_store(tmp_path: Path) -> None:
    """SQLite says "disk I/O error" when it cannot grow -shm; that was "the store is
    damaged … move it away and run `merklog init`" (exit 5) for a healthy home."""
    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", "edge(1, 2).")
    assert not (home / "store.sqlite-shm").exists()
    # -shm cannot grow past 16 KiB (a real write failure), and the disk shows no space.
    full = fault_env(statvfs="1")
    for args in (("status",), ("query", "edge(X, Y)"), ("put", "edge(2, 3).")):
        done = merklog(home, *args, env=full, fsize=16 << 10)
        line = assert_fails(done, ExitCode.DISK_FULL, "no space left on the device")
        assert "damaged" not in line and "init" not in line
    assert "edge(1, 2)" in merklog(home, "ls").stdout


def test_a_store_this_user_cannot_write_is_no_damaged_store(tmp_path: Path) -> None:
    """``attempt to write a readonly database`` (a store owned by another user, a
    read-only mount) was "damaged … move it away and run `merklog init`" (exit 5).
    Root writes any file, so the error comes from SQLite opening the file read-only."""
    home = tmp_path / "home"
    Cli(home)("init")
    conn = sqlite3.connect(f"file:{home / 'store.sqlite'}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as err:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    code, message = classify(err.value, home)
    assert code == ExitCode.FAILED
    assert str(home / "store.sqlite") in message and "writable" in message
    assert "damaged" not in message and "init" not in message


def test_a_full_disk_leaves_no_temporary_file_in_the_home(tmp_path: Path) -> None:
    """``peers add`` on a full disk left an empty ``config.toml.tmp`` behind (here the
    write fails for real past a file size limit, EFBIG)."""
    home = tmp_path / "home"
    Cli(home)("init")
    before = (home / "config.toml").read_bytes()
    done = merklog(home, "peers", "add", "p1", "http://127.0.0.1:9", "--key", "cd" * 32, fsize=512)
    assert_fails(done, ExitCode.DISK_FULL, "no space left")
    assert (home / "config.toml").read_bytes() == before
    assert sorted(p.name for p in home.iterdir() if p.name.endswith(".tmp")) == []


def test_a_ticking_node_on_a_full_disk_logs_one_warning(tmp_path: Path, node_factory) -> None:
    """It logged "epoch failed" and a traceback for every epoch (5 a second here)."""
    home = tmp_path / "home"
    Cli(home)("init")
    flag = tmp_path / "disk-is-full"
    node = node_factory(
        home,
        env=fault_env(flag=str(flag)),
        options=("-v", "--set", "node.tick=true", "--set", "node.epoch_interval=0.2"),
    ).start()
    flag.touch()
    time.sleep(2)
    flag.unlink()
    deadline = time.monotonic() + 10
    while "epochs work again" not in node.stderr_text and time.monotonic() < deadline:
        time.sleep(0.1)
    log = node.stderr_text
    assert "Traceback" not in log and "epoch failed" not in log, log
    warnings = [line for line in log.splitlines() if "epochs fail" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], log
    assert "no space left on the device" in warnings[0]
    assert "epochs work again" in log


def test_export_through_a_node_reports_local_output_errors_as_such(
    tmp_path: Path, node_factory
) -> None:
    """A full local disk was "cannot reach node …: [Errno 28]" (exit 4), and a closed
    standard output "[Errno 32] Broken pipe" (exit 4)."""
    home = tmp_path / "home"
    run = Cli(home)
    run("init")
    source = tmp_path / "facts.dl"
    source.write_text("".join(f"edge({i}, {i + 1}).\n" for i in range(5000)))
    run("put", "-f", str(source))
    node_factory(home).start()

    out = tmp_path / "out.car"
    done = merklog(home, "export", str(out), fsize=64 << 10)  # a write fails: EFBIG
    assert_fails(done, ExitCode.DISK_FULL, "no space left")
    assert not out.exists() and not (tmp_path / "out.car.tmp").exists()

    proc = subprocess.Popen(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "export", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(100)
    proc.stdout.close()  # `| head -c 100`
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


def test_http_statuses_map_back_to_the_exit_statuses_they_come_from() -> None:
    """The node's 409 "failed" (exit 1) came back to the CLI as exit 2 (bad input)."""
    for code, (status, _name) in _FAILURE_STATUS.items():
        if code == ExitCode.STORE_DAMAGED:
            continue  # 500 is also the node's "internal error": the CLI cannot tell
        assert exit_code_for_status(status) == code, (code, status)
    assert exit_code_for_status(409) == ExitCode.FAILED


def test_an_io_error_with_space_left_is_not_a_full_disk(tmp_path: Path) -> None:
    """Free space is what tells a full disk from other I/O errors of SQLite."""
    code, _ = classify(sqlite3.OperationalError("disk I/O error"), tmp_path)
    assert code == ExitCode.STORE_DAMAGED
    code, _ = classify(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert code == ExitCode.DISK_FULL


def test_output_to_a_full_disk_is_one_line_and_exit_6(tmp_path: Path) -> None:
    """``merklog status > /dev/full`` (output to a full disk) said the error line, then
    Python's "Exception ignored … OSError" lines, and exited 120. One line now, exit 6,
    and what the command wrote to the home stays written."""
    home = tmp_path / "home"
    Cli(home)("init")
    for args in (("status",), ("put", "out(1)."), ("query", "out(X)"), ("export", "-")):
        with open("/dev/full", "w") as full:
            done = output_to(home, *args, stdout=full)
        assert done.returncode == ExitCode.DISK_FULL, (args, done.returncode, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith("Error: cannot write the output:"), line
    assert "out(1)" in merklog(home, "ls").stdout


def test_a_write_over_the_file_size_limit_is_no_damaged_store(tmp_path: Path) -> None:
    """``ulimit -f`` (or FAT32's 4 GiB) under ``put -f``: SQLite says "disk I/O error"
    (SQLITE_IOERR_WRITE) with room left on the disk, and that was "the store … is damaged
    … move it away and run merklog init" (exit 5) for a healthy store."""
    home = tmp_path / "home"
    Cli(home)("init")
    facts = tmp_path / "facts.dl"
    facts.write_text("".join(f"edge({i}, {i + 1}).\n" for i in range(100_000)))
    done = merklog(home, "put", "-q", "-f", str(facts), fsize=4 << 20)
    line = assert_fails(done, ExitCode.DISK_FULL, "the file system refused a write")
    assert "damaged or not" not in line and "init" not in line
    assert merklog(home, "fsck").returncode == 0


def test_out_of_file_descriptors_is_said_as_such(tmp_path: Path) -> None:
    """QA: under ``ulimit -n 8`` a put said ``/…/engine/incremental.py: Too many open
    files`` (a lazy import's file), and with fewer, SQLite's "unable to open database
    file" was "the store … is damaged … move it away and run merklog init" (exit 5) for
    a healthy store. Each limit gives success or one line naming the limit, exit 1."""
    home = tmp_path / "home"
    Cli(home)("init")
    said = []
    for limit in range(4, 16):

        def nofile(limit: int = limit) -> None:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

        done = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "put", "n(1)."],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            preexec_fn=nofile,
        )
        if done.returncode == 0 or "Fatal Python error" in done.stderr:
            continue  # enough, or too few for the interpreter itself to start
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, (limit, done.returncode, done.stderr)
        assert "damaged" not in lines[0] and ".py" not in lines[0], lines[0]
        assert "ulimit -n" in lines[0], lines[0]
        said.append(limit)
    assert said, "no limit made the put fail: the test tests nothing"
    assert merklog(home, "fsck").returncode == 0


def test_full_disk_names_the_file_for_export_and_node_run(tmp_path: Path) -> None:
    """QA: ``export /dev/full`` said "no space left on the device: [Errno 28] …" without
    the file, and ``node run`` on a full disk said "cannot serve on 127.0.0.1:PORT" (exit
    1) when writing its run file node.json failed. Both now name the file and exit 6:
    export for real; the run file's write on a real full 4 MiB tmpfs (root only; that
    part is skipped otherwise), and node run keeps "cannot serve" for address errors."""
    import errno
    import socket

    from merklog.node.commands.node_cmd import _address_problem
    from merklog.node.files import write_private

    home = tmp_path / "home"
    Cli(home)("init")
    done = merklog(home, "export", "/dev/full")
    line = assert_fails(done, ExitCode.DISK_FULL, "cannot write /dev/full: no space left")
    assert "Errno" not in line
    assert _address_problem(OSError(errno.EADDRINUSE, "Address already in use"))
    assert _address_problem(socket.gaierror(-2, "Name or service not known"))
    small = tmp_path / "small"
    small.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        # take every free block: the write that meets the full disk ends the loop
        with open(small / "filler", "wb", buffering=0) as fill, contextlib.suppress(OSError):
            while True:
                fill.write(b"\0" * 4096)
        with pytest.raises(OSError) as full:
            write_private(small / "node.json", b'{"pid": 1, "url": "http://127.0.0.1:1"}')
        assert full.value.filename == str(small / "node.json")
        assert not _address_problem(full.value)
        code, message = classify(full.value, None)
        assert code == ExitCode.DISK_FULL and message.startswith(
            f"cannot write {small / 'node.json'}: no space left on the device"
        )
        assert not (small / "node.json.tmp").exists()
    finally:
        subprocess.run(["umount", str(small)], check=False)
