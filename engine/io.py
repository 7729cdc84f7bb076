"""Sources and sinks: how tuples enter and leave an evaluation epoch by epoch.

A *source* introduces tuples at the start of each epoch (as a delta: inserts
and deletes), a *sink* receives the derived tuples at its end (the Dedalus
model of time, Alvaro et al., "Dedalus: Datalog in Time and Space", 2011).
Both are small Python protocols so the node can plug in replicated facts,
inbox messages, live-query subscribers or user callbacks.

Fact files (``<rel>.facts`` in, ``<rel>.csv`` out) live in :mod:`merklog.engine.tsv`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from merklog.store import Fact

if TYPE_CHECKING:
    from .program import EpochResult

Row = tuple[Any, ...]


@runtime_checkable
class Source(Protocol):
    """Introduces tuples at the start of each epoch."""

    def poll(self, epoch: int) -> tuple[Iterable[Fact], Iterable[Fact]]:
        """``(inserts, deletes)`` to apply to the source's persistent EDB at ``epoch``."""
        ...


@runtime_checkable
class Sink(Protocol):
    """Receives each epoch's outcome (relations, deltas, @async outbox) at its end."""

    def emit(self, result: EpochResult) -> None:
        """Called once per epoch, after every stratum reached its fixpoint."""
        ...


class ListSource:
    """A source replaying a fixed list of ``(inserts, deletes)`` per epoch (tests, scripts)."""

    def __init__(self, changes: Sequence[tuple[Iterable[Fact], Iterable[Fact]]]) -> None:
        self.changes = [(list(ins), list(dels)) for ins, dels in changes]

    def poll(self, epoch: int) -> tuple[Iterable[Fact], Iterable[Fact]]:
        if epoch < len(self.changes):
            return self.changes[epoch]
        return (), ()


class CollectingSink:
    """A sink that keeps every epoch result it receives, in order."""

    def __init__(self) -> None:
        self.results: list[EpochResult] = []

    def emit(self, result: EpochResult) -> None:
        self.results.append(result)


class CallbackSink:
    """A sink calling ``fn(result)`` at the end of each epoch."""

    def __init__(self, fn: Callable[[EpochResult], None]) -> None:
        self.fn = fn

    def emit(self, result: EpochResult) -> None:
        self.fn(result)
