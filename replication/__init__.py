"""Replication: signed delta DAG, add-wins CRDT merge, and the sync protocol.

Uses :mod:`merklog.store` only; the node mounts :func:`sync_routes` and drives
:class:`SyncClient`, :class:`Outbox` and :class:`Inbox`. See docs/crdt.md and
docs/sync-protocol.md.
"""

from .auth import AllowList, ReplayGuard, sign_headers, verify_request
from .blocks import (
    MAX_OPS,
    Assert,
    Delta,
    Genesis,
    Grant,
    Op,
    Retract,
    Revoke,
    build_delta,
    make_genesis,
    parse_delta,
    parse_genesis,
)
from .errors import (
    AuthError,
    CIDMismatchError,
    CycleError,
    Forbidden,
    InvalidDelta,
    InvalidSignature,
    MalformedBlock,
    MissingParents,
    NeedSummary,
    NotFound,
    PeerError,
    PeerUnreachable,
    ReplicationError,
    RequestTimeout,
    TooLarge,
    Unauthorized,
    WrongDataset,
)
from .identity import Identity, verify_signature
from .messages import DeliveryReport, Inbox, Message, Outbox
from .metrics import Metrics
from .replica import ApplyResult, ChangeCallback, LogRow, Replica, Summary
from .txn import connect

#: Names served from modules that import aiohttp (~1 s on a loaded machine): loaded on
#: first use, so ``merklog put`` on a stopped home never imports the HTTP stack.
_LAZY = {
    "SyncClient": "client",
    "SyncStats": "client",
    "SYNC_SERVICE": "server",
    "Limits": "server",
    "SyncService": "server",
    "make_sync_app": "server",
    "sync_routes": "server",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "MAX_OPS",
    "SYNC_SERVICE",
    "AllowList",
    "ApplyResult",
    "Assert",
    "AuthError",
    "CIDMismatchError",
    "ChangeCallback",
    "CycleError",
    "Delta",
    "DeliveryReport",
    "Forbidden",
    "Genesis",
    "Grant",
    "Identity",
    "Inbox",
    "InvalidDelta",
    "InvalidSignature",
    "Limits",
    "LogRow",
    "MalformedBlock",
    "Message",
    "Metrics",
    "MissingParents",
    "NeedSummary",
    "NotFound",
    "Op",
    "Outbox",
    "PeerError",
    "PeerUnreachable",
    "ReplayGuard",
    "Replica",
    "ReplicationError",
    "RequestTimeout",
    "Retract",
    "Revoke",
    "Summary",
    "SyncClient",
    "SyncService",
    "SyncStats",
    "TooLarge",
    "Unauthorized",
    "WrongDataset",
    "build_delta",
    "connect",
    "make_genesis",
    "make_sync_app",
    "parse_delta",
    "parse_genesis",
    "sign_headers",
    "sync_routes",
    "verify_request",
    "verify_signature",
]
