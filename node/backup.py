"""Restore a home from a backup: a CAR written by ``merklog export``.

An export holds the dataset's genesis block first, then every delta with its fact
blocks in clock order, rooted at the heads. ``restore`` creates a fresh home that
follows the genesis found in the CAR (all or nothing, like ``init``), optionally
with the node key saved next to the backup (``identity.pem`` is a secret and is
not part of the CAR), then verifies and applies every block in one transaction. A
backup whose blocks do not reach the heads it names as its roots (a copy cut short
between two blocks, which reads as a valid, shorter CAR) is refused, and nothing is left.

The node that applies the blocks comes from the caller (``open_node``, the CLI passes
:class:`~.node.Node`): the node facade delegates its CAR work to :mod:`.carfiles`, and
nothing below the facade imports it, so there is no import cycle, lazy or not.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from merklog.store import Link

from .config import Config
from .failures import ExitCode, Failure
from .files import RESTORE_MARKER, write_private
from .homeinit import IDENTITY_FILE, Join, initialise
from .runtime import LOCK_FILE, HomeLock


class Restoring(Protocol):
    """The node a restore applies the backup to (a :class:`~.node.Node`)."""

    def import_car(self, path: Path) -> dict[str, int]: ...
    def heads(self) -> list[Link]: ...
    def status(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def read_genesis(car: Path) -> tuple[Link, bytes, list[Link]]:
    """The dataset genesis block of an exported CAR (its first ``kind: dataset`` block)
    and the CAR's roots: the heads of the home it was exported from."""
    from merklog.replication.blocks import parse_genesis
    from merklog.store import decode

    from .carfiles import read_input_car

    with open(car, "rb") as src:
        roots, blocks = read_input_car(src, car)
        for cid, data in blocks:
            obj = decode(data)
            if isinstance(obj, dict) and obj.get("kind") == "dataset":
                return cid, parse_genesis(cid, data).data, roots
    raise Failure(f"{car} holds no dataset genesis block: not a merklog export", ExitCode.BAD_INPUT)


def _require_whole(car: Path, roots: list[Link], heads: list[Link]) -> None:
    """Refuse (bad input) a backup whose import did not reach the heads it was exported
    at: a copy cut short exactly between two blocks reads as a valid, shorter CAR, and
    restored an older state of the dataset with exit 0 (a cut inside a block is a CAR
    fault already)."""
    missing = set(roots) - set(heads)
    if missing:
        raise Failure(
            f"{car} is incomplete: {len(missing)} of the {len(roots)} head(s) it was"
            " exported at are not in it (a copy cut short?); nothing was restored",
            ExitCode.BAD_INPUT,
        )


def restore(
    home: Path,
    car: Path,
    identity: Path | None,
    overrides: dict[str, Any],
    open_node: Callable[[Config, HomeLock], Restoring],
) -> dict[str, Any]:
    """Create ``home`` from the backup ``car`` (and key file ``identity``); returns
    ``dataset``, the import's ``accepted`` and ``duplicates`` deltas, and ``facts``: the
    visible facts of the restored home, as ``merklog status`` counts them (the import's
    own count is of every fact block, retracted ones too, which no command shows).
    Refuses a home that is already initialised, unless
    it is what a restore that was killed left (:data:`RESTORE_MARKER`): that one is
    undone and the restore starts again. ``open_node(config, lock)`` opens the fresh
    home's node (and owns the lock)."""
    unfinished = (home / RESTORE_MARKER).exists()
    if (home / "config.toml").exists() and not unfinished:
        raise Failure(
            f"{home} is already a merklog home; restore into a new --home (or import the"
            " CAR into this one with `merklog import`)"
        )
    if identity is not None:
        _check_identity(identity)
    dataset, genesis, roots = read_genesis(car)
    existed = home.exists()
    lock = HomeLock.acquire(home)
    if unfinished:
        existed, before = _undo_unfinished(home)
    else:
        before = sorted(p.name for p in home.iterdir() if p.name != LOCK_FILE)
    # Until the import has committed, the home says it is an unfinished restore: a
    # restore killed with -9 (no cleanup runs) is then undone by the next one, and other
    # commands refuse it instead of serving an empty dataset.
    marker = {"existed": existed, "before": before}
    # Owner-only from the start, as every file of a home (the marker names its files;
    # a copied key must never be readable by others, not even until a chmod).
    write_private(home / RESTORE_MARKER, json.dumps(marker).encode())
    try:
        if identity is not None:
            write_private(home / IDENTITY_FILE, Path(identity).read_bytes())
        cfg, _ = initialise(home, overrides, Join("", dataset, genesis, None), existed)
        node = open_node(cfg, lock)
        try:
            result = {**node.import_car(car), "facts": node.status()["facts"]}
            _require_whole(car, roots, node.heads())
            (home / RESTORE_MARKER).unlink()
        finally:
            node.close()
            lock = None
    except BaseException:
        if lock is not None:
            lock.release()
        if not existed:
            shutil.rmtree(home, ignore_errors=True)
        else:
            _undo_unfinished(home)
        raise
    return {"dataset": str(dataset), **result}


def _check_identity(path: Path) -> None:
    """Refuse (exit 2, nothing created) a ``--identity`` file that holds no node key."""
    from merklog.replication.errors import BadKey
    from merklog.replication.identity import Identity

    try:
        Identity.load(path)
    except BadKey as exc:
        raise Failure(f"--identity: {exc.detail}", ExitCode.BAD_INPUT) from None


def _undo_unfinished(home: Path) -> tuple[bool, list[str]]:
    """Remove what an unfinished restore made in ``home`` (everything but what its
    marker lists as there before, and the lock); returns the marker's record."""
    try:
        record = json.loads((home / RESTORE_MARKER).read_text())
        existed, before = bool(record["existed"]), list(record["before"])
    except (OSError, ValueError, KeyError, TypeError):
        existed, before = False, []
    keep = {*before, LOCK_FILE}
    for path in home.iterdir():
        if path.name in keep:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return existed, before
