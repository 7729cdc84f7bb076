"""analyze == the engine's batch evaluation == the node's queries, on generated replicas.

Each case builds a real node home with seeded-random facts of every value type
(``1``, ``1.0``, ``true``, ``"1"``, bytes, ints near 2^53 and 2^63, floats near
2^53, sums that overflow int64), retracts some of them, exports it with the CLI
(``merklog parquet export``) and evaluates several programs three ways: analyze
over the export in PySpark local[2], ``Program.evaluate`` over the node's visible
facts, and the node itself (``load_program`` + ``query``). Rows are compared by
*typed* key, so ``1`` and ``1.0`` (or ``true``) never count as the same row.
"""

from __future__ import annotations

import random

import pytest
from click.testing import CliRunner

import merklog
from merklog.engine.parser import parse_program
from merklog.engine.program import Program
from merklog.node.cli import cli
from merklog.node.spark.analyze import (
    evaluate,
    output_relations,
    relations_from_snapshot,
    used_relations,
)
from merklog.node.spark.compact import read_ops, snapshot_frame

pytestmark = pytest.mark.spark

I53, I63 = 2**53, 2**63

PROGRAMS = {
    "identity": """
        both(X) :- ints(X), floats(X).
        numeq(X, Y) :- ints(X), floats(Y), X == Y.
        numlt(X, Y) :- ints(X), floats(Y), X < Y.
        numge(X, Y) :- floats(Y), ints(X), X >= Y.
        boolint(X, Y) :- ints(X), bools(Y), X == Y.
        boolne(Y) :- bools(Y), ints(X), X != Y, X == 1.
        strint(X) :- ints(X), strs(S), X == S.
    """,
    "negation_constants": """
        onlyint(X) :- ints(X), !floats(X).
        onlyfloat(X) :- floats(X), !ints(X).
        notbool(X) :- ints(X), !bools(X).
        kone(V) :- kv(1, V).
        kfone(V) :- kv(1.0, V).
        ftrue(K) :- fv(K, _), K == true.
        fint(K, V) :- fv(K, V), V == 1.0.
        cmpone(K, V) :- fv(K, V), V == 1.
        byteset(B) :- bins(B), !bins(x"01").
    """,
    "aggregates": """
        n(K, N) :- kv(K, _), N := count : kv(K, _).
        s(K, S) :- kv(K, _), S := sum V : kv(K, V).
        fs(K, S) :- fv(K, _), S := sum V : fv(K, V).
        lo(K, M) :- kv(K, _), M := min V : kv(K, V).
        hi(K, M) :- fv(K, _), M := max V : fv(K, V).
        total(S) :- S := sum X : ints(X).
        nstr(N) :- N := count : strs(_).
    """,
    "arithmetic": """
        inc(X, Y) :- ints(X), Y == X + 1.
        dbl(X, Y) :- ints(X), Y == X * 2.
        neg(X, Y) :- ints(X), Y == -X.
        quo(K, V, Q) :- kv(K, V), Q == V / K, Q > 0.
        mixed(X, F, Y) :- ints(X), floats(F), Y == X + F, Y < 100.0.
        cat(S, T) :- strs(S), T == S + "!".
    """,
}


def _key(row: tuple) -> tuple:
    """A row's identity: type and value of every argument (``1`` ≠ ``1.0`` ≠ ``true``)."""
    return tuple((type(v).__name__, v) for v in row)


def _keys(rows) -> set[tuple]:
    return {_key(tuple(r)) for r in rows}


