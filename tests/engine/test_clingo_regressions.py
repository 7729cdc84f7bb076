"""Shrunk failures of the clingo differential fuzzer (test_clingo_differential.py),
each kept as a regression test: the case must agree with clingo on every path."""

from __future__ import annotations

from .clingo_check import check_case
from .clingo_fuzz import Case


def agree(kinds: dict, rules: list[tuple[str, str]], epochs: list[tuple[dict, dict]]) -> None:
    case = Case(kinds, [m for m, _c in rules], [c for _m, c in rules], epochs)
    stats = {"cases": 0, "rejected": 0, "columnar": 0, "eval": 0}
    assert check_case(case, stats) is None
    assert stats["rejected"] == 0


KINDS = {"a": ["M", "M"], "b": ["I", "M"], "c": ["M"], "p0": ["M", "M"], "p1": ["I"]}
KINDS |= {"p2": ["M", "I"], "p3": ["M"]}


def test_seed_351_count_over_a_ground_atom_in_the_columnar_executor() -> None:
    """IndexError in engine/columnar.py: an aggregate body without variables."""
    rules = [('p1(-1) :- a(V1, _), V2 := count : c("a").',
              'r_p1(-1) :- r_a(V1,_), V2 = #count{ 0 : r_c((2,0,0,"a")) }.')]  # fmt: skip
    agree(KINDS, rules, [({"a": {("b", "b")}, "b": set(), "c": {("a",)}}, {})])
