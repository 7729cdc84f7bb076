"""Shrunk failures of the clingo differential fuzzer (test_clingo_differential.py),
each kept as a regression test: the case must agree with clingo on every path."""

from __future__ import annotations

from .clingo_check import check_case
from .clingo_fuzz import Case, Rows


def agree(kinds: dict, rules: list[tuple[str, str]], epochs: list[tuple[dict, dict]]) -> None:
    """Rules as (merklog, clingo) pairs; epochs as (inserts, deletes) of row lists
    (lists, not sets: a set literal would merge (1,), (1.0,) and (True,))."""
    rows = [
        ({r: Rows(v) for r, v in ins.items()}, {r: Rows(v) for r, v in dels.items()})
        for ins, dels in epochs
    ]
    case = Case(kinds, [m for m, _c in rules], [c for _m, c in rules], rows)
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


def test_seed_19_mixed_values() -> None:
    """Mixed-value case shrunk by the fuzzer (batch epoch 0 p1 disagreed with clingo)."""
    kinds = {
        "a": ["M", "M"],
        "b": ["M", "I"],
        "c": ["M"],
        "p0": ["M"],
        "p1": ["M", "M"],
        "p2": ["M"],
        "p3": ["I", "I"],
    }
    rules = [
        ("p1(V1, V1) :- c(V1), !a(V1, 1.0).", 'r_p1(V1,V1) :- r_c(V1), not r_a(V1,(1,2,1,"")).')
    ]
    agree(kinds, rules, [({'a': [(True, True)], 'b': [], 'c': [(True,)]}, {})])  # fmt: skip


def test_seed_23_mixed_values() -> None:
    """Mixed-value case shrunk by the fuzzer (incremental epoch 1 p2 disagreed with clingo)."""
    kinds = {
        "a": ["M", "I"],
        "b": ["I", "M"],
        "c": ["M"],
        "p0": ["I"],
        "p1": ["I", "I"],
        "p2": ["M"],
        "p3": ["I", "M"],
    }
    rules = [("p2(V1) :- c(V1).", "r_p2(V1) :- r_c(V1).")]
    agree(kinds, rules, [({'a': [], 'b': [], 'c': [(False,)]}, {}), ({'b': [], 'c': [(0.0,)]}, {'c': [(False,)]})])  # fmt: skip


def test_seed_50_mixed_values() -> None:
    """Mixed-value case shrunk by the fuzzer (incremental epoch 1 p0 disagreed with clingo)."""
    kinds = {
        "a": ["I", "I"],
        "b": ["I", "M"],
        "c": ["I"],
        "p0": ["M", "I"],
        "p1": ["I"],
        "p2": ["M", "I"],
        "p3": ["M"],
    }
    rules = [
        ("p0(-0.0, V1) :- a(V1, V1), c(V1).", 'r_p0((1,0,1,""),V1) :- r_a(V1,V1), r_c(V1).'),
        ("p0(false, V1) :- a(2, V1), !c(V1).", 'r_p0((0,0,0,""),V1) :- r_a(2,V1), not r_c(V1).'),
    ]
    agree(kinds, rules, [({'a': [(2, 2)], 'b': [], 'c': [(2,)]}, {}), ({'b': [], 'c': []}, {'a': [], 'b': [], 'c': [(2,)]})])  # fmt: skip


def test_seed_68_mixed_values() -> None:
    """Mixed-value case shrunk by the fuzzer (incremental epoch 1 p0 disagreed with clingo)."""
    kinds = {
        "a": ["M", "M"],
        "b": ["M", "I"],
        "c": ["I"],
        "p0": ["M"],
        "p1": ["M"],
        "p2": ["I"],
        "p3": ["I"],
    }
    rules = [("p0(V1) :- b(V1, V2), c(V3).", "r_p0(V1) :- r_b(V1,V2), r_c(V3).")]
    agree(kinds, rules, [({'a': [], 'b': [(1.0, 1), (2.0, 0)], 'c': []}, {}), ({'a': [], 'b': [(1, 3)], 'c': [(2,)]}, {'b': [], 'c': []})])  # fmt: skip


def test_seed_69_mixed_values() -> None:
    """Mixed-value case shrunk by the fuzzer (batch epoch 0 p1 disagreed with clingo)."""
    kinds = {
        "a": ["M", "M"],
        "b": ["M", "M"],
        "c": ["M"],
        "p0": ["M", "I"],
        "p1": ["M", "I"],
        "p2": ["M", "I"],
        "p3": ["I"],
    }
    rules = [("p1(1, -1) :- a(1, _).", 'r_p1((1,2,0,""),-1) :- r_a((1,2,0,""),_).')]
    agree(kinds, rules, [({'a': [(True, 1)], 'b': [], 'c': []}, {})])  # fmt: skip


def test_seed_94_mixed_values() -> None:
    """Mixed-value case shrunk by the fuzzer (batch epoch 0 p1 disagreed with clingo)."""
    kinds = {
        "a": ["M", "M"],
        "b": ["M", "I"],
        "c": ["M"],
        "p0": ["M"],
        "p1": ["M", "M"],
        "p2": ["I"],
        "p3": ["M", "I"],
    }
    rules = [("p1(V1, V1) :- a(true, V1).", 'r_p1(V1,V1) :- r_a((0,1,0,""),V1).')]
    agree(kinds, rules, [({'a': [(1, 2.5)], 'b': [], 'c': []}, {})])  # fmt: skip


def test_seed_98_mixed_values() -> None:
    """Mixed-value case shrunk by the fuzzer (batch epoch 0 p1 disagreed with clingo)."""
    kinds = {
        "a": ["I", "M"],
        "b": ["I", "M"],
        "c": ["I"],
        "p0": ["I", "I"],
        "p1": ["M", "M"],
        "p2": ["M"],
        "p3": ["I"],
    }
    rules = [("p1(V2, V2) :- a(V1, V2), b(V3, V2).", "r_p1(V2,V2) :- r_a(V1,V2), r_b(V3,V2).")]
    agree(kinds, rules, [({'a': [(2, 0)], 'b': [(1, 0.0)], 'c': []}, {})])  # fmt: skip


def test_seed_106_mixed_values() -> None:
    """Mixed-value case shrunk by the fuzzer (batch epoch 0 p2 disagreed with clingo)."""
    kinds = {
        "a": ["M", "M"],
        "b": ["M", "M"],
        "c": ["I"],
        "p0": ["M", "M"],
        "p1": ["I"],
        "p2": ["M", "M"],
        "p3": ["I", "M"],
    }
    rules = [("p2(V1, V1) :- b(V1, V1).", "r_p2(V1,V1) :- r_b(V1,V1).")]
    agree(kinds, rules, [({'a': [], 'b': [(0, False)], 'c': []}, {})])  # fmt: skip
