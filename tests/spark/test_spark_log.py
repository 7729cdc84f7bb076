"""The driver JVM's log file, which has a fixed name in a shared directory, is never
written through a symbolic link nor into another user's file (no JVM needed)."""

from __future__ import annotations

import os
from pathlib import Path

from merklog.node.spark.session import _private_log


def test_the_spark_log_is_not_written_through_a_symbolic_link(tmp_path: Path) -> None:
    """QA: with ``merklog-spark-UID.log`` made a link to another file, the JVM's output
    went into that file. The link is left alone and a private file beside it is used."""
    victim = tmp_path / "victim.txt"
    victim.write_text("victim\n")
    link = tmp_path / "merklog-spark-0.log"
    link.symlink_to(victim)
    fd = _private_log(link)
    try:
        os.write(fd, b"JVM output\n")
        used = Path(os.readlink(f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)
    assert victim.read_text() == "victim\n"
    assert used != victim and used.parent == tmp_path and used.name.startswith("merklog-spark-")
    assert used.read_text() == "JVM output\n" and used.stat().st_mode & 0o777 == 0o600


def test_a_log_file_others_may_read_is_made_private(tmp_path: Path) -> None:
    """A log of this user's made by an older merklog with other modes is made 0600."""
    log = tmp_path / "merklog-spark-0.log"
    log.write_text("old lines\n")
    log.chmod(0o666)
    fd = _private_log(log)
    try:
        os.write(fd, b"new\n")
    finally:
        os.close(fd)
    assert log.read_text() == "old lines\nnew\n" and log.stat().st_mode & 0o777 == 0o600
