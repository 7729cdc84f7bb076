"""Replication: signed delta DAG, add-wins CRDT merge, and the sync protocol.

Uses :mod:`merklog.store` only; the node mounts :func:`sync_routes` and drives
:class:`SyncClient`, :class:`Outbox` and :class:`Inbox`. See docs/crdt.md and
docs/sync-protocol.md.
"""

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
    NotTheOwner,
    PeerError,
    PeerRefused,
    PeerUnreachable,
    PeerUntrusted,
    ReplicationError,
    RequestTimeout,
    TooLarge,
    Unauthorized,
    WrongDataset,
)

#: Every public name but the errors is loaded from its module on first use. The errors
#: are what the CLI needs to tell a user what went wrong; the rest pulls in the
#: signatures' crypto, the replica and its numpy, and (client, server) aiohttp, ~1 s on a
#: loaded machine. So ``merklog put`` on a stopped home never imports the HTTP stack, and
#: a command that reaches a running node imports none of them.
_LAZY = {
    **dict.fromkeys(["AllowList", "ReplayGuard", "sign_headers", "verify_request"], "auth"),
    **dict.fromkeys(
        [
            "MAX_OPS",
            "Assert",
            "Delta",
            "Genesis",
            "Grant",
            "Op",
            "Retract",
            "Revoke",
            "build_delta",
            "make_genesis",
            "parse_delta",
            "parse_genesis",
        ],
        "blocks",
    ),
    **dict.fromkeys(["SyncClient", "SyncStats"], "client"),
    **dict.fromkeys(["Identity", "verify_signature"], "identity"),
    **dict.fromkeys(["DeliveryReport", "Inbox", "Message", "Outbox"], "messages"),
    "Metrics": "metrics",
    **dict.fromkeys(["ApplyResult", "ChangeCallback", "LogRow", "Replica", "Summary"], "replica"),
    **dict.fromkeys(
        ["SYNC_SERVICE", "Limits", "SyncService", "make_sync_app", "sync_routes"], "server"
    ),
    "connect": "txn",
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
    "PeerRefused",
    "PeerUnreachable",
    "PeerUntrusted",
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
    "NotTheOwner",
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
