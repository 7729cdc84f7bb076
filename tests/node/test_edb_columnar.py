"""An all-int relation stays columnar in the node's EDB across changes (ADR 0103): its
int64 matrix plus an overlay of rows added and removed, membership of a change's rows
answered through the matrix's hash index. Rows with ``1.0``, ``true``, ``"1"`` or
``x"01"`` never enter the matrix, so value identity holds.

Each example opens a real home whose ``p`` and ``r`` facts are all ints (read back as
int64 matrices), then runs epochs of mixed-type inserts and deletes — several writes
per epoch, so a row may come and go within one — and after each epoch compares every
relation with a fresh batch evaluation of the facts then stored."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merklog.engine.arraybase import ArrayBase
from merklog.engine.program import Program
from merklog.engine.values import row_to_engine
from merklog.node import edb as edb_module
from merklog.node.edb import Edb
from merklog.node.node import Node
from merklog.store import Fact

PROGRAM = """
q(X, Y) :- p(X, Y), !r(X).
c(N) :- N := count : p(_, _).
s(X, T) :- r(X), T := sum Y : p(X, Y).
w(X) :- p(X, _), X == 1.
o(X) :- p(X, X).
"""
DERIVED = ("q", "c", "s", "w", "o")

#: Values Python calls equal or alike, beside plain ints and int64's largest.
ODD = [1.0, True, False, "1", b"\x01", -0.5, 2**63 - 1]
value = st.one_of(st.integers(-3, 3), st.sampled_from(ODD))
int_value = st.integers(-3, 3)
row = st.tuples(value, value)
#: An epoch: writes, each an (assert?, relation, row) change.
change = st.tuples(st.booleans(), st.sampled_from(["p", "p", "r"]), row)
epochs = st.lists(st.lists(change, min_size=1, max_size=6), min_size=1, max_size=4)
initial = st.lists(st.tuples(int_value, int_value), min_size=1, max_size=30)


def _expected(facts: list[tuple[str, tuple]]) -> dict[str, set[tuple]]:
    grouped: dict[str, list[tuple]] = {"p": [], "r": []}
    for rel, args in facts:
        grouped[rel].append(args)
    got = Program.parse(PROGRAM).evaluate(grouped)
    return {rel: set(got.engine(rel)) if rel in got else set() for rel in DERIVED}


def _key(rel: str, args: tuple) -> tuple[str, tuple]:
    return rel, row_to_engine(args)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=initial, epochs=epochs)
def test_mixed_changes_on_an_int_relation_match_a_batch_evaluation(
    initial: list[tuple[int, int]], epochs: list[list[tuple[bool, str, tuple]]]
) -> None:
    plain: dict[tuple[str, tuple], tuple[str, tuple]] = {}  # engine key -> plain fact
    for args in initial:
        plain[_key("p", args)] = ("p", args)
        plain[_key("r", args[:1])] = ("r", args[:1])
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "h"
        with Node.open(home) as node:
            node.write(list(plain.values()))
            node.load_program(PROGRAM, "p.dl")
        with Node.open(home) as node:
            node.epochs.ready()  # the first epoch reads the stored facts (ADR 0154)
            held = node.epochs.edb.base()
            assert isinstance(held["p"], np.ndarray) and held["p"].dtype == np.int64
            int_only = True
            for epoch in epochs:
                for insert, rel, args in epoch:
                    args = args[:1] if rel == "r" else args
                    key = _key(rel, args)
                    if insert:
                        node.write([(rel, args)])
                        plain[key] = (rel, args)
                        if rel == "p" and set(map(type, args)) != {int}:
                            int_only = False
                    elif key in plain:
                        node.write([], [(rel, args)])
                        del plain[key]
                node.run_epoch()
                want = _expected(list(plain.values()))  # a list: a set would merge 1 and 1.0
                for rel in DERIVED:
                    assert node.relation(rel) == want[rel], (rel, epoch)
                stored = {_key(rel, args) for rel, args in plain.values()}
                assert {("p", r) for r in node.relation("p")} | {
                    ("r", r) for r in node.relation("r")
                } == stored
                if int_only and any(rel == "p" for rel, _ in plain.values()):
                    # every p fact an int64: the EDB still hands the engine a matrix
                    assert isinstance(node.epochs.edb.base()["p"], np.ndarray)


def test_a_float_beside_int_rows_is_a_new_row_and_the_relation_leaves_the_matrix(
    tmp_path: Path,
) -> None:
    home = tmp_path / "h"
    with Node.open(home) as node:
        node.write([("p", (i, i)) for i in range(50)] + [("r", (1,))])
        node.load_program(PROGRAM, "p.dl")
    with Node.open(home) as node:
        node.write([("p", (1, 7)), ("p", (-4, -4))], [("p", (2, 2))])
        node.run_epoch()
        held = node.epochs.edb.base()
        assert isinstance(held["p"], np.ndarray) and len(held["p"]) == 51
        assert node.relation("o") == {(i,) for i in range(50) if i != 2} | {(-4,)}
        node.write([("p", (1.0, 1.0)), ("p", (True, True))], [("p", (1, 1))])
        node.run_epoch()
        assert not isinstance(node.epochs.edb.base()["p"], np.ndarray)
        o = node.relation("o")
        assert len(o) == 51 and (1,) not in o
        assert {r for r in o if type(r[0]) is not int} == {
            row_to_engine((1.0,)),
            row_to_engine((True,)),
        }
        assert node.query("c(N)").rows == [(52,)]
        # p(1, 7) is still there: w holds 1 and 1.0 (== compares numbers exactly), not true
        assert sorted(map(repr, node.relation("w"))) == ["(1,)", "(Float(1.0),)"]


def test_a_grown_overlay_is_folded_into_a_new_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edb_module, "FOLD_FROM", 3)
    edb = Edb({"p": np.arange(20, dtype=np.int64).reshape(10, 2)})  # rows (0,1) .. (18,19)
    model = {(2 * i, 2 * i + 1) for i in range(10)}
    # a row added then removed in one batch, a removal then a re-add: net nothing
    changes = [((100, 101), 1), ((100, 101), -1), ((0, 1), -1), ((0, 1), 1)]
    changes += [((2, 3), -1), ((4, 5), -1), ((-1, -1), 1), ((7, 7), 1), ((8, 9), 1)]
    inserts, deletes = edb.apply((Fact("p", args), w) for args, w in changes)
    assert inserts == {"p": [(-1, -1), (7, 7)]} and deletes == {"p": [(2, 3), (4, 5)]}
    model = (model - {(2, 3), (4, 5)}) | {(-1, -1), (7, 7)}
    held = edb.base()["p"]
    assert isinstance(held, np.ndarray) and set(map(tuple, held.tolist())) == model
    assert len(held) == len(model)  # distinct rows
    # four overlay rows > FOLD_FROM: folded in apply, so base() hands over the stored matrix
    assert edb.base()["p"] is held
    edb.apply([(Fact("p", (1.0, 1)), 1), (Fact("p", (True, 3)), 1)])
    assert edb.arities("p") == {2}
    # rows with a float and a bool never enter the matrix: the relation becomes a set
    mixed = edb.base()["p"]
    assert not isinstance(mixed, np.ndarray)
    assert mixed == model | {row_to_engine((1.0, 1)), row_to_engine((True, 3))}
    assert (1, 1) not in mixed and (6, 7) in mixed


def test_folded_drops_removed_rows_and_refuses_non_int_rows() -> None:
    base = ArrayBase(np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int64))
    assert base.folded() is base.matrix
    base.remove_present([(3, 4)])
    base.add_new([(2**63 - 1, -(2**63))])
    assert sorted(map(tuple, base.folded().tolist())) == [(1, 2), (5, 6), (2**63 - 1, -(2**63))]
    base.add_new([row_to_engine((1.0, 2))])
    assert base.folded() is None


def test_the_fact_shape_reads_see_follows_the_edb() -> None:
    """What reads know of the stored facts (ADR 0205), kept from each epoch's net
    changes, is what the EDB holds: its arities per relation (one going when its last
    fact goes, a matrix relation gaining a float row) and its number of facts."""
    from merklog.node.epochview import FactShape

    edb = Edb({"p": np.arange(20, dtype=np.int64).reshape(10, 2), "s": {("a",), ("b", 1)}})
    shape = FactShape(edb.arity_counts())
    batches = [
        [(Fact("p", (0, 1)), -1), (Fact("p", (1.0, 1)), 1), (Fact("p", (5,)), 1)],
        [(Fact("s", ("b", 1)), -1), (Fact("t", ()), 1), (Fact("p", (5,)), -1)],
        [(Fact("p", (2, 3)), -1), (Fact("p", (2, 3)), 1), (Fact("t", ()), -1)],
    ]
    for changes in batches:
        shape = shape.updated(*edb.apply(changes))
        fresh = FactShape(edb.arity_counts())
        for rel in ("p", "s", "t", "none"):
            assert shape.arities(rel) == fresh.arities(rel) == edb.arities(rel), rel
        assert shape.total == fresh.total == len(edb)
    assert (shape.arities("p"), shape.arities("s"), shape.arities("t")) == ({2}, {1}, set())
