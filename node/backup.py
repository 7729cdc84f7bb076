"""Restore a home from a backup: a CAR written by ``merklog export``.

An export holds the dataset's genesis block first, then every delta with its fact
blocks in clock order, rooted at the heads. ``restore`` creates a fresh home that
follows the genesis found in the CAR (all or nothing, like ``init``), optionally
with the node key saved next to the backup (``identity.pem`` is a secret and is
not part of the CAR), then verifies and applies every block in one transaction.

The node that applies the blocks comes from the caller (``open_node``, the CLI passes
:class:`~.node.Node`): the node facade delegates its CAR work to :mod:`.carfiles`, and
nothing below the facade imports it, so there is no import cycle, lazy or not.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from merklog.store import Link

from .config import Config
from .failures import ExitCode, Failure
from .homeinit import IDENTITY_FILE, Join, initialise
from .runtime import HomeLock


class Restoring(Protocol):
    """The node a restore applies the backup to (a :class:`~.node.Node`)."""

    def import_car(self, path: Path) -> dict[str, int]: ...
    def close(self) -> None: ...


def read_genesis(car: Path) -> tuple[Link, bytes]:
    """The dataset genesis block of an exported CAR (its first ``kind: dataset`` block)."""
    from merklog.replication.blocks import parse_genesis
    from merklog.store import decode

    from .carfiles import read_input_car

    with open(car, "rb") as src:
        _roots, blocks = read_input_car(src, car)
        for cid, data in blocks:
            obj = decode(data)
            if isinstance(obj, dict) and obj.get("kind") == "dataset":
                return cid, parse_genesis(cid, data).data
    raise Failure(f"{car} holds no dataset genesis block: not a merklog export", ExitCode.BAD_INPUT)


def restore(
    home: Path,
    car: Path,
    identity: Path | None,
    overrides: dict[str, Any],
    open_node: Callable[[Config, HomeLock], Restoring],
) -> dict[str, Any]:
    """Create ``home`` from the backup ``car`` (and key file ``identity``); returns the
    import counts plus ``dataset``. Refuses a home that is already initialised.
    ``open_node(config, lock)`` opens the fresh home's node (and owns the lock)."""
    if (home / "config.toml").exists():
        raise Failure(
            f"{home} is already a merklog home; restore into a new --home (or import the"
            " CAR into this one with `merklog import`)"
        )
    dataset, genesis = read_genesis(car)
    existed = home.exists()
    lock = HomeLock.acquire(home)
    try:
        if identity is not None:
            shutil.copyfile(identity, home / IDENTITY_FILE)
            (home / IDENTITY_FILE).chmod(0o600)
        cfg, _ = initialise(home, overrides, Join("", dataset, genesis, None), existed)
        node = open_node(cfg, lock)
        try:
            result = node.import_car(car)
        finally:
            node.close()
            lock = None
    except BaseException:
        if lock is not None:
            lock.release()
        if not existed:
            shutil.rmtree(home, ignore_errors=True)
        raise
    return {"dataset": str(dataset), **result}
