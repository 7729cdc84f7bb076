"""A single-atom query with constants (``p(1, Y)``) over a stored relation that the
incremental engine holds as an int64 matrix reads only the matching rows
(``ArrayBase.matching``), never the whole relation, and answers exactly what a scan
answers: by value identity (``1``, ``1.0``, ``true`` and ``"1"`` are four values),
with the overlay of rows added and removed since the matrix was loaded, int64 extremes
and negative ints."""

from __future__ import annotations

from pathlib import Path

import pytest

from merklog.engine.incremental import IncrementalEngine
from merklog.engine.values import row_from_engine, row_to_engine
from merklog.node.node import Node

BASE = [(i, i % 7) for i in range(-50, 300)]
ADDED = [(1, 1.0), (True, 3), (2**63 - 1, 1), (1, "1"), (-5, 2.5), (400, 3)]
REMOVED = [(3, 3), (10, 3)]
QUERIES = [
    "p(1, Y)", "p(X, 3)", "p(1.0, Y)", "p(true, Y)", "p(X, 1.0)", 'p(X, "1")',
    "p(9223372036854775807, Y)", "p(-9223372036854775808, Y)", "p(3, Y)", "p(-5, Y)", "p(-5, 2)", "p(10, 3)", "p(X, 3.0)",
    "p(400, 3)", "p(1, 1)", "p(1000, Y)",
]  # fmt: skip


def _expected(query: str, facts: list[tuple]) -> list[str]:
    """The answer by a scan of the facts, matching by identity (engine form)."""
    from merklog.node.queries import parse_query

    (lit,) = parse_query(query)
    consts = {i: a.value for i, a in enumerate(lit.atom.args) if hasattr(a, "value")}
    out = set()
    for fact in facts:
        engine, want = row_to_engine(fact), row_to_engine(tuple(consts.values()))
        if all(
            engine[i] == w and type(engine[i]) is type(w) for i, w in zip(consts, want, strict=True)
        ):
            out.add(tuple(v for i, v in enumerate(engine) if i not in consts))
    return sorted(repr(row_from_engine(r)) for r in out)


def test_point_queries_read_only_their_rows_and_match_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "h"
    with Node.open(home) as node:
        node.write([("p", row) for row in BASE])
    with Node.open(home) as node:
        node.epochs.ready()
        node.write([("p", (1000, 6))])  # an int row: the engine takes the matrix over
        node.run_epoch()
        assert not node.engine.snapshot  # incremental state
        # ... and keeps it, with these rows in its overlay
        node.write([("p", row) for row in ADDED], [("p", row) for row in REMOVED])
        node.run_epoch()
        facts = [r for r in BASE if r not in REMOVED] + [(1000, 6)] + ADDED
        whole = IncrementalEngine.relation

        def not_p(self: IncrementalEngine, name: str):  # a point query of p must not scan p
            assert name != "p", "the whole relation was read"
            return whole(self, name)

        monkeypatch.setattr(IncrementalEngine, "relation", not_p)
        for query in QUERIES:
            got = sorted(repr(tuple(r)) for r in node.query(query).rows)
            assert got == _expected(query, facts), query
        monkeypatch.undo()
        assert sorted(map(repr, node.query("p(X, Y)").rows)) == sorted(map(repr, facts))


def test_point_queries_on_a_reopened_home_read_only_their_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home opened again (``merklog query`` on a stopped home) answers from its reload
    snapshot: an all-int relation is still int64 columns there, and a point query
    filters them instead of making a tuple of every row; a relation of mixed values is
    filtered by identity. Both answer what a scan answers."""
    from merklog.engine.batch import Relations

    home = tmp_path / "h"
    mixed = [r for r in ADDED if r not in BASE] + [(4, 4), (5, -0.0), (5, 0.0)]
    with Node.open(home) as node:
        node.write([("p", row) for row in BASE] + [("q", row) for row in mixed])
    with Node.open(home) as node:
        engine = Relations.engine

        def not_p(self: Relations, rel: str):  # a point query of p must not decode p
            assert rel != "p", "the whole relation was decoded"
            return engine(self, rel)

        monkeypatch.setattr(Relations, "engine", not_p)
        for query in [*QUERIES, "p(5, -0.0)", "p(X, 0.0)", "p(X, 4)"]:
            got = sorted(repr(tuple(r)) for r in node.query(query).rows)
            assert got == _expected(query, BASE), query
            other = query.replace("p(", "q(", 1)
            got = sorted(repr(tuple(r)) for r in node.query(other).rows)
            assert got == _expected(other, mixed), other
        assert node.engine.snapshot  # answered from the reload, not incremental state
        monkeypatch.undo()
        assert sorted(map(repr, node.query("p(X, Y)").rows)) == sorted(map(repr, BASE))
