"""Large epochs (bulk loads, mass retractions) through the incremental engine.

An epoch of at least :data:`~merklog.engine.incremental.GC_PAUSE_ROWS` rows runs
with the cyclic collector paused; these tests check that such epochs give the
same relations as a fresh batch evaluation after every epoch, over mixed-type
values (``1``, ``1.0``, ``true``, ``"1"``, ``x"01"`` are five values), and that
the collector's state is restored afterwards, also when the epoch fails.
"""

from __future__ import annotations

import gc
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine.errors import EngineError
from merklog.engine.incremental import GC_PAUSE_ROWS, IncrementalEngine
from merklog.engine.program import Program
from merklog.engine.values import row_to_engine

from .incremental_check import assert_matches_batch

TEXT = """
seen(V) :- p(_, V).
stats(G, C, S) :- grp(G), C := count : p(G, _), S := sum V : p(G, V).
low(G, M) :- grp(G), M := min V : p(G, V).
lonely(G) :- grp(G), !p(G, 1).
pair(V, W) :- p(G, V), q(G, W).
"""

MIXED = [1, 1.0, True, False, "1", b"\x01", 0, 0.5, -3, "a", 2**40]
RELS = ("seen", "stats", "low", "lonely", "pair", "p", "q", "grp")


def _value(rng: random.Random) -> object:
    """A value of a mixed-type domain large enough that epochs hold tens of thousands of
    distinct rows, with the colliding-under-``==`` values among them."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.choice(MIXED)
    i = rng.randrange(50_000)
    return i if kind == 1 else (float(i) if kind == 2 else str(i))


def _rows(rng: random.Random, n: int, groups: int) -> set[tuple]:
    """At least ``n`` random rows in engine form: a Python set of raw rows would merge
    p(0, 1), p(0, 1.0) and p(0, true)."""
    out: set[tuple] = set()
    while len(out) < n:
        out.add(row_to_engine((rng.randrange(groups), _value(rng))))
    return out


def _check(engine: IncrementalEngine, base: dict[str, set[tuple]], checked) -> None:
    assert_matches_batch(engine, base, checked, RELS)


# Each example is four epochs of up to GC_PAUSE_ROWS + 5,000 rows, each checked against
# a fresh batch run (~4 s on a loaded machine): 2 in CI, 6 in long mode.
@settings(max_examples=6 if os.environ.get("MERKLOG_LONG") == "1" else 2, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 40))
def test_large_epochs_equal_a_fresh_batch_run(seed: int, groups: int) -> None:
    rng = random.Random(seed)
    checked = Program.parse(TEXT).checked
    engine = IncrementalEngine(checked)
    base: dict[str, set[tuple]] = {"grp": {(g,) for g in range(groups)}, "p": set(), "q": set()}
    base["q"] = {row_to_engine((g, rng.choice(MIXED))) for g in range(groups)}
    # One bulk epoch above the pause threshold, then large and small mixed epochs.
    first = _rows(rng, GC_PAUSE_ROWS + 5_000, groups)
    base["p"] |= first
    engine.step(inserts={"grp": list(base["grp"]), "q": list(base["q"]), "p": list(first)})
    assert gc.isenabled()
    _check(engine, base, checked)
    for size in (GC_PAUSE_ROWS, 7, GC_PAUSE_ROWS + 1):
        gone = set(rng.sample(sorted(base["p"], key=repr), min(size, len(base["p"]))))
        new = _rows(rng, size, groups)
        base["p"] = (base["p"] - gone) | new
        engine.step(deletes={"p": list(gone)}, inserts={"p": list(new)})
        assert gc.isenabled()
        _check(engine, base, checked)


def test_a_failing_large_epoch_restores_the_collector() -> None:
    engine = IncrementalEngine(Program.parse("q(X) :- p(X), X > 0.").checked)

    class Boom(EngineError):
        pass

    class Rows(list):
        """A sized batch whose iteration fails half-way (a source gone bad)."""

        def __iter__(self):
            yield (1,)
            raise Boom("source failed")

    assert gc.isenabled()
    with pytest.raises(Boom):
        engine.step(inserts={"p": Rows([(i,) for i in range(GC_PAUSE_ROWS)])})
    assert gc.isenabled()


def test_a_small_epoch_leaves_a_disabled_collector_disabled() -> None:
    engine = IncrementalEngine(Program.parse("q(X) :- p(X).").checked)
    gc.disable()
    try:
        engine.step(inserts={"p": [(i,) for i in range(GC_PAUSE_ROWS)]})
        assert not gc.isenabled()
        assert engine.count("q") == GC_PAUSE_ROWS
    finally:
        gc.enable()
