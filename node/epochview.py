"""What a node's reads answer from: the last epoch that completed.

An epoch is evaluated first and published after (ADR 0205). Until it is published,
queries, ``relation``, status and the arity check of a query read the epoch before
it: an :class:`EpochView`, which names that epoch's number, the program runner whose
published state is that epoch's, and the arities and number of the stored facts it
evaluated (:class:`FactShape`). A read holds the epoch driver's view lock while it
reads (:meth:`~.epoch.EpochDriver.reading`); an epoch takes that lock only to
publish, which costs in proportion to its changes. So a read never waits for an
evaluation, and never sees half of one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Row = tuple


class FactShape:
    """How many stored facts an epoch evaluated, by relation and arity.

    Kept in step with the epochs' net changes (:meth:`updated`: work in proportion to
    them), so that a read needs neither the node's EDB, which the next epoch changes
    while it evaluates, nor a pass over its relations. Immutable: an update is a new
    shape that shares the relations it leaves alone.
    """

    __slots__ = ("_counts", "total")

    def __init__(self, counts: Mapping[str, Mapping[int, int]] | None = None) -> None:
        self._counts: dict[str, dict[int, int]] = {
            rel: dict(by_arity) for rel, by_arity in (counts or {}).items() if by_arity
        }
        #: Number of stored facts (every relation, every arity).
        self.total = sum(n for by_arity in self._counts.values() for n in by_arity.values())

    def arities(self, rel: str) -> set[int]:
        """The arities the stored facts of ``rel`` have (empty when it has none)."""
        return set(self._counts.get(rel, ()))

    def relations(self) -> list[str]:
        """The relations the stored facts have (each with at least one fact)."""
        return list(self._counts)

    def updated(
        self, inserts: Mapping[str, list[Row]], deletes: Mapping[str, list[Row]]
    ) -> FactShape:
        """The shape after an epoch's net changes (new rows and rows gone, by relation:
        what :meth:`.edb.Edb.apply` answers)."""
        if not inserts and not deletes:
            return self
        out = FactShape.__new__(FactShape)
        counts = dict(self._counts)
        total = self.total
        for rel in inserts.keys() | deletes.keys():
            by_arity = Counter(counts.get(rel, {}))
            added = Counter(map(len, inserts.get(rel, ())))
            gone = Counter(map(len, deletes.get(rel, ())))
            total += added.total() - gone.total()
            by_arity.update(added)
            by_arity.subtract(gone)
            kept = {arity: n for arity, n in by_arity.items() if n > 0}
            if kept:
                counts[rel] = kept
            else:
                counts.pop(rel, None)
        out._counts = counts
        out.total = total
        return out


@dataclass(frozen=True)
class EpochView:
    """The last completed epoch as reads see it."""

    #: Its number: the ``epoch`` of an answer read from it.
    epoch: int
    #: The program runner (:class:`~.programs.ProgramRunner`) whose published state is
    #: that epoch's: during a program load, the program before it.
    engine: Any
    #: The stored facts it evaluated.
    facts: FactShape
