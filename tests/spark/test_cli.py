"""The Spark commands end to end through the real CLI (in-process, sharing the test session)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from merklog.node.cli import cli

pytestmark = pytest.mark.spark


def run(*args: str, ok: bool = True) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code != 0, result.output
    return result.output


def facts_of(home) -> set[str]:
    return {
        line.split("\t", 1)[1]
        for line in run("--home", str(home), "ls").splitlines()
        if "\t" in line
    }


def test_export_compact_import_snapshot_analyze(spark, tmp_path):
    a, c = tmp_path / "a", tmp_path / "c"
    run("--home", str(a), "init")
    run("--home", str(a), "put", "edge(1, 2).", "edge(2, 3).", "edge(3, 4).", 'label(1, "x").')
    run("--home", str(a), "retract", "edge(3, 4).")
    run("--home", str(a), "put", "edge(3, 1).")
    out = run("--home", str(a), "parquet", "export", str(tmp_path / "ea"))
    assert json.loads(out.strip().splitlines()[-1])["ops"] == 6

    out = run("--home", str(a), "compact", str(tmp_path / "ea"), "--out", str(tmp_path / "snap"))
    info = json.loads(out.strip().splitlines()[-1])
    assert info["facts"] == 4
    # QA: the new home's port could only be set by editing its config.toml
    out = run("--home", str(c), "--set", "sync.interval=5", "import-snapshot", info["directory"],
              "--port", "23012")  # fmt: skip
    assert json.loads(out)["facts"] == 4
    assert facts_of(c) == facts_of(a) == {"edge(1, 2)", "edge(2, 3)", "edge(3, 1)", 'label(1, "x")'}
    config = (c / "config.toml").read_text()
    assert "port = 23012" in config and "interval = 5.0" in config, config
    # a second install is refused (the replica is no longer empty)
    err = run("--home", str(c), "import-snapshot", info["directory"], ok=False)
    assert "empty replica" in err
    err = run("--home", str(c), "import-snapshot", info["directory"], "--port", "1", ok=False)
    assert "--port is for a new home" in err

    prog = tmp_path / "reach.dl"
    prog.write_text("reach(X, Y) :- edge(X, Y).\nreach(X, Z) :- reach(X, Y), edge(Y, Z).\n")
    out = run(
        "--home",
        str(a),
        "analyze",
        str(prog),
        "--input",
        str(tmp_path / "ea"),
        "--out",
        str(tmp_path / "out"),
        "--format",
        "csv",
    )
    assert out.startswith("reach\t")
    rows = "".join(p.read_text() for p in (tmp_path / "out" / "reach").glob("*.csv"))
    assert len(rows.strip().splitlines()) == 1 + 9  # header + 3x3 pairs on the 3-cycle

    bad = tmp_path / "bad.dl"
    bad.write_text("ok(X) :- edge(X, _).\nping(@P, X)@async :- edge(P, X).\n")
    err = run(
        "--home",
        str(a),
        "analyze",
        str(bad),
        "--input",
        str(tmp_path / "ea"),
        "--out",
        str(tmp_path / "out2"),
        ok=False,
    )
    assert "bad.dl:2:1" in err and "@async" in err


def test_compact_with_args_in_spark_gives_the_same_snapshot(spark, tmp_path, monkeypatch):
    """``--args-in-spark`` (facts too large for the driver) never reads the inputs in this
    process and gives the same snapshot, manifest CID included, with mixed-type values."""
    import merklog.node.spark.compact as compact_mod
    import merklog.node.spark.factargs as factargs_mod

    a = tmp_path / "a"
    run("--home", str(a), "init")
    run("--home", str(a), "put", "v(1).", "v(1.0).", "v(true).", 'v("1").', 'v(x"01").')
    run("--home", str(a), "retract", "v(1.0).")
    run("--home", str(a), "parquet", "export", str(tmp_path / "ea"))
    compact = ("--home", str(a), "compact", str(tmp_path / "ea"), "--out")
    first = json.loads(run(*compact, str(tmp_path / "s1")).strip().splitlines()[-1])

    def no_driver_reads(*args, **kwargs):
        raise AssertionError("the driver read the inputs")

    monkeypatch.setattr(factargs_mod, "read_inputs", no_driver_reads)
    monkeypatch.setattr(compact_mod, "read_inputs", no_driver_reads)
    text = run(*compact, str(tmp_path / "s2"), "--args-in-spark")
    second = json.loads(text.strip().splitlines()[-1])
    assert first["facts"] == second["facts"] == 4
    assert first["manifest"] == second["manifest"]
    with pytest.raises(AssertionError, match="driver read"):  # the patch is in force
        run(*compact, str(tmp_path / "s3"))


def test_a_master_spark_cannot_use_is_one_error_line(tmp_path):
    """``--master bogus://x`` said ``internal error (PySparkRuntimeError:
    [JAVA_GATEWAY_EXITED] …) please report it`` with exit 70."""
    import os
    import subprocess
    import sys

    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "p(1).")
    run("--home", str(home), "parquet", "export", str(tmp_path / "ex"))
    (tmp_path / "p.dl").write_text("q(X) :- p(X).\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "merklog.node.cli",
            "analyze",
            str(tmp_path / "p.dl"),
            "--input",
            str(tmp_path / "ex"),
            "--out",
            str(tmp_path / "o"),
            "--master",
            "bogus://x",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().startswith("Error: the Spark JVM exited before it started"), (
        done.stderr
    )
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_a_rest_pattern_over_several_arities_is_an_error_at_its_atom(spark, tmp_path):
    """The error said ``rp.dl:relation w holds facts of arities [2, 3]``: no LINE:COL."""
    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "w(1, 2).", "w(1, 2, 3).")
    run("--home", str(home), "parquet", "export", str(tmp_path / "ex"))
    prog = tmp_path / "rp.dl"
    prog.write_text("% reads every w\nr(X) :- w(X, ...).\n")
    err = run(
        "analyze",
        str(prog),
        "--input",
        str(tmp_path / "ex"),
        "--out",
        str(tmp_path / "o"),
        ok=False,
    )
    assert f"{prog}:2:9: w(...) reads relation w, which holds facts of arities [2, 3]" in err, err


def _merklog(*args: str, timeout: float = 180) -> Any:
    """``merklog ARGS`` as its own process (a JVM of its own, if it starts one)."""
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )


@pytest.fixture
def export(tmp_path):
    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "ni(1).", "ni(2).")
    run("--home", str(home), "parquet", "export", str(tmp_path / "ex"))
    return tmp_path / "ex"


def test_analyze_never_replaces_a_folder_it_did_not_write(spark, tmp_path, export):
    """``analyze --out .`` in a project with a ``docs/`` folder and a relation ``docs``
    deleted ``docs/`` and wrote the relation there, exit 0. It is refused, before the
    JVM starts (``--master bogus://x`` would fail to start one), and nothing is touched;
    an earlier analyze output is replaced as before."""
    prog = tmp_path / "docs.dl"
    prog.write_text("docs(X) :- ni(X).\n")
    proj = tmp_path / "proj"
    (proj / "docs").mkdir(parents=True)
    (proj / "docs" / "notes.md").write_text("precious")
    (proj / "other").mkdir()
    for out in (proj, proj / "docs"):
        (proj / "docs" / "docs").mkdir(exist_ok=True)  # so --out proj/docs meets one too
        (proj / "docs" / "docs" / "keep.txt").write_text("keep")
        done = _merklog(
            "analyze", str(prog), "--input", str(export), "--out", str(out), "--master", "bogus://x"
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [
            f"Error: {out / 'docs'} is a folder that no analyze wrote, and the output relation"
            " docs would replace it: give --out a folder of its own (nothing was written)"
        ]
        assert (proj / "docs" / "notes.md").read_text() == "precious"
        assert (proj / "docs" / "docs" / "keep.txt").read_text() == "keep"
    for fmt in ("csv", "parquet", "csv"):  # an earlier output, of either format, is replaced
        run("analyze", str(prog), "--input", str(export), "--out", str(tmp_path / "o"),
            "--format", fmt)  # fmt: skip
    assert (tmp_path / "o" / "docs" / "part-00000.csv").read_text() == "c0\n1\n2\n" or (
        tmp_path / "o" / "docs" / "part-00000.csv"
    ).read_text() == "c0\n2\n1\n"


def test_an_unwritable_out_is_one_line_naming_it_before_the_jvm(tmp_path, export):
    """``analyze --out /proc/x`` gave exit 70 and a 150-line Java stack trace once the
    job had run."""
    prog = tmp_path / "p.dl"
    prog.write_text("p(X) :- ni(X).\n")
    done = _merklog(
        "analyze", str(prog), "--input", str(export), "--out", "/proc/merklog-x",
        "--master", "bogus://x",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "Error: cannot write to --out /proc/merklog-x: No such file or directory"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("p(X, Y) :- ni(X).\n", "p.dl:1:6: "),
        ("p(X)@next :- ni(X).\n", "p.dl:1:1: @next rules are not supported by analyze"),
        (
            ".decl ni(x: number)\n.decl p(x: number)\n.output p\np(x + 1) :- ni(x).\n",
            "p.dl:4:1: analyze implements merklog's int64 arithmetic",
        ),
    ],
)
def test_program_checks_come_before_the_jvm_starts(tmp_path, export, text, message):
    """An unsafe rule, an ``@next`` rule and Soufflé arithmetic were reported only once
    the JVM was up (with a master it cannot use: its error instead)."""
    prog = tmp_path / "p.dl"
    prog.write_text(text)
    out = tmp_path / "o"
    done = _merklog(
        "analyze", str(prog), "--input", str(export), "--out", str(out), "--master", "bogus://x"
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"Error: {tmp_path / message}"), done.stderr
    assert not out.exists()


def test_compact_of_an_export_without_deltas_is_one_line(spark, tmp_path):
    """``compact`` of a fresh home's export died with exit 70 ``IndexError`` (``live_frame``
    read ``datasets[0]``). It is bad input, said before the JVM starts, and the library
    refuses it on both paths; no snapshot folder is made."""
    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "parquet", "export", str(tmp_path / "ex"))
    done = _merklog(
        "--home", str(home), "compact", str(tmp_path / "ex"), "--out", str(tmp_path / "s"),
        "--master", "bogus://x",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "Error: the inputs hold no deltas (the export of a fresh home, or of one whose deltas"
        " were all pruned): there is nothing to compact"
    ]
    assert not (tmp_path / "s").exists()
    from merklog.node.spark.compact import NothingToCompact, compact
    from merklog.replication.identity import Identity

    key = Identity.from_seed(b"\x05" * 32)
    for gather in (None, False):
        with pytest.raises(NothingToCompact):
            compact(spark, [str(tmp_path / "ex")], tmp_path / "s2", key, gather=gather)


def test_a_spark_connect_server_that_is_not_there_is_exit_4(tmp_path, export):
    """``--remote sc://127.0.0.1:PORT`` with nothing listening hung for over ten minutes
    (pyspark's client retrying), deaf to Ctrl-C and SIGTERM, and printed only pyspark's
    raw ``[RETRIES_EXCEEDED]`` warning."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    prog = tmp_path / "p.dl"
    prog.write_text("p(X) :- ni(X).\n")
    url = f"sc://127.0.0.1:{port}"
    for args in (
        ["analyze", str(prog), "--input", str(export), "--out", str(tmp_path / "o")],
        ["--home", str(tmp_path / "h"), "compact", str(export), "--out", str(tmp_path / "s")],
    ):
        done = _merklog(*args, "--remote", url, timeout=120)
        assert done.returncode == 4, done.stderr
        assert done.stderr.splitlines() == [
            f"Error: the Spark Connect server {url} could not be reached (Connection refused)"
        ]
    assert not (tmp_path / "o").exists()
    # QA: an unreachable standalone master took a minute, then a Java stack trace, exit 70
    master = f"spark://127.0.0.1:{port}"
    for args in (
        ["analyze", str(prog), "--input", str(export), "--out", str(tmp_path / "o")],
        ["--home", str(tmp_path / "h"), "compact", str(export), "--out", str(tmp_path / "s")],
    ):
        done = _merklog(*args, "--master", master, timeout=120)
        assert done.returncode == 4, done.stderr
        assert done.stderr.splitlines() == [
            f"Error: the Spark master {master} could not be reached (Connection refused)"
        ]
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


def test_a_listener_that_never_answers_as_spark_connect_is_exit_4(tmp_path, export):
    """A port that accepts connections and says nothing (a wedged server, the wrong
    service) passed the TCP check, and pyspark's client then waited without end. The
    HTTP/2 preface every gRPC server answers at once tells them apart: one line, exit 4,
    after the connect timeout; a listener that hangs up at once is refused the same way."""
    import socket
    import threading

    held: list[socket.socket] = []

    def serve(server: socket.socket, keep: bool) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if keep:
                held.append(conn)  # accepted, never answered
            else:
                conn.close()

    for keep in (True, False):
        server = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=serve, args=(server, keep), daemon=True).start()
        url = f"sc://127.0.0.1:{server.getsockname()[1]}"
        try:
            done = _merklog(
                "--home", str(tmp_path / "h"), "compact", str(export),
                "--out", str(tmp_path / "s"), "--remote", url, timeout=120,
            )  # fmt: skip
        finally:
            server.close()
        assert done.returncode == 4, done.stderr
        (line,) = done.stderr.splitlines()
        said = f"Error: the Spark Connect server {url} accepts connections but does not answer"
        if keep:
            assert line == said + " as one (no HTTP/2 settings within 10 s)", line
        else:  # QA: one that hung up at once was said to be silent for 10 s
            assert line.startswith(said + " as one (it ") and "without an HTTP/2 answer" in line
        assert not (tmp_path / "s").exists()
    for conn in held:
        conn.close()


