"""analyze follows the engine's rule for which equality binds a variable (ADR 0208):
the repros of tests/engine/test_equality_binding.py give the same exact answers."""

from __future__ import annotations

import pytest

from merklog.engine.parser import parse_program
from merklog.node.spark.analyze import evaluate, relations_from_rows

from ..engine.test_equality_binding import CASES, typed

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(("text", "facts", "want"), CASES)
def test_analyze_gives_the_rules_answer(spark, text: str, facts: dict, want: set) -> None:
    result = evaluate(spark, parse_program(text), relations_from_rows(spark, facts))
    assert typed(result.rows("r")) == want
