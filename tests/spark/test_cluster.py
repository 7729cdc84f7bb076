"""A real standalone cluster started from the pyspark wheel (``bin/spark-class`` Master and
Worker, REST port off, every port on 127.0.0.1): ``merklog compact`` and ``merklog analyze``
run against it as subprocesses, with relative paths, and agree with the local session;
the snapshot is byte-for-byte the one a local run signs with the same key."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from merklog.engine.program import Program
from merklog.node.spark.compact import compact
from merklog.node.spark.export import export
from merklog.node.spark.gen import Simulation
from merklog.node.spark.schema import decode_args
from merklog.node.spark.session import LIGHT_JVM
from merklog.replication.identity import Identity

pytestmark = pytest.mark.spark

#: What the JVM prints on its own when nobody redirects it; none may reach the terminal.
JVM_NOISE = ("WARNING: Using incubator modules", "log4j", "NativeCodeLoader", "WARN ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not start")
        time.sleep(0.5)


def _alive_workers(ui_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=10) as resp:
        state = json.load(resp)
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


@pytest.fixture(scope="module")
def master_url(tmp_path_factory):
    import pyspark

    home = Path(pyspark.__file__).parent
    spark_class = home / "bin" / "spark-class"
    assert spark_class.exists(), "the pyspark wheel ships bin/spark-class"
    logs = tmp_path_factory.mktemp("cluster")
    port, ui, worker_port, worker_ui = (_free_port() for _ in range(4))
    light = LIGHT_JVM
    env = dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(logs),
        SPARK_WORKER_DIR=str(logs / "work"),
        SPARK_MASTER_OPTS=f"-Dspark.master.rest.enabled=false {light}",
        SPARK_WORKER_OPTS=light,
        SPARK_DAEMON_MEMORY="256m",
        PYSPARK_PYTHON=sys.executable,
    )
    master_cmd = [
        "bash",
        str(spark_class),
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--webui-port",
        str(ui),
    ]
    worker_cmd = [
        "bash",
        str(spark_class),
        "org.apache.spark.deploy.worker.Worker",
        f"spark://127.0.0.1:{port}",
        "--host",
        "127.0.0.1",
        "--port",
        str(worker_port),
        "--webui-port",
        str(worker_ui),
        "--cores",
        "2",
        "--memory",
        "1g",
    ]
    procs: list[subprocess.Popen] = []
    files = []
    try:
        for name, cmd in (("master", master_cmd), ("worker", worker_cmd)):
            log = logs / f"{name}.log"
            fh = open(log, "wb")  # noqa: SIM115 - closed in teardown
            files.append(fh)
            proc = subprocess.Popen(
                cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
            procs.append(proc)
            _wait_port(port if name == "master" else worker_port, proc, log, name)
        deadline = time.monotonic() + 120
        while _alive_workers(ui) < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the worker did not register with the master")
            time.sleep(0.5)
        assert "REST server" not in (logs / "master.log").read_text()  # port 6066 stays shut
        yield f"spark://127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, 15)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        for fh in files:
            fh.close()


def _merklog(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_compact_and_analyze_on_a_standalone_cluster(spark, master_url, tmp_path):
    sim = Simulation(peers=2, pool=40, seed=6).run(150)
    for i in range(2):
        export(sim.log_rows(i), [], tmp_path / f"p{i}")
    home = tmp_path / "home"
    _merklog("--home", str(home), "init", cwd=tmp_path)
    cluster = ["--master", master_url, "--conf", "spark.executor.memory=512m"]

    done = _merklog(
        "--home", str(home), "compact", "p0", "p1", "--out", "snap", *cluster, cwd=tmp_path
    )
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert not [n for n in JVM_NOISE if n in done.stderr], done.stderr[-3000:]
    sim.sync_all()
    assert info["facts"] == len(sim.visible(0))
    # the same inputs and key on the local session give the very same signed snapshot
    key = Identity.load(home / "identity.pem")
    [local] = compact(spark, [tmp_path / "p0", tmp_path / "p1"], tmp_path / "local", key)
    assert info["manifest"] == str(local.manifest_cid)
    assert Path(info["directory"]).parent == tmp_path / "snap"

    (tmp_path / "p.dl").write_text("""
        path(X, Y) :- edge(X, Y).
        path(X, Z) :- path(X, Y), edge(Y, Z).
        cid_of(C, X, Y) :- C := edge(X, Y).
    """)
    done = _merklog(
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
        *cluster,
        cwd=tmp_path,
    )
    assert not [n for n in JVM_NOISE if n in done.stderr], done.stderr[-3000:]
    # the engine's evaluation of the merged visible facts (the parity tests compare
    # analyze with it on every value type; here the cluster or server is the point)
    base: dict[str, set] = {}
    for fact in sim.visible(0):
        base.setdefault(fact.rel, set()).add(fact.args)
    want = Program.parse((tmp_path / "p.dl").read_text()).evaluate(base)
    for rel in ("path", "cid_of"):
        table = pq.read_table(tmp_path / "out" / rel).to_pylist()
        assert {decode_args(r["args"]) for r in table} == set(want[rel]) != set()
