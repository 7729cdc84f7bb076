"""Shared pytest configuration: long mode, hypothesis profiles, the Spark JVMs' cache."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from hypothesis import HealthCheck, settings

LONG = os.environ.get("MERKLOG_LONG") == "1"

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
settings.register_profile(
    "long", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=1000
)
settings.load_profile("long" if LONG else "ci")

#: The test run's own merklog cache (``MERKLOG_CACHE_DIR``), in this checkout and not the
#: user's ``~/.cache/merklog``: Spark's launch commands and the class-data-sharing archive
#: that every Spark driver JVM of the tests maps (node/spark/cds.py). Without the archive a
#: JVM starts in ~15 s of CPU on a 2-core machine, with it in ~7 s, and the suite starts
#: dozens of them (ADR 0184).
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "tests"
os.environ.setdefault("MERKLOG_CACHE_DIR", str(CACHE))

#: Dumps the archive (run in the background as a run starts).
WARM_UP = Path(__file__).resolve().parent / "spark" / "cds_warm_up.py"
_warm_up: subprocess.Popen | None = None


def pytest_sessionstart(session):
    """In the controlling process, start the class-data-sharing dump in the background
    unless the cache holds the archive already (ADR 0184).

    It runs before the workers' first Spark JVM asks for the archive, so it is the one
    that dumps (the others start without sharing meanwhile and dump nothing); the archive
    is mapped from the first JVM that starts once it has settled (about three minutes
    into a clean clone's run: the dump, then cds.SETTLE_SECONDS).
    """
    global _warm_up
    if hasattr(session.config, "workerinput"):
        return
    try:
        from merklog.node.spark import cds
        from merklog.node.spark.session import LIGHT_JVM, jvm_defaults
    except ImportError:
        return
    os.environ.setdefault("MERKLOG_SPARK_LIGHT_JVM", "1")  # as tests/spark/conftest.py
    options = jvm_defaults().get("spark.driver.extraJavaOptions", LIGHT_JVM)
    key = cds.archive_key(options)
    if not cds.enabled() or key is None or (cds.cache_dir() / f"{key}.jsa").exists():
        return  # off, no java, or there already
    _warm_up = subprocess.Popen(
        [sys.executable, str(WARM_UP)],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # reaped as soon as it exits: until then its pid is taken, and cds.py promotes no part
    # file of a process that may still be running
    threading.Thread(target=_warm_up.wait, name="cds-warm-up", daemon=True).start()


def pytest_sessionfinish(session):
    """Reap the warm-up process (it is long done by the end of a run)."""
    if _warm_up is not None and _warm_up.poll() is None:
        _warm_up.wait(120)
