"""Start the local driver JVM directly, without pyspark's launch scripts (ADR 0130).

pyspark starts its JVM with ``bin/spark-submit``: bash sources ``find-spark-home`` and
``load-spark-env.sh``, execs ``spark-class``, which runs a first JVM
(``org.apache.spark.launcher.Main``) only to print the real command line, then execs
the driver JVM. That costs ~0.3 s of wall time per command on this machine, and the
command it prints depends only on its arguments, the environment and the install.

So the first start with a given set of those runs the launcher itself (as ``spark-class``
does, with the environment ``load-spark-env.sh`` exports) and keeps the command it
printed in merklog's cache; every start after that runs the driver JVM from the cache,
and pyspark connects to it through its documented hand-over: the driver writes its
gateway port and secret to ``_PYSPARK_DRIVER_CONN_INFO_PATH``, and
``PYSPARK_GATEWAY_PORT``/``PYSPARK_GATEWAY_SECRET`` tell pyspark to use a running
gateway instead of launching one.

Only for a ``local`` master, and never when anything the scripts would read is there:
``spark-env.sh`` or ``spark-defaults.conf`` in the conf directory, ``PYSPARK_SUBMIT_ARGS``,
a gateway already given. Anything unexpected (no java, a launcher that fails, a JVM
that exits before its gateway is up) returns None, and the caller lets pyspark launch
the JVM its own way. ``MERKLOG_SPARK_DIRECT=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .cds import _stamp, cache_dir, java_binary

#: The main class the launcher is asked about, and pyspark's primary resource.
SUBMIT = "org.apache.spark.deploy.SparkSubmit"
#: How long the driver JVM may take to write its gateway port before this gives up.
START_TIMEOUT = 120.0


def enabled() -> bool:
    """False when ``MERKLOG_SPARK_DIRECT=0``."""
    return os.environ.get("MERKLOG_SPARK_DIRECT", "1") != "0"


def spark_home() -> Path | None:
    """The Spark home pyspark would use (``$SPARK_HOME``, else the wheel), or None.

    Found by pyspark's own ``find_spark_home.py``, loaded from its file without importing
    the pyspark package, which would cost ~0.1 s before the JVM starts (ADR 0158)."""
    import importlib.util

    from .cds import pyspark_dir

    package = pyspark_dir()
    script = package / "find_spark_home.py" if package is not None else None
    if script is None or not script.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location("_merklog_find_spark_home", script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        home = Path(module._find_spark_home())
    except (Exception, SystemExit):  # found nothing it could use: its launcher will say so
        return None
    return home if (home / "jars").is_dir() else None


def _script_env(home: Path) -> dict[str, str] | None:
    """The variables ``spark-submit`` and ``load-spark-env.sh`` export, or None when
    ``spark-env.sh`` would run (its effects are not known here)."""
    conf_dir = Path(os.environ.get("SPARK_CONF_DIR") or home / "conf")
    if (conf_dir / "spark-env.sh").exists() or (conf_dir / "spark-defaults.conf").exists():
        return None
    env = {
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_ENV_LOADED": "1",
        "PYTHONHASHSEED": "0",  # spark-submit exports it for the Python workers
    }
    scala = os.environ.get("SPARK_SCALA_VERSION")
    if not scala:
        try:
            text = (home / "bin" / "load-spark-env.sh").read_text()
        except OSError:
            return None
        found = re.search(r"^export SPARK_SCALA_VERSION=(\S+)$", text, re.M)
        if not found:
            return None
        scala = found.group(1)
    env["SPARK_SCALA_VERSION"] = scala
    return env


def _relevant_env() -> dict[str, str]:
    """The environment the launcher may read (Spark's, Hadoop's, YARN's and Java's)."""
    prefixes = ("SPARK_", "HADOOP_", "YARN_", "JAVA", "_SPARK")
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)}


def launcher_command(home: Path, args: list[str], env: dict[str, str]) -> list[str] | None:
    """What ``org.apache.spark.launcher.Main`` prints for ``SparkSubmit args``: the driver
    JVM's command line (None when the launcher fails or prints something else)."""
    java = java_binary()
    if java is None:
        return None
    launcher = [str(java), "-Xmx128m"]
    launcher += os.environ.get("SPARK_LAUNCHER_OPTS", "").split()
    launcher += ["-cp", f"{home / 'jars'}/*", "org.apache.spark.launcher.Main", SUBMIT, *args]
    try:
        done = subprocess.run(
            launcher,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=START_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    # spark-class's protocol: lines of messages, a line holding one NUL, then the command's
    # words, each ended by a NUL
    marker = done.stdout.find(b"\0\n")
    if done.returncode != 0 or marker < 0:
        return None
    parts = done.stdout[marker + 2 :].split(b"\0")
    if len(parts) < 3 or parts[-1] != b"":
        return None
    command = [p.decode() for p in parts[:-1]]
    if SUBMIT not in command:
        return None
    # the launcher re-emits the --conf pairs in its own order: the same pairs, nothing else
    rest = command[command.index(SUBMIT) + 1 :]
    return command if _pairs(rest) == _pairs(args) and rest[-1:] == args[-1:] else None


def _pairs(args: list[str]) -> list[str]:
    """The sorted ``--conf`` values of a SparkSubmit argument list (and its other words)."""
    out = []
    i = 0
    while i < len(args):
        if args[i] == "--conf" and i + 1 < len(args):
            out.append("conf:" + args[i + 1])
            i += 2
        else:
            out.append("arg:" + args[i])
            i += 1
    return sorted(out)


def driver_command(args: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """The driver JVM's command line for ``SparkSubmit args`` and the variables to add to
    its environment, from merklog's cache (asking the launcher on a miss), or None."""
    home = spark_home()
    if home is None:
        return None
    env = _script_env(home)
    java = java_binary()
    if env is None or java is None:
        return None
    key_parts = [_stamp(java), _stamp(home / "jars"), json.dumps(args), json.dumps(_relevant_env())]
    key = hashlib.sha256("\n".join(key_parts).encode()).hexdigest()[:24]
    directory = cache_dir().parent / "spark-launch"
    path = directory / f"{key}.json"
    try:
        command = json.loads(path.read_text())["command"]
        if isinstance(command, list) and all(isinstance(c, str) for c in command):
            return command, env
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no entry yet, or a damaged one: ask the launcher again and rewrite it
    command = launcher_command(home, args, env)
    if command is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"command": command}))
        os.replace(tmp, path)
    except OSError:
        pass  # no cache: the launcher runs again next time
    return command, env


