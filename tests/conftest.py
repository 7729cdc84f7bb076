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
