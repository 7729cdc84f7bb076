"""The driver JVM's class-data-sharing archive (ADR 0114): dumped once into merklog's cache,
mapped afterwards, keyed by JVM, pyspark and options, quiet, and harmless when damaged."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from merklog.node.spark import cds

OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MERKLOG_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MERKLOG_SPARK_CDS", raising=False)
    return tmp_path / "spark-cds"


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


def _flag(options: str, name: str) -> str | None:
    for item in options.split():
        if item.startswith(f"-XX:{name}="):
            return item.split("=", 1)[1]
    return None


def test_first_run_dumps_others_wait_then_the_archive_is_mapped(cache: Path, monkeypatch) -> None:
    first = cds.cds_options(OPTS)
    part = Path(_flag(first, "ArchiveClassesAtExit") or "")
    assert part.parent == cache and part.name.endswith(f".{os.getpid()}.part")
    part.write_bytes(cds.MAGIC + b"\0" * 60)  # what the exiting JVM leaves
    # while it may still be written (its process alive, or touched lately): no second dump
    assert cds.cds_options(OPTS) == cds.QUIET
    dead = part.with_name(part.name.replace(f".{os.getpid()}.", f".{_dead_pid()}."))
    part.rename(dead)
    assert cds.cds_options(OPTS) == cds.QUIET  # not settled yet
    old = time.time() - cds.SETTLE_SECONDS - 1
    os.utime(dead, (old, old))
    mapped = cds.cds_options(OPTS)
    archive = Path(_flag(mapped, "SharedArchiveFile") or "")
    assert archive.parent == cache and archive.suffix == ".jsa" and archive.exists()
    assert not dead.exists()
    # other options (another class path for the JVM) get an archive of their own
    assert _flag(cds.cds_options("-XX:+UseG1GC"), "ArchiveClassesAtExit") is not None


def test_a_cut_short_dump_is_dropped_and_dumped_again(cache: Path) -> None:
    part = Path(_flag(cds.cds_options(OPTS), "ArchiveClassesAtExit") or "")
    dead = part.with_name(part.name.replace(f".{os.getpid()}.", f".{_dead_pid()}."))
    part.rename(dead)
    dead.write_bytes(b"\0" * 64)  # no header: the JVM died while dumping
    old = time.time() - cds.SETTLE_SECONDS - 1
    os.utime(dead, (old, old))
    again = cds.cds_options(OPTS)
    assert not dead.exists()
    assert _flag(again, "ArchiveClassesAtExit") is not None


def test_the_dump_is_claimed_before_the_jvm_starts(cache: Path) -> None:
    """Commands started side by side dump one archive between them: the first claims the
    dump with an empty part file at once, before its JVM runs (a JVM writes its own only
    as it exits), and a second command that finds the claim starts without dumping."""
    part = Path(_flag(cds.cds_options(OPTS), "ArchiveClassesAtExit") or "")
    assert part.exists() and part.stat().st_size == 0
    beside = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from merklog.node.spark.cds import cds_options; print(cds_options({OPTS!r}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert beside.stdout.strip() == cds.QUIET
    assert list(cache.glob("*.part")) == [part]


def test_off_when_asked(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERKLOG_SPARK_CDS", "0")
    assert cds.cds_options(OPTS) == ""
    assert not cache.exists()


def _java(options: str) -> subprocess.CompletedProcess:
    java = cds.java_binary()
    assert java is not None
    return subprocess.run([str(java), *options.split(), "-version"], capture_output=True, text=True)


def test_real_jvm_dumps_maps_and_ignores_a_damaged_archive(cache: Path, monkeypatch) -> None:
    """With the JVM pyspark runs: the dump flags leave an archive and nothing on stdout, the
    next start maps it (``-Xshare:on`` fails otherwise), a damaged archive is ignored."""
    dump = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; from merklog.node.spark.cds import cds_options, java_binary;"
            f" sys.exit(subprocess.run([str(java_binary()), *cds_options({OPTS!r}).split(),"
            " '-version'], capture_output=True).returncode)",
        ],
        capture_output=True,
        text=True,
    )
    assert dump.returncode == 0, dump.stderr
    [part] = cache.glob("*.part")
    assert part.read_bytes()[:4] == cds.MAGIC
    monkeypatch.setattr(cds, "SETTLE_SECONDS", 0.0)
    mapped = cds.cds_options(OPTS)
    archive = Path(_flag(mapped, "SharedArchiveFile") or "")
    run = _java(f"{OPTS} {mapped} -Xshare:on")
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    assert "sharing" in run.stderr
    archive.chmod(0o600)
    archive.write_bytes(b"\0" * 4096)  # damaged (or made by another JVM): started without it
    run = _java(f"{OPTS} {mapped}")
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
