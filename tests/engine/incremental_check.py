"""One comparison for the incremental engine's tests: every relation equals a fresh batch
evaluation of the same program over the same base facts (engine form, so ``1``, ``1.0``
and ``true`` stay apart)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from merklog.engine.batch import BatchEvaluator
from merklog.engine.incremental import IncrementalEngine


def assert_matches_batch(
    engine: IncrementalEngine, base: dict[str, set[tuple]], checked, rels: Iterable[str]
) -> None:
    strata = [list(s.rules) for s in checked.strata if not s.temporal]
    reference = BatchEvaluator(checked.program.rules, strata=strata).evaluate(base)
    for rel in rels:
        want = reference.engine(rel) if rel in reference else set()
        assert engine.relation(rel).engine == want, (rel, engine.relation(rel).engine ^ want)


#: Group keys of the aggregation tests: ``0``/``False``, ``1``/``1.0``/``true``/``"1"``/
#: ``x"01"`` must stay apart as groups.
KEYS = [0, 1, 1.0, True, False, "1", b"\x01", 2, 0.5, "a", -3]
#: Summed values beside ints: floats, bools, strings, bytes, -0.0 and the int64 edges.
MIXED = [1, 1.0, True, "1", b"\x01", 0.5, -0.0, 2**62, -(2**63), 7]
#: Magnitudes near the int64 bound, so that sums overflow and come back.
BIG = [2**62, 2**63 - 1]


def summed_value(
    rng: random.Random, kind: str, *, mixed: Sequence[object] = MIXED, small: bool = False
) -> object:
    """A value to sum: for ``kind`` "mixed" one of ``mixed`` or an int, float or string
    twin of a random int; for "big" an int near the int64 bounds; else a random int
    (with ``small``, often 1 or 0, so that sums can equal counts)."""
    i = rng.randrange(-1000, 1000)
    if kind == "mixed" and rng.random() < 0.5:
        return rng.choice(mixed)
    if kind == "mixed":
        return rng.choice([i, float(i), str(i)])
    if kind == "big":
        return rng.choice(BIG) - abs(i) if rng.random() < 0.5 else -rng.choice(BIG) + abs(i)
    return rng.choice([i, 1, 0]) if small else i


def ops_of(engine: IncrementalEngine, kind: type) -> list[Any]:
    """The operators of class ``kind`` in ``engine``'s circuit (to assert a path ran)."""
    return [n.op for n in engine.circuit.nodes if isinstance(getattr(n, "op", None), kind)]
