"""The user-facing API: Program.parse / evaluate / query / run, sources and sinks."""

from __future__ import annotations

import pytest

from merklog.engine import EpochResult, Program, Relations, Sink, Source
from merklog.engine.errors import ArityError, EngineError, UnknownRelationError
from merklog.engine.io import CallbackSink, CollectingSink, ListSource
from merklog.store import Fact

TC = """
path(X, Y) :- edge(X, Y).
path(X, Y) :- path(X, Z), edge(Z, Y).
"""
EDGES = {"edge": [(1, 2), (2, 3), (3, 4)]}


def test_evaluate_accepts_a_mapping_or_facts_and_returns_every_relation() -> None:
    program = Program.parse(TC)
    by_map = program.evaluate(EDGES)
    by_facts = program.evaluate([Fact("edge", (1, 2)), Fact("edge", (2, 3)), ("edge", (3, 4))])
    assert isinstance(by_map, Relations)
    assert by_map == by_facts
    assert by_map["path"] == {(1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)}
    assert by_map["edge"] == {(1, 2), (2, 3), (3, 4)}
    assert by_map.count("path") == 6
    assert by_map.sorted("path")[:2] == [(1, 2), (1, 3)]
    assert Fact("path", (1, 4)) in set(by_map.facts())


def test_underived_relations_are_present_and_empty() -> None:
    rels = Program.parse(TC).evaluate({})
    assert rels["path"] == set()
    assert rels["edge"] == set()


def test_inline_facts_join_given_facts() -> None:
    program = Program.parse(TC + "edge(4, 5).")
    assert (1, 5) in program.evaluate(EDGES)["path"]


def test_query_returns_rows_of_the_query_variables() -> None:
    program = Program.parse(TC)
    assert program.query("path(1, X)", facts=EDGES) == [(2,), (3,), (4,)]
    assert program.query("path(X, 4)", facts=EDGES, bindings=True) == [
        {"X": 1},
        {"X": 2},
        {"X": 3},
    ]
    assert program.query("path(1, 4)", facts=EDGES) == [()]
    assert program.query("path(4, 1)", facts=EDGES) == []
    assert program.query("path(X, _)", facts=EDGES) == [(1,), (2,), (3,)]
    loops = Program.parse(TC).query("path(X, X)", facts={"edge": [(1, 2), (2, 1), (3, 4)]})
    assert loops == [(1,), (2,)]


def test_query_an_earlier_result() -> None:
    program = Program.parse(TC)
    rels = program.evaluate(EDGES)
    assert program.query("path(Y, 3)", relations=rels) == [(1,), (2,)]


def test_query_of_unknown_relation_is_an_error_with_position() -> None:
    program = Program.parse(TC)
    with pytest.raises(UnknownRelationError) as err:
        program.query("pth(1, X)", facts=EDGES)
    assert (err.value.line, err.value.col) == (1, 1)
    with pytest.raises(ArityError):
        program.query("path(1, X, Y)", facts=EDGES)


def test_bad_program_raises_engine_error_with_line_and_column() -> None:
    with pytest.raises(EngineError) as err:
        Program.parse("ok(X) :- edge(X, _).\nbad(X, Y) :- edge(X, _).")
    assert err.value.line == 2


def test_facts_with_the_wrong_arity_are_rejected() -> None:
    with pytest.raises(ArityError, match="edge has arity 3 in the facts and 2 here") as err:
        Program.parse(TC).evaluate({"edge": [(1, 2, 3)]})
    assert (err.value.line, err.value.col) == (2, 15)


def test_run_carries_next_tuples_and_collects_async_outbox() -> None:
    program = Program.parse(
        """
        seen(X)@next :- seen(X).
        seen(X)@next :- event(X).
        notify(@P, X)@async :- peer(P), event(X).
        """
    )
    sink = CollectingSink()
    results = program.run(
        [{"event": [(1,)], "peer": [("p1",)]}, {"event": [(2,)]}, {}], sinks=[sink]
    )
    assert [r.relations["seen"] for r in results] == [set(), {(1,)}, {(1,), (2,)}]
    assert results[0].outbox == [("p1", Fact("notify", ("p1", 1)))]
    assert results[1].outbox == []  # no peer at epoch 1: events are transient inputs
    assert sink.results == results
    assert all(isinstance(r, EpochResult) for r in results)
    assert results[2].inserted() == {"seen": {(2,)}}
    assert results[2].deleted() == {"event": {(2,)}}


def test_sources_feed_a_persistent_edb_and_sinks_see_every_epoch() -> None:
    program = Program.parse(TC)
    source = ListSource(
        [
            ([Fact("edge", (1, 2))], []),
            ([Fact("edge", (2, 3))], []),
            ([], [Fact("edge", (1, 2))]),
        ]
    )
    seen: list[set] = []
    sink = CallbackSink(lambda r: seen.append(set(r.relations["path"])))
    assert isinstance(source, Source) and isinstance(sink, Sink)
    program.run(count=3, sources=[source], sinks=[sink])
    assert seen == [{(1, 2)}, {(1, 2), (1, 3), (2, 3)}, {(2, 3)}]


def test_souffle_dialect_is_detected_and_uses_32_bit_integers() -> None:
    program = Program.parse(".decl n(x: number)\n.decl r(x: number)\nr(y) :- n(x), y = x + 1.\n")
    assert program.dialect == "souffle"
    assert program.int_bits == 32
    assert program.evaluate({"n": [(2**31 - 1,), (5,)]})["r"] == {(-(2**31),), (6,)}
    assert program.query("r(6)", facts={"n": [(5,)]}) == [()]