def _facts(rng: random.Random) -> tuple[list, list]:
    """Asserted and retracted facts of one generated replica."""
    ints = {0, 1, -1, 2, 7, I53, I53 + 1, I63 - 1, -I63, I63 - 2, -I63 + 1}
    ints |= {rng.randrange(-50, 50) for _ in range(12)}
    floats = {1.0, 0.5, -1.0, float(I53), 9.2e18, -9.3e18, 2.0, 3.25}
    floats |= {rng.randrange(-200, 200) / 4 for _ in range(8)}
    asserts = [("ints", (x,)) for x in sorted(ints)]
    asserts += [("floats", (x,)) for x in sorted(floats)]
    asserts += [("bools", (True,)), ("bools", (False,))]
    asserts += [("strs", (s,)) for s in ("1", "a", "é", "")]
    asserts += [("bins", (b,)) for b in (b"\x01", b"", b"\xff\x00")]
    kv = [(k, rng.choice([1, 2, 3, -5, 100])) for k in range(1, 5) for _ in range(3)]
    kv += [(5, I63 - 1), (5, 1), (6, -I63), (6, -1), (7, I63 - 1), (7, -5)]
    asserts += [("kv", t) for t in kv]
    fv = [(k, rng.choice([0.1, 0.2, 1e16, -1e16, 1.0, 2.5])) for k in range(1, 5) for _ in range(3)]
    fv += [(1, 1.0), (2, 0.0)]
    asserts += [("fv", t) for t in fv]
    # a relation the programs never read, with a column of every type: analyze must not care
    asserts += [("unused", (v,)) for v in (1, 1.0, True, "1", b"\x01")]
    small = [a for a in asserts if a[0] in ("ints", "floats") and abs(a[1][0]) < 100]
    retracts = rng.sample(small, 4) + [("kv", kv[0])]
    return asserts, retracts


@pytest.fixture(scope="module")
def replicas(spark, tmp_path_factory):
    """Two generated replicas: (analyze's base, visible facts, node home) each."""
    out = []
    for seed in (1, 2):
        tmp = tmp_path_factory.mktemp(f"parity{seed}")
        home = tmp / "home"
        asserts, retracts = _facts(random.Random(seed))
        with merklog.open(home) as node:
            node.write(asserts=asserts)
            node.write(retracts=retracts)
            visible: dict[str, list] = {}
            for _cid, fact in node.list_facts():
                visible.setdefault(fact.rel, []).append(tuple(fact.args))
        result = CliRunner().invoke(
            cli, ["--home", str(home), "parquet", "export", str(tmp / "export")]
        )
        assert result.exit_code == 0, result.output
        snap = snapshot_frame(read_ops(spark, [str(tmp / "export")])).cache()
        out.append((snap, visible, home))
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_analyze_matches_engine_and_node(spark, replicas, name):
    text = PROGRAMS[name]
    program = parse_program(text)
    for snap, visible, home in replicas:
        base = relations_from_snapshot(snap, used_relations(program))
        assert "unused" not in base
        got = evaluate(spark, program, base)
        expected = Program.parse(text).evaluate(visible)
        with merklog.open(home) as node:
            node.load_program(text, source=f"{name}.dl")
            node.run_epoch()  # the next epoch re-derives from the stored facts
            for rel in output_relations(program):
                arity = len(next(r for r in program.rules if r.head.rel == rel).head.args)
                vars_ = ", ".join(f"V{i}" for i in range(arity))
                answers = node.query(f"{rel}({vars_})").rows
                spark_rows = _keys(got.rows(rel))
                assert spark_rows == _keys(expected.get(rel, ())), (name, rel)
                assert spark_rows == _keys(answers), (name, rel)
    assert any(_keys(got.rows(rel)) for rel in output_relations(program))


def test_parity_cases_exercise_the_edges(spark, replicas):
    """The generated data reaches the cases the parity test is for (so it can fail)."""
    snap, visible, _home = replicas[0]
    text = PROGRAMS["identity"] + PROGRAMS["aggregates"]
    program = parse_program(text)
    got = evaluate(spark, program, relations_from_snapshot(snap, used_relations(program)))
    assert not got.rows("both")  # 1 and 1.0 never join
    assert not got.rows("boolint")  # true is not 1
    assert (I53 + 1, float(I53)) not in got.rows("numeq")  # exact, not through doubles
    assert _key((I53, float(I53))) in _keys(got.rows("numeq"))
    sums = {k for k, _s in got.rows("s")}
    assert 5 not in sums and 6 not in sums and 7 in sums  # overflowing groups derive nothing
