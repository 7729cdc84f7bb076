"""Spark ``analyze`` walks the engine's plans (merklog.engine.planner): existence checks
and arithmetic arguments give the local engine's answers."""

from __future__ import annotations

from merklog.engine import Program
from merklog.engine.parser import parse_program
from merklog.node.spark.analyze import evaluate, relations_from_rows


def test_analyze_existence_checks_and_arithmetic_arguments_match_the_engine(spark):
    base = {
        "f": {(i,) for i in range(40)},
        "a": {()},
        "c": {(i, i + 1, i + 2) for i in range(300)},
        "d": {(i,) for i in range(300)},
        "choose": {(4, 2, 10), (5, 2, 11), (6, 3, 12), (8, 3, 15)},
        "e": {(i, i + 1) for i in range(6)},
    }
    text = """
        r(X) :- f(X), a(), c(_, _, _), d(_).
        none(X) :- f(X), missing(_).
        half(N, C) :- choose(2 * N, N, C).
        p(X, Y) :- e(X, Y).
        p(X, Z) :- p(X, Y), e(Y, Z), d(_).
    """
    program = parse_program(text)
    expected = Program.parse(text).evaluate(base)
    result = evaluate(spark, program, relations_from_rows(spark, base))
    for rel in ("r", "half", "p"):
        assert result.rows(rel) == set(expected[rel]), rel
    assert result.rows("r") == base["f"]
    assert result.rows("half") == {(2, 10), (3, 12)}
    assert result.rows("none") == set()
