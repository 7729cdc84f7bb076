"""deploy/ cannot run here (no Docker engine): check what can be checked statically."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def test_compose_file_is_consistent():
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = doc["services"]
    assert {"peer-a", "peer-b", "peer-c", "ipfs", "spark-master", "spark-worker"} <= set(services)
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"
        for vol in svc.get("volumes", []):
            source = vol.split(":", 1)[0]
            assert source in doc["volumes"], f"{name} mounts undeclared volume {source}"
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    build = services["peer-a"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert "spark://spark-master:7077" in " ".join(services["spark-job"]["command"])


def test_dockerfile_copies_existing_paths_and_runs_the_cli():
    text = (DEPLOY / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY source {src} missing"
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "merklog"]' in text
    assert re.search(r"^USER \d+:\d+$", text, re.M)


def test_spark_containers_run_the_drivers_image_and_exports_are_writable():
    """The worker was the stock apache/spark image: Python 3.10, Spark 4.0.1, no
    pyarrow or libipld, and no interpreter at the driver's PYSPARK_PYTHON path. Master,
    worker and job now run the merklog image, whose pyspark is pinned to the version the
    Spark tests run; and /exports, the volume the peers' `parquet export` writes as uid
    10001, exists in the image owned by that user (a new volume was root's, 0755)."""
    from importlib.metadata import version

    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    image = services["peer-a"]["image"]
    for name in ("spark-master", "spark-worker", "spark-job"):
        assert services[name]["image"] == image, name
    for name, role in (("spark-master", ".master.Master"), ("spark-worker", ".worker.Worker")):
        argv = [*services[name]["entrypoint"], *services[name]["command"]]
        assert argv[:3] == ["/usr/bin/tini", "--", "spark-class"], argv
        assert argv[3].endswith(role), argv
    work = services["spark-worker"]["environment"]["SPARK_WORKER_DIR"]
    assert work.startswith("/tmp/"), work  # writable by uid 10001
    assert "exports:/exports" in services["spark-worker"]["volumes"]

    text = (DEPLOY / "Dockerfile").read_text()
    pins = re.findall(r'"pyspark==([0-9.]+)"', text)
    assert pins == [version("pyspark")], f"pin pyspark in deploy/Dockerfile to {version('pyspark')}"
    joined = text.replace("\\\n", " ")  # continuation lines as one
    run = " ".join(re.findall(r"^RUN (.+)$", joined, re.M))
    assert re.search(r"mkdir -p [^&]*/exports", run), run
    assert re.search(r"chown 10001:10001 [^&]*/exports", run), run
    assert re.search(r"chmod 0700 [^&]*/exports", run), run
    user = re.search(r"^USER (\d+):", text, re.M).group(1)
    assert user == "10001"


def test_systemd_unit_sections():
    text = (DEPLOY / "merklog.service").read_text()
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read_string(text)
    assert unit["Service"]["ExecStart"].endswith("merklog node run")
    assert unit["Service"]["User"] == "merklog"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    # The home holds the node key and tokens: systemd must not open it up (its default
    # StateDirectoryMode is 0755).
    assert unit["Service"]["StateDirectoryMode"] == "0700"
    # Documentation= names a file the install steps in the header put there (pip
    # installs no docs: file:///opt/merklog/docs/spark.md pointed at nothing).
    for uri in unit["Unit"]["Documentation"].split():
        assert uri.startswith("file:///opt/merklog/docs/"), uri
        assert (ROOT / "docs" / uri.removeprefix("file:///opt/merklog/docs/")).is_file(), uri
        assert "cp -r /path/to/merklog/docs /opt/merklog/docs" in text


def test_the_documented_json_logging_runs_and_misplaced_options_say_where_they_go(tmp_path):
    """deploy/README advised `--log-format json` in ExecStart, and `merklog node run
    --log-format json` failed with "No such option" (exit 2) forever under
    Restart=on-failure. What it shows now parses, a misplaced option of merklog itself
    says where it goes, and the unit does not restart on exit 2."""
    import os
    import subprocess
    import sys

    readme = (DEPLOY / "README.md").read_text()
    (line,) = re.findall(r"^ExecStart=/opt/merklog/bin/merklog (.+)$", readme, re.M)
    args = line.split()
    assert "--log-format" in args and args.index("--log-format") < args.index("node")

    def merklog(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(tmp_path), *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )

    assert merklog(*args, "--help").returncode == 0
    for misplaced in (["node", "run", "--log-format", "json"], ["node", "run", "-v"]):
        done = merklog(*misplaced)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        option = misplaced[2]
        assert f"`merklog {option} … node run`" in done.stderr, done.stderr
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read_string((DEPLOY / "merklog.service").read_text())
    # QA: a damaged store (exit 5) was restarted every 3 s forever, and systemd killed a
    # node after 30 s that the docs let wait five minutes for writes in flight.
    assert unit["Service"]["RestartPreventExitStatus"].split() == ["2", "5"]
    assert int(unit["Service"]["TimeoutStopSec"]) > 300
