"""Differential fuzzing against clingo: random stratified programs give clingo's answer
through every merklog evaluation path.

Each case (see :mod:`tests.engine.clingo_fuzz` for the generator, the value
encoding and the restrictions where clingo's semantics differ) is evaluated by
clingo (the oracle: a stratified program has exactly one stable model) and by
merklog's batch evaluator (tuple backend), the columnar executor forced on
(skipped for strata it does not implement: it raises ``Ineligible``), the
incremental engine over random insert/delete epochs (compared after every
epoch with a fresh batch run and with clingo), and ``merklog eval`` from fact
files to CSV files (for cases whose values round-trip through untyped TSV).

1,000 seeded cases run by default (about a minute); ``MERKLOG_LONG=1`` runs
20,000. A failing seed is shrunk (rules, literals and facts removed while it
still fails) and printed ready to paste into ``test_clingo_regressions.py``.
"""

from __future__ import annotations

import os

import pytest

from .clingo_check import check_case, shrink
from .clingo_fuzz import Generator

CASES = 20_000 if os.environ.get("MERKLOG_LONG") == "1" else 1_000
MIXED = True  # 1, 1.0, true, "1" and -0.0 together


def test_random_programs_match_clingo() -> None:
    stats = {"cases": 0, "rejected": 0, "columnar": 0, "eval": 0}
    for seed in range(CASES):
        case = Generator(seed, MIXED).case()
        failure = check_case(case, stats)
        if failure is not None:
            small = shrink(case, failure)
            pytest.fail(f"seed {seed}: {failure}\nshrunk case:\n{small.describe()}")
    assert stats["rejected"] < CASES // 10, stats
    assert stats["columnar"] > CASES // 10, stats
    assert stats["eval"] > CASES // 10, stats
