"""One comparison for the incremental engine's tests: every relation equals a fresh batch
evaluation of the same program over the same base facts (engine form, so ``1``, ``1.0``
and ``true`` stay apart)."""

from __future__ import annotations

from collections.abc import Iterable

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
