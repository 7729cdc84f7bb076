"""Per-peer sync state of a running node: what ``status`` shows for each peer.

Kept in memory by the node (a restart starts with no attempts); ``deltas_behind``
comes from the replica: how many of our deltas the peer lacked when last seen,
plus everything written since.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class PeerSync:
    """Sync history with one peer URL."""

    url: str
    last_attempt: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    failures: int = 0  # consecutive failed attempts (0 after a success)

    def attempt(self) -> None:
        self.last_attempt = time.time()

    def succeeded(self) -> None:
        self.last_success = time.time()
        self.last_error = None
        self.failures = 0

    def failed(self, error: str) -> bool:
        """Record a failure; True if it is news (first failure or a different error)."""
        news = self.failures == 0 or error != self.last_error
        self.last_error = error
        self.failures += 1
        return news

    def to_json(self, name: str | None, deltas_behind: int | None) -> dict[str, Any]:
        return {"name": name, **asdict(self), "deltas_behind": deltas_behind}
