"""``merklog.node.factplace``: the place in an input text of a fact refused after it
parsed, found by value identity (``p(1)``, ``p(1.0)``, ``p(true)``, ``p("1")`` and
``p(x"01")`` are five facts)."""

from __future__ import annotations

import pytest

from merklog.node.factplace import place_of
from merklog.store import Fact

MIXED = 'p(1).\np(1.0).\n\np(true).\np("1").\n'


@pytest.mark.parametrize(
    ("value", "place"),
    [(1, (1, 1)), (1.0, (2, 1)), (True, (4, 1)), ("1", (5, 1))],
    ids=["int", "float", "bool", "str"],
)
def test_each_value_is_found_on_its_own_line(value: object, place: tuple[int, int]) -> None:
    assert place_of(MIXED, Fact("p", (value,))) == place


def test_clauses_the_parser_reads_are_found_at_their_column() -> None:
    text = '% values\np(x"01"). p(1). p(-0.0).\n  q(2, "a").\n'
    assert place_of(text, Fact("p", (b"\x01",))) == (2, 1)
    assert place_of(text, Fact("p", (1,))) == (2, 11)
    assert place_of(text, Fact("p", (0.0,))) == (2, 17)  # -0.0 is stored as 0.0
    assert place_of(text, Fact("q", (2, "a"))) == (3, 3)


def test_a_fact_not_in_the_text_has_no_place() -> None:
    assert place_of(MIXED, Fact("p", (2,))) is None
    assert place_of(MIXED, Fact("p", (b"1",))) is None
    assert place_of(MIXED, Fact("p", (1, 1))) is None
    assert place_of("p(1", Fact("p", (1,))) is None  # no longer parses: no place
