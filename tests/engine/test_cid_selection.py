"""CID selection edge cases shared by the batch evaluator's semantics."""

from __future__ import annotations

from merklog.engine import Program
from merklog.store import Fact, fact_cid


def test_cid_variable_also_used_as_argument_matches_nothing():
    # A fact cannot contain its own CID, so C := edge(C, _) selects nothing
    # (the variable must equal both the CID and the first argument).
    rels = Program.parse("self(C) :- C := edge(C, _).").evaluate({"edge": [(5, 6), (7, 8)]})
    assert rels["self"] == set()


def test_cid_variable_binds_the_fact_cid():
    rels = Program.parse("id(C, X) :- C := edge(X, _).").evaluate({"edge": [(5, 6)]})
    assert rels["id"] == {(fact_cid(Fact("edge", (5, 6))), 5)}
