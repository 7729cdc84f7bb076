"""Which JVM flags a session asks for (ADR 0085): light on the driver by default, every JVM
with ``MERKLOG_SPARK_LIGHT_JVM=1``, none with ``=0``; the rest of the defaults unchanged."""

from __future__ import annotations

import pytest

from merklog.node.spark.session import LIGHT_JVM, LOCAL_DEFAULTS, jvm_defaults

DRIVER = "spark.driver.extraJavaOptions"
EXECUTOR = "spark.executor.extraJavaOptions"


def test_light_flags_on_the_driver_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MERKLOG_SPARK_LIGHT_JVM", raising=False)
    settings = jvm_defaults()
    assert settings[DRIVER] == LIGHT_JVM
    assert EXECUTOR not in settings  # a cluster's long-lived executors keep C2 and G1
    assert {k: v for k, v in settings.items() if k != DRIVER} == LOCAL_DEFAULTS


def test_light_flags_everywhere_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERKLOG_SPARK_LIGHT_JVM", "1")
    settings = jvm_defaults()
    assert settings[DRIVER] == settings[EXECUTOR] == LIGHT_JVM


def test_jvm_defaults_when_light_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERKLOG_SPARK_LIGHT_JVM", "0")
    assert jvm_defaults() == LOCAL_DEFAULTS


def test_light_flags_pin_c1_serial_gc_and_a_full_code_cache() -> None:
    flags = LIGHT_JVM.split()
    assert "-XX:TieredStopAtLevel=1" in flags
    assert "-XX:+UseSerialGC" in flags
    assert "-XX:ReservedCodeCacheSize=240m" in flags
