"""A cheap look at a home before opening it: its store missing, empty or not SQLite, or
its node key missing.

SQLite happily opens a zero-length or deleted file as a new, empty database, after
which the node would only say "genesis block … is not known". Checking the file
first gives the user the real reason and a way out; deeper damage is found by
SQLite itself (``DatabaseError``, exit status 5) or by ``merklog fsck``. Likewise a
missing ``identity.pem`` would be replaced by a new key that may not write to the
dataset, and the owner told to "ask the dataset owner".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .failures import STORE_WAY_OUT, Failure, KeyMissing, StoreDamaged
from .files import IDENTITY_FILE, RESTORE_MARKER

SQLITE_HEADER = b"SQLite format 3\x00"


def precheck(cfg: Any) -> None:
    """Raise :class:`StoreDamaged` if the configured SQLite store is missing, empty or
    not a SQLite file, or :class:`KeyMissing` if the node key is, while the config names
    a dataset that should be in the home."""
    if cfg.home is not None:
        refuse_unfinished_restore(cfg.home)
    if not cfg.get("dataset.id"):
        return
    check_store_file(cfg)
    if cfg.home is not None:
        check_key(cfg.home)


def refuse_unfinished_restore(home: Path) -> None:
    """Refuse (exit 1) a home whose restore was stopped before it ended: what it holds is
    part of a backup, and only running that restore again makes it a home."""
    if (home / RESTORE_MARKER).exists():
        raise Failure(
            f"{home} holds a restore that was stopped before it ended; run the same"
            f" `merklog --home {home} restore BACKUP.car` again (it starts over)"
        )


def check_key(home: Path) -> Path:
    """The path of ``home``'s node key; :class:`KeyMissing` saying how to get one back if
    the file is not there."""
    path = home / IDENTITY_FILE
    if not path.exists():
        raise KeyMissing(
            f"the node key {path} is missing, so this home cannot sign writes as itself;"
            f" {_key_way_out(home, path)}"
        )
    return path


def _key_way_out(home: Path, path: Path, damaged: bool = False) -> str:
    """How to get a working key back. ``init`` makes a key only where there is none, so
    a damaged one (junk, a directory) is moved away first: told to run init, init
    refused it ("not a valid node key")."""
    backup = 'the copy made as docs/operations.md "Backup and restore" says'
    if damaged:
        return (
            f"move it away (`mv {path} {path}.damaged`), then put the key back (e.g. `cp"
            f" BACKUP-identity.pem {path}`, {backup}) or run `merklog --home {home} init`"
            f" to make a new key, {_GRANT}"
        )
    return (
        f"put the key back (e.g. `cp BACKUP-identity.pem {path}`, {backup}), or run"
        f" `merklog --home {home} init` to make a new key, {_GRANT}"
    )


_GRANT = (
    "which a writer of the dataset must then grant (`merklog peers add NAME URL --writer`"
    " on its home)"
)


def load_key(home: Path) -> Any:
    """``home``'s node key (an :class:`~merklog.replication.identity.Identity`), never a
    new one: :class:`KeyMissing` if it is gone (only ``init`` makes keys)."""
    from merklog.replication.errors import BadKey
    from merklog.replication.identity import Identity

    path = check_key(home)
    try:
        return Identity.load(path)
    except BadKey as exc:  # as a missing key: part of the home is gone (exit 5)
        raise KeyMissing(
            f"the node key {path} is damaged ({exc.why}), so this home cannot sign writes"
            " as itself;"
            f" {_key_way_out(home, path, damaged=True)}"
        ) from None


def check_store_file(cfg: Any) -> None:
    """The store half of :func:`precheck` (SQLite homes only); ``init`` of a home that
    follows a dataset runs it too, so it says the store is gone, not "already
    initialised"."""
    if cfg.get("store.backend") != "sqlite":
        return
    path = cfg.path("store.path")
    if path is None:
        return
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        raise StoreDamaged(f"the store {path} is missing; {STORE_WAY_OUT}") from None
    except IsADirectoryError:  # raised as is: "[Errno 21] Is a directory", exit 1
        raise StoreDamaged(
            f"the store {path} is a directory, not a SQLite database; {STORE_WAY_OUT}"
        ) from None
    if size == 0:
        raise StoreDamaged(f"the store {path} is empty (zero bytes); {STORE_WAY_OUT}")
    if header != SQLITE_HEADER:
        raise StoreDamaged(f"the store {path} is not a SQLite database; {STORE_WAY_OUT}")
