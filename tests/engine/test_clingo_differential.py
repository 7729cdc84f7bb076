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
The node's ``assert_``/``retract``/``query`` path is fuzzed with the same cases
in ``tests/node/test_node_fuzz.py``.

600 seeded cases run by default (~15 s alone; each path is taken by well over a
tenth of them, which the test checks, and the seeds that ever failed are pinned in
``test_clingo_regressions.py``). Long mode:
``MERKLOG_FUZZ_CASES=20000`` runs 20,000 (``MERKLOG_LONG=1`` is the same);
``MERKLOG_FUZZ_START=N`` starts at seed N, so a long run can be split into
chunks run side by side. In long mode every failing seed is collected (not
only the first); each is shrunk (rules, literals and facts removed while it
still fails) and printed ready to paste into ``test_clingo_regressions.py``.
"""

from __future__ import annotations

import os

import pytest

from .clingo_check import check_case, run_seeds

START = int(os.environ.get("MERKLOG_FUZZ_START", "0"))
CASES = int(
    os.environ.get(
        "MERKLOG_FUZZ_CASES", "20000" if os.environ.get("MERKLOG_LONG") == "1" else "600"
    )
)
MIXED = True  # 1, 1.0, true, "1" and -0.0 together
MAX_REPORTED = 20  # failing seeds shrunk and printed before the run stops
LONG = CASES > 1_000


@pytest.mark.timeout(0 if LONG else 300)  # long mode runs for as long as it takes
def test_random_programs_match_clingo() -> None:
    stats = {"cases": 0, "rejected": 0, "columnar": 0, "eval": 0}
    failures = run_seeds(
        "clingo differential",
        range(START, START + CASES),
        lambda _seed, case, counts: check_case(case, counts),
        stats,
        mixed=MIXED,
        max_reported=MAX_REPORTED,
        progress_every=1000 if LONG else None,
    )
    if failures:
        pytest.fail(f"{len(failures)} failing seeds\n" + "\n\n".join(failures))
    assert stats["rejected"] < CASES // 10, stats
    assert stats["columnar"] > CASES // 10, stats
    assert stats["eval"] > CASES // 10, stats
