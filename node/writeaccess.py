"""Who may write, and the one sync a freshly joined home makes before its first write.

Rules that sit above the replica's own:

- A write by a key that is not a writer fails with :class:`NotAWriter` saying plainly
  why and what to do, instead of the replica's "author … is not a writer in the
  causal past of …".
- A home made by ``init --join URL`` has never seen the grants made after the
  dataset's genesis: before its first write (CLI ``put`` and ``POST /v1/facts``) it
  syncs once with that origin (``[peers] origin``), so a grant the owner already made
  takes effect; if the origin cannot be reached the write fails with
  :class:`NotWritableYet` naming it (HTTP 503, CLI exit 4).
- The Python API does the same (``Node.write``, ``assert_``, ``retract``): outside an
  event loop it syncs there and then; ``async with merklog.open(home)`` syncs when it
  opens (an unreachable origin is logged, the node still opens); a write made inside a
  running event loop that still needs the sync cannot wait for it and raises
  :class:`NotWritableYet` saying ``await node.sync(origin)`` (ADR 0076). If the origin
  answered and refused that sync (e.g. it does not list this node's key), the write
  fails with :class:`NotAWriter` naming the refusal, as it does outside an event loop.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from merklog.replication.errors import PeerUnreachable

from .config import ORIGIN
from .failures import NotAWriter, NotWritableYet, local_failure

log = logging.getLogger(__name__)

#: The nodes whose origin answered and refused their sync before the first write (not
#: merely unreachable): their write inside an event loop is then refused as
#: :class:`NotAWriter` with that answer, not as "the origin was unreachable".
_REFUSED: weakref.WeakSet[Any] = weakref.WeakSet()


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
    from merklog.replication.authstate import last_revoke

    revoked = last_revoke(node.replica, node.identity.public_key)
    if revoked is not None:
        # "its earlier writes stay" only of a key that wrote (QA: said of one that never had)
        stay = (
            "; its earlier writes stay"
            if node.replica.has_written(node.identity.public_key)
            else ""
        )
        raise NotAWriter(
            f"this node cannot write: the dataset owner revoked its key {key} (delta"
            f" {revoked}){stay}. Ask the owner to grant it again"
            f" (`merklog writers grant KEY`), then `merklog sync` and write again."
        )
    origin = origin_url(node.config)
    synced = origin is not None and bool(node.replica.peer_heads(origin.rstrip("/")))
    failed = _last_sync_error(node, origin) if origin and not synced else None
    if synced:
        # Synced once means no grant had arrived by then; one made since arrives with the
        # next sync (it said the grant "has not been made there yet", which sent users
        # back to an owner who had granted it already).
        raise NotAWriter(
            f"this node cannot write yet: its key {key} is not a writer of dataset"
            f" {node.dataset}: no grant to it had arrived by its last sync with {origin}."
            " If the owner has granted it since, run `merklog sync` and write again;"
            " otherwise ask the dataset owner to grant it (on the owner's home: `merklog"
            " peers add NAME URL --writer`)."
        )
    hint = (f" and has not synced with {origin} yet" if origin else "") + (
        f" (its last sync with it failed: {failed})" if failed else ""
    )
    raise NotAWriter(
        f"this node cannot write yet: its key {key} is not a writer of dataset"
        f" {node.dataset}{hint}. Ask the dataset owner to grant it (on the owner's home:"
        f" `merklog peers add NAME URL --writer`), then `merklog sync` and write again."
    )


def _last_sync_error(node: Any, url: str) -> str | None:
    """Why the last sync with ``url`` failed, if it did (a grant made on the owner's
    home does not arrive while the owner refuses this node's syncs, e.g. because it is
    not in the owner's ``[peers]``)."""
    state = node.peer_sync.get(url.rstrip("/"))
    return state.last_error if state is not None else None


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
    except PeerUnreachable as exc:
        raise _unreachable(origin, exc) from None
    except Exception as exc:  # refused (not granted): require_writer's message says why
        if local_failure(exc):
            raise  # this home's disk or store failed (a full disk: exit 6), not the peer
        log.info("sync with %s before the first write failed: %s", origin, exc)


def _must_sync_first(node: Any) -> str | None:
    """The origin URL when the node may not write and never synced with its origin."""
    if can_write(node):
        return None
    origin = origin_url(node.config)
    if origin is None or node.replica.peer_heads(origin.rstrip("/")):
        return None
    return origin


def _unreachable(origin: str, exc: PeerUnreachable) -> NotWritableYet:
    why = exc.reason or exc  # "connection refused", not "cannot reach peer URL: …" again
    return NotWritableYet(
        f"this node cannot write yet: it joined from {origin} and must sync with it once"
        f" before its first write (to receive its writer grant), but {origin} cannot be"
        f" reached now ({why}). Start that node or check the URL, then write again."
    )


async def sync_before_first_write_async(node: Any) -> None:
    """The event-loop form of :func:`sync_before_first_write` (HTTP writes): an origin
    that cannot be reached raises :class:`NotWritableYet` naming it (503)."""
    origin = _must_sync_first(node)
    if origin is None:
        return
    log.info("not a writer yet: syncing once with %s before the first write", origin)
    try:
        await node.sync(origin)
    except PeerUnreachable as exc:
        raise _unreachable(origin, exc) from None
    except Exception as exc:  # refused (not granted): require_writer's message says so
        if local_failure(exc):
            raise  # this node's disk or store failed (a full disk: 507), not the peer
        log.warning("sync with %s before the first write failed: %s", origin, exc)
        _REFUSED.add(node)  # the origin answered: a later write in a loop says so


def sync_before_first_write_here(node: Any) -> None:
    """The Python API's form (``Node.write``): sync once with the origin before the first
    write when needed. Outside an event loop the sync runs here (``asyncio.run``); inside
    one it cannot be waited for without blocking that loop, so the write is refused with
    :class:`NotWritableYet` naming the origin and the call that makes it possible.
    A home that joined from nowhere (the owner's) pays one dict lookup, no query."""
    if origin_url(node.config) is None:
        return
    origin = _must_sync_first(node)
    if origin is None:
        return
    import asyncio  # the Python API's path: the CLI's commands through a node never load it

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        sync_before_first_write(node, lambda url: asyncio.run(node.sync(url)))
        return
    if node in _REFUSED:  # it was tried when the node opened and the origin refused
        require_writer(node)  # NotAWriter, with the origin's answer
        return
    raise NotWritableYet(
        f"this node cannot write yet: it joined from {origin} and must sync with it once"
        f" before its first write (to receive its writer grant), and it has not (the origin"
        f" was unreachable when the node opened, or the node was opened without"
        f" `async with`). Inside an event loop that sync cannot run here: `await"
        f" node.sync({origin!r})`, then write again."
    )


async def sync_on_open(node: Any) -> None:
    """``async with merklog.open(home)``: a freshly joined home syncs once with its origin
    now, so writes in the block work; an unreachable origin is logged and the node opens
    anyway (a later write says why it cannot write yet)."""
    try:
        await sync_before_first_write_async(node)
    except NotWritableYet as exc:
        log.warning("%s", exc)
