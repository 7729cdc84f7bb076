"""Timestamps: epochs in the root circuit, ``(epoch, iteration)`` in child circuits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Timestamp:
    """A point in time, ordered by product order (Dialog dataflow spec §2.5).

    ``(0, 2) <= (1, 2)`` but ``(0, 2)`` and ``(1, 1)`` are incomparable: neither
    ``<=`` nor ``>=`` holds. Root-circuit timestamps have ``iteration == 0``.
    """

    epoch: int
    iteration: int = 0

    def __le__(self, other: Timestamp) -> bool:
        return self.epoch <= other.epoch and self.iteration <= other.iteration

    def __lt__(self, other: Timestamp) -> bool:
        return self <= other and self != other

    def __ge__(self, other: Timestamp) -> bool:
        return other <= self

    def __gt__(self, other: Timestamp) -> bool:
        return other < self

    def join(self, other: Timestamp) -> Timestamp:
        """Least upper bound under product order."""
        return Timestamp(max(self.epoch, other.epoch), max(self.iteration, other.iteration))

    def next_iteration(self) -> Timestamp:
        return Timestamp(self.epoch, self.iteration + 1)

    def __str__(self) -> str:
        return f"({self.epoch}, {self.iteration})"
