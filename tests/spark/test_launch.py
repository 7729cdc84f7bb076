"""The driver JVM started directly from the launcher's cached command (ADR 0130): the JVM
runs exactly what Spark's launcher prints, later starts need no launcher, and anything
the scripts would read, another master or a command that fails sends the start back to
pyspark's own launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from merklog.node.spark import launch

#: The probes start JVMs with a fresh cache each: none dumps a class-data-sharing archive
#: (a dump costs a JVM ~20 s of CPU as it exits; test_cds.py tests the archive).
NO_CDS = {"MERKLOG_SPARK_CDS": "0"}

CONF = {"spark.app.name": "merklog-launch-test", "spark.master": "local[1]"}

PROBE = r"""
import json, os, sys
if "no-stdout" in sys.argv[2:]:  # a process whose stdout is closed: report on stderr
    os.close(1)
from merklog.node.spark import launch
from merklog.node.spark.session import build_session, spark_log_path
if sys.argv[1] == "no-launcher":
    def refuse(*a, **k):
        raise AssertionError("the launcher ran although its command is cached")
    launch.launcher_command = refuse
spark = build_session(master="local[1]", app_name="merklog-launch-test", quiet=True)
proc = spark.sparkContext._gateway.proc
with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
    cmdline = [w.decode() for w in f.read().split(b"\0")[:-1]]
fds = [n for n in (1, 2) if os.path.exists(f"/proc/self/fd/{n}")]
seen = json.dumps({
    "rows": spark.range(5).count(),
    "cmdline": cmdline,
    "gateway_env": [k for k in os.environ if k.startswith("PYSPARK_GATEWAY")],
    "log": str(spark_log_path()),
    "jvm_out": [os.readlink(f"/proc/{proc.pid}/fd/{n}") for n in (1, 2)],
    "own_out": [os.readlink(f"/proc/self/fd/{n}") for n in fds],
})
os.write(fds[0], seen.encode() + b"\n")
"""


def _probe(cache: Path, mode: str, direct: str = "1", *flags: str) -> dict:
    env = dict(os.environ, MERKLOG_CACHE_DIR=str(cache), MERKLOG_SPARK_DIRECT=direct, **NO_CDS)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    reported = out.stderr if "no-stdout" in flags else out.stdout
    return json.loads(reported.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def first_start(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A session started directly (the launcher asked once, its command cached): the
    cache folder and what the probe saw."""
    cache = tmp_path_factory.mktemp("launch")
    return cache, _probe(cache, "first")


@pytest.fixture(scope="module")
def second_start(first_start: tuple[Path, dict]) -> dict:
    """A second session from the same cache, the launcher refused (the cached command
    must do), in a process whose stdout is closed (a daemon's, a script's that closed
    it): what that probe saw, reported on its stderr. One JVM start for both cases."""
    return _probe(first_start[0], "no-launcher", "1", "no-stdout")


def test_the_driver_runs_the_launchers_command_and_later_starts_skip_the_launcher(
    first_start: tuple[Path, dict], second_start: dict
) -> None:
    cache, first = first_start
    assert first["rows"] == 5
    assert first["gateway_env"] == []  # handed over, then forgotten
    [cached] = (cache / "spark-launch").glob("*.json")
    command = json.loads(cached.read_text())["command"]
    assert first["cmdline"] == command  # the JVM is the command the launcher printed
    assert Path(command[0]).name == "java" and "org.apache.spark.launcher.Main" not in command
    # the cache answers: no launcher JVM at all
    assert second_start["rows"] == 5 and second_start["cmdline"] == command


def test_a_quiet_jvm_holds_neither_of_the_commands_streams(
    first_start: tuple[Path, dict], tmp_path: Path
) -> None:
    """The JVM writes its stdout and stderr to the log, whichever way it was started
    (directly, as in ``first_start``, or by pyspark's launcher): it outlives the command
    by its shutdown, and a reader of the command's output (a pipe) would otherwise wait
    for that too; the command gets its own streams back."""
    for seen in (first_start[1], _probe(tmp_path, "first", direct="0")):
        assert seen["rows"] == 5
        assert seen["jvm_out"] == [seen["log"], seen["log"]]
        assert seen["log"] not in seen["own_out"]


def test_a_quiet_session_starts_when_the_command_has_no_stdout(second_start: dict) -> None:
    """A process whose stdout is closed (a daemon, a script that closed it) still gets a
    quiet session: the stream it has is pointed at the log, the missing one is skipped,
    and the JVM's stderr goes to the log too."""
    assert second_start["rows"] == 5
    assert len(second_start["own_out"]) == 1  # only stderr was open
    assert second_start["log"] not in second_start["own_out"]
    assert second_start["jvm_out"][1] == second_start["log"]  # its fd 1 is whatever it
    # opened first: the process had none to hand down


def test_what_the_scripts_would_read_keeps_pyspark_s_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = launch.spark_home()
    assert home is not None
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert launch._script_env(home) is not None
    (tmp_path / "spark-env.sh").write_text("export SPARK_DAEMON_MEMORY=1g\n")
    assert launch._script_env(home) is None
    (tmp_path / "spark-env.sh").unlink()
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.memory 2g\n")
    assert launch._script_env(home) is None
    monkeypatch.delenv("SPARK_CONF_DIR")
    # another master, pyspark's own submit arguments, or switched off: no direct start
    assert launch.start_driver({**CONF, "spark.master": "spark://127.0.0.1:7077"}) is None
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 2g pyspark-shell")
    assert launch.start_driver(CONF) is None
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    monkeypatch.setenv("MERKLOG_SPARK_DIRECT", "0")
    assert launch.start_driver(CONF) is None


