"""Which JVM flags a session asks for (ADR 0085): the light flags on the driver for an
input known to be small, the JVM's defaults otherwise; ``MERKLOG_SPARK_LIGHT_JVM=1`` puts
them on every JVM, ``=0`` on none. The CLI sizes the input from the Parquet footers."""

from __future__ import annotations

import pytest

from merklog.node.commands.spark_cmds import _input_rows
from merklog.node.spark.export import write_ops
from merklog.node.spark.session import (
    INTERPRET_MAX_ROWS,
    INTERPRETED,
    LIGHT_JVM,
    LIGHT_MAX_ROWS,
    LOCAL_DEFAULTS,
    jvm_defaults,
    package_zip,
)

DRIVER = "spark.driver.extraJavaOptions"
EXECUTOR = "spark.executor.extraJavaOptions"


@pytest.fixture
def auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MERKLOG_SPARK_LIGHT_JVM", raising=False)


def test_small_input_gets_the_light_driver(auto) -> None:
    settings = jvm_defaults(LIGHT_MAX_ROWS - 1)
    assert settings[DRIVER] == LIGHT_JVM
    assert EXECUTOR not in settings  # a cluster's long-lived executors keep C2 and G1
    assert {k: v for k, v in settings.items() if k != DRIVER} == LOCAL_DEFAULTS
    assert jvm_defaults(INTERPRET_MAX_ROWS)[DRIVER] == LIGHT_JVM


@pytest.mark.parametrize("rows", [LIGHT_MAX_ROWS, 5 * LIGHT_MAX_ROWS, None])
def test_large_or_unknown_input_gets_the_jvm_defaults(auto, rows) -> None:
    assert jvm_defaults(rows) == LOCAL_DEFAULTS


@pytest.mark.parametrize("rows", [0, LIGHT_MAX_ROWS, None])
def test_light_everywhere_when_asked(monkeypatch: pytest.MonkeyPatch, rows) -> None:
    monkeypatch.setenv("MERKLOG_SPARK_LIGHT_JVM", "1")
    settings = jvm_defaults(rows)
    assert settings[DRIVER] == settings[EXECUTOR] == LIGHT_JVM


def test_jvm_defaults_when_light_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERKLOG_SPARK_LIGHT_JVM", "0")
    assert jvm_defaults(10) == {**LOCAL_DEFAULTS, **INTERPRETED}
    assert jvm_defaults(INTERPRET_MAX_ROWS + 1) == LOCAL_DEFAULTS


@pytest.mark.parametrize("rows", [0, 10, INTERPRET_MAX_ROWS])
def test_a_small_input_is_interpreted_not_compiled(auto, rows) -> None:
    """ADR 0188: up to INTERPRET_MAX_ROWS op rows, Spark generates no code (compiling
    it cost a small analyze more than interpreting its rows); above, its defaults."""
    settings = jvm_defaults(rows)
    assert settings["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
    assert settings["spark.sql.codegen.wholeStage"] == "false"
    for larger in (INTERPRET_MAX_ROWS + 1, None):
        assert not set(INTERPRETED) & set(jvm_defaults(larger))


def test_light_flags_pin_c1_serial_gc_and_a_full_code_cache() -> None:
    flags = LIGHT_JVM.split()
    assert "-XX:TieredStopAtLevel=1" in flags
    assert "-XX:+UseSerialGC" in flags
    assert "-XX:ReservedCodeCacheSize=240m" in flags


def _rows(n: int) -> list[dict]:
    return [
        {"dataset": "ds", "delta_cid": bytes([i % 256]) * 36, "clock": i, "op": "none"}
        for i in range(n)
    ]


def test_cli_sizes_inputs_from_parquet_footers(tmp_path) -> None:
    write_ops(_rows(7), tmp_path / "a", file_rows=3, batch_rows=3)  # several files
    write_ops(_rows(5), tmp_path / "b")
    assert _input_rows([str(tmp_path / "a"), str(tmp_path / "b")], "INPUTS") == 12
    assert _input_rows([str(tmp_path / "a" / "ops")], "INPUTS") == 7


def test_cli_size_is_unknown_for_urls_and_inputs_that_are_no_export_are_refused(tmp_path) -> None:
    """An input that is not a merklog export (junk named .parquet, an empty folder, a
    snapshot's Parquet given by mistake) made Spark fail with an internal error and a
    Java stack trace, or (analyze) run on nothing: it is a usage error naming it."""
    import click
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_ops(_rows(3), tmp_path / "a")
    assert _input_rows([str(tmp_path / "a"), "hdfs://nn/exports/b"], "INPUTS") is None
    bad = tmp_path / "bad" / "ops"
    bad.mkdir(parents=True)
    (bad / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(click.BadParameter, match="is not a Parquet file of a merklog export"):
        _input_rows([str(tmp_path / "bad")], "INPUTS")
    (tmp_path / "empty").mkdir()
    with pytest.raises(click.BadParameter, match="holds no Parquet files"):
        _input_rows([str(tmp_path / "empty")], "--input")
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"relation": ["x"], "fact_cid": [b"1"]}), other / "f.parquet")
    with pytest.raises(click.BadParameter, match="not a merklog export's op file"):
        _input_rows([str(other)], "--input")


