"""Epoch driver behaviour: exact retraction, CID selection, sources, sinks, inspect hooks."""

from __future__ import annotations

import pytest

from merklog.engine.errors import EngineError
from merklog.engine.incremental import IncrementalEngine
from merklog.engine.io import CollectingSink, ListSource
from merklog.engine.program import Program
from merklog.store import Fact, fact_cid

REACH = """
path(X, Y) :- edge(X, Y).
path(X, Z) :- path(X, Y), edge(Y, Z).
reach(X, N) :- node(X), N := count : path(X, _).
far(X, M) :- node(X), M := max Y : path(X, Y).
isolated(X) :- node(X), !path(X, _), !path(_, X).
"""


def engine_for(text: str) -> IncrementalEngine:
    return IncrementalEngine(Program.parse(text).checked)


def test_deleting_a_fact_retracts_exactly_its_consequences_through_recursion() -> None:
    eng = engine_for(REACH)
    nodes = [(i,) for i in range(1, 6)]
    eng.step(inserts={"node": nodes, "edge": [(1, 2), (2, 3), (3, 1), (3, 4)]})
    assert eng.relation("path") == {(a, b) for a in (1, 2, 3) for b in (1, 2, 3, 4)}
    assert eng.relation("reach") == {(1, 4), (2, 4), (3, 4), (4, 0), (5, 0)}
    assert eng.relation("isolated") == {(5,)}
    # Cutting the cycle: paths that needed 3->1 go, everything else stays.
    delta = eng.step(deletes={"edge": [(3, 1)]})
    assert delta["path"] == {(3, 1): -1, (3, 2): -1, (3, 3): -1, (2, 1): -1, (2, 2): -1, (1, 1): -1}
    assert delta["reach"] == {(2, 4): -1, (2, 2): 1, (3, 4): -1, (3, 1): 1, (1, 4): -1, (1, 3): 1}
    assert "far" not in delta  # every node still reaches 4
    assert "isolated" not in delta
    # Removing the bridge to 4 updates max() exactly; 4 becomes reachable by nobody.
    delta = eng.step(deletes={"edge": [(3, 4)]})
    assert delta["far"] == {(1, 4): -1, (1, 3): 1, (2, 4): -1, (2, 3): 1, (3, 4): -1}
    assert delta["isolated"] == {(4,): 1}
    # Re-inserting restores the original state exactly.
    eng.step(inserts={"edge": [(3, 1), (3, 4)]})
    assert eng.relation("path") == {(a, b) for a in (1, 2, 3) for b in (1, 2, 3, 4)}
    assert eng.relation("isolated") == {(5,)}


def test_deleting_a_fact_with_two_derivations_keeps_the_result() -> None:
    eng = engine_for(REACH)
    eng.step(inserts={"node": [(1,), (2,), (3,)], "edge": [(1, 2), (2, 3), (1, 3)]})
    delta = eng.step(deletes={"edge": [(1, 3)]})
    assert delta == {"edge": {(1, 3): -1}}  # path(1, 3) is still derived through 2
    assert (1, 3) in eng.relation("path")


def test_cid_selection_binds_the_fact_cid() -> None:
    eng = engine_for(
        """
        byid(C, X) :- C := point(X, _).
        same(X) :- point(X, Y), C := point(X, Y), byid(C, X).
        """
    )
    eng.step(inserts={"point": [(1, 2), (3, 4)]})
    cid = fact_cid(Fact("point", (1, 2)))
    assert (cid, 1) in eng.relation("byid")
    assert eng.relation("same") == {(1,), (3,)}
    delta = eng.step(deletes={"point": [(1, 2)]})
    assert delta["byid"] == {(cid, 1): -1}