def test_a_command_that_fails_falls_back_and_leaves_no_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MERKLOG_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MERKLOG_SPARK_DIRECT", raising=False)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    args = launch.submit_args(CONF)
    found = launch.driver_command(args)  # asks the real launcher, fills the cache
    assert found is not None
    command, env = found
    assert command[-1] == "pyspark-shell" and launch.SUBMIT in command
    assert env["SPARK_HOME"] == str(launch.spark_home()) and env["PYTHONHASHSEED"] == "0"
    [cached] = (tmp_path / "spark-launch").glob("*.json")
    cached.write_text(json.dumps({"command": [sys.executable, "-c", "raise SystemExit(3)"]}))
    assert launch.start_driver(CONF) is None  # exited before its gateway was up
    assert "PYSPARK_GATEWAY_PORT" not in os.environ
    cached.write_text("not json")
    assert launch.driver_command(args) == found  # a damaged entry is asked again


def test_the_launcher_output_is_parsed_as_spark_class_does() -> None:
    words = ["--conf", "b=2", "--conf", "a=1", "pyspark-shell"]
    assert launch._pairs(words) == launch._pairs(
        ["--conf", "a=1", "--conf", "b=2", "pyspark-shell"]
    )
    assert launch._pairs(words) != launch._pairs(["--conf", "a=1", "pyspark-shell"])


PRELAUNCH = r"""
import json, os, sys
from merklog.node.spark.session import build_session, prelaunch, spark_log_path
pre = prelaunch(master="local[1]", app_name="merklog-launch-test", quiet=True, input_rows=10)
jvm = pre.launch.proc
assert "pyspark.sql" not in sys.modules  # started before the Spark code is imported
if sys.argv[1] == "unused":
    pre.close()
    pre.close()  # idempotent
    print(json.dumps({"exit": jvm.poll(), "gateway_env": [k for k in os.environ if "GATEWAY" in k]}))
    raise SystemExit(0)
if sys.argv[1] == "interrupted":  # a Ctrl-C while the session waits for the gateway
    from merklog.node.spark import launch as launch_module

    def interrupted(self):
        raise KeyboardInterrupt

    launch_module.Launch.connect = interrupted
    stopped = False
    try:
        build_session(
            master="local[1]", app_name="merklog-launch-test", quiet=True, input_rows=10,
            prelaunched=pre,
        )
    except KeyboardInterrupt:
        stopped = True
    pre.close()  # what the command's cleanup does
    jvm.wait(timeout=60)
    print(json.dumps({
        "interrupted": stopped,
        "exit": jvm.poll(),
        "gateway_env": [k for k in os.environ if "GATEWAY" in k],
    }))
    raise SystemExit(0)
spark = build_session(
    master="local[1]", app_name="merklog-launch-test", quiet=True, input_rows=10, prelaunched=pre
)
pre.close()  # the session took the JVM over: nothing to stop
with open(f"/proc/{jvm.pid}/cmdline", "rb") as f:
    cmdline = [w.decode() for w in f.read().split(b"\0")[:-1]]
print(json.dumps({
    "same": spark.sparkContext._gateway.proc is jvm,
    "rows": spark.range(5).count(),
    "alive": jvm.poll() is None,
    "light": "-XX:TieredStopAtLevel=1" in " ".join(cmdline),
    "gateway_env": [k for k in os.environ if k.startswith("PYSPARK_GATEWAY")],
    "log": str(spark_log_path()),
    "jvm_out": [os.readlink(f"/proc/{jvm.pid}/fd/{n}") for n in (1, 2)],
}))
"""


def _prelaunch_probe(cache: Path, mode: str) -> dict:
    env = dict(os.environ, MERKLOG_CACHE_DIR=str(cache), MERKLOG_SPARK_DIRECT="1", **NO_CDS)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    env.pop("MERKLOG_SPARK_LIGHT_JVM", None)
    out = subprocess.run(
        [sys.executable, "-c", PRELAUNCH, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_prelaunched_jvm_is_the_one_the_session_uses(tmp_path: Path) -> None:
    """ADR 0158: the JVM a command starts before it imports the Spark code is the one its
    session runs on, started with the flags its input size picks (light below 10M rows),
    quiet, and its gateway variables forgotten once pyspark connected."""
    seen = _prelaunch_probe(tmp_path, "used")
    assert seen["same"] and seen["alive"] and seen["rows"] == 5
    assert seen["light"]
    assert seen["gateway_env"] == []
    assert seen["jvm_out"] == [seen["log"], seen["log"]]


def test_a_prelaunched_jvm_no_session_takes_is_stopped(tmp_path: Path) -> None:
    """A command that fails between the start and its session (no identity, a bad input)
    stops the JVM it started: closed, it has exited, and no gateway was handed over."""
    seen = _prelaunch_probe(tmp_path, "unused")
    assert seen["exit"] is not None
    assert seen["gateway_env"] == []


def test_a_ctrl_c_while_the_session_waits_for_its_jvm_stops_the_jvm(tmp_path: Path) -> None:
    """A Ctrl-C 0.8-1.5 s into ``compact`` (the session waiting for the prelaunched JVM's
    gateway) left that JVM running, orphaned, ~250 MB, for good: the session had taken
    it from the command's cleanup before connecting. The interrupt is raised where the
    wait is (it cannot be timed from outside); the cleanup then stops the JVM."""
    seen = _prelaunch_probe(tmp_path, "interrupted")
    assert seen["interrupted"] and seen["exit"] is not None
    assert seen["gateway_env"] == []


def test_no_prelaunch_for_spark_connect() -> None:
    from merklog.node.spark.session import prelaunch

    assert prelaunch(remote="sc://127.0.0.1:15002") is None