def test_a_local_master_shuffles_without_compression_or_checksums(spark, monkeypatch) -> None:
    """ADR 0137: a local session's shuffle blocks are neither compressed nor checksummed; a
    cluster or a Connect server keeps Spark's defaults."""
    from merklog.node.spark.session import LOCAL_SHUFFLE, shuffle_settings

    conf = spark.sparkContext.getConf()
    assert {k: conf.get(k) for k in LOCAL_SHUFFLE} == LOCAL_SHUFFLE
    assert LOCAL_SHUFFLE == {
        "spark.shuffle.compress": "false",
        "spark.shuffle.checksum.enabled": "false",
    }
    monkeypatch.delenv("MERKLOG_SPARK_MASTER", raising=False)
    assert shuffle_settings(None) == shuffle_settings("local[2]") == LOCAL_SHUFFLE
    assert shuffle_settings("spark://127.0.0.1:7077") == {}
    assert shuffle_settings(None, "sc://127.0.0.1:15002") == {}
    monkeypatch.setenv("MERKLOG_SPARK_MASTER", "spark://127.0.0.1:7077")
    assert shuffle_settings(None) == {}


def test_the_shipped_package_zip_is_removed_when_its_process_exits(tmp_path) -> None:
    """The zip shipped to a cluster's executors (a real process builds it): it holds
    the four subpackages as ``merklog/<sub>/…`` while the process lives, and its
    directory is gone once the process has exited."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    script = (
        "import sys, zipfile\n"
        "from merklog.node.spark.session import package_zip\n"
        "path = package_zip()\n"
        "names = zipfile.ZipFile(path).namelist()\n"
        "print(path)\n"
        "print(sorted({n.split('/')[1] for n in names if n.count('/') > 1}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    path, subs = done.stdout.splitlines()
    assert subs == str(["engine", "node", "replication", "store"])
    assert Path(path).name == "merklog.zip"
    assert not Path(path).parent.exists()
    kept = package_zip(tmp_path / "given")  # a directory the caller gave stays
    assert kept.parent == tmp_path / "given" and zipfile.ZipFile(kept).testzip() is None


def test_pyspark_records_no_call_sites_in_a_merklog_session(spark, monkeypatch) -> None:
    """PySpark's DataFrame debugging sends the Python call site of every DataFrame and
    Column call to the JVM (four more gateway round trips each, ~25% of a small
    analyze's time), for error contexts merklog never shows: it is off."""
    import pyspark.errors.utils as perrors

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    monkeypatch.setattr(perrors, "_enable_debugging_cache", None)  # read from the session
    assert perrors.is_debugging_enabled() is False
