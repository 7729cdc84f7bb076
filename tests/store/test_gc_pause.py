"""Leaving a bulk GC pause (ADR 0120): the collector is on again, the pause's survivors
are not pending for a young collection, and cyclic garbage is still collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from merklog.replication.txn import gc_paused as replica_gc_paused
from merklog.store.codec import gc_paused as store_gc_paused


class _Node:
    other: object = None


@pytest.mark.parametrize("pause", [store_gc_paused, replica_gc_paused])
def test_leaving_a_pause_promotes_survivors_without_losing_cycles(pause) -> None:
    assert gc.isenabled()
    gc.collect()
    with pause():
        assert not gc.isenabled()
        rows = [(i, str(i)) for i in range(50_000)]  # survivors of the bulk work
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle that becomes garbage inside the pause
        ref = weakref.ref(a)
        del a, b
    assert gc.isenabled()
    # The 100k+ allocations of the pause are not pending: no young collection over them.
    assert gc.get_count()[0] < 1_000
    assert gc.get_freeze_count() == 0  # nothing stays frozen
    assert ref() is not None  # not collected yet ...
    gc.collect()
    assert ref() is None  # ... but a full collection frees the cycle
    assert len(rows) == 50_000


def test_a_pause_inside_a_disabled_collector_leaves_it_disabled() -> None:
    gc.disable()
    try:
        with store_gc_paused(), replica_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_frozen_heap_stays_frozen_after_a_pause() -> None:
    kept = [[i] for i in range(1_000)]
    gc.freeze()  # as put and the CLI do before exit (ADR 0110)
    try:
        frozen = gc.get_freeze_count()
        with store_gc_paused():
            pass
        with replica_gc_paused():
            pass
        assert gc.get_freeze_count() == frozen and gc.isenabled()
    finally:
        gc.unfreeze()
    assert len(kept) == 1_000
