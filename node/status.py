"""``Node.status()`` / ``GET /v1/status`` / ``merklog status``: one dict that says what a
node holds and how it is doing — dataset, key, heads, epoch, stored and derived fact
counts, program and engine mode, pending and dropped ``@async`` messages, and per-peer sync state
(from :mod:`.peersync`). The node delegates here; this module reads the node through
:class:`Owner` and does not import it.
"""

from __future__ import annotations

from typing import Any, Protocol

from merklog.store import Link


class Owner(Protocol):
    """What the status needs of its node."""

    dataset: Link
    identity: Any
    replica: Any
    epochs: Any
    outbox: Any
    last_sync: dict[str, Any] | None

    def heads(self) -> list[Link]: ...
    def peer_status(self) -> list[dict[str, Any]]: ...


def node_status(node: Owner) -> dict[str, Any]:
    """The node's status (see the module docstring); fields as ``GET /v1/status`` answers.
    The epoch, the counts and the program are those of the last completed epoch, read
    together: an epoch evaluating meanwhile is not waited for (ADR 0205)."""
    # derived: tuples in relations the program's rules define
    epoch, facts, derived, engine = node.epochs.summary()
    return {
        "dataset": str(node.dataset),
        "key": node.identity.public_key.hex(),
        # whether that key may write on top of the heads (QA: a team lead could learn it
        # only by trying a write)
        "writer": node.replica.is_writer(node.identity.public_key),
        "heads": sorted(str(h) for h in node.heads()),
        "epoch": epoch,
        "facts": facts,
        "derived": derived,
        "program": bool(engine.text) and engine.says_anything,
        # why the last epoch failed (the program on the stored facts), else None
        "program_error": node.epochs.start_failure or node.epochs.last_error,
        "engine": engine.mode,
        "outbox_pending": node.outbox.pending_count(),
        "outbox_dropped": node.outbox.dropped_count(),
        "peers": node.peer_status(),
        "last_sync": node.last_sync,
    }
