"""Ctrl-C during a Spark job is one line, ``Error: interrupted (Ctrl-C)``, exit 1: not
py4j's "Exception while sending command." traceback (pyspark's SIGINT handler cancels
the jobs over the gateway connection the interrupted call is reading), and not an
internal error for the Py4JError the torn-down gateway raises after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .test_cli import _merklog

CHAIN = 150  # edges: the closure below runs one Spark iteration per step, for minutes


def _started(local: Path) -> bool:
    """Whether the job's SparkContext is up: its block manager folder exists."""
    return local.is_dir() and any(local.glob("blockmgr-*"))


def _interrupt_mid_job(tmp_path: Path, command: list[str]) -> subprocess.CompletedProcess:
    """Run ``merklog COMMAND`` in a process group of its own, as a shell runs it, and
    press Ctrl-C (SIGINT to the whole group: the JVM gets it too) once its job runs."""
    local = tmp_path / "local"
    proc = subprocess.Popen(
        [sys.executable, "-m", "merklog.node.cli", *command, "--conf", f"spark.local.dir={local}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    try:
        while not _started(local) and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(8)  # well into the job's iterations (each a round of py4j calls)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_ctrl_c_during_analyze_is_one_line_exit_1(tmp_path):
    home = tmp_path / "h"
    facts = tmp_path / "e.dl"
    facts.write_text("".join(f"e({i}, {i + 1}).\n" for i in range(CHAIN)))
    for args in (("init",), ("put", "-f", str(facts)), ("parquet", "export", str(tmp_path / "ex"))):
        done = _merklog("--home", str(home), *args)
        assert done.returncode == 0, done.stderr
    prog = tmp_path / "p.dl"
    prog.write_text("p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).\n")
    done = _interrupt_mid_job(
        tmp_path,
        [
            "--home",
            str(home),
            "analyze",
            str(prog),
            "--input",
            str(tmp_path / "ex"),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert (done.returncode, done.stderr) == (1, "Error: interrupted (Ctrl-C)\n")
    # its JVM ended with it: it ignores Ctrl-C, and its abandoned tasks went on writing
    # (re-creating _temporary folders) for seconds after the command had cleaned up
    assert _jvms_of(tmp_path / "local") == []
    assert not (tmp_path / "out").exists()
    # its JVM's temporary folders are gone too (QA: two spark-<uuid> folders were left in
    # the local dir, /tmp by default, by every interrupted command)
    assert list((tmp_path / "local").glob("spark-*")) == []


def _jvms_of(local: Path) -> list[int]:
    """The processes whose command line names ``spark.local.dir=local``: a job's JVM."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if f"spark.local.dir={local}".encode() in cmdline and b"java" in cmdline:
            found.append(int(entry.name))
    return found


def test_py4j_records_while_a_ctrl_c_is_handled_do_not_reach_stderr(capsys):
    """What py4j logs (through the root logger, with a chain holding no
    KeyboardInterrupt) once the interrupt is marked is dropped; before, it is shown."""
    import logging

    from py4j.protocol import Py4JNetworkError

    from merklog.node import interrupts
    from merklog.node.logs import setup_logging

    setup_logging(0)
    try:
        raise Py4JNetworkError("Error while sending or receiving")
    except Py4JNetworkError:
        interrupts.reset()
        logging.exception("before")
        interrupts.mark()
        logging.exception("Exception while sending command.")
        logging.getLogger("py4j.clientserver").error("closing")
    interrupts.reset()
    err = capsys.readouterr().err
    assert "before" in err
    assert "Exception while sending command." not in err and "closing" not in err


def test_the_accumulator_server_logs_a_dropped_connection_instead_of_printing_it(capsys):
    """QA: Ctrl-C during an analyze whose job runs a Python UDF printed a dashed line and
    an EOFError traceback from pyspark's accumulator server thread before the command's
    one line. Its error handler now logs at debug level and prints nothing."""
    from pyspark.accumulators import AccumulatorTCPServer

    from merklog.node.spark.session import _quiet_accumulator_server

    _quiet_accumulator_server()
    try:
        raise EOFError
    except EOFError:
        AccumulatorTCPServer.handle_error(None, None, ("127.0.0.1", 48208))  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
