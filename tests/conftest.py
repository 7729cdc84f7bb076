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
    """Under ``-n`` (pytest-xdist), keep every Spark test on one worker.

    The Spark session is session-scoped; grouping its tests means one worker starts one
    JVM instead of each worker starting its own on a 2-core machine.
    """
    import pytest

    for item in items:
        if "tests/spark/" in item.nodeid or item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.xdist_group("spark"))
