"""A Spark Connect server for the benches: pyspark's own ``start-connect-server.sh`` on a
free loopback port, ``local[2]``, the JVM's default flags (a long-lived server: C2 and
G1 pay off there), its UI off. ``with connect_server() as url:`` yields ``sc://…`` and
kills the server's process group at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def connect_server(master: str = "local[2]", timeout: float = 180) -> Iterator[str]:
    import pyspark

    home = Path(pyspark.__file__).parent
    logs = Path(tempfile.mkdtemp(prefix="merklog-bench-connect-"))
    port = _free_port()
    env = dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(logs),
        SPARK_PID_DIR=str(logs),
        PYSPARK_PYTHON=sys.executable,
    )
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
    }
    args = [f"--conf={key}={value}" for key, value in conf.items()]
    with open(logs / "server.log", "wb") as log:
        proc = subprocess.Popen(
            ["bash", str(home / "sbin" / "start-connect-server.sh"), "--wait", "--master", master]
            + args,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError((logs / "server.log").read_text()[-3000:])
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the Spark Connect server did not start")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        shutil.rmtree(logs, ignore_errors=True)
