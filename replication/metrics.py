"""Counters for the sync server and client (plain dict-like, cheap to export)."""

from __future__ import annotations

from collections import Counter


class Metrics(Counter):
    """A Counter keyed by event name: ``requests``, ``rejected``, ``rejected.<code>``,
    ``bytes_in``, ``bytes_out``, ``deltas_in``, ``deltas_out``, ``inbox_messages`` …"""

    def reject(self, code: str) -> None:
        self["rejected"] += 1
        self[f"rejected.{code}"] += 1

    def snapshot(self) -> dict[str, int]:
        return dict(self)
