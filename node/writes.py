"""Rules of the node's write path that sit above the replica's own.

- A write by a key that is not a writer fails with :class:`NotAWriter` saying plainly
  why and what to do, instead of the replica's "author … is not a writer in the
  causal past of …".
- A home made by ``init --join URL`` has never seen the grants made after the
  dataset's genesis: before its first write it syncs once with that origin
  (``[peers] origin``), so a grant the owner already made takes effect.
- ``retract`` reports the facts that were not visible (nothing to retract).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from merklog.store import Fact, Link, fact_cid

from .failures import NotAWriter
from .homeinit import ORIGIN

log = logging.getLogger(__name__)


def origin_url(config: Any) -> str | None:
    """The URL this home joined from (``[peers] origin``), if any."""
    peer = config.peers.get(ORIGIN)
    if isinstance(peer, dict) and isinstance(peer.get("url"), str):
        return str(peer["url"])
    return None


def can_write(node: Any) -> bool:
    """Whether the node's key may write on top of its current heads."""
    return bool(node.replica.is_writer(node.identity.public_key))


def require_writer(node: Any) -> None:
    """Raise :class:`NotAWriter` unless the node's key may write now."""
    if can_write(node):
        return
    key = node.identity.public_key.hex()
    origin = origin_url(node.config)
    synced = origin is not None and bool(node.replica.peer_heads(origin.rstrip("/")))
    hint = (
        f"; it synced with {origin}, so the grant has not been made there yet"
        if synced
        else (f" and has not synced with {origin} yet" if origin else "")
    )
    raise NotAWriter(
        f"this node cannot write yet: its key {key} is not a writer of dataset"
        f" {node.dataset}{hint}. Ask the dataset owner to grant it (on the owner's home:"
        f" `merklog peers add NAME URL --writer`), then `merklog sync` and write again."
    )


def sync_before_first_write(node: Any, sync: Callable[[str], Any]) -> None:
    """If the node may not write and joined from an origin it never synced with, sync
    once with that origin (``sync(url)``) so grants made there arrive first."""
    if can_write(node):
        return
    origin = origin_url(node.config)
    if origin is None or node.replica.peer_heads(origin.rstrip("/")):
        return
    log.info("not a writer yet: syncing once with %s before the first write", origin)
    try:
        sync(origin)
    except Exception as exc:  # reported by require_writer's message below
        log.warning("sync with %s before the first write failed: %s", origin, exc)


def not_visible(replica: Any, facts: list[Fact]) -> list[tuple[Link, Fact]]:
    """The facts among ``facts`` that are not visible now, with their CIDs."""
    cids = [fact_cid(f) for f in facts]
    visible = replica.visible_among(cids)
    return [(c, f) for c, f in zip(cids, facts, strict=True) if c not in visible]
