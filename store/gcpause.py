"""The one way merklog pauses CPython's cyclic garbage collector around bulk work.

Encoding, storing or evaluating a million facts allocates millions of small tracked
objects (tuples, Links, lists) and no cycles among them; with the collector running,
every allocation burst triggers young collections, and every few of those a pass over
the ever-growing older generations, which costs as much as the work itself. Reference
counting still frees everything promptly while the collector is paused.

The pause is process-wide and re-entrant across threads: the collector is switched
off by the first pause to begin and back on by the last to end, and only if it was on
when the first began (a collector the user disabled stays disabled).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_guard = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for the ``with`` block (nestable, thread-safe)."""
    global _depth, _was_enabled
    with _guard:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _guard:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                resume_gc()


def resume_gc() -> None:
    """Re-enable the cyclic collector after a bulk pause, with the objects that survived
    the pause moved to the oldest generation unscanned (``gc.freeze`` then
    ``gc.unfreeze``: two O(1) list splices, and the allocation counter reset).

    ``gc.enable()`` alone left the pause's allocation count pending, so the next
    allocation started a young collection over every survivor (a 200k-fact request's
    rows), and the promotions it made brought full collections sooner: 4% of a running
    node's CPU under ``put -f`` of 1M facts (py-spy, ADR 0120). Nothing is frozen for
    good: the next full collection scans (and frees) them as usual. A heap someone froze
    on purpose (``put`` and the CLI freeze theirs before exit, ADR 0110) stays frozen:
    then this is the plain ``gc.enable()``."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
    gc.enable()
