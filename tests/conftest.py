"""Shared pytest configuration: long mode and hypothesis profiles."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG = os.environ.get("MERKLOG_LONG") == "1"

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
settings.register_profile(
    "long", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=1000
)
settings.load_profile("long" if LONG else "ci")


def pytest_collection_modifyitems(config, items):
    """Under ``-n`` (pytest-xdist), keep every test of the shared Spark session on one
    worker (ADR 0182).

    The session fixture is session-scoped: grouping the tests that use it means one
    worker starts that JVM instead of each worker starting its own on a 2-core machine.
    Spark tests that start their own processes (launch, CDS, cluster commands) or need
    no JVM at all run on either worker.
    """
    import pytest

    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
