"""The one bulk GC pause (``merklog.store.gcpause``, ADR 0120): leaving it, the collector
is on again, the pause's survivors are not pending for a young collection, and cyclic
garbage is still collected; pauses nest, also across threads."""

from __future__ import annotations

import gc
import threading
import weakref

from merklog.store.gcpause import gc_paused


class _Node:
    other: object = None


def test_leaving_a_pause_promotes_survivors_without_losing_cycles() -> None:
    assert gc.isenabled()
    gc.collect()
    with gc_paused():
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
        with gc_paused(), gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_frozen_heap_stays_frozen_after_a_pause() -> None:
    kept = [[i] for i in range(1_000)]
    gc.freeze()  # as put and the CLI do before exit (ADR 0110)
    try:
        with gc_paused():
            pass
        with gc_paused(), gc_paused():
            pass
        assert gc.isenabled()
        # still in the permanent generation: in none of the three the collector scans
        # (the freeze count itself moves when other threads free frozen objects)
        kept_ids = {id(obj) for obj in kept}
        for generation in range(3):
            assert not kept_ids & {id(obj) for obj in gc.get_objects(generation)}
    finally:
        gc.unfreeze()
    assert len(kept) == 1_000


def test_pauses_nest_across_threads_the_last_to_end_resumes() -> None:
    """A bulk write on a worker thread and an epoch on the loop thread overlap: the first
    to end must not switch the collector back on under the other."""
    entered, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def worker() -> None:
        with gc_paused():
            entered.set()
            release.wait(10)
            seen.append(gc.isenabled())

    t = threading.Thread(target=worker)
    with gc_paused():
        t.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the worker's pause is still running
    release.set()
    t.join(10)
    assert seen == [False]
    assert gc.isenabled()
