"""Why a key may not write: was its write access revoked here (``merklog put`` and
``POST /v1/facts`` say so instead of "the grant has not been made yet")."""

from __future__ import annotations

from typing import Any

from merklog.store import Link


def last_revoke(replica: Any, key: bytes) -> Link | None:
    """The latest revoke of ``key`` this replica has accepted (by clock), if any. Read
    only; whether the key may write is still decided by ``Replica.is_writer``."""
    with replica._lock:
        row = replica.conn.execute(
            "SELECT delta FROM repl_auth WHERE ds = ? AND key = ? AND is_grant = 0"
            " ORDER BY clock DESC, delta DESC LIMIT 1",
            (replica.ds, key),
        ).fetchone()
    return Link(bytes(row[0])) if row else None
