"""Who may write: granting and revoking writer keys (``merklog writers grant|revoke``,
``POST /v1/writers``, ``DELETE /v1/writers/{key}``, ``Node.grant`` / ``Node.revoke``),
and listing them (``merklog writers list``, ``GET /v1/writers``, ``Node.writers``).

The owner's signed grant or revoke is a delta of the replica like any write; a revoke
keeps the deltas the key signed before it (in its causal past) and every replica that
has seen it refuses later ones. This module checks the key given by a user and hands
the grant to the replica; the node delegates here and wakes its epoch loop.
"""

from __future__ import annotations

import re
from typing import Any

from merklog.replication.identity import public_key_problem

from .errors import NodeInputError


def grant(replica: Any, key_hex: str) -> str | None:
    """Let the Ed25519 public key ``key_hex`` write to this dataset (owner only); the CID
    of the grant delta, or None when there was nothing to change: the key (the owner's
    included) may already write on top of the current heads. Each grant used to be a
    new signed delta, which every peer then synced, for a change of nothing."""
    key = public_key(key_hex)
    problem = public_key_problem(key)
    if problem is not None:  # revoke takes it: a grant made before this was checked
        raise NodeInputError(
            f"{key_hex!r} is not an Ed25519 public key of a node: {problem} (copy the key"
            " `merklog status` prints on the other device)"
        )
    if _owner(replica) and replica.is_writer(key):
        return None
    cid = replica.grant(key)
    return str(cid) if cid else None


def revoke(replica: Any, key_hex: str) -> str | None:
    """Stop the Ed25519 public key ``key_hex`` from writing (owner only); the CID of the
    revoke delta, or None when there was nothing to change. The owner's own key is
    refused: the owner is a writer whatever the deltas say, so such a delta would only
    look as if it did something."""
    key = public_key(key_hex)
    if key == replica.genesis.owner and _owner(replica):  # elsewhere: refused as not owner
        raise NodeInputError(
            "that is the dataset owner's key: the owner always writes and cannot be revoked"
        )
    if _owner(replica) and not replica.is_writer(key):  # never granted, or revoked already
        return None
    cid = replica.revoke(key)
    return str(cid) if cid else None


def writers(replica: Any) -> list[dict[str, Any]]:
    """Who may write on top of the current heads, and who was revoked: one dict per key,
    ``{"key", "writer", "owner", "delta"}`` (``delta``: the grant or revoke that decides,
    the genesis for the owner and the genesis writers), the owner first."""
    return [
        {"key": w.key.hex(), "writer": w.writer, "owner": w.owner, "delta": str(w.delta)}
        for w in replica.writers()
    ]


def _owner(replica: Any) -> bool:
    """Whether this replica's key owns the dataset (anyone else's grant or revoke is
    refused by the replica, with its own message, whatever the key's state)."""
    return bool(replica.identity.public_key == replica.genesis.owner)


def public_key(key_hex: str) -> bytes:
    """The 32 bytes of a hex Ed25519 public key, or NodeInputError naming what was given.
    Exactly 64 hex digits: ``bytes.fromhex`` also skips spaces, so ``DELETE
    /v1/writers/%20<key>`` was taken for the key."""
    if not (isinstance(key_hex, str) and _HEX64.fullmatch(key_hex)):
        raise NodeInputError(f"{key_hex!r} is not a 64-digit hex Ed25519 public key")
    return bytes.fromhex(key_hex)


_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