def submit_args(conf: dict[str, str]) -> list[str]:
    """The ``SparkSubmit`` arguments pyspark's ``launch_gateway`` passes for ``conf``."""
    args = []
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return [*args, "pyspark-shell"]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Launch:
    """A driver JVM started from the cached command, whose gateway pyspark has not yet
    been pointed at: :meth:`connect` waits for it (ADR 0158)."""

    def __init__(self, proc: Any, info_dir: Path) -> None:
        self.proc = proc
        self._info_dir = info_dir

    def connect(self) -> Any | None:
        """Wait for the JVM's gateway port and secret and put them in this process's
        environment for pyspark to connect to; returns the ``Popen`` (the JVM lives as
        long as its stdin pipe is open), or None (the JVM is stopped) when it exited or
        gave nothing within :data:`START_TIMEOUT`."""
        from pyspark.serializers import UTF8Deserializer, read_int

        info = self._info_dir / "conn"
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not info.is_file():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    return None
                time.sleep(0.02)
            with info.open("rb") as f:
                port = read_int(f)
                secret = UTF8Deserializer().loads(f)
        finally:
            shutil.rmtree(self._info_dir, ignore_errors=True)
        os.environ["PYSPARK_GATEWAY_PORT"] = str(port)
        os.environ["PYSPARK_GATEWAY_SECRET"] = secret
        return self.proc

    def kill(self) -> None:
        """Stop the JVM (a launch nobody will connect to); idempotent."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self._info_dir, ignore_errors=True)


def launch_driver(conf: dict[str, str]) -> Launch | None:
    """Start the driver JVM for a ``local`` master with ``conf`` (the session's settings,
    ``spark.master`` and ``spark.app.name`` included) without waiting for it; None when
    pyspark should launch the JVM itself (see the module docstring)."""
    if not enabled() or os.name != "posix":
        return None
    if not conf.get("spark.master", "").startswith("local"):
        return None
    if any(k in os.environ for k in ("PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT")):
        return None
    found = driver_command(submit_args(conf))
    if found is None:
        return None
    command, script_env = found
    info_dir = Path(tempfile.mkdtemp(prefix="merklog-gateway-"))
    env = {
        **os.environ,
        **script_env,
        "SPARK_CONNECT_MODE": "0",
        "_PYSPARK_DRIVER_CONN_INFO_PATH": str(info_dir / "conn"),
    }
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, preexec_fn=_ignore_sigint)
    except OSError:
        shutil.rmtree(info_dir, ignore_errors=True)
        return None
    return Launch(proc, info_dir)


def start_driver(conf: dict[str, str]) -> Any | None:
    """:func:`launch_driver` and :meth:`Launch.connect`: the ``Popen`` of a driver JVM
    whose gateway pyspark is pointed at, or None when pyspark should launch it."""
    launch = launch_driver(conf)
    return launch.connect() if launch is not None else None


def forget_gateway() -> None:
    """Remove the gateway variables :func:`start_driver` set, once pyspark has connected
    (a later session in this process must not reuse a stopped JVM's port)."""
    os.environ.pop("PYSPARK_GATEWAY_PORT", None)
    os.environ.pop("PYSPARK_GATEWAY_SECRET", None)
