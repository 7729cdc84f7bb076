"""A program's own facts (``edge(1, 2).`` in its text) hold at every epoch of the
incremental engine, as they do in a batch evaluation, whatever the stored facts do: a
stored fact equal to one of them can be put and retracted without taking it away."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine import Program
from merklog.engine.incremental import IncrementalEngine

TEXT = """\
edge(1, 2).
edge(2, 2.0).
edge(true, "1").
path(X, Y) :- edge(X, Y).
path(X, Z) :- path(X, Y), edge(Y, Z).
node(X) :- edge(X, _).
node(Y) :- edge(_, Y).
lone(X) :- node(X), !edge(X, _).
"""

#: Values that overlap the program's facts, of every kind: 1, 1.0 and true stay apart.
VALUES = st.sampled_from([1, 2, 1.0, 2.0, True, "1", b"\x01"])
EDGES = st.lists(st.tuples(VALUES, VALUES), max_size=6)


def _rows(relations, rel: str) -> set:
    return {_typed(row) for row in relations.get(rel, ())}


def _typed(row: tuple) -> tuple:
    """A row's key by value identity: Python's ``==`` and ``hash`` make (1, 1) and
    (1, 1.0) one set member, which they are not."""
    return tuple((type(v).__name__, v) for v in row)


def test_retracting_a_stored_copy_keeps_the_programs_fact() -> None:
    """The QA case: put edge(1, 2) and edge(2, 3), retract edge(1, 2): a running node
    answered path = {(2, 3)}; its batch evaluation (and a restart) {(1,2), (1,3), (2,3)}."""
    program = Program.parse("edge(1, 2).\npath(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n")
    engine = IncrementalEngine(program.checked)
    engine.step(inserts={"edge": [(1, 2), (2, 3)]})
    engine.step(deletes={"edge": [(1, 2)]})
    assert sorted(engine.relation("path")) == [(1, 2), (1, 3), (2, 3)]
    engine.step(deletes={"edge": [(1, 2)]})  # again, and a later epoch: still there
    engine.step()
    assert sorted(engine.relation("edge")) == [(1, 2), (2, 3)]
    negation = Program.parse("p(1).\nq(X) :- r(X), !p(X).\n")
    engine = IncrementalEngine(negation.checked)
    engine.step(inserts={"r": [(1,)], "p": [(1,)]})
    engine.step(deletes={"p": [(1,)]})
    assert sorted(engine.relation("q")) == []  # p(1) still holds: no q(1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(EDGES, EDGES), min_size=1, max_size=5))
def test_the_incremental_engine_equals_batch_with_program_facts(epochs) -> None:
    program = Program.parse(TEXT)
    engine = IncrementalEngine(program.checked)
    stored: dict = {}  # by value identity (see _typed)
    for inserts, deletes in epochs:
        for row in deletes:
            stored.pop(_typed(row), None)
        stored.update((_typed(row), row) for row in inserts)
        engine.step(inserts={"edge": inserts}, deletes={"edge": deletes})
        expected = program.evaluate({"edge": list(stored.values())})
        for rel in ("edge", "path", "node", "lone"):
            got = {_typed(row) for row in engine.relation(rel)}
            assert got == _rows(expected, rel), (rel, inserts, deletes)


def test_a_node_keeps_its_programs_fact_when_a_stored_copy_is_retracted() -> None:
    """The same through a node, whose epochs are incremental: a running node answered
    path = {(2, 3)} where the same home, stopped, answered all three rows."""
    import merklog

    with merklog.open(memory=True) as node:
        node.load_program(
            "edge(1, 2).\npath(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n",
            source="p.dl",
        )
        node.write(asserts=[("edge", (1, 2)), ("edge", (2, 3))])
        node.retract("edge", 1, 2)
        assert node.query("path(X, Y)").rows == [(1, 2), (1, 3), (2, 3)]