def test_sources_sinks_events_and_inspect_hooks() -> None:
    eng = engine_for("big(X) :- n(X), X > 10.")
    eng.add_source(
        ListSource([([Fact("n", (5,)), Fact("n", (50,))], []), ([], [Fact("n", (50,))])])
    )
    sink = CollectingSink()
    eng.add_sink(sink)
    seen: list = []
    eng.inspect("big", lambda epoch, d: seen.append((epoch, dict(d))))
    eng.step()
    eng.step()
    eng.step(events={"n": [(20,)]})
    eng.step()
    assert seen == [(0, {(50,): 1}), (1, {(50,): -1}), (2, {(20,): 1}), (3, {(20,): -1})]
    assert [r.epoch for r in sink.results] == [0, 1, 2, 3]
    assert sink.results[2].inserted() == {"n": {(20,)}, "big": {(20,)}}
    assert sink.results[3].deleted() == {"n": {(20,)}, "big": {(20,)}}
    assert eng.relation("n") == {(5,)}
    assert dict(sink.results[3].relations) == {"big": set(), "n": {(5,)}}


def test_inspect_nodes_sees_operator_outputs_inside_recursion() -> None:
    eng = engine_for("p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).")
    seen: list = []
    eng.inspect_nodes(lambda node, ts, value: seen.append((node.global_id, ts.iteration)))
    eng.step(inserts={"e": [(1, 2), (2, 3)]})
    assert any(len(gid) == 2 and it >= 1 for gid, it in seen)  # nested nodes, later iterations


def test_async_heads_go_to_the_outbox_once_while_derived() -> None:
    eng = engine_for("ping(@P, X)@async :- peer(P), want(X).")
    eng.step(inserts={"peer": [("p1",)], "want": [(1,)]})
    assert eng.outbox == [("p1", Fact("ping", ("p1", 1)))]
    eng.step()
    assert eng.outbox == []
    assert eng.async_relation("ping") == {("p1", 1)}
    assert "ping" not in eng.relations()


def test_unstratifiable_programs_are_rejected() -> None:
    with pytest.raises(EngineError):
        engine_for("p(X) :- q(X), !p(X).")


def test_correlated_aggregate_matches_batch_under_changes() -> None:
    """``C := count : { n(Y), Y < X }``: X only constrains the aggregate (Soufflé style)."""
    from merklog.engine import ast
    from merklog.engine.batch import BatchEvaluator

    x, y, c, s = ast.Var("X"), ast.Var("Y"), ast.Var("C"), ast.Var("S")
    n = lambda v: ast.Positive(ast.Atom("n", (v,)))  # noqa: E731
    rules = [
        ast.Rule(
            ast.Atom("rank", (x, c)),
            (n(x), ast.Aggregate(c, "count", None, (n(y), ast.Comparison("<", y, x)))),
        ),
        ast.Rule(
            ast.Atom("below", (x, s)),
            (n(x), ast.Aggregate(s, "max", y, (n(y), ast.Comparison("<", y, x)))),
        ),
    ]
    eng = IncrementalEngine(rules)
    base: set = set()
    for ins, dels in [({1, 5, 9}, set()), ({3}, {5}), ({5, 7}, {1}), (set(), {3, 7, 9})]:
        base = (base - dels) | ins
        eng.step(inserts={"n": [(v,) for v in ins]}, deletes={"n": [(v,) for v in dels]})
        ref = BatchEvaluator(rules).evaluate({"n": {(v,) for v in base}})
        assert eng.relation("rank") == set(ref.get("rank", set()))
        assert eng.relation("below") == set(ref.get("below", set()))
    assert eng.relation("rank") == {(5, 0)}


def test_correlated_aggregate_inside_recursion_is_rejected_precisely() -> None:
    from merklog.engine import ast
    from merklog.engine.incremental import CompileError

    x, y, z, c = ast.Var("X"), ast.Var("Y"), ast.Var("Z"), ast.Var("C")
    rules = [
        ast.Rule(ast.Atom("t", (x,)), (ast.Positive(ast.Atom("e", (x,))),)),
        ast.Rule(
            ast.Atom("t", (x,)),
            (
                ast.Positive(ast.Atom("t", (y,))),
                ast.Positive(ast.Atom("f", (y, x))),
                ast.Aggregate(
                    c,
                    "count",
                    None,
                    (ast.Positive(ast.Atom("n", (z,))), ast.Comparison("<", z, x)),
                ),
            ),
        ),
    ]
    with pytest.raises(CompileError, match="correlated"):
        IncrementalEngine(rules)


