"""A real Spark Connect server (pyspark's bundled start-connect-server.sh, 127.0.0.1 only):
compact and analyze run remotely, and UDFs import merklog from the shipped artifact zip."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from merklog.engine.program import Program
from merklog.node.spark.bootstrap import load_snapshot
from merklog.node.spark.export import export
from merklog.node.spark.gen import Simulation
from merklog.node.spark.schema import decode_args
from merklog.node.spark.session import LIGHT_JVM

pytestmark = pytest.mark.spark


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    import pyspark

    home = Path(pyspark.__file__).parent
    script = home / "sbin" / "start-connect-server.sh"
    assert script.exists(), "pyspark wheel ships sbin/start-connect-server.sh"
    logs = tmp_path_factory.mktemp("connect")
    port = _free_port()
    env = dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(logs),
        SPARK_PID_DIR=str(logs),
        PYSPARK_PYTHON=sys.executable,
    )
    log = open(logs / "server.log", "wb")  # noqa: SIM115 - closed in teardown
    proc = subprocess.Popen(
        [
            "bash",
            str(script),
            "--wait",
            "--master",
            "local[1]",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            f"spark.driver.extraJavaOptions={LIGHT_JVM}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError((logs / "server.log").read_text()[-3000:])
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("Spark Connect server did not start")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)
        log.close()


def _merklog(*args: str, cwd: Path | None = None) -> str:
    """Run the real CLI in its own process (one process holds one kind of Spark session)."""
    proc = subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_compact_and_analyze_over_spark_connect(connect_url, tmp_path):
    sim = Simulation(peers=2, pool=40, seed=4).run(120)
    dirs = []
    for i in range(2):
        export(sim.log_rows(i), [], tmp_path / f"p{i}")
        dirs.append(str(tmp_path / f"p{i}"))
    home = tmp_path / "home"
    _merklog("--home", str(home), "init")

    # relative paths mean the user's working directory, not the Connect server's
    out = _merklog(
        "--home",
        str(home),
        "compact",
        "p0",
        "p1",
        "--out",
        "snap",
        "--remote",
        connect_url,
        cwd=tmp_path,
    )
    info = json.loads(out.strip().splitlines()[-1])
    assert Path(info["directory"]).parent == tmp_path / "snap"
    sim.sync_all()
    assert info["facts"] == len(sim.visible(0))
    snap = load_snapshot(info["directory"])
    assert {(f.rel, f.args) for _c, f, _s in snap.facts()} == {
        (f.rel, f.args) for f in sim.visible(0)
    }

    program = tmp_path / "p.dl"
    program.write_text("""
        path(X, Y) :- edge(X, Y).
        path(X, Z) :- path(X, Y), edge(Y, Z).
        cid_of(C, X, Y) :- C := edge(X, Y).
    """)
    listed = _merklog(
        "--home",
        str(home),
        "analyze",
        "p.dl",
        "--input",
        "p0",
        "--input",
        "p1",
        "--out",
        "out",
        "--remote",
        connect_url,
        cwd=tmp_path,
    )
    assert f"path\t{tmp_path / 'out' / 'path'}" in listed.splitlines()
    # the engine's evaluation of the merged visible facts (the parity tests compare
    # analyze with it on every value type; here the cluster or server is the point)
    base: dict[str, set] = {}
    for fact in sim.visible(0):
        base.setdefault(fact.rel, set()).add(fact.args)
    want = Program.parse(program.read_text()).evaluate(base)
    for rel in ("path", "cid_of"):
        table = pq.read_table(tmp_path / "out" / rel).to_pylist()
        assert {decode_args(r["args"]) for r in table} == set(want[rel]) != set()

    probe = f"""
from merklog.node.spark.session import build_session, is_connect
from pyspark.sql import functions as F
s = build_session(remote={connect_url!r})
assert is_connect(s)
def where_from(_x):
    import merklog.store
    return merklog.store.__file__
print(s.range(1).select(F.udf(where_from, "string")("id")).collect()[0][0])
s.stop()
"""
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "merklog.zip" in proc.stdout  # executors import the shipped package, not the driver's
