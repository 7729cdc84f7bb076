"""``analyze`` runs merklog's int64 arithmetic: a Soufflé program, whose numbers wrap at
32 bits in ``merklog eval`` and in the node, is refused where it would differ."""

from __future__ import annotations

import pytest

from merklog.engine.errors import UnsupportedError
from merklog.engine.program import parse_text
from merklog.node.spark.analyze import strata_of

DECLS = """.decl edge(x: number, y: number)
.input edge
.decl pt(x: number, s: number)
.output pt
"""


def test_a_souffle_sum_is_refused_at_its_rule() -> None:
    """A ``sum`` over ``number`` wraps at 32 bits in eval and in the node (1 + 2^31 - 1
    + 5 gave -2147483644) but not in Spark (2147483652): analyze answered differently
    without a word. It is refused, at the rule that sums."""
    program = parse_text(
        DECLS + "pt(x, 0) :- edge(x, _).\npt(x, s) :- edge(x, _), s = sum y : edge(x, y).\n"
    )
    with pytest.raises(UnsupportedError, match="32-bit numbers") as err:
        strata_of(program)
    assert (err.value.line, err.value.col) == (6, 1)


def test_souffle_arithmetic_is_refused_at_the_rule_that_computes() -> None:
    program = parse_text(DECLS + "pt(x, y) :- edge(x, y).\npt(x, y + 1) :- edge(x, y).\n")
    with pytest.raises(UnsupportedError, match="32-bit numbers") as err:
        strata_of(program)
    assert err.value.line == 6  # was always the first rule's position


def test_a_souffle_program_without_sums_or_arithmetic_runs() -> None:
    program = parse_text(DECLS + "pt(x, y) :- edge(x, y).\n")
    assert strata_of(program)
