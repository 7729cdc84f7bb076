"""One session-scoped PySpark local[2] session for every Spark test (JVM start is ~5 s)."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# short jobs: the fast-starting JVM (C1 only, serial GC); real jobs use the JVM defaults
os.environ.setdefault("MERKLOG_SPARK_LIGHT_JVM", "1")


@pytest.fixture(scope="session")
def spark():
    from merklog.node.spark.session import build_session

    # Every test's input is small: the session is the one a command builds for a small
    # input (interpreted expressions, ADR 0188); bench/ runs the compiled path at scale.
    session = build_session(
        master="local[2]",
        app_name="merklog-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        input_rows=1000,
    )
    yield session
    session.stop()
