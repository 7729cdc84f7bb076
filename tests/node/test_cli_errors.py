"""The CLI's one error boundary: every failure a user can cause or meet gives one
``Error:`` line on stderr and the documented exit status (docs/operations.md), never
a Python traceback. Each command runs as a real ``merklog`` subprocess on real files;
only the full disk is injected (in-process), because it cannot be produced safely.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from merklog.node.failures import ExitCode

from .conftest import Cli, put_script


def merklog(
    home: Path, *args: str, timeout: float = 120, stdout: Any = None
) -> subprocess.CompletedProcess:
    """``merklog --home HOME ARGS`` as a process, its output captured; ``stdout``: where
    its standard output goes instead (a full disk, a closed pipe)."""
    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args],
        stdout=subprocess.PIPE if stdout is None else stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        stdin=subprocess.DEVNULL,
    )


def assert_fails(result: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """Exit status ``code``, no traceback anywhere, one ``Error:`` line naming ``words``."""
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    assert result.returncode == code, (result.returncode, out)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ready(tmp_path: Path) -> Path:
    """An initialised home holding edge(1, 2)."""
    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", "edge(1, 2).")
    return home


def test_bad_input_exits_2(ready: Path, tmp_path: Path) -> None:
    assert_fails(merklog(ready, "put", "edge(1,"), ExitCode.BAD_INPUT, "1:")
    assert_fails(merklog(ready, "query", "edge(1,"), ExitCode.BAD_INPUT, "1:")
    assert_fails(merklog(ready, "query", "X > 1"), ExitCode.BAD_INPUT, "1:1:", "X > 1")
    assert_fails(merklog(ready, "--set", "nonsense", "status"), ExitCode.BAD_INPUT)
    bad = tmp_path / "bad.dl"
    bad.write_text("p(X) :- q(Y).\n")
    assert_fails(merklog(ready, "load", str(bad)), ExitCode.BAD_INPUT, "bad.dl:1:")
    big = tmp_path / "big.dl"  # one fact over the 1 MiB limit: refused, nothing written
    big.write_text(f'blob("{"x" * 1_100_000}").\n')
    assert_fails(merklog(ready, "put", "-f", str(big)), ExitCode.BAD_INPUT, "1048576-byte limit")
    junk = tmp_path / "junk.car"
    junk.write_bytes(b"\x01not a car at all")
    assert_fails(merklog(ready, "import", str(junk)), ExitCode.BAD_INPUT)
    assert Cli(ready)("ls").output.count("\t") == 1  # the store is intact


def test_an_unfinished_fact_argument_is_an_error_where_the_user_stopped(ready: Path) -> None:
    """``put 'bad(1'`` was given a ``.`` of its own and failed at "found '.'", a
    character the user never typed; a complete fact still needs no final ``.``."""
    for text, col in (("bad(1", 6), ("bad(", 5), ('bad(1, "a"', 11), ("bad(1, (2)", 11)):
        line = assert_fails(merklog(ready, "put", text), ExitCode.BAD_INPUT, "found end of input")
        assert f"1:{col}:" in line, line
        assert "'.'" not in line, line
    assert merklog(ready, "put", 'ok(1, "(")').returncode == 0
    assert merklog(ready, "retract", 'ok(1, "(")').returncode == 0


def test_a_bad_fact_in_a_file_is_named_with_its_file_line_and_column(
    ready: Path, tmp_path: Path, node_factory
) -> None:
    """``put -f facts.dl`` said ``2:6: …`` and, with facts given as arguments too, a line
    of the text it joined (``3:6``), a place in no file the user has. It names the file
    and its line, on a stopped home and through a running node, from a file or stdin;
    an argument's error keeps its own position."""
    data = tmp_path / "facts.dl"
    data.write_text("a(1).\nb(2, .\n")

    def check() -> None:
        at = f"{data}:2:6: expected a term"
        assert_fails(merklog(ready, "put", "-f", str(data)), ExitCode.BAD_INPUT, at)
        assert_fails(merklog(ready, "put", "x(1).", "y(2)", "-f", str(data)), 2, at)
        assert_fails(merklog(ready, "retract", "-f", str(data)), ExitCode.BAD_INPUT, at)
        piped = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(ready), "put", "-f", "-"],
            input=data.read_text(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert_fails(piped, ExitCode.BAD_INPUT, "<stdin>:2:6: expected a term")
        line = assert_fails(merklog(ready, "put", "bad(1"), ExitCode.BAD_INPUT)
        assert line.startswith("Error: 1:6: "), line

    check()
    node = node_factory(ready).start()
    try:
        check()
    finally:
        node.stop()
    assert Cli(ready)("ls").output.count("\t") == 1  # nothing written


@pytest.mark.parametrize(
    "args", [("status",), ("query", "edge(X, Y)"), ("ls",), ("put", "more(1)."), ("peers", "list")]
)
def test_a_closed_standard_output_ends_the_command_quietly(ready: Path, args) -> None:
    """``merklog status | head -1`` exited 1, sometimes with "Error: [Errno 32] Broken
    pipe" (rich's console and click each handled the closed pipe their own way). Now
    every command meets it alike: nothing on stderr, exit 141 (128 + SIGPIPE, as a Unix
    tool the signal ends). The pipe's reader is gone before the command writes."""
    Cli(ready)("peers", "add", "p", "http://127.0.0.1:9", "--key", "cd" * 32)
    read, write = os.pipe()
    os.close(read)
    try:
        result = merklog(ready, *args, timeout=60, stdout=write)
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (141, ""), result
    if args[0] == "put":  # what it wrote stays written
        assert "more(1)" in Cli(ready)("ls").output


def test_a_fact_over_the_limit_is_bad_input_through_a_running_node_too(
    ready: Path, tmp_path: Path, node_factory
) -> None:
    """Through a running node a fact over the 1 MiB limit was answered 403 ``refused``
    and the CLI said exit 7, as if the key could not write. It is bad input, as on a
    stopped home: 400 ``bad input`` naming the limit (it answered 413 ``too_large``,
    which the docs keep for a body over ``node.max_body``), exit 2, nothing written."""
    import json
    import tomllib
    import urllib.error
    import urllib.request

    node = node_factory(ready).start()
    try:
        big = tmp_path / "big.dl"
        big.write_text(f'blob("{"x" * 1_048_570}").\n')  # 1,048,577 bytes encoded
        assert_fails(
            merklog(ready, "put", "-f", str(big)), ExitCode.BAD_INPUT, "1048576-byte limit"
        )
        token = tomllib.loads((ready / "config.toml").read_text())["api"]["token"]
        body = json.dumps({"assert": [{"rel": "blob", "args": ["x" * 1_048_570]}]}).encode()
        request = urllib.request.Request(
            node.url + "/v1/facts",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400
        answer = json.loads(refused.value.read())
        assert answer["error"] == "bad input" and "1048576-byte limit" in answer["detail"]
        assert Cli(ready)("ls").output.count("\t") == 1  # nothing written
    finally:
        node.stop()


def test_a_relation_name_over_the_limit_anywhere_in_a_large_put_writes_nothing(
    ready: Path, tmp_path: Path
) -> None:
    """A relation name of 100,000 characters was accepted and synced, and then no home
    holding it could open (node/factscan padded every name to the longest). Names are
    now at most MAX_RELATION_CHARS, checked as the input is read: a too-long name on
    the last line of an input larger than one chunk is a LINE:COL error and nothing of
    the input is written, not the chunks before it."""
    # A real merklog whose chunks are 2,000 facts (LOCAL_CHUNK_FACTS is 200,000): the
    # input is still more than one chunk, its first written while the rest is read.
    chunk = 2000
    data = tmp_path / "facts.dl"
    lines = [f'n({i}, {i}.0, "{i}").' for i in range(chunk + 1000)]
    data.write_text("\n".join([*lines, "r" + "x" * 99_999 + "(1).", ""]))
    at = f"{len(lines) + 1}:1"
    put = subprocess.run(
        [sys.executable, "-c", put_script("LOCAL_CHUNK_FACTS"), str(chunk)]
        + ["--home", str(ready), "put", "-f", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        stdin=subprocess.DEVNULL,
    )
    assert_fails(put, ExitCode.BAD_INPUT, at, "256-character")
    assert Cli(ready)("ls").output.count("\t") == 1  # edge(1, 2) only


def test_deeply_nested_terms_exit_2_with_their_position(ready: Path, tmp_path: Path) -> None:
    """Terms nested thousands deep (a parenthesis or operator at a time): a LINE:COL
    syntax error and exit 2, where Python's stack used to overflow (an internal error,
    exit 70, or a message without a position)."""
    deep = "(" * 5000 + "1" + ")" * 5000
    facts = tmp_path / "deep.dl"
    facts.write_text(f"x({deep}).\n")
    assert_fails(merklog(ready, "put", "-f", str(facts)), ExitCode.BAD_INPUT, "1:103", "nests")
    assert_fails(merklog(ready, "query", f"edge({deep}, X)"), ExitCode.BAD_INPUT, "1:106")
    program = tmp_path / "deep_rule.dl"
    program.write_text("q(1).\np(X) :- q(Y), X == Y" + " + 1" * 5000 + ".\n")
    assert_fails(merklog(ready, "load", str(program)), ExitCode.BAD_INPUT, "deep_rule.dl:2:422")
    evaluated = merklog(ready, "eval", str(program))  # eval's own convention: FILE:LINE:COL
    assert evaluated.returncode == 1 and "Traceback" not in evaluated.stderr
    assert evaluated.stderr.startswith(f"{program}:2:422: this term nests"), evaluated.stderr
    assert Cli(ready)("ls").output.count("\t") == 1  # the store is intact


def test_not_found_exits_3(ready: Path) -> None:
    line = assert_fails(merklog(ready, "retract", "edge(5, 5)."), ExitCode.NOT_FOUND)
    assert "not visible" in line and "edge(5, 5)" in line
    assert_fails(merklog(ready, "query", "nope(X)"), ExitCode.NOT_FOUND, "unknown relation nope/1")
    assert_fails(merklog(ready, "query", "edge(X)"), ExitCode.NOT_FOUND, "edge/2")
    cid = "bafyreigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
    assert_fails(merklog(ready, "get", cid), ExitCode.NOT_FOUND, cid)


def test_peer_down_exits_4(ready: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = merklog(ready, "sync", url)
    assert_fails(result, ExitCode.PEER_UNREACHABLE, "cannot reach peer")
    assert result.stderr.strip().count("\n") == 0, result.stderr  # one line, no log echo
    fresh = tmp_path / "fresh"
    assert_fails(merklog(fresh, "init", "--join", url), ExitCode.PEER_UNREACHABLE, url)
    assert not fresh.exists()


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100:] = bytes((i * 131 + 7) % 256 for i in range(len(data) - 100))
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _delete(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize("damage", [_corrupt, _truncate, _empty, _delete])
def test_damaged_store_exits_5(ready: Path, damage) -> None:
    damage(ready / "store.sqlite")
    for args in (("status",), ("query", "edge(X, Y)"), ("node", "run", "--port", "0")):
        assert_fails(merklog(ready, *args), ExitCode.STORE_DAMAGED, "store")


def test_a_damaged_store_names_a_way_out_that_works(ready: Path, tmp_path: Path) -> None:
    """The message of a damaged store names the command that restores a backup into a
    fresh home (it named `merklog import`, which refuses a home that is not initialised)."""
    import re

    backup = tmp_path / "backup.car"
    assert merklog(ready, "export", str(backup)).returncode == 0
    before = merklog(ready, "ls").stdout
    _empty(ready / "store.sqlite")
    failed = merklog(ready, "status")
    assert_fails(failed, ExitCode.STORE_DAMAGED, "restore BACKUP.car")
    found = re.search(r"`merklog --home NEW_HOME (\w+) BACKUP\.car`", failed.stderr)
    assert found is not None, failed.stderr
    fresh = tmp_path / "fresh"
    assert merklog(fresh, found.group(1), str(backup)).returncode == 0
    assert merklog(fresh, "ls").stdout == before != ""


@pytest.mark.parametrize("damage", [_corrupt, _delete])
def test_a_damaged_store_says_to_move_the_home_and_that_works(
    ready: Path, tmp_path: Path, damage
) -> None:
    """QA: a corrupted store said "move it away and run `merklog init`"; moving the store
    away, as it said, made `init` refuse again (a home whose store is missing). The line
    says to move the whole home away, and `init` then makes a home there."""
    damage(ready / "store.sqlite")
    failed = merklog(ready, "status")
    assert_fails(failed, ExitCode.STORE_DAMAGED, "move the whole home away", "merklog init")
    ready.rename(tmp_path / "moved")
    made = merklog(ready, "init")
    assert made.returncode == 0, made.stderr
    assert merklog(ready, "status").returncode == 0


def test_every_home_command_reports_a_damaged_store(ready: Path, tmp_path: Path) -> None:
    _corrupt(ready / "store.sqlite")
    facts = tmp_path / "f.dl"
    facts.write_text("edge(3, 4).\n")
    prog = tmp_path / "p.dl"
    prog.write_text("path(X, Y) :- edge(X, Y).\n")
    car = tmp_path / "x.car"
    for args in (
        ("put", "edge(2, 3)."),
        ("put", "-f", str(facts)),
        ("retract", "edge(1, 2)."),
        ("ls",),
        ("get", "bafyreigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"),
        ("load", str(prog)),
        ("export", str(car)),
        ("sync", f"http://127.0.0.1:{free_port()}"),
        ("parquet", "export", str(tmp_path / "pq")),
    ):
        assert_fails(merklog(ready, *args), ExitCode.STORE_DAMAGED)
    assert not car.exists()


def test_unknown_backend_leaves_nothing_half_created(tmp_path: Path) -> None:
    home = tmp_path / "new"
    assert_fails(merklog(home, "--set", "store.backend=bogus", "init"), ExitCode.BAD_INPUT, "bogus")
    assert not home.exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    assert_fails(merklog(existing, "--set", "store.backend=bogus", "init"), ExitCode.BAD_INPUT)
    # the backend is checked before anything is created, the home lock included
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
    assert merklog(existing, "init").returncode == 0  # and a correct init then works
    assert merklog(existing, "status").returncode == 0


def test_a_failed_node_run_init_leaves_nothing_half_created(tmp_path: Path, monkeypatch) -> None:
    """``node run --init`` (the image's default command) with its IPFS daemon down left
    ``identity.pem`` and ``node.lock`` behind: a home every later command called "not a
    merklog home". It now rolls back as ``merklog init`` does; so does the Python API's
    first ``merklog.open`` of a home."""
    down = {
        "MERKLOG_STORE_BACKEND": "ipfs",
        "MERKLOG_STORE_IPFS_API": f"http://127.0.0.1:{free_port()}",
    }

    def node_run_init(home: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(home)]
            + ["node", "run", "--init", "--port", "0"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **down},
            stdin=subprocess.DEVNULL,
        )

    home = tmp_path / "new"
    assert_fails(node_run_init(home), ExitCode.PEER_UNREACHABLE, "IPFS")
    assert not home.exists()
    volume = tmp_path / "volume"  # an empty directory (a container's /data volume)
    volume.mkdir()
    assert_fails(node_run_init(volume), ExitCode.PEER_UNREACHABLE, "IPFS")
    assert {p.name for p in volume.iterdir()} <= {"node.lock"}  # no key, config or store
    assert merklog(volume, "init").returncode == 0  # and a later init works there

    import merklog as api

    for key, value in down.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(api.Error):
        api.open(tmp_path / "api")
    assert not (tmp_path / "api").exists()


def test_missing_home_says_run_init(tmp_path: Path) -> None:
    for args in (("status",), ("put", "a(1)."), ("query", "a(X)"), ("parquet", "export", "x")):
        assert_fails(merklog(tmp_path / "none", *args), ExitCode.FAILED, "merklog", "init")
    assert not (tmp_path / "none" / "config.toml").exists()


# ---------------------------------------------------------------- full disk (injected)


def test_full_disk_exits_6_and_loses_nothing(ready: Path, tmp_path: Path, monkeypatch) -> None:
    from merklog.store.sqlite import SQLiteBlockStore

    run = Cli(ready)

    def full(*_args, **_kw):
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as m:
        # the blocks a write stores (the test met the fault at opening before: the
        # genesis block was put again on every open, which it no longer is)
        m.setattr(SQLiteBlockStore, "put_many", full)
        m.setattr(SQLiteBlockStore, "put_encoded", full)
        result = run("put", "edge(7, 8).", ok=False)
    assert result.exit_code == ExitCode.DISK_FULL and "no space left" in result.output
    assert "Traceback" not in result.output
    assert [line.split("\t")[1] for line in run("ls").output.splitlines()] == ["edge(1, 2)"]

    def enospc(*_args, **_kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    car = tmp_path / "backup.car"
    with monkeypatch.context() as m:
        m.setattr("merklog.store.car.write_car", enospc)
        result = run("export", str(car), ok=False)
    assert result.exit_code == ExitCode.DISK_FULL and "no space left" in result.output
    assert not car.exists() and not (tmp_path / "backup.car.tmp").exists()


def test_unknown_relation_through_a_running_node_exits_3(ready: Path, node_factory) -> None:
    node_factory(ready).start()
    assert_fails(merklog(ready, "query", "nope(X)"), ExitCode.NOT_FOUND, "unknown relation nope/1")
    assert_fails(merklog(ready, "query", "edge(X)"), ExitCode.NOT_FOUND, "edge/2")
    line = assert_fails(merklog(ready, "retract", "edge(5, 5)."), ExitCode.NOT_FOUND)
    assert "not visible" in line


@pytest.mark.parametrize(
    "args",
    [
        ("query", "edge(X, Y)", "--json", "--csv"),
        ("export", "/"),
        ("get",),
        ("querry", "edge(X, Y)"),
        ("put", "--nope"),
    ],
)
def test_a_usage_error_is_one_line(ready: Path, args: tuple[str, ...]) -> None:
    """Click printed a usage error as four lines (usage, a hint, a blank line, the
    error); it is one ``Error:`` line that names the command's ``--help``, exit 2."""
    done = merklog(ready, *args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("Error: ") and "--help`)" in done.stderr, done.stderr


def test_ctrl_c_of_a_command_that_writes_nothing_says_only_that(tmp_path: Path) -> None:
    """The note on what stays written is for put and retract; ``eval``, ``compact`` or
    ``analyze`` interrupted said it too. Tracebacks that libraries log for the call Ctrl-C
    cut short (py4j's 'Exception while sending command') are not printed below -vv."""
    import signal
    import time

    program = tmp_path / "slow.dl"  # a million rounds before it stops: seconds
    program.write_text("n(0).\nn(X + 1) :- n(X).\n")
    (tmp_path / "facts").mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "merklog.node.cli",
            "eval",
            str(program),
            "--facts",
            str(tmp_path / "facts"),
            "--out",
            str(tmp_path / "out"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.strip() == "Error: interrupted (Ctrl-C)", err


def test_library_tracebacks_caused_by_ctrl_c_are_not_logged() -> None:
    import logging

    from merklog.node.logs import interrupted

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("reentrant call") from None
    except RuntimeError:
        cut = logging.LogRecord("root", logging.ERROR, "x", 1, "sending", None, sys.exc_info())
    assert cut.exc_info[1].__context__ is not None and interrupted(cut)
    plain = logging.LogRecord("root", logging.ERROR, "x", 1, "other", None, None)
    assert not interrupted(plain)


def test_a_program_file_that_is_not_utf8_is_named_with_its_place(
    ready: Path, tmp_path: Path
) -> None:
    """``load`` of a Latin-1 file said only ``'utf-8' codec can't decode byte 0xe9 in
    position 19``: no file, no line."""
    latin = tmp_path / "latin.dl"
    latin.write_bytes("p(X) :- q(X).\nr(X) :- q(X). % café\n".encode("latin-1"))
    assert_fails(merklog(ready, "load", str(latin)), ExitCode.BAD_INPUT, f"{latin}:2:20: not UTF-8")
    evaluated = merklog(
        ready, "eval", str(latin), "--facts", str(tmp_path), "--out", str(tmp_path / "o")
    )
    assert evaluated.returncode == 1 and evaluated.stderr.startswith(f"{latin}:2:20: not UTF-8")


def test_with_json_logs_the_error_line_is_json_too(ready: Path) -> None:
    """``--log-format json`` promised JSON lines on stderr, but a failing command ended
    with a plain ``Error:`` line."""
    import json

    for args, code in (
        (("query", "nope(X)"), ExitCode.NOT_FOUND),
        (("query", "edge(X, Y)", "--json", "--csv"), ExitCode.BAD_INPUT),
        (("put", "edge(1,"), ExitCode.BAD_INPUT),
        (("nosuchcmd",), ExitCode.BAD_INPUT),  # was plain text: met before the options (QA)
    ):
        done = merklog(ready, "--log-format", "json", *args)
        assert done.returncode == code, done.stderr
        records = [json.loads(line) for line in done.stderr.splitlines()]
        assert records[-1]["level"] == "ERROR" and records[-1]["logger"] == "merklog.cli"
        assert "Traceback" not in done.stderr


def test_a_refusing_peer_exits_1_and_an_unreachable_one_4_stopped_or_running(
    tmp_path: Path, node_factory
) -> None:
    """A script tells "peer down, retry" (4) from "peer refused, fix the config" (1): the
    same status and the same line whether the home's node is stopped or running."""
    a = Cli(tmp_path / "a")
    a("init")
    origin = node_factory(a.home).start()
    joined = Cli(tmp_path / "joined")  # A does not list its key: 403
    joined("init", "--join", origin.url, "--token", origin.read_token)
    other = Cli(tmp_path / "other")  # another dataset: 404
    other("init")
    down = f"http://127.0.0.1:{free_port()}"
    cases = [
        (joined.home, origin.url, ExitCode.FAILED, "peer refused", "not allowed to sync"),
        (other.home, origin.url, ExitCode.FAILED, "peer refused", "not served here"),
        (other.home, down, ExitCode.PEER_UNREACHABLE, "cannot reach peer", "connection refused"),
    ]
    stopped = [assert_fails(merklog(h, "sync", url), code, *w) for h, url, code, *w in cases]
    nodes = {h: node_factory(h).start() for h in (joined.home, other.home)}
    running = [assert_fails(merklog(h, "sync", url), code, *w) for h, url, code, *w in cases]
    assert running == stopped
    # A running node asked to sync with itself: it answers, and refuses.
    itself = nodes[other.home].url
    assert_fails(merklog(other.home, "sync", itself), ExitCode.FAILED, "peer refused")
    status, answer = nodes[other.home].request("POST", "/v1/sync", {"url": origin.url})
    assert (status, answer["error"]) == (424, "peer refused")
    status, answer = nodes[other.home].request("POST", "/v1/sync", {"url": down})
    assert (status, answer["error"]) == (502, "peer unreachable")


def test_a_peer_refusing_the_token_exits_1_for_join_and_peers_add(
    tmp_path: Path, node_factory
) -> None:
    """A wrong (or missing) read token is the peer's refusal, exit 1 (not bad input),
    whether ``init --join`` or ``peers add`` asked; the failed join leaves no home."""
    a = Cli(tmp_path / "a")
    a("init")
    node = node_factory(a.home).start()
    fresh = tmp_path / "fresh"
    for token in (("--token", "wrong"), ()):
        result = merklog(fresh, "init", "--join", node.url, *token)
        assert_fails(result, ExitCode.FAILED, node.url, "--token")
        assert not fresh.exists()
    b = Cli(tmp_path / "b")
    b("init")
    result = merklog(b.home, "peers", "add", "a", node.url, "--token", "wrong")
    assert_fails(result, ExitCode.FAILED, node.url)


def test_the_memory_store_is_refused_for_a_home(tmp_path: Path) -> None:
    """``init --store memory`` made a home in which every command started a new, empty
    dataset: ``put`` said it worked and kept nothing. A memory store only lives inside
    one process (``merklog.open(memory=True)``): init refuses it and creates nothing,
    and a home whose config.toml was edited to it is refused by every command."""
    home = tmp_path / "home"
    for args in (("init", "--store", "memory"), ("--set", "store.backend=memory", "init")):
        assert_fails(
            merklog(home, *args), ExitCode.BAD_INPUT, "memory", "merklog.open(memory=True)"
        )
        assert not home.exists()
    assert "memory" not in merklog(home, "init", "--help").stdout
    Cli(home)("init")
    config = home / "config.toml"
    config.write_text(config.read_text().replace('backend = "sqlite"', 'backend = "memory"'))
    for args in (("put", "a(1)."), ("status", "--json"), ("node", "run", "--port", "0")):
        assert_fails(merklog(home, *args), ExitCode.BAD_INPUT, str(config), "memory")


def test_a_missing_node_key_exits_5_and_no_new_key_is_made(ready: Path) -> None:
    """A command on an initialised home whose identity.pem was gone made a new key, so
    the owner's home could no longer write and was told to ask the dataset owner. Only
    ``init`` makes a key; every other command says the key is missing and how to fix it."""
    key = ready / "identity.pem"
    saved = key.read_bytes()
    key.unlink()
    for args in (("put", "edge(2, 3)."), ("status",), ("query", "edge(X, Y)"), ("fsck",)):
        assert_fails(merklog(ready, *args), ExitCode.STORE_DAMAGED, str(key), "missing", "init")
        assert not key.exists()
    key.write_bytes(saved)  # the way out it names: put the key back
    key.chmod(0o600)
    assert merklog(ready, "put", "edge(2, 3).").returncode == 0
    # The other way out, ``init``, said only "already initialised" while it made a new key
    # that may not write: it now says so. With the key there, ``init`` says nothing of it.
    assert "new key" not in merklog(ready, "init").stdout
    key.unlink()
    made = merklog(ready, "init")
    assert made.returncode == 0 and key.exists() and key.read_bytes() != saved
    assert "  new key  the node key was missing, so this made a new one" in made.stdout
    assert "writers grant" in made.stdout


def test_a_peer_entry_of_the_wrong_shape_exits_2(ready: Path) -> None:
    """A hand-edited ``[peers]`` entry with a number for its url, or a string instead of
    a table, crashed ``sync``/``peers list`` with an internal error (exit 70) while other
    commands accepted the file. Every command now refuses it naming file and entry."""
    config = ready / "config.toml"
    original = config.read_text()
    for entry, says in (
        ('\n[peers.x]\nurl = 5\nkey = "zz"\n', "url"),
        ('\n[peers.x]\nurl = "http://127.0.0.1:7401"\nkey = "zz"\n', "key"),
        ('\n[peers]\nx = "http://127.0.0.1:7401"\n', "table"),
        # What `peers add` refuses is refused hand-written too (only the scheme was checked).
        ('\n[peers.x]\nurl = "http://user:pw@127.0.0.1:7401"\n', "user name or password"),
        ('\n[peers.x]\nurl = "http://127.0.0.1:99999"\n', "Port out of range"),
        ('\n[peers.x]\nurl = "http://127.0.0.1:7401/?a=1"\n', "query or fragment"),
        ('\n[peers.x]\nurl = "http:// 127.0.0.1:7401"\n', "space"),
    ):
        config.write_text(original + entry)
        for args in (("sync", "x"), ("peers", "list"), ("status",), ("put", "edge(5, 6).")):
            assert_fails(merklog(ready, *args), ExitCode.BAD_INPUT, str(config), "[peers.x]", says)
    config.write_text(original)
    assert "edge(5, 6)" not in Cli(ready)("ls").output


def test_non_finite_numbers_and_bad_choices_are_refused_before_anything_exists(
    ready: Path, tmp_path: Path
) -> None:
    """``nan`` passed every range check (an epoch interval of NaN stopped idle and tick
    epochs), and a dataset.id that is no CID was written into a new home."""
    assert_fails(
        merklog(ready, "--set", "node.epoch_interval=nan", "status"),
        ExitCode.BAD_INPUT,
        "node.epoch_interval",
        "nan",
    )
    env = {**os.environ, "MERKLOG_SYNC_TIMEOUT": "inf"}
    done = subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(ready), "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert_fails(done, ExitCode.BAD_INPUT, "MERKLOG_SYNC_TIMEOUT", "inf")
    new = tmp_path / "new"
    for setting in ("dataset.id=bogus", "store.backend=bogus", "node.epoch_interval=-inf"):
        assert_fails(merklog(new, "--set", setting, "init"), ExitCode.BAD_INPUT, setting[:8])
        assert not new.exists()


def test_a_command_waits_for_another_command_to_free_the_home(ready: Path) -> None:
    """A command that found the home's lock held by another one-shot command waited 15 s
    for a node's run file that never came, then refused, although the other command
    had ended seconds before. It now takes the lock as soon as it is free."""
    import time

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(ready / 'node.lock')!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(1.5)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        result = merklog(ready, "put", "waited(1).")
        took = time.monotonic() - started
    finally:
        holder.wait(timeout=30)
    assert result.returncode == 0, result.stderr
    assert took < 10, took  # the old code refused after 15 s
    assert "waited(1)" in Cli(ready)("ls").output


def test_a_trusted_key_of_the_wrong_length_is_a_usage_error(tmp_path: Path) -> None:
    """``import-snapshot --trust 00112233`` (hex, but no node key) was taken, and every
    snapshot was then "signed by an untrusted key": a typo read as a forged snapshot."""
    snap = tmp_path / "snap"
    snap.mkdir()
    home = tmp_path / "home"
    for key in ("00112233", "ab" * 33):
        result = merklog(home, "import-snapshot", str(snap), "--trust", key)
        assert_fails(result, ExitCode.BAD_INPUT, "--trust", "32 bytes (64 hex digits)")
    assert not home.exists()


@pytest.mark.parametrize("damage", ["empty", "cut short", "not UTF-8", "a directory"])
def test_a_damaged_config_file_is_named_with_the_bad_config_status(
    ready: Path, damage: str
) -> None:
    """An emptied or cut-short config.toml gave ``Error: not a CID: ''``, one that is not
    UTF-8 Python's codec message (no file named), and a directory in its place
    ``[Errno 21] Is a directory`` with exit 1. Each is a damaged config now: exit 2, the
    file (and the entry) named, for every command and for ``init``, which made a new
    dataset in the old store over an emptied one; nothing is changed."""
    config = ready / "config.toml"
    original = config.read_text()
    says: tuple[str, ...] = ("dataset.id is missing", "backup")
    if damage == "empty":
        config.write_text("")
    elif damage == "cut short":
        config.write_text(original[: original.index("[dataset]")])
    elif damage == "not UTF-8":
        config.write_bytes(b"\xff" + original.encode())
        says = ("1:1: not UTF-8",)
    else:
        config.unlink()
        config.mkdir()
        says = ("is a directory", "backup")
    for args in (("status",), ("put", "edge(5, 6)."), ("token",), ("init",)):
        assert_fails(merklog(ready, *args), ExitCode.BAD_INPUT, str(config), *says)
    assert_fails(merklog(ready, "node", "run", "--port", "0"), ExitCode.BAD_INPUT, str(config))
    if config.is_dir():
        config.rmdir()
    config.write_text(original)
    config.chmod(0o600)
    listed = Cli(ready)("ls").output.splitlines()
    assert [line.split("\t")[1] for line in listed] == ["edge(1, 2)"], listed


def test_a_node_key_that_is_a_directory_is_a_damaged_key(ready: Path) -> None:
    """A directory in place of identity.pem gave ``[Errno 21] Is a directory`` with exit
    1; a missing or junk key gives exit 5 and the way out, and so does it now, for
    ``init`` too (which refused a junk key with exit 1 and no way out)."""
    key = ready / "identity.pem"
    saved = key.read_bytes()
    key.unlink()
    key.mkdir()
    for args in (("status",), ("put", "edge(2, 3)."), ("fsck",), ("init",)):
        assert_fails(
            merklog(ready, *args), ExitCode.STORE_DAMAGED, str(key), "put the key back", "mv "
        )
        assert key.is_dir()
    key.rmdir()  # the way out it names
    key.write_bytes(saved)
    key.chmod(0o600)
    assert merklog(ready, "put", "edge(2, 3).").returncode == 0


def test_init_of_a_home_whose_store_is_gone_says_so(ready: Path) -> None:
    """``init`` on a home whose store.sqlite was deleted said "already initialised" and
    exited 0, and the next ``status`` said the store is missing (exit 5). It says so
    itself now, with the same status and way out, and makes no new empty store (the
    dataset's history would be lost under a home that looks whole)."""
    store = ready / "store.sqlite"
    for path in (store, ready / "store.sqlite-wal", ready / "store.sqlite-shm"):
        path.unlink(missing_ok=True)
    before = (ready / "config.toml").read_text()
    result = merklog(ready, "init")
    assert_fails(result, ExitCode.STORE_DAMAGED, str(store), "missing", "restore")
    assert "initialised" not in result.stdout
    assert not store.exists()
    assert (ready / "config.toml").read_text() == before


def test_init_of_a_home_whose_store_header_is_damaged_says_so(ready: Path) -> None:
    """QA: 16 random bytes at offset 16 of store.sqlite (its page size and format):
    every command said "file is not a database" (exit 5) but ``init`` said "already
    initialised" (exit 0). It opens the store as they do now; nothing is written."""
    store = ready / "store.sqlite"
    with open(store, "r+b") as f:
        f.seek(16)
        f.write(bytes(range(200, 216)))
    before = (ready / "config.toml").read_text(), store.read_bytes()
    result = merklog(ready, "init")
    assert_fails(result, ExitCode.STORE_DAMAGED, "file is not a database")
    assert "initialised" not in result.stdout
    assert ((ready / "config.toml").read_text(), store.read_bytes()) == before


@pytest.mark.parametrize("store", ["a directory", "not SQLite", "damaged SQLite"])
def test_init_over_an_unusable_store_exits_5_and_leaves_the_directory_as_it_was(
    tmp_path: Path, store: str
) -> None:
    """QA: ``init`` where ``store.sqlite`` was a directory said ``PATH: Is a directory``
    (exit 1) and left ``node.lock`` behind; a file that is not SQLite, or a damaged one,
    exited 5 but left ``node.lock`` too. Each is refused as every command refuses an
    unusable store (exit 5, saying to restore a backup), by ``init`` and ``node run
    --init``, and the directory is left as it was. A zero-length file holds nothing to
    lose: init makes the store in it, as SQLite does."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    path = home / "store.sqlite"
    if store == "a directory":
        path.mkdir()
    elif store == "not SQLite":
        path.write_bytes(b"junk " * 1000)
    else:
        path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    for command in (["init"], ["node", "run", "--init", "--port", "0"]):
        line = assert_fails(merklog(home, *command), ExitCode.STORE_DAMAGED, "store", "restore")
        assert "Is a directory" not in line, line
        assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "store.sqlite"], command
    if path.is_dir():
        path.rmdir()
    path.write_bytes(b"")
    assert merklog(home, "init").returncode == 0
    assert merklog(home, "status").returncode == 0


def test_a_home_this_user_may_not_open_names_the_owner_and_the_way_back(ready: Path) -> None:
    """A command once run as another user (``sudo merklog node run``) leaves the home's
    files that user's; every later command said ``[Errno 13] Permission denied:
    '…/store.sqlite'``. Now the line says whose the file is and what to do, exit 1.
    As root the command runs as ``nobody`` (setpriv) on a copy of the home root keeps;
    as another user, the user's own files are made unreadable."""
    import shutil
    import tempfile

    if os.geteuid() != 0:
        store = ready / "store.sqlite"
        store.chmod(0)
        try:
            line = assert_fails(merklog(ready, "status"), ExitCode.FAILED, str(store))
            assert "it is yours but its mode (----------)" in line, line
        finally:
            store.chmod(0o600)
        assert Cli(ready)("ls").output.count("edge(1, 2)") == 1
        return
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("no setpriv to run a command as another user")
    shared = Path(tempfile.mkdtemp(prefix="merklog-perm-"))
    home = shared / "home"

    def as_nobody(*args: str) -> subprocess.CompletedProcess:
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        command += [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args]
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        return subprocess.run(
            command, capture_output=True, text=True, timeout=120, env=env, cwd=shared
        )

    try:
        shared.chmod(0o755)  # nobody may reach the home, not open its files
        shutil.copytree(ready, home)
        home.chmod(0o755)
        config = home / "config.toml"
        config.chmod(0o644)  # first the store (0600, as every home file)
        for args in (("status",), ("ls",)):
            store = home / "store.sqlite"
            line = assert_fails(as_nobody(*args), ExitCode.FAILED, str(store), "belongs to")
            assert f"chown -R nobody {home}" in line, line
        config.chmod(0o600)  # then the config, which is read first
        denied = f"cannot open {config}: permission denied"
        assert_fails(as_nobody("status"), ExitCode.FAILED, denied)
    finally:
        shutil.rmtree(shared)


def test_compact_without_the_node_key_says_so_as_every_command_does(
    ready: Path, tmp_path: Path
) -> None:
    """``compact`` signs its snapshot with the home's key. Without one it said ``no node
    key at …: run 'merklog init' first`` with exit 1, after starting the JVM, where every
    other command says the key is missing (exit 5) and how to get it back; a directory
    that is no home at all is exit 1, as for ``status``. Nothing is written."""
    export = tmp_path / "export"
    Cli(ready)("parquet", "export", str(export))
    out = tmp_path / "snap"
    key = ready / "identity.pem"
    key.rename(tmp_path / "saved.pem")
    result = merklog(ready, "compact", str(export), "--out", str(out))
    assert_fails(result, ExitCode.STORE_DAMAGED, f"the node key {key} is missing", "init")
    key.write_text("junk")
    result = merklog(ready, "compact", str(export), "--out", str(out))
    assert_fails(result, ExitCode.STORE_DAMAGED, f"the node key {key} is damaged")
    nohome = tmp_path / "nohome"
    result = merklog(nohome, "compact", str(export), "--out", str(out))
    assert_fails(result, ExitCode.FAILED, f"{nohome} is not a merklog home")
    assert not out.exists() and not nohome.exists()


def test_a_read_token_as_the_write_token_is_a_token_problem_not_exit_7(
    ready: Path, node_factory
) -> None:
    """Through a running node, a home configured with the read token where the write
    token belongs now hears 403 ``forbidden``; that is a token to fix (exit 1, as a 401
    is), not "this key is not a writer" (exit 7, the other 403)."""
    node = node_factory(ready).start()
    # Another read token here: one equal to the write token is refused before any request.
    token = ("--set", f"api.token={node.read_token}", "--set", "api.read_token=another")
    result = merklog(ready, *token, "put", "edge(7, 8).")
    assert_fails(result, ExitCode.FAILED, "forbidden", "grants reads only")
    assert "edge(7, 8)" not in Cli(ready)("ls").output


def test_a_group_without_its_command_and_an_empty_home_are_one_line(tmp_path: Path) -> None:
    """``merklog writers`` (no subcommand) printed ``Error: Usage: …`` and the group's whole
    help, and ``--home ""`` was the current directory ("run `merklog --home . init`"):
    each is now one usage line, exit 2, and nothing is made in the working directory."""
    for group, commands in (("writers", "grant, list, revoke"), ("peers", "add, list, remove")):
        done = merklog(tmp_path / "h", group)
        assert_fails(done, ExitCode.BAD_INPUT, f"`merklog {group} COMMAND`", commands)
        assert done.stderr.count("\n") == 1 and done.stdout == ""
    for empty in ("", " "):
        done = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", empty, "init"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert_fails(done, ExitCode.BAD_INPUT, "--home is empty")
        assert list(tmp_path.iterdir()) == []


def test_an_empty_path_argument_is_refused_not_taken_for_the_working_directory(
    tmp_path: Path,
) -> None:
    """``Path("")`` is ``Path(".")``: ``parquet export ''`` (an unset shell variable)
    exported into the working directory and ``compact ''`` read it. Every path a command
    takes now refuses an empty name: one usage line, exit 2, nothing written."""
    home = tmp_path / "h"
    assert merklog(home, "init").returncode == 0
    work = tmp_path / "work"
    work.mkdir()
    for args, name in (
        (["export", ""], "FILE"),
        (["restore", ""], "FILE"),
        (["load", ""], "PROGRAM"),
        (["parquet", "export", ""], "DIRECTORY"),
        (["compact", "", "--out", "snap"], "INPUTS"),
        (["node", "run", "--static-dir", " "], "--static-dir"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=work,
        )
        assert_fails(done, ExitCode.BAD_INPUT, name, "is empty")
        assert list(work.iterdir()) == [], args


def test_an_empty_peer_is_a_bad_argument_not_an_unknown_peer(ready: Path) -> None:
    """QA: ``fsck --repair-from ''`` (an unset shell variable) looked the empty name up in
    ``[peers]`` and said ``unknown peer ''``, exit 3 (not found), where every other empty
    argument is a usage error. It is one now: one line naming the option, exit 2."""
    for value in ("", " "):
        done = merklog(ready, "fsck", "--repair-from", value)
        line = assert_fails(done, ExitCode.BAD_INPUT, "'--repair-from'", "is empty")
        assert done.stderr.strip() == line
        assert line == (
            "Error: Invalid value for '--repair-from': is empty: name a peer of [peers] or"
            " give http://HOST:PORT (see `merklog fsck --help`)"
        )
    done = merklog(ready, "fsck", "--repair-from", "nope")  # a name it lacks: still not found
    assert_fails(done, ExitCode.NOT_FOUND, "unknown peer 'nope'")
    # the other commands that look a peer up by name said the same of '' (exit 3)
    for args, name in (
        (("sync", ""), "'PEER'"),
        (("peers", "remove", " "), "'NAME'"),
        (("writers", "grant", ""), "'KEY_OR_PEER'"),
        (("writers", "revoke", ""), "'KEY_OR_PEER'"),
    ):
        done = merklog(ready, *args)
        line = assert_fails(done, ExitCode.BAD_INPUT, name, "is empty: name a peer of [peers]")
        assert done.stderr.strip() == line


def test_a_misspelt_setting_in_the_environment_is_refused_like_an_unknown_set_key(
    tmp_path: Path,
) -> None:
    """``MERKLOG_NODE_PROT=8000`` was ignored (the node took the default port) while
    ``--set node.prot=8000`` exits 2; now both are refused, naming the variable and the
    section's options. ``MERKLOG_NODE_HELPER`` is no setting and stays allowed."""
    home = tmp_path / "h"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}

    def run(command: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(home), command],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, **extra},
        )

    done = run("init", MERKLOG_NODE_PROT="8000")
    line = assert_fails(done, ExitCode.BAD_INPUT, "MERKLOG_NODE_PROT", "'node.prot'")
    assert "MERKLOG_NODE_PORT" in line
    assert not home.exists()
    done = run("init", MERKLOG_NODE_HELPER="0", MERKLOG_NODE_PORT="7499")
    assert done.returncode == 0, done.stderr
    assert "port = 7499" in (home / "config.toml").read_text()
    assert_fails(run("status", MERKLOG_SYNC_INTERVALL="5"), ExitCode.BAD_INPUT, "'sync.intervall'")
    # the case of a name: MERKLOG_NODE_port was ignored as no variable merklog reads
    assert_fails(run("status", MERKLOG_NODE_port="5"), ExitCode.BAD_INPUT, "(MERKLOG_NODE_PORT)")


def test_a_command_stopped_by_sigterm_says_so_on_one_line(tmp_path: Path) -> None:
    """SIGTERM (``kill``, ``timeout``) ended every command but ``put`` and ``retract``
    with exit 143 and nothing on stderr; each now says ``Error: stopped (SIGTERM)``,
    ``sync`` with what stays of it."""
    import socket
    import time

    home = tmp_path / "h"
    assert merklog(home, "init").returncode == 0
    with socket.socket() as silent:  # accepts, never answers: the sync waits
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        sync_said = (
            "Error: stopped (SIGTERM): the deltas received before it are kept; sync again to go on"
        )
        for args, said in (
            (["sync", url], sync_said),
            (["peers", "add", "p", url, "--token", "t"], "Error: stopped (SIGTERM)"),
        ):
            proc = subprocess.Popen(
                [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(3)  # started and waiting for the peer
            proc.terminate()
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 143, (proc.returncode, err)
            assert "Traceback" not in err
            assert err.splitlines() == [said], err


def test_a_file_of_the_home_that_cannot_be_opened_is_named_without_an_errno(
    tmp_path: Path,
) -> None:
    """A ``node.lock`` that is a directory made every command print ``Error: [Errno 21]
    Is a directory: '…/node.lock'``: Python's rendering. Now the path and the reason."""
    home = tmp_path / "h"
    assert merklog(home, "init").returncode == 0
    (home / "node.lock").unlink(missing_ok=True)
    (home / "node.lock").mkdir()
    for command in (["status"], ["query", "p(X)"], ["put", "p(1)."]):
        line = assert_fails(merklog(home, *command), ExitCode.FAILED)
        assert line == f"Error: {home / 'node.lock'}: Is a directory", line


def test_init_where_no_home_can_be_made_names_the_path_not_an_errno(tmp_path: Path) -> None:
    """``init`` under a missing parent or a file printed ``Error: [Errno 2] No such file or
    directory: '…'``: one line now says it cannot make the home, why, and where."""
    (tmp_path / "file").write_text("")
    for home, why in (
        (Path("/proc/nonexistent/h"), "No such file or directory"),
        (tmp_path / "file" / "h", "Not a directory"),
    ):
        line = assert_fails(merklog(home, "init"), ExitCode.FAILED, f"cannot make {home}", why)
        assert "Errno" not in line


@pytest.mark.parametrize("command", ["put", "retract"])
def test_a_repeated_file_option_is_refused_and_writes_nothing(
    ready: Path, tmp_path: Path, command: str
) -> None:
    """QA: ``put -f A -f B`` silently wrote B alone (click kept the last ``-f``), and
    ``retract`` did the same. A second ``-f`` is a usage error, exit 2, on one line,
    and neither file is read."""
    first, second = tmp_path / "a.dl", tmp_path / "b.dl"
    first.write_text("edge(1, 2).\n")
    second.write_text("edge(7, 8).\n")
    for args in (("-f", str(first), "-f", str(second)), ("--file", str(first), "-f", "-")):
        done = merklog(ready, command, *args)
        line = assert_fails(done, ExitCode.BAD_INPUT, "-f", "given 2 times", "give one file")
        assert done.stderr.strip() == line, done.stderr
    listed = [line.split("\t")[1] for line in Cli(ready)("ls").output.splitlines()]
    assert listed == ["edge(1, 2)"]  # the fixture's fact alone: nothing was written
    assert merklog(ready, command, "-f", str(first)).returncode == 0  # once: as before


def test_a_peer_name_over_64_characters_is_refused_wherever_a_name_is_taken(
    ready: Path, node_factory
) -> None:
    """QA: ``peers add`` took a name of 100,000 characters, and ``status`` was
    unreadable after. A peer name has at most 64 characters: ``peers add``, a
    hand-written ``[peers.NAME]``, the commands that look a name up and ``POST
    /v1/sync`` refuse a longer one as bad input (exit 2, 400), on a line that does not
    repeat it whole; 64 characters are taken, with the characters allowed before."""
    key = "cd" * 32
    longest, huge = "n" * 64, "n" * 100_000
    for name in (huge, "n" * 65):
        line = assert_fails(
            merklog(ready, "peers", "add", name, "http://127.0.0.1:9", "--key", key),
            ExitCode.BAD_INPUT,
            f"is {len(name):,} characters long",
            "at most 64",
        )
        assert len(line) < 200, len(line)
    for args in (
        ("sync", huge),
        ("fsck", "--repair-from", huge),
        ("peers", "remove", huge),
        ("writers", "grant", huge),
    ):
        line = assert_fails(merklog(ready, *args), ExitCode.BAD_INPUT, "at most 64")
        assert len(line) < 200, len(line)
    # the character rule is unchanged: letters, digits, - and _
    assert_fails(
        merklog(ready, "peers", "add", "a.b", "http://127.0.0.1:9", "--key", key),
        ExitCode.BAD_INPUT,
        "letters, digits, - or _",
    )
    assert Cli(ready)("peers", "add", longest, "http://127.0.0.1:9", "--key", key).exit_code == 0
    assert longest in Cli(ready)("peers", "list").output
    config = ready / "config.toml"
    original = config.read_text()
    config.write_text(original + f'\n[peers.{"m" * 65}]\nurl = "http://127.0.0.1:7401"\n')
    for args in (("status",), ("peers", "list"), ("put", "edge(5, 6).")):
        line = assert_fails(merklog(ready, *args), ExitCode.BAD_INPUT, str(config), "at most 64")
        assert len(line) < 300, len(line)
    config.write_text(original)
    node = node_factory(ready).start()
    status, answer = node.request("POST", "/v1/sync", {"url": huge})
    assert status == 400 and "at most 64" in answer["detail"], (status, answer)
    assert len(answer["detail"]) < 200
    # A name [peers] does not hold is not found, as `merklog sync NAME` says (exit 3):
    # it was 400 "neither a peer in [peers] nor an http(s) URL".
    status, answer = node.request("POST", "/v1/sync", {"url": "nosuch"})
    assert (status, answer["error"]) == (404, "unknown peer"), (status, answer)
    assert "unknown peer 'nosuch'" in answer["detail"], answer


def test_init_over_a_store_whose_config_is_gone_keeps_its_dataset(tmp_path: Path) -> None:
    """With config.toml deleted, `init` made a new dataset in the old store and the
    home's facts vanished from view. It now refuses, naming the dataset, and the way it
    names follows that dataset again with the facts in place."""
    home = tmp_path / "home"
    run = Cli(home)
    run("init")
    run("put", "edge(1, 2).", 'name("x", 1.0, true).')
    dataset = json.loads(run("status", "--json").output)["dataset"]
    (home / "config.toml").unlink()
    refused = run("init", ok=False)
    assert refused.exit_code == 1, refused.output
    assert dataset in refused.output and "Traceback" not in refused.output
    assert not (home / "config.toml").exists()
    # Every other command says the same, not "run init first" (init refuses there).
    for args in (("status",), ("query", "edge(X, Y)")):
        said = run(*args, ok=False)
        assert said.exit_code == 1, said.output
        assert "config.toml is missing" in said.output and dataset in said.output, said.output
        assert f"--set dataset.id={dataset} init" in said.output
    assert not (home / "config.toml").exists()
    again = run("--set", f"dataset.id={dataset}", "init")
    assert dataset in again.output
    assert sorted(line.split("\t")[1] for line in run("ls").output.splitlines()) == [
        "edge(1, 2)",
        'name("x", 1.0, true)',
    ]


def test_an_empty_fact_file_is_nothing_to_do_like_one_of_comments(
    tmp_path: Path, node_factory
) -> None:
    """``put -f`` of an empty file was a usage error (exit 2, "no facts given"), while a
    file of comments only was a no-op (exit 0): scripts over generated files broke on an
    empty one. Both are nothing to do now, stopped or running; no argument and no file
    is still a usage error."""
    home = tmp_path / "home"
    run = Cli(home)
    run("init")
    empty, comments = tmp_path / "empty.dl", tmp_path / "comments.dl"
    empty.write_text("")
    comments.write_text("% nothing yet\n")

    def each() -> None:
        for command in ("put", "retract"):
            for path in (empty, comments):
                done = subprocess.run(
                    [sys.executable, "-m", "merklog.node.cli", "--home", str(home), command,
                     "-f", str(path)],
                    capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                )  # fmt: skip
                assert done.returncode == 0, (command, path, done.stderr)
                assert done.stdout == "" and done.stderr == "", (done.stdout, done.stderr)

    each()
    node_factory(home).start()
    each()
    assert run("ls").output == ""
    assert run("put", ok=False).exit_code == 2


def test_node_run_on_a_folder_that_is_no_home_creates_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """QA: ``node run`` on a mistyped home said "not a merklog home" (exit 1) after
    making the folder with a node.lock in it, or turning an existing 0755 folder 0700
    with a node.lock: a unit with a wrong MERKLOG_HOME left stray folders at each restart.
    ``status``, ``token`` and the other commands created nothing there."""
    ghost = tmp_path / "ghost"
    result = merklog(ghost, "node", "run")
    assert_fails(result, ExitCode.FAILED, f"{ghost} is not a merklog home")
    assert not ghost.exists()
    folder = tmp_path / "folder"
    folder.mkdir()
    folder.chmod(0o755)
    result = merklog(folder, "node", "run")
    assert_fails(result, ExitCode.FAILED, f"{folder} is not a merklog home")
    assert list(folder.iterdir()) == [] and folder.stat().st_mode & 0o777 == 0o755


def test_a_dataset_setting_does_not_switch_a_home_to_another_dataset(tmp_path: Path) -> None:
    """``--set dataset.id=OTHER init`` on an initialised home answered success, changed
    only the config line, and every command afterwards called the store damaged (its
    genesis was not in it). Init, and any command, now refuse such a setting as bad
    input and change nothing; the home's own dataset id is accepted as it is."""
    home, other = tmp_path / "home", tmp_path / "other"
    run = Cli(home)
    run("init")
    run("put", "a(1).", "a(1.0).", "a(true).")
    Cli(other)("init")
    mine = json.loads(run("status", "--json").output)["dataset"]
    theirs = json.loads(Cli(other)("status", "--json").output)["dataset"]
    config = (home / "config.toml").read_text()
    for args in (("init",), ("query", "a(X)"), ("put", "a(2).")):
        refused = run("--set", f"dataset.id={theirs}", *args, ok=False)
        assert refused.exit_code == ExitCode.BAD_INPUT, refused.output
        assert mine in refused.output and theirs in refused.output, refused.output
        assert "--join URL --force" in refused.output and "damaged" not in refused.output
    assert (home / "config.toml").read_text() == config
    assert run("--set", f"dataset.id={mine}", "init").exit_code == 0
    assert len(run("query", "a(X)").output.strip().splitlines()) >= 3
    assert sorted(line.split("\t")[1] for line in run("ls").output.splitlines()) == [
        "a(1)",
        "a(1.0)",
        "a(true)",
    ]
