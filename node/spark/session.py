"""Spark session and cluster configuration for merklog jobs.

One place decides how a job reaches Spark:

- ``master="local[*]"`` (default): an in-process local cluster;
- ``master="spark://host:7077"``: a standalone cluster (executors are remote
  Python workers, so the merklog package is shipped to them as a zip);
- ``remote="sc://host:15002"``: Spark Connect; the client is thin, the package
  is shipped with ``SparkSession.addArtifacts(..., pyfile=True)``.

The defaults are the measured ones: UI off, few shuffle partitions, and the JVM
flags by input size. A ``merklog compact`` is one fresh JVM per command: below
:data:`LIGHT_MAX_ROWS` input rows the driver JVM (which runs the tasks of a local
job) gets C1 only and the serial collector (``-XX:TieredStopAtLevel=1
-XX:+UseSerialGC``), because C2's compiler threads and G1's concurrent threads cost
more CPU at start than they save in a short job; above it, and when the size is
unknown, the JVM's own defaults (C2, G1) (ADR 0085 has the figures at 1M and 5M ops
of the older, heavier job; ADR 0124 those that moved the threshold to 10M). Executors
of a cluster keep the JVM's defaults.
``MERKLOG_SPARK_LIGHT_JVM=1`` puts the light flags on every JVM whatever the size
(the test suite sets it), ``=0`` on none.

Quiet by default: the driver JVM is started with its stdout and stderr sent to a log
file (:func:`spark_log_path`), so its banners and warnings (``WARNING: Using incubator
modules``, log4j's default-profile lines, ``NativeCodeLoader``) stay off the
terminal; ``quiet=False`` (the CLI's ``-v``) leaves them on it. The JVM outlives this
process by its shutdown (~0.5 s after a compaction: Spark's hooks stop the context and
delete its shuffle files), so holding this process's stdout would keep a reader of the
command's output (``merklog compact … | jq``, a script's pipe) waiting for that too.

The driver JVM maps a class-data-sharing archive from merklog's cache, dumped by the
first run (:mod:`merklog.node.spark.cds`, ADR 0114): ~4-5 s less JVM CPU per command.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from merklog.node.failures import ExitCode, Failure
from merklog.node.logs import json_logging

from .cds import cds_options
from .launch import Launch, forget_gateway, launch_driver, start_driver

LOCAL_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.compression.codec": "zstd",
    # PySpark's DataFrame debugging records the Python call site of every DataFrame and
    # Column call in the JVM (four more gateway round trips each) for Spark's own error
    # contexts, which merklog never shows: analyze of a 15-rule program makes ~1,700
    # such calls. Off, a warm analyze of the parity suite's mixed_arith_aggregates took
    # 19.8 / 16.9 s against 26.7 / 23.2 s (alternating, load ~2).
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}
#: Shuffle settings of a local master, whose shuffle files never leave the machine: no lz4
#: compression of the shuffle blocks and no checksums of them (Spark's defaults are for
#: blocks sent over a network). A cold 1M-op compaction, four alternating pairs at load
#: ~3: the facts job's JVM CPU 4.68 -> 4.41 s (medians), the whole run 10.6 -> 9.8 s wall
#: (ADR 0137). A cluster keeps Spark's defaults; ``--conf`` overrides either.
LOCAL_SHUFFLE: dict[str, str] = {
    "spark.shuffle.compress": "false",
    "spark.shuffle.checksum.enabled": "false",
}
#: JVM flags of one-shot jobs: C1 only and the serial collector (ADR 0085). With C1 alone the
#: JVM reserves only 48 MiB for compiled code, which one long-lived session fills over a whole
#: test run ("Out of space in CodeCache for method handle intrinsic" inside a Spark query),
#: so the code cache gets the size the default tiered JVM reserves.
LIGHT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"


#: Input op rows below which a job's driver JVM gets the light flags. Measured on 2 cores
#: (ADR 0085), a cold compaction of 1M ops used ~22 % less CPU with them and one of 5M ops
#: ~28 % more; since the compaction job carries only narrow rows (ADR 0122), 5M ops take
#: ~25 % less wall time with them too (ADR 0124). Above 10M, unmeasured, the JVM's defaults.
LIGHT_MAX_ROWS = 10_000_000


#: Input op rows up to which a job's expressions are interpreted, not compiled: Spark
#: generates and compiles (Janino, then the JIT) Java code for every query's
#: expressions, which on a fresh JVM costs more than evaluating a small input row by row.
#: A cold ``merklog analyze`` of a 15-rule program over ~120 facts took 31 s against
#: 40-47 s with code generation (ADR 0188). Larger inputs keep Spark's defaults.
INTERPRET_MAX_ROWS = 100_000
#: The settings of a small job (:data:`INTERPRET_MAX_ROWS`): no whole-stage code and no
#: generated expression code (``factoryMode`` is an internal Spark setting, stable since
#: Spark 3.0; ``--conf`` overrides both).
INTERPRETED: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


def jvm_defaults(input_rows: int | None = None) -> dict[str, str]:
    """The session settings for a job over ``input_rows`` op rows (None: unknown):
    LOCAL_DEFAULTS, plus the light JVM flags on the driver JVM (which runs the tasks
    too when the master is ``local``) when the input is known to be small, and
    :data:`INTERPRETED` when it is known to be at most :data:`INTERPRET_MAX_ROWS`. A cluster's
    executors keep the JVM's defaults. ``MERKLOG_SPARK_LIGHT_JVM=1`` puts the light flags
    on every JVM whatever the size, ``=0`` leaves every JVM at its defaults."""
    settings = dict(LOCAL_DEFAULTS)
    light = os.environ.get("MERKLOG_SPARK_LIGHT_JVM")
    if light == "1" or (light != "0" and input_rows is not None and input_rows < LIGHT_MAX_ROWS):
        settings["spark.driver.extraJavaOptions"] = LIGHT_JVM
    if light == "1":
        settings["spark.executor.extraJavaOptions"] = LIGHT_JVM
    if input_rows is not None and input_rows <= INTERPRET_MAX_ROWS:
        settings.update(INTERPRETED)
    return settings


def shuffle_settings(master: str | None, remote: str | None = None) -> dict[str, str]:
    """:data:`LOCAL_SHUFFLE` for a local master (``master`` None: ``$MERKLOG_SPARK_MASTER``,
    else ``local[*]``), nothing for a cluster or a Connect server."""
    if remote:
        return {}
    resolved = master or os.environ.get("MERKLOG_SPARK_MASTER") or "local[*]"
    return dict(LOCAL_SHUFFLE) if resolved.startswith("local") else {}


def spark_log_path() -> Path:
    """Where the driver JVM's own output goes when quiet (one file per user, appended)."""
    return Path(tempfile.gettempdir()) / f"merklog-spark-{os.getuid()}.log"


@contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` while a child process (the JVM) is
    started, so the child keeps writing there and holds neither of this process's
    streams; this process gets its own back afterwards."""
    fd = _private_log(path)
    try:
        with _fds_to(fd):
            yield
    finally:
        os.close(fd)


def _private_log(path: Path) -> int:
    """``path`` opened for appending, when it is a regular file of this user's (made
    0600 if it was not); else a fresh private file beside it (``mkstemp``). The log has a
    fixed name in a shared directory: QA made it a symbolic link to another file, which
    the JVM's output then went into, and another user may make it first, readable by
    them. Never through a link (``O_NOFOLLOW``), never another user's file."""
    import stat

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError:  # a symbolic link (ELOOP), or a name this user cannot write
        fd = -1
    if fd >= 0:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
            if info.st_mode & 0o077:
                os.fchmod(fd, 0o600)
            return fd
        os.close(fd)
    fd, _name = tempfile.mkstemp(prefix="merklog-spark-", suffix=".log", dir=path.parent)
    return fd


#: Held while file descriptors 1 and 2 point away from this process's own streams, and
#: the count of such blocks (:func:`_fds_to`); :func:`_log_lines` logs outside them only.
_REDIRECTED = threading.Condition()
_redirect_depth = 0


@contextmanager
def _fds_to(fd: int) -> Iterator[None]:
    """File descriptors 1 and 2 pointed at ``fd`` for the block, then given back."""
    global _redirect_depth
    sys.stdout.flush()
    sys.stderr.flush()
    saved: dict[int, int] = {}
    for n in (1, 2):
        with suppress(OSError):  # not open in this process: the child does not get it either
            saved[n] = os.dup(n)
    with _REDIRECTED:
        _redirect_depth += 1
    try:
        for n in saved:
            os.dup2(fd, n)
        yield
    finally:
        for n, old in saved.items():
            os.dup2(old, n)
            os.close(old)
        with _REDIRECTED:
            _redirect_depth -= 1
            _REDIRECTED.notify_all()


#: A log4j line: ``26/11/27 22:22:09 WARN NativeCodeLoader: …``.
_LOG4J_LINE = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
_LOG4J_LEVELS = {"TRACE": logging.DEBUG, "WARN": logging.WARNING, "FATAL": logging.CRITICAL}


def _log_lines(stream: IO[bytes], logger: logging.Logger) -> None:
    """Log each line the JVM writes (at its log4j level when it has one, else INFO),
    never while this process's own stderr points elsewhere (:func:`_fds_to`): a record
    logged into a JVM's pipe would be read back and logged again, without end."""
    with stream:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            match = _LOG4J_LINE.match(line)
            level = match.group(1) if match else "INFO"
            with _REDIRECTED:
                _REDIRECTED.wait_for(lambda: _redirect_depth == 0)
                logger.log(_LOG4J_LEVELS.get(level, getattr(logging, level)), "%s", line)


@contextmanager
def _output_as_log() -> Iterator[None]:
    """Point file descriptors 1 and 2 at a pipe while the JVM is started, and log what
    it writes there as records of ``merklog.spark.jvm``: with ``-v --log-format json``
    every line on stderr is then a JSON object, the JVM's banners and log4j lines too.
    The reader is a daemon thread; what the JVM writes after this process has gone
    (its shutdown) is lost, as a quiet session's is not."""
    read_fd, write_fd = os.pipe()
    threading.Thread(
        target=_log_lines,
        args=(os.fdopen(read_fd, "rb"), logging.getLogger("merklog.spark.jvm")),
        name="jvm-output",
        daemon=True,
    ).start()
    try:
        with _fds_to(write_fd):
            yield
    finally:
        os.close(write_fd)  # the JVM holds its own copy


def _jvm_output(quiet: bool) -> AbstractContextManager[None]:
    """Where the driver JVM's output goes: a log file when quiet, else the terminal,
    as log records when the log lines are JSON (:func:`_output_as_log`)."""
    if quiet:
        return _output_to(spark_log_path())
    if json_logging():
        return _output_as_log()
    return nullcontext()


def _prepare_env() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def package_zip(dest_dir: str | Path | None = None) -> Path:
    """Zip the installed ``merklog`` package (all four subpackages) for executors.

    The repository maps ``engine/ store/ replication/ node/`` onto ``merklog.*``
    through setup.py, so the zip is built from the *imported* packages and laid
    out as ``merklog/<sub>/…``: an executor that adds it to ``sys.path`` imports
    ``merklog.store`` exactly as the driver does.

    Without ``dest_dir`` the zip goes to a directory of its own that is removed when
    this process exits: a session's file server reads it from there as long as the
    session lives (every ``compact`` on a cluster left one in ``/tmp`` before).
    """
    import merklog.engine
    import merklog.node
    import merklog.replication
    import merklog.store

    if dest_dir is None:
        dest_dir = tempfile.mkdtemp(prefix="merklog-pyfiles-")
        atexit.register(shutil.rmtree, dest_dir, ignore_errors=True)
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / "merklog.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("merklog/__init__.py", "")
        for mod in (merklog.engine, merklog.node, merklog.replication, merklog.store):
            root = Path(mod.__file__).parent
            sub = mod.__name__.split(".", 1)[1]
            for path in sorted(root.rglob("*.py")):
                if "__pycache__" in path.parts:
                    continue
                zf.write(path, f"merklog/{sub}/{path.relative_to(root).as_posix()}")
    return out


@dataclass
class Prelaunch:
    """A local driver JVM started by :func:`prelaunch` before its session is built: the
    master and settings it was started with, and the JVM (None: pyspark launches one)."""

    master: str
    settings: dict[str, str]
    launch: Launch | None

    def close(self) -> None:
        """Stop the JVM unless a session took it over; idempotent."""
        if self.launch is not None:
            self.launch.kill()
            self.launch = None


def _local_settings(
    master: str, conf: dict[str, str] | None, input_rows: int | None, new_jvm: bool
) -> dict[str, str]:
    """The settings of a local or cluster session (not Connect), with the class-data-
    sharing options when this process starts the driver JVM (``new_jvm``)."""
    settings = jvm_defaults(input_rows)
    settings.update(shuffle_settings(master))
    settings.update(conf or {})
    if new_jvm:
        driver = "spark.driver.extraJavaOptions"
        extra = cds_options(
            settings.get(driver, ""), settings.get("spark.driver.extraClassPath", "")
        )
        if extra:
            settings[driver] = f"{settings.get(driver, '')} {extra}".strip()
    return settings


def _jvm_conf(master: str, app_name: str, settings: dict[str, str]) -> dict[str, str]:
    """What the driver JVM is started with: the settings, master and name, sorted."""
    return dict(sorted({"spark.master": master, "spark.app.name": app_name, **settings}.items()))


def prelaunch(
    master: str | None = None,
    remote: str | None = None,
    conf: dict[str, str] | None = None,
    quiet: bool = True,
    input_rows: int | None = None,
    app_name: str = "merklog",
) -> Prelaunch | None:
    """Start the driver JVM that :func:`build_session` with the same arguments would start,
    now, and return without waiting for it (ADR 0158): a command starts the JVM first and
    imports and reads its inputs while the JVM boots. Pass the result to
    :func:`build_session` as ``prelaunched`` (and :meth:`Prelaunch.close` it if the
    session is never built). None for a Connect ``remote`` or when this process already
    has a JVM."""
    if remote:
        return None
    if "pyspark" in sys.modules:
        from pyspark import SparkContext

        if SparkContext._gateway is not None:
            return None
    _prepare_env()
    master = master or os.environ.get("MERKLOG_SPARK_MASTER") or "local[*]"
    settings = _local_settings(master, conf, input_rows, new_jvm=True)
    with _jvm_output(quiet):
        launch = launch_driver(_jvm_conf(master, app_name, settings))
    return Prelaunch(master, settings, launch)


#: Spark Connect's default port (``sc://HOST`` without one).
CONNECT_PORT = 15002

#: Seconds a TCP connection to a Spark Connect server may take to open.
CONNECT_TIMEOUT = 10.0


class ConnectUnreachable(Failure):
    """The Spark Connect server of ``--remote``, or the standalone master of ``--master
    spark://…``, could not be reached (refused, timeout, DNS): exit 4, worth retrying,
    like a peer that cannot be reached."""

    exit_code = ExitCode.PEER_UNREACHABLE


def check_master_reachable(master: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Open (and close) a TCP connection to a standalone master of ``spark://HOST:PORT``
    (``spark://H1:P1,H2:P2`` for standby masters: any one answering will do), or raise
    :class:`ConnectUnreachable`. Spark's driver retried one that is not there for about
    a minute, then failed with a Java stack trace, exit 70 (QA). Other masters
    (``local[N]``, ``yarn``, …) are left to Spark."""
    import socket

    if not master.startswith("spark://"):
        return
    reasons = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            return  # Spark says what is wrong with it
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
            return
        except OSError as exc:
            reasons.append(
                "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
            )
    raise ConnectUnreachable(
        f"the Spark master {master} could not be reached ({'; '.join(reasons)})"
    )


def check_reachable(remote: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Open (and close) a TCP connection to the server of the ``sc://HOST:PORT`` URL
    ``remote``, or raise :class:`ConnectUnreachable`. pyspark's client retries a server
    that is not there for over ten minutes, silent, with Ctrl-C and SIGTERM unheard; a
    URL pyspark would refuse anyway is left to it."""
    import socket
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(remote)
        host, port = parts.hostname, parts.port or CONNECT_PORT
    except ValueError:
        return
    if parts.scheme != "sc" or not host:
        return
    params = {p.split("=", 1)[0].lower() for p in parts.path.split(";")[1:]}
    plain = not params & {"use_ssl", "token"}  # a token turns TLS on in pyspark's client
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            why = _not_http2(conn, timeout) if plain else None
            if why is not None:
                raise ConnectUnreachable(
                    f"the Spark Connect server {remote} accepts connections but does not "
                    f"answer as one ({why})"
                )
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ConnectUnreachable(
            f"the Spark Connect server {remote} could not be reached ({reason})"
        ) from None


#: The HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113 §3.4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _not_http2(conn: Any, timeout: float) -> str | None:
    """Why the server on ``conn`` (a socket with a timeout) is no Spark Connect server,
    or None when it answers the HTTP/2 preface with its SETTINGS frame, as every gRPC
    server does at once. A listener that accepts and stays silent (a wedged server, the
    wrong port) made pyspark's client wait without end; it is one error line now, which
    says whether it stayed silent or answered something else (QA: a server that hung up
    at once was said to be silent for 10 s)."""
    try:
        conn.sendall(_H2_PREFACE)
        header = b""
        while len(header) < 9:
            chunk = conn.recv(9 - len(header))
            if not chunk:
                return "it closed the connection without an HTTP/2 answer"
            header += chunk
    except TimeoutError:
        return f"no HTTP/2 settings within {timeout:g} s"
    except OSError as exc:  # reset
        return f"it ended the connection ({exc.strerror or exc}) without an HTTP/2 answer"
    if header[3] != 4:  # the frame type: SETTINGS
        return "it answered, but not with HTTP/2 settings"
    return None


def build_session(
    master: str | None = None,
    remote: str | None = None,
    app_name: str = "merklog",
    conf: dict[str, str] | None = None,
    ship_code: bool | None = None,
    quiet: bool = True,
    input_rows: int | None = None,
    prelaunched: Prelaunch | None = None,
) -> Any:
    """Create (or reuse) a SparkSession for ``master`` or a Spark Connect ``remote``.

    A process uses one kind: pyspark refuses a Connect session next to a classic one.

    ``ship_code`` (default: on for anything but ``local[...]``) ships the merklog
    package to executors so Python UDFs can import it on a real cluster.
    ``quiet`` keeps the JVM's own output off the terminal (see :func:`spark_log_path`).
    ``input_rows`` (the job's input op rows, when known) picks the JVM flags
    (:func:`jvm_defaults`); it only matters when this call starts the JVM.
    ``prelaunched``: the :func:`prelaunch` of the same arguments, whose JVM this session
    connects to instead of starting one.
    """
    _prepare_env()
    from pyspark.sql import SparkSession

    if master and remote:
        raise ValueError("give either master (spark://…, local[*]) or remote (sc://…), not both")
    if remote:
        check_reachable(remote)
        builder = SparkSession.builder.remote(remote).appName(app_name)
        spark = builder.getOrCreate()
        if ship_code is not False:
            spark.addArtifacts(str(package_zip()), pyfile=True)
        return spark
    if prelaunched is not None:
        master, settings = prelaunched.master, prelaunched.settings
    else:
        master = master or os.environ.get("MERKLOG_SPARK_MASTER") or "local[*]"
        # class-data sharing when this call starts the JVM
        new_jvm = SparkSession.getActiveSession() is None
        if new_jvm:
            check_master_reachable(master)
        settings = _local_settings(master, conf, input_rows, new_jvm)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    jvm_conf = _jvm_conf(master, app_name, settings)
    _quiet_accumulator_server()
    with _jvm_output(quiet):
        spark = _get_or_create(builder, jvm_conf, prelaunched)
    if ship_code is None:
        ship_code = not master.startswith("local")
    if ship_code:
        spark.sparkContext.addPyFile(str(package_zip()))
    return spark


def _quiet_accumulator_server() -> None:
    """Log at debug level, not print, what pyspark's accumulator server meets when the
    JVM drops its connection (Ctrl-C during a job with a Python UDF, QA): socketserver
    printed a dashed line and an EOFError traceback in front of the command's one line."""
    from pyspark import accumulators

    def handle_error(self: Any, request: Any, client_address: Any) -> None:
        logging.getLogger(__name__).debug(
            "the accumulator connection from %s ended", client_address, exc_info=True
        )

    for name in ("AccumulatorTCPServer", "AccumulatorUnixServer"):
        server = getattr(accumulators, name, None)
        if server is not None:
            server.handle_error = handle_error


def _get_or_create(builder: Any, conf: dict[str, str], prelaunched: Prelaunch | None) -> Any:
    """``builder.getOrCreate()``; when that starts the JVM of a local master, the JVM is
    started directly from merklog's cache of the launcher's command (:mod:`.launch`,
    ADR 0130), or was by :func:`prelaunch` (ADR 0158), else by pyspark's own scripts."""
    from pyspark import SparkContext

    proc = None
    if prelaunched is not None and prelaunched.launch is not None:
        launch = prelaunched.launch
        proc = launch.connect() if SparkContext._gateway is None else launch.kill()
        # Taken over only now: a Ctrl-C while connect() waits for the gateway left the
        # JVM to the caller's Prelaunch.close(), which then stops it (it was cleared
        # before, and the JVM lived on, orphaned, ~250 MB each time).
        prelaunched.launch = None
    elif prelaunched is None and SparkContext._gateway is None:
        proc = start_driver(conf)
    try:
        spark = builder.getOrCreate()
    except BaseException:
        if proc is not None:
            proc.kill()
        raise
    finally:
        if proc is not None:
            forget_gateway()
    if proc is not None:
        spark.sparkContext._gateway.proc = proc  # as pyspark's launcher leaves it
    return spark


#: Seconds an abandoned driver JVM gets to run its shutdown hooks before it is killed.
TERM_WAIT = 3.0


def stop_driver(spark: Any, timeout: float = 10.0) -> None:
    """End this process's driver JVM now and wait for it to exit. A command that failed or
    was interrupted part way calls it before it cleans up what its jobs were writing: the
    JVM ignores Ctrl-C (ADR 0158) and outlived the command by seconds, its abandoned
    tasks re-creating ``_temporary`` folders after the cleanup. Nothing for a Spark
    Connect session (the server's own) or one without a JVM process of this one."""
    if spark is None or is_connect(spark):
        return
    gateway = getattr(getattr(spark, "sparkContext", None), "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return
    from merklog.node.interrupts import mark_driver_ended

    mark_driver_ended()  # py4j's complaints about the closed gateway are expected now
    if proc.poll() is None:
        # SIGTERM first: the JVM's shutdown hooks remove its spark-<uuid> folders, which a
        # SIGKILL left behind in the local dir (/tmp) after every interrupted command (QA).
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):  # busy past the grace time: killed below
            proc.wait(TERM_WAIT)
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout)
    except Exception:  # a JVM that will not die within the timeout is the kernel's now
        logging.getLogger(__name__).debug("the driver JVM did not exit within %s s", timeout)


def is_connect(spark: Any) -> bool:
    """True when ``spark`` is a Spark Connect client session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