def test_the_export_of_a_pruned_home_is_marked_and_compact_refuses_it(spark, tmp_path):
    """``compact`` of a pruned home's export signed a snapshot that lacked the facts of the
    pruned deltas while claiming the home's heads: peers bootstrapped from it matched the
    heads and never converged. The export says how many deltas it lacks, and compact
    refuses it (given as the export or as its ``ops/`` folder) before the JVM starts."""
    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "a(1).", "a(2).")
    run("--home", str(home), "put", "a(3).")
    whole = json.loads(run("--home", str(home), "parquet", "export", str(tmp_path / "e1")))
    assert "missing_deltas" not in whole
    out = run("--home", str(home), "compact", str(tmp_path / "e1"), "--out", str(tmp_path / "s"))
    snap = json.loads(out.strip().splitlines()[-1])["directory"]
    assert run("--home", str(home), "prune", snap).strip() == "pruned 2 delta blocks"
    run("--home", str(home), "put", "a(4).")
    done = _merklog("--home", str(home), "parquet", "export", str(tmp_path / "e2"))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["missing_deltas"] == 2 and summary["facts"] == {"a": 4}
    assert done.stderr.strip().startswith("note: this home no longer holds 2 of its deltas")
    # A part file of it, or its ops/ folder copied without export.json, says it too: the
    # check read export.json only, and a snapshot of the part file claimed the heads.
    shutil.copytree(tmp_path / "e2" / "ops", tmp_path / "copied")
    part = tmp_path / "e2" / "ops" / "part-00000.parquet"
    for given in (tmp_path / "e2", tmp_path / "e2" / "ops", part, tmp_path / "copied"):
        done = _merklog(
            "--home", str(home), "compact", str(tmp_path / "e1"), str(given),
            "--out", str(tmp_path / "s2"), "--master", "bogus://x",
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [
            f"Error: {given} is the export of a home that no longer holds 2 of its deltas"
            " (pruned, or covered by the snapshot it was bootstrapped from): its ops do not"
            " account for all its facts, and a snapshot of it would lack facts while claiming"
            " the home's heads; compact exports made before pruning, or keep the snapshot"
            " made then"
        ]
    assert not (tmp_path / "s2").exists()
    # analyze reads the same ops, and missed a(1) and a(2) without a word
    (tmp_path / "all.dl").write_text("all(X) :- a(X).\n")
    done = _merklog(
        "analyze", str(tmp_path / "all.dl"), "--input", str(tmp_path / "e2"),
        "--out", str(tmp_path / "an"), "--master", "bogus://x",
    )  # fmt: skip
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "analyze would miss the facts of those deltas" in done.stderr
    done = _merklog(
        "analyze", str(tmp_path / "all.dl"), "--input", str(part),
        "--out", str(tmp_path / "an"), "--master", "bogus://x",
    )  # fmt: skip
    assert done.returncode == 1 and "analyze would miss the facts" in done.stderr, done.stderr
    assert not (tmp_path / "an").exists()


def test_import_snapshot_takes_the_compact_out_folder_or_says_which_to_give(spark, tmp_path):
    """``import-snapshot`` of compact's ``--out`` (not its ``dataset=<cid>/`` child) said
    ``[Errno 2] No such file or directory: '…/manifest.cbor'``."""
    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "a(1).", "a(2).")
    run("--home", str(home), "parquet", "export", str(tmp_path / "ex"))
    run("--home", str(home), "compact", str(tmp_path / "ex"), "--out", str(tmp_path / "s"))
    out = run("--home", str(tmp_path / "c"), "import-snapshot", str(tmp_path / "s"))
    assert json.loads(out)["facts"] == 2
    assert facts_of(tmp_path / "c") == {"a(1)", "a(2)"}
    done = _merklog("--home", str(tmp_path / "d"), "import-snapshot", str(tmp_path / "ex"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"Error: Invalid value for DIRECTORY: {tmp_path / 'ex'} is not a snapshot (no"
        " manifest.cbor): give the dataset=<cid>/ folder that `merklog compact` wrote under"
        " its --out (or that --out, when it holds one) (see `merklog import-snapshot --help`)"
    ]
    assert not (tmp_path / "d").exists()


def test_parquet_export_prints_nothing_on_stderr_off_a_terminal(tmp_path):
    """Its progress bar, disabled off a terminal in the other commands, left a blank line
    on a redirected stderr (a log file, a pipe)."""
    import subprocess
    import sys

    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "p(1).", "p(1.0).")
    done = subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "parquet", "export",
         str(tmp_path / "ex")],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["ops"] == 2


