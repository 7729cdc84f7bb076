"""Stopping an evaluation from another thread, between two fixpoint rounds.

A recursive stratum can take many rounds (a transitive closure over a long chain, a
recursion that computes values until :data:`~.errors.MAX_FIXPOINT_ITERATIONS`): a node
closing while such an epoch ran waited for it to end, 8-15 s where the Python API
promises about two. The caller runs the evaluation inside :func:`interruptible` with
an event; every evaluator calls :func:`check` once per round, which raises
:class:`~.errors.EvaluationInterrupted` once the event is set. The event is the calling
thread's (evaluations run on the thread that asks for them), so two nodes in one
process do not stop each other's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import EvaluationInterrupted

_local = threading.local()


@contextmanager
def interruptible(event: threading.Event) -> Iterator[None]:
    """Evaluations run on this thread inside the block stop at their next round once
    ``event`` is set."""
    previous = getattr(_local, "event", None)
    _local.event = event
    try:
        yield
    finally:
        _local.event = previous


def check() -> None:
    """Raise :class:`EvaluationInterrupted` if this thread's evaluation was asked to
    stop (see :func:`interruptible`); cheap enough for every round."""
    event = getattr(_local, "event", None)
    if event is not None and event.is_set():
        raise EvaluationInterrupted("the evaluation was stopped: its node is closing")


__all__ = ["check", "interruptible"]
