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
    """The Spark home pyspark would use (``$SPARK_HOME``, else the wheel), or None."""
    try:
        from pyspark.find_spark_home import _find_spark_home

        home = Path(_find_spark_home())
    except Exception:  # pyspark found nothing it could use: its own launcher will say so
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


def start_driver(conf: dict[str, str]) -> Any | None:
    """Start the driver JVM for a ``local`` master with ``conf`` (the session's settings,
    ``spark.master`` and ``spark.app.name`` included) and put its gateway in this process's
    environment for pyspark to connect to; returns the ``Popen`` (the JVM lives as long as
    its stdin pipe is open), or None when pyspark should launch the JVM itself."""
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
    from pyspark.serializers import UTF8Deserializer, read_int

    info_dir = Path(tempfile.mkdtemp(prefix="merklog-gateway-"))
    info = info_dir / "conn"
    env = {
        **os.environ,
        **script_env,
        "SPARK_CONNECT_MODE": "0",
        "_PYSPARK_DRIVER_CONN_INFO_PATH": str(info),
    }
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, preexec_fn=_ignore_sigint)
    except OSError:
        shutil.rmtree(info_dir, ignore_errors=True)
        return None
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not info.is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return None
            time.sleep(0.02)
        with info.open("rb") as f:
            port = read_int(f)
            secret = UTF8Deserializer().loads(f)
    finally:
        shutil.rmtree(info_dir, ignore_errors=True)
    os.environ["PYSPARK_GATEWAY_PORT"] = str(port)
    os.environ["PYSPARK_GATEWAY_SECRET"] = secret
    return proc


def forget_gateway() -> None:
    """Remove the gateway variables :func:`start_driver` set, once pyspark has connected
    (a later session in this process must not reuse a stopped JVM's port)."""
    os.environ.pop("PYSPARK_GATEWAY_PORT", None)
    os.environ.pop("PYSPARK_GATEWAY_SECRET", None)