def test_verbose_json_logs_carry_the_jvms_own_lines_as_json(tmp_path, export):
    """``-v --log-format json`` promises one JSON object per stderr line; the JVM's banners
    and log4j lines (``WARNING: Using incubator modules``, ``NativeCodeLoader``) reached
    stderr raw. They come as records of ``merklog.spark.jvm`` now, at their log4j level."""
    home = tmp_path / "h"
    done = _merklog(
        "--home", str(home), "-v", "--log-format", "json",
        "compact", str(export), "--out", str(tmp_path / "snap"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    jvm = [r for r in records if r["logger"] == "merklog.spark.jvm"]
    assert any("Using incubator modules" in r["msg"] for r in jvm), records
    native = [r for r in jvm if "NativeCodeLoader" in r["msg"]]
    assert native and all(r["level"] == "WARNING" for r in native), records
    assert json.loads(done.stdout.strip().splitlines()[-1])["facts"] == 2


def test_fsck_and_backup_know_the_deltas_a_snapshot_covers(spark, tmp_path):
    """After ``prune`` (and in a home bootstrapped by ``import-snapshot``) fsck listed
    every delta the snapshot covers as a missing block, exit 5, on a healthy home, and
    ``merklog export`` stopped at the first of them. Such deltas are recorded as covered:
    fsck counts them apart (exit 0) and still finds a block that is really lost; the CAR
    backup is refused up front, naming the snapshot as that history's backup."""
    import sqlite3

    from merklog.store import Link

    def fsck(home, *args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, ["--home", str(home), "fsck", *args])
        assert "Traceback" not in result.output
        return result.exit_code, result.output

    a, c = tmp_path / "a", tmp_path / "c"
    run("--home", str(a), "init")
    run("--home", str(a), "put", "a(1).", "a(2).")
    run("--home", str(a), "put", "a(3).")
    run("--home", str(a), "parquet", "export", str(tmp_path / "e"))
    out = run("--home", str(a), "compact", str(tmp_path / "e"), "--out", str(tmp_path / "s"))
    snap = json.loads(out.strip().splitlines()[-1])["directory"]
    assert run("--home", str(a), "prune", snap).strip() == "pruned 2 delta blocks"
    run("--home", str(a), "put", "a(4).")
    code, out = fsck(a)
    assert code == 0, out
    assert "2 deltas kept as a snapshot's metadata only" in out
    code, out = fsck(a, "--json")
    assert code == 0 and json.loads(out)["covered"] == 2, out
    backup = CliRunner().invoke(cli, ["--home", str(a), "export", str(tmp_path / "b.car")])
    assert backup.exit_code == 1, backup.output
    assert "keeps 2 of its deltas only as a snapshot's metadata" in backup.output
    assert not (tmp_path / "b.car").exists()

    out = run("--home", str(c), "import-snapshot", snap)
    code, out = fsck(c)
    assert code == 0 and "kept as a snapshot's metadata only" in out, out
    assert json.loads(fsck(c, "--json")[1])["covered"] == 2

    # A block that is really lost is still one: the newest delta's, not covered.
    with sqlite3.connect(a / "store.sqlite") as conn:
        (newest,) = conn.execute("SELECT cid FROM repl_delta ORDER BY clock DESC").fetchone()
        conn.execute("DELETE FROM blocks WHERE cid = ?", (newest,))
    code, out = fsck(a, "--json")
    report = json.loads(out.splitlines()[0])  # then the error line (stderr)
    assert code == 5 and report["problems"] == [f"block {Link(newest)} is missing"], out
    assert report["covered"] == 2


def test_a_snapshot_of_a_partial_log_is_refused_and_leaves_no_home(spark, tmp_path, monkeypatch):
    """A snapshot made from a pruned home's ops (as the part-file hole of compact allowed,
    and an earlier merklog did) claims the dataset's heads but covers deltas whose parents
    it lacks: import-snapshot installed it, and the bootstrapped home then never received
    the facts of those parents (fsck: 'parent … is not an accepted delta'). It is refused,
    and the home the command had just created is removed again."""
    import merklog.node.spark.compact as compact_mod

    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "a(1).", "a(2).")
    run("--home", str(home), "put", "a(3).")
    run("--home", str(home), "parquet", "export", str(tmp_path / "e1"))
    out = run("--home", str(home), "compact", str(tmp_path / "e1"), "--out", str(tmp_path / "s"))
    run("--home", str(home), "prune", json.loads(out.strip().splitlines()[-1])["directory"])
    run("--home", str(home), "put", "a(4).")
    run("--home", str(home), "parquet", "export", str(tmp_path / "e2"))
    monkeypatch.setattr(compact_mod, "refuse_partial_exports", lambda *a, **k: None)
    out = run("--home", str(home), "compact", str(tmp_path / "e2"), "--out", str(tmp_path / "p"))
    partial = json.loads(out.strip().splitlines()[-1])["directory"]

    fresh = tmp_path / "fresh"
    result = CliRunner().invoke(cli, ["--home", str(fresh), "import-snapshot", partial])
    assert result.exit_code == 1, result.output
    assert "snapshot rejected: snapshot delta" in result.output
    assert "which the snapshot does not cover" in result.output
    assert not fresh.exists()
    fresh.mkdir()
    (fresh / "mine.txt").write_text("kept")
    result = CliRunner().invoke(cli, ["--home", str(fresh), "import-snapshot", partial])
    assert result.exit_code == 1, result.output
    assert sorted(p.name for p in fresh.iterdir()) == ["mine.txt"]


def test_parquet_export_replaces_only_an_earlier_export(tmp_path):
    """``parquet export DIR`` deleted a user's own ``DIR/facts`` and ``DIR/ops`` folders
    (it replaces those of an earlier export whole), and wrote into the home itself. A
    folder holding anything but an earlier export, or inside the home, is refused (exit 1,
    nothing touched); a new, empty or earlier export's folder is written."""
    home = tmp_path / "h"
    run("--home", str(home), "init")
    run("--home", str(home), "put", "a(1).", "a(1.0).")
    proj = tmp_path / "proj"
    (proj / "facts").mkdir(parents=True)
    (proj / "facts" / "important.txt").write_text("precious")
    for target in (proj, home, home / "sub"):
        done = _merklog("--home", str(home), "parquet", "export", str(target))
        assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
    assert (proj / "facts" / "important.txt").read_text() == "precious"
    assert not (home / "sub").exists() and not (home / "ops").exists()
    assert (
        "no merklog export wrote (facts)"
        in _merklog("--home", str(home), "parquet", "export", str(proj)).stderr
    )
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new", tmp_path / "new"):  # twice: over it
        summary = json.loads(run("--home", str(home), "parquet", "export", str(target)))
        assert summary["facts"] == {"a": 2}


def test_a_conf_value_spark_refuses_is_one_usage_line(tmp_path, export) -> None:
    """``--conf spark.sql.shuffle.partitions=0`` was an "internal error" with a Java stack
    trace (exit 70) once a job read it. Spark's own check of each value is one usage line
    naming it (exit 2), before anything is written; a value Spark takes runs as usual."""
    home = str(tmp_path / "h")
    for bad, named in (
        ("spark.sql.shuffle.partitions=0", "spark.sql.shuffle.partitions"),
        ("spark.sql.adaptive.enabled=maybe", "'boolean'"),
    ):
        out = tmp_path / "snap"
        done = _merklog("--home", home, "compact", str(export), "--out", str(out), "--conf", bad)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith("Error: Spark refused a --conf: ") and named in line, line
        assert "JVM stacktrace" not in done.stderr and not out.exists()


def test_what_an_unfinished_analyze_write_left_is_replaced_and_removed(tmp_path) -> None:
    """An analyze interrupted while Spark wrote a relation left ``REL/_temporary`` (and
    maybe part files): the next analyze refused the folder as one "no analyze wrote".
    It is Spark's own unfinished write: replaced, and removed by the failed command once
    its JVM has ended. A folder with anything else in it stays refused and untouched."""
    from merklog.node.spark.analyze import OutputFolderTaken, check_out_folders, remove_unfinished

    out = tmp_path / "out"
    (out / "p" / "_temporary" / "0" / "_temporary").mkdir(parents=True)
    (out / "p" / "part-00000-x.snappy.parquet").write_bytes(b"PAR1")
    (out / "q" / "_temporary").mkdir(parents=True)
    (out / "q" / "notes.md").write_text("mine")
    check_out_folders(out, ["p"])
    with pytest.raises(OutputFolderTaken):
        check_out_folders(out, ["q"])
    remove_unfinished(out, ["p", "q", "r"])
    assert not (out / "p").exists()
    assert (out / "q" / "notes.md").read_text() == "mine"


def test_analyze_refuses_inputs_of_several_datasets(tmp_path, export) -> None:
    """Exports of two unrelated homes were analysed as one fact set (their union), with
    no word. They are refused before the JVM starts, and nothing is written."""
    other = tmp_path / "other"
    run("--home", str(other), "init")
    run("--home", str(other), "put", "ni(3).")
    run("--home", str(other), "parquet", "export", str(tmp_path / "ex2"))
    prog = tmp_path / "p.dl"
    prog.write_text("q(X) :- ni(X).\n")
    out = tmp_path / "out"
    done = _merklog(
        "analyze", str(prog), "--input", str(export), "--input", str(tmp_path / "ex2"),
        "--out", str(out), "--master", "bogus://x",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("Error: the inputs hold 2 datasets") and "one dataset" in line, line
    assert not out.exists()


def _dataset_of(export) -> str:
    """The one dataset CID an export's ops belong to (its ``export.json``)."""
    [dataset] = json.loads((export / "export.json").read_text())["datasets"]
    return dataset


def _refused_before_the_jvm(home, export, out, line: str) -> None:
    """``compact EXPORT --out OUT`` fails with exit 1 and the one ``line``, before any JVM
    starts (``--master bogus://x`` would fail to start one)."""
    done = _merklog(
        "--home", str(home), "compact", str(export), "--out", str(out), "--master", "bogus://x"
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [line]


def test_compact_never_replaces_a_dataset_folder_it_did_not_write(spark, tmp_path, export):
    """``compact --out DIR`` deleted the user's own files in ``DIR/dataset=<cid>/`` (it
    replaces that folder whole) and exited 0. Such a folder, or a file of that name, is
    refused before the JVM starts (``--master bogus://x`` would fail to start one), with
    one line naming it, exit 1, and nothing is written; with a working session too."""
    home, out = tmp_path / "h", tmp_path / "out"
    folder = out / f"dataset={_dataset_of(export)}"
    cases = {
        "mine.txt": lambda: (folder / "mine.txt").write_text("mine"),
        "facts/notes.md": lambda: (folder / "facts" / "notes.md").write_text("mine"),
    }
    for name, make in cases.items():
        shutil.rmtree(out, ignore_errors=True)
        (folder / "facts").mkdir(parents=True)
        make()
        _refused_before_the_jvm(
            home, export, out,
            f"Error: {folder} is a folder that no compact wrote, and the snapshot of its"
            " dataset would replace it: give --out a folder of its own (nothing was written)",
        )  # fmt: skip
        assert (folder / name).read_text() == "mine"
        assert sorted(p.name for p in out.iterdir()) == [folder.name]
    result = CliRunner().invoke(
        cli, ["--home", str(home), "compact", str(export), "--out", str(out)]
    )
    assert result.exit_code == 1, result.output
    assert (folder / "facts" / "notes.md").read_text() == "mine"
    assert sorted(p.name for p in folder.rglob("*")) == ["facts", "notes.md"]
    shutil.rmtree(out)
    out.mkdir()
    folder.write_text("mine")  # a file of that name
    done = _merklog("--home", str(home), "compact", str(export), "--out", str(out))
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"Error: {folder} is a file that no compact wrote"), line
    assert folder.read_text() == "mine"


def test_compact_replaces_a_snapshot_folder_a_compact_wrote(spark, tmp_path, export):
    """What compact writes in ``dataset=<cid>/`` (a whole snapshot, or the part that a
    compaction interrupted while placing its files leaves), and an empty folder, are
    replaced; beside them, nothing else in ``--out`` is touched. The library refuses a
    folder holding anything else too, before it replaces one."""
    from merklog.node.spark.compact import SnapshotFolderTaken, compact
    from merklog.replication.identity import Identity

    home, out = tmp_path / "h", tmp_path / "out"
    (out / "notes").mkdir(parents=True)
    (out / "notes" / "mine.txt").write_text("mine")
    first = json.loads(run("--home", str(home), "compact", str(export), "--out", str(out)))
    folder = Path(first["directory"])
    assert folder == out / f"dataset={_dataset_of(export)}"
    for undo in (
        lambda: None,  # an earlier snapshot, whole
        lambda: [(folder / n).unlink() for n in ("manifest.cbor", "MANIFEST_CID")],  # part
        lambda: [shutil.rmtree(folder), folder.mkdir()],  # an empty folder
    ):
        undo()
        again = json.loads(run("--home", str(home), "compact", str(export), "--out", str(out)))
        assert again["manifest"] == first["manifest"]
        assert (folder / "MANIFEST_CID").read_text().strip() == first["manifest"]
    assert (out / "notes" / "mine.txt").read_text() == "mine"
    (folder / "acl" / "mine.txt").write_text("mine")
    with pytest.raises(SnapshotFolderTaken):
        compact(spark, [str(export)], out, Identity.from_seed(b"\x05" * 32))
    assert (folder / "acl" / "mine.txt").read_text() == "mine"
    assert (folder / "MANIFEST_CID").read_text().strip() == first["manifest"]


def test_compact_refuses_an_out_in_the_home(tmp_path, export):
    """``compact --out HOME`` (or a folder inside it) wrote a ``dataset=<cid>/`` snapshot
    among the home's store and key, exit 0. It is refused before the JVM starts by the
    check ``parquet export`` makes, exit 1, and nothing is written into the home."""
    home = tmp_path / "h"
    before = sorted(p.name for p in home.iterdir())
    for out, said in ((home, "is the home"), (home / "sub", f"is inside the home {home}")):
        _refused_before_the_jvm(
            home, export, out,
            f"Error: {out} {said}: give --out a folder of its own (nothing was written)",
        )  # fmt: skip
        assert sorted(p.name for p in home.iterdir()) == before
    # QA: analyze wrote its outputs into the home of a running node, exit 0
    prog = tmp_path / "p.dl"
    prog.write_text("q(X) :- ni(X).\n")
    out = home / "anx"
    done = _merklog(
        "--home", str(home), "analyze", str(prog), "--input", str(export), "--out", str(out),
        "--master", "bogus://x",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"Error: {out} is inside the home {home}: give --out a folder of its own (nothing was"
        " written)"
    ]
    assert sorted(p.name for p in home.iterdir()) == before
    # QA: the check knew only the --home of the command; analyze needs none, and wrote
    # into another home beside its store. Any home is refused now.
    other = tmp_path / "other-home"
    run("--home", str(other), "init")
    done = _merklog(
        "--home", str(tmp_path / "unrelated"), "analyze", str(prog), "--input", str(export),
        "--out", str(other / "anx"), "--master", "bogus://x",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"Error: {other / 'anx'} is inside the merklog home {other}: give --out a folder of"
        " its own (nothing was written)"
    ]
    assert not (other / "anx").exists()
    # and a program file that is not UTF-8 is exit 1, as for eval (it was 2, QA)
    latin = tmp_path / "latin.dl"
    latin.write_bytes(b"\xff p(X) :- q(X).")
    done = _merklog(
        "analyze", str(latin), "--input", str(export), "--out", str(tmp_path / "an-latin"),
        "--master", "bogus://x",
    )  # fmt: skip
    assert done.returncode == 1 and "not UTF-8" in done.stderr, done.stderr


def test_analyze_of_a_snapshot_says_what_compact_says(spark, tmp_path, export):
    """``analyze --input SNAPSHOT`` (a compact's output, not an export) printed pyarrow's
    ``No match for FieldRef.Name(dataset) in delta_cid: binary`` and the schema, ten
    lines, exit 2: the inputs' datasets were read before the inputs were checked. It is
    the one line compact gives for the same input, before the JVM starts."""
    home, snap, out = tmp_path / "h", tmp_path / "snap", tmp_path / "a"
    run("--home", str(home), "compact", str(export), "--out", str(snap))
    prog = tmp_path / "p.dl"
    prog.write_text("q(X) :- ni(X).\n")
    for given in (snap, snap / f"dataset={_dataset_of(export)}"):
        done = _merklog(
            "analyze", str(prog), "--input", str(given), "--out", str(out),
            "--master", "bogus://x",
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        by_compact = _merklog(
            "--home", str(home), "compact", str(given), "--out", str(tmp_path / "s2"),
            "--master", "bogus://x",
        )  # fmt: skip
        assert by_compact.returncode == 2, by_compact.stderr
        [compact_line] = by_compact.stderr.splitlines()
        as_analyze = compact_line.replace("for INPUTS:", "for --input:")
        assert done.stderr.splitlines() == [as_analyze.replace("compact --help", "analyze --help")]
        assert "is not a merklog export's op file (no column dataset, op)" in compact_line
        assert not out.exists() and not (tmp_path / "s2").exists()


def test_each_analyze_input_takes_its_own_input_option(tmp_path, export):
    """``--input ex1 ex2`` (docs/spark.md's table read as if one --input took several
    paths) said only ``Got unexpected extra argument (ex2)``. The line says to repeat
    ``--input``; nothing is written."""
    prog = tmp_path / "p.dl"
    prog.write_text("q(X) :- ni(X).\n")
    out = tmp_path / "a"
    for extra, said in (
        ([str(export)], f"argument ({export})"),
        ([str(export), "ex3"], f"arguments ({export} ex3)"),
    ):
        done = _merklog("analyze", str(prog), "--input", str(export), *extra, "--out", str(out))
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"Error: Got unexpected extra {said}; give each input with its own --input"
            " (see `merklog analyze --help`)"
        ]
        assert not out.exists()


def test_a_dataset_value_that_is_no_cid_names_no_folder_to_replace(tmp_path, export):
    """compact builds ``--out/dataset=<value>`` from the inputs' dataset column and
    replaces that folder: a crafted value ``x/../../victim`` named a folder outside
    ``--out`` (it resolves once ``out/dataset=x`` exists). A value that is not a CID is
    refused before any folder is named, and ``victim`` is left as it was."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    crafted = tmp_path / "crafted"
    shutil.copytree(export, crafted)
    for part in (crafted / "ops").glob("*.parquet"):
        table = pq.read_table(part)
        at = table.column_names.index("dataset")
        value = pa.array(["x/../../victim"] * table.num_rows, table.schema.field("dataset").type)
        pq.write_table(table.set_column(at, "dataset", value), part)
    victim, out = tmp_path / "victim", tmp_path / "out"
    victim.mkdir()  # empty: the foreign-folder check alone would let it be replaced
    (out / "dataset=x").mkdir(parents=True)
    done = _merklog("--home", str(tmp_path / "h"), "compact", str(crafted), "--out", str(out))
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "Error: the inputs name a dataset 'x/../../victim' that is not a CID: they are no"
        " merklog export (nothing was written)"
    ]
    assert victim.is_dir() and not any(victim.iterdir())
    assert sorted(p.name for p in out.iterdir()) == ["dataset=x"]


def test_a_snapshot_without_a_genesis_block_says_so(spark, tmp_path, export):
    """QA: ``compact EXPORT/ops/part-00000.parquet`` (a part file, not the export folder)
    wrote a snapshot without ``genesis.cbor`` and said nothing; ``import-snapshot`` then
    refused it for a fresh home. A note says so; a whole export's snapshot has none."""
    home = tmp_path / "h"
    part = sorted((export / "ops").glob("*.parquet"))[0]
    said = run("--home", str(home), "compact", str(part), "--out", str(tmp_path / "s1"))
    assert "note: no input carried the genesis block of dataset" in said, said
    said = run("--home", str(home), "compact", str(export), "--out", str(tmp_path / "s2"))
    assert "note:" not in said, said
