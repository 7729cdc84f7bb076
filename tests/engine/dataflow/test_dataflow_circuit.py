"""Circuits: sources, sinks, feedback, import/export and recursion inside a child circuit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.engine.dataflow import (
    Circuit,
    DistinctTrace,
    Filter,
    IndexWith,
    Join,
    Map,
    Plus,
    Timestamp,
)


def closure(edges: set[tuple[int, int]]) -> set[tuple[int, int]]:
    tc = set(edges)
    while True:
        new = {(a, d) for (a, b) in tc for (c, d) in edges if b == c} - tc
        if not new:
            return tc
        tc |= new


def build_tc() -> tuple[Circuit, list[dict], dict]:
    """tc(X,Y) :- e(X,Y).  tc(X,Z) :- tc(X,Y), e(Y,Z).  as a root + child circuit."""
    root = Circuit()
    inbox: list[dict] = []
    edges = root.source(lambda ts: inbox.pop(0) if inbox else {}, label="e")
    child_node = root.child(label="tc-stratum")
    child = child_node.child
    e = child.import_(edges)
    fb = child.feedback(label="tc@prev")
    tc_by_dst = child.operator(IndexWith(lambda r: r[1]), fb)
    e_by_src = child.operator(IndexWith(lambda r: r[0]), e)
    step = child.operator(Join(lambda k, a, b: (a[0], b[1])), tc_by_dst, e_by_src)
    total = child.operator(Plus(), e, step)
    tc = child.operator(DistinctTrace(), total, label="tc")
    fb.connect(tc)
    out = child_node.export(tc)
    view: dict = {}

    def apply(ts: Timestamp, delta: dict) -> None:
        for row, w in delta.items():
            n = view.get(row, 0) + w
            if n:
                view[row] = n
            else:
                del view[row]

    root.sink(apply, out)
    return root, inbox, view


def test_transitive_closure_handles_insertions_and_deletions() -> None:
    root, inbox, view = build_tc()
    inbox.append({(1, 2): 1, (2, 3): 1, (3, 4): 1})
    root.step()
    assert set(view) == closure({(1, 2), (2, 3), (3, 4)})
    assert all(w == 1 for w in view.values())
    inbox.append({(2, 3): -1})
    root.step()
    assert set(view) == {(1, 2), (3, 4)}
    inbox.append({(4, 1): 1, (2, 3): 1})  # a cycle
    root.step()
    assert set(view) == closure({(1, 2), (2, 3), (3, 4), (4, 1)})
    inbox.append({(4, 1): -1})
    root.step()
    assert set(view) == closure({(1, 2), (2, 3), (3, 4)})


edge = st.tuples(st.integers(0, 5), st.integers(0, 5))


@settings(max_examples=150)
@given(st.lists(st.tuples(st.sets(edge, max_size=6), st.sets(edge, max_size=4)), max_size=8))
def test_recursive_child_circuit_matches_recomputation(batches) -> None:
    root, inbox, view = build_tc()
    edges: set = set()
    for ins, dels in batches:
        delta = {}
        for row in ins - edges:
            delta[row] = 1
        for row in (dels & edges) - ins:
            delta[row] = -1
        edges = (edges | ins) - ((dels & edges) - ins)
        inbox.append(delta)
        root.step()
        assert view == {row: 1 for row in closure(edges)}


def test_feedback_in_root_delays_by_one_epoch_and_sinks_see_every_epoch() -> None:
    root = Circuit()
    fb = root.feedback()
    inc = root.operator(Map(lambda r: (r[0] + 1,)), fb)
    start = root.source(lambda ts: {(0,): 1} if ts.epoch == 0 else {})
    nxt = root.operator(Plus(), start, root.operator(Filter(lambda r: r[0] < 3), inc))
    fb.connect(nxt)
    seen = []
    root.sink(lambda ts, v: seen.append((ts.epoch, dict(v))), nxt)
    for _ in range(5):
        root.step()
    assert seen == [(0, {(0,): 1}), (1, {(1,): 1}), (2, {(2,): 1}), (3, {}), (4, {})]


def test_nodes_have_local_and_global_ids() -> None:
    root = Circuit()
    src = root.source(lambda ts: {})
    child_node = root.child()
    inner = child_node.child.import_(src)
    assert src.global_id == (0,)
    assert child_node.global_id == (1,)
    assert inner.global_id == (1, 0)


def test_wiring_errors_are_rejected() -> None:
    root = Circuit()
    other = Circuit()
    src = other.source(lambda ts: {})
    with pytest.raises(ValueError):
        root.operator(Map(lambda r: r), src)
    with pytest.raises(ValueError):
        root.import_(src)
    fb = root.feedback()
    with pytest.raises(ValueError):
        root.step()
    fb.connect(root.source(lambda ts: {}))
    assert root.step() == 0
