"""A cheap look at a home's store before opening it: missing, empty or not SQLite.

SQLite happily opens a zero-length or deleted file as a new, empty database, after
which the node would only say "genesis block … is not known". Checking the file
first gives the user the real reason and a way out; deeper damage is found by
SQLite itself (``DatabaseError``, exit status 5) or by ``merklog fsck``.
"""

from __future__ import annotations

from typing import Any

from .failures import StoreDamaged

SQLITE_HEADER = b"SQLite format 3\x00"
_WAY_OUT = (
    "restore a backup into a fresh home (`merklog --home NEW_HOME restore BACKUP.car`, see"
    " docs/operations.md) or move the home away and run `merklog init`"
)


def precheck(cfg: Any) -> None:
    """Raise :class:`StoreDamaged` if the configured SQLite store is missing, empty or
    not a SQLite file while the config names a dataset that should be in it."""
    if cfg.get("store.backend") != "sqlite" or not cfg.get("dataset.id"):
        return
    path = cfg.path("store.path")
    if path is None:
        return
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        raise StoreDamaged(f"the store {path} is missing; {_WAY_OUT}") from None
    if size == 0:
        raise StoreDamaged(f"the store {path} is empty (zero bytes); {_WAY_OUT}")
    if header != SQLITE_HEADER:
        raise StoreDamaged(f"the store {path} is not a SQLite database; {_WAY_OUT}")
