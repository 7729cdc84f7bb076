"""Class-data sharing for the local Spark driver JVM: a dynamic AppCDS archive in merklog's cache.

Every ``merklog compact`` or ``analyze`` starts a fresh JVM, which loads and verifies
some ten thousand Spark classes before the first job runs. Java 17 can dump the
classes a run loaded into an archive when the JVM exits
(``-XX:ArchiveClassesAtExit``) and map that archive at the next start
(``-XX:SharedArchiveFile``), skipping parsing and verification. Measured on a cold
1M-op compaction: ~4-5 s less JVM CPU, most of it in the session start (ADR 0114).

The archive lives in ``<cache>/spark-cds/`` (``$MERKLOG_CACHE_DIR``, else
``$XDG_CACHE_HOME/merklog``, else ``~/.cache/merklog``), one file per *key*: the
Java binary, the pyspark install and the driver JVM's options, because the JVM only
maps an archive made by the same JVM with the same class path. The first run without
one claims the dump by creating ``<key>.jsa.<pid>.part`` empty, and its JVM writes the
archive there as it exits, after this process (runs that find a claim dump nothing); a
later run promotes a part file that nobody has touched for
:data:`SETTLE_SECONDS` to ``<key>.jsa``. A missing, stale or damaged archive is not
an error: the JVM checks the header and starts without sharing, and its CDS log
lines go to stderr (the log file of a quiet session), not to stdout. ``MERKLOG_SPARK_CDS=0`` turns
the whole thing off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

#: A part file untouched this long was completely written by a JVM that has exited.
SETTLE_SECONDS = 30.0
#: CDS warnings (a signed jar's classes are skipped, an archive does not match) go to the
#: JVM's stdout by default, which is the terminal (and ``compact``'s JSON lines): send them
#: to stderr, which a quiet session points at its log file.
QUIET = "-Xlog:cds*=off -Xlog:cds*=warning:stderr"
#: The first bytes of a dynamic archive (``CDS_DYNAMIC_ARCHIVE_MAGIC``, little-endian); the JVM
#: writes the header last, so a dump cut short does not start with it.
MAGIC = (0xF00BABA8).to_bytes(4, "little")


def cache_dir() -> Path:
    """Where merklog keeps its archives (created on demand)."""
    base = os.environ.get("MERKLOG_CACHE_DIR")
    if base:
        return Path(base) / "spark-cds"
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "merklog" / "spark-cds"


def enabled() -> bool:
    """False when ``MERKLOG_SPARK_CDS=0``."""
    return os.environ.get("MERKLOG_SPARK_CDS", "1") != "0"


def java_binary() -> Path | None:
    """The java that pyspark's launcher runs: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def pyspark_dir() -> Path | None:
    """The installed pyspark package's directory, found without importing pyspark (an
    import costs ~0.1 s before the driver JVM can start, ADR 0158); None if absent."""
    from importlib.util import find_spec

    spec = find_spec("pyspark")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def archive_key(java_options: str, class_path: str = "") -> str | None:
    """A name for the archive of this JVM, this pyspark and these options (None: no java)."""
    java = java_binary()
    if java is None:
        return None
    package = pyspark_dir()
    jars = package / "jars" if package is not None else None
    stamp = _stamp(jars) if jars is not None and jars.exists() else ""
    parts = [_stamp(java), stamp, java_options, class_path]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _promote(directory: Path, key: str, now: float) -> Path | None:
    """Rename the first finished part file of ``key`` to the archive; drop the others."""
    final = directory / f"{key}.jsa"
    for part in sorted(directory.glob(f"{key}.jsa.*.part")):
        try:
            pid = int(part.name.split(".")[-2])
            settled = now - part.stat().st_mtime >= SETTLE_SECONDS
        except (ValueError, OSError):
            continue
        if _alive(pid) or not settled:
            continue
        with part.open("rb") as f:
            whole = f.read(4) == MAGIC
        if final.exists() or not whole:
            part.unlink(missing_ok=True)
            continue
        os.replace(part, final)
    return final if final.exists() else None


def cds_options(java_options: str, class_path: str = "") -> str:
    """JVM options to add to the driver's ``java_options``: map the archive when there is
    one, else dump one when this JVM exits; empty when off or when no java is found."""
    if not enabled():
        return ""
    key = archive_key(java_options, class_path)
    if key is None:
        return ""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        archive = _promote(directory, key, time.time())
    except OSError:
        return ""
    if archive is not None:
        return f"-XX:SharedArchiveFile={archive} {QUIET}"
    part = _claim(directory, key)
    if part is None:
        return QUIET  # another run is dumping it: do not dump a second one
    return f"-XX:ArchiveClassesAtExit={part} {QUIET}"


def _claim(directory: Path, key: str) -> Path | None:
    """Claim the dump of ``key``'s archive for this process: its part file, created now
    (the JVM replaces it as it exits), or None when another process holds a claim.

    A JVM writes its part file only as it exits, so without the empty one made here,
    commands started side by side (or a long session and the commands beside it) would
    each dump an archive, ~20 s of CPU apiece. Two claims made at the same moment: the
    one that sorts first keeps it."""
    mine = directory / f"{key}.jsa.{os.getpid()}.part"
    if any(directory.glob(f"{key}.jsa.*.part")):
        return None
    try:
        os.close(os.open(mine, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:
        return None
    if sorted(directory.glob(f"{key}.jsa.*.part"))[0] != mine:
        mine.unlink(missing_ok=True)
        return None
    return mine