def test_compiled_circuit_is_driven_through_its_handles_alone() -> None:
    """``compile_program`` returns a circuit with input/output handles and no engine:
    pushing deltas and stepping is all a driver needs (DBSP's handle pattern)."""
    from merklog.engine.incremental import compile_program
    from merklog.engine.program import Program

    checked = Program.parse("path(X, Y) :- e(X, Y).\npath(X, Z) :- path(X, Y), e(Y, Z).").checked
    compiled = compile_program(checked.program.rules, checked.strata)
    assert set(compiled.inputs) == {"e", "path"} and "e" in compiled.inputs_only
    assert not hasattr(compiled, "engine")
    compiled.inputs["e"].push({(1, 2): 1, (2, 3): 1})
    compiled.step()
    assert compiled.relations["path"].delta == {(1, 2): 1, (2, 3): 1, (1, 3): 1}
    compiled.inputs["e"].push({(2, 3): -1})
    compiled.step()
    assert compiled.relations["path"].delta == {(2, 3): -1, (1, 3): -1}
    compiled.step()  # nothing pushed: nothing changes
    assert compiled.relations["path"].delta == {}


SHOWN = f"""{REACH}
big(X) :- edge(X, _), X > 2.
seen(X)@next :- clicked(X).
seen(X)@next :- seen(X).
ping(@X, Y)@async :- node(X), clicked(Y).
"""
SHOWN_RELS = ("node", "edge", "clicked", "path", "reach", "far", "isolated", "big", "seen")


def _contents(eng: IncrementalEngine) -> dict:
    """What a reader sees of ``eng``: every relation, count, ``@async`` and ``@next`` set."""
    out: dict = {rel: (eng.relation(rel), eng.count(rel)) for rel in SHOWN_RELS}
    out["matching"] = eng.relation_matching("edge", {0: 3})
    out["ping"] = eng.async_relation("ping")
    out["seen@next"] = eng.next_relation("seen")
    return out


def test_an_epoch_evaluated_unpublished_shows_only_once_published() -> None:
    """``step(publish=False)`` leaves every read at the previous epoch — base facts held as
    an int64 matrix, a flat derived relation (read from its distinct operator), recursive,
    aggregate, ``@next`` and ``@async`` state, events — until ``publish()``, which shows
    exactly what ``step()`` shows at once (ADR 0205)."""
    import numpy as np

    chain = [[1, 2], [2, 3], [3, 4]]  # an int64 matrix of base facts
    epochs = [
        {"inserts": {"node": [(i,) for i in range(1, 6)], "edge": np.array(chain)}},
        {"inserts": {"edge": [(3, 1), (4, 5)]}, "events": {"clicked": [(7,)]}},
        {"deletes": {"edge": [(3, 1)]}, "inserts": {"edge": [(3, 5), (1, 2.0)]}},
        {},  # the click is withdrawn; seen(7) is carried
        {"deletes": {"edge": [(3, 4), (3, 5)], "node": [(5,)]}, "events": {"clicked": [(8,)]}},
    ]
    shown, direct = engine_for(SHOWN), engine_for(SHOWN)
    before = _contents(shown)
    for change in epochs:
        got = shown.step(**change, publish=False)
        want = direct.step(**change)
        assert got == want
        assert shown.last.outbox == direct.last.outbox
        assert _contents(shown) == before  # evaluated, not shown
        shown.publish()
        before = _contents(shown)
        assert before == _contents(direct)
    shown.step(inserts={"edge": [(9, 9)]}, publish=False)
    shown.step(inserts={"edge": [(9, 10)]})  # an unpublished epoch is published first
    assert {(9, 9), (9, 10)} <= shown.relation("edge")
