"""analyze (Spark DataFrames) == the local engine on the same merged replicas."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from merklog.engine.errors import RangeRestrictionError, UnsupportedError
from merklog.engine.parser import parse_program
from merklog.engine.program import Program
from merklog.node.spark.analyze import (
    evaluate,
    output_relations,
    relations_from_rows,
    relations_from_snapshot,
    write_outputs,
)
from merklog.node.spark.compact import read_ops, snapshot_frame
from merklog.node.spark.export import export
from merklog.node.spark.gen import Simulation, reference_visible
from merklog.node.spark.schema import decode_args
from merklog.store import format_value

pytestmark = pytest.mark.spark

PROGRAMS = {
    "closure": """
        path(X, Y) :- edge(X, Y).
        path(X, Z) :- path(X, Y), edge(Y, Z).
    """,
    "negation": """
        node(X) :- edge(X, _).
        node(Y) :- edge(_, Y).
        path(X, Y) :- edge(X, Y).
        path(X, Z) :- path(X, Y), edge(Y, Z).
        unreach(X, Y) :- node(X), node(Y), !path(X, Y).
        unlabelled(X) :- node(X), !label(X, _).
    """,
    "aggregation": """
        node(X) :- edge(X, _).
        node(Y) :- edge(_, Y).
        outdeg(X, N) :- node(X), N := count : edge(X, _).
        total(S) :- S := sum Y : edge(_, Y).
        top(X, M) :- node(X), M := max Y : edge(X, Y).
        low(X, M) :- node(X), M := min Y : edge(Y, X).
        nlabels(N) :- N := count : label(_, _).
        nmissing(N) :- N := count : label(_, "no such label").
    """,
    "arithmetic": """
        big(X, Y, Z) :- edge(X, Y), Z == X * 10 + Y / 2 - Y % 3, Y > 1, X != Y.
        half(X, H) :- edge(X, Y), H == (X - 7) / (Y - 2), H >= -100.
        shout(X, L2) :- label(X, L), L2 == L + "!".
        cids(C, X) :- C := edge(X, 1).
        odd(A, B, F) :- misc(A, B, _, _, true, _), F == B * 2.0.
        wide(A) :- misc(A, _, _, _, _, _), A * 2 > 0.
    """,
}


@pytest.fixture(scope="module")
def merged(spark, tmp_path_factory):
    """Three generated replicas (concurrent asserts/retracts), exported and merged in Spark."""
    tmp = tmp_path_factory.mktemp("analyze")
    sim = Simulation(peers=3, pool=100, seed=21).run(250)
    dirs = []
    for i in range(3):
        export(sim.log_rows(i), [], tmp / f"p{i}")
        dirs.append(tmp / f"p{i}")
    snap = snapshot_frame(read_ops(spark, dirs)).cache()
    facts = reference_visible([r for i in range(3) for r in sim.log_rows(i)])
    base: dict[str, set] = {}
    for f in facts:
        base.setdefault(f.rel, set()).add(f.args)
    assert set(base) >= {"edge", "label", "misc"}
    return relations_from_snapshot(snap), base


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_analyze_equals_local_engine(spark, merged, name):
    spark_base, base = merged
    program = parse_program(PROGRAMS[name])
    expected = Program.parse(PROGRAMS[name]).evaluate(base)
    result = evaluate(spark, program, spark_base)
    for rel in output_relations(program):
        assert result.rows(rel) == set(expected[rel]), rel
    assert any(result.rows(rel) for rel in output_relations(program))


def test_edge_cases_match_engine(spark):
    """Overflow, division by zero, bool vs int, and facts written inline in the program."""
    base = {
        "n": {(9223372036854775807,), (-9223372036854775808,), (0,), (-7,), (3,)},
        "flag": {(True,), (1,)} - {(1,)},
    }
    text = """
        inc(X, Y) :- n(X), Y == X + 1.
        neg(X, Y) :- n(X), Y == -X.
        quo(X, Q, R) :- n(X), d(D), Q == X / D, R == X % D.
        same(X) :- n(X), flag(B), X == B.
        d(2). d(0). d(-1).
    """
    program = parse_program(text)
    expected = Program.parse(text).evaluate(base)
    result = evaluate(spark, program, relations_from_rows(spark, base))
    for rel in ("inc", "neg", "quo", "same"):
        assert result.rows(rel) == set(expected.get(rel, set())), rel


def test_recursion_is_semi_naive_with_bounded_rounds(spark):
    chain = {(i, i + 1) for i in range(12)}
    program = parse_program("path(X, Y) :- edge(X, Y). path(X, Z) :- path(X, Y), edge(Y, Z).")
    result = evaluate(spark, program, relations_from_rows(spark, {"edge": chain}))
    assert len(result.rows("path")) == 12 * 13 // 2
    assert result.iterations["path"] == 13  # one round per path length, then the empty delta


def test_outputs_round_trip_exactly(spark, merged, tmp_path):
    spark_base, base = merged
    program = parse_program("m(A, B, C, D, E, F) :- misc(A, B, C, D, E, F).")
    result = evaluate(spark, program, spark_base)
    paths = write_outputs(result, ["m"], tmp_path / "pq", "parquet")
    table = pq.read_table(paths["m"]).to_pylist()
    assert {decode_args(r["args"]) for r in table} == base["misc"]
    csv_paths = write_outputs(result, ["m"], tmp_path / "csv", "csv")
    text = "".join(p.read_text() for p in sorted((tmp_path / "csv" / "m").glob("*.csv")))
    lines = text.strip().splitlines()[1:]
    facts = parse_program("".join(f"m({line}).\n" for line in lines)).facts
    assert {tuple(args) for _rel, args in facts} == base["misc"]
    assert csv_paths["m"].endswith("m")


def test_csv_lines_read_back_whatever_the_strings_hold(spark, tmp_path):
    """Spark's CSV writer wrapped a field holding a comma, a CR or a NUL in NUL bytes
    (its quote character with quoting "off"), and tabs and other controls came out raw:
    such lines no longer parsed as ``o(LINE).``. Each line is now the literals joined by
    commas, written as text, the header first; an empty relation's header has its
    arity's columns."""
    odd = {("a,b",), ("x\ry",), ("n\0ul",), ("t\tab",), ('q"b',), ("",), ("e\x1b\u2028",), ("é",)}
    # format characters (zero-width space, BOM, a bidi control, one beyond the BMP):
    # written as format_value writes them, \u{...}, not raw (two values printed alike)
    odd |= {("zw\u200bsp",), ("bom\ufeff",), ("rl\u202eo",), ("eg\U00013430",), ("e\u0301",)}
    program = parse_program("o(X) :- s(X).\nnone(X, Y) :- nothing(X, Y).")
    result = evaluate(spark, program, relations_from_rows(spark, {"s": odd}))
    paths = write_outputs(result, ["o", "none"], tmp_path / "csv", "csv", {"none": 2})
    (part,) = Path(paths["o"]).glob("*.csv")
    header, *lines = part.read_bytes().decode().split("\n")[:-1]
    assert header == "c0" and len(lines) == len(odd)
    facts = parse_program("".join(f"o({line}).\n" for line in lines)).facts
    assert {tuple(args) for _rel, args in facts} == odd
    assert sorted(lines) == sorted(format_value(v) for (v,) in odd)  # one rendering
    (empty,) = Path(paths["none"]).glob("*.csv")
    assert empty.read_text() == "c0,c1\n"


def test_unsupported_constructs_fail_clearly(spark):
    program = parse_program("p(X) :- q(X).\nping(@P, X)@async :- peer(P), q(X).")
    with pytest.raises(UnsupportedError) as err:
        evaluate(spark, program, relations_from_rows(spark, {"q": {(1,)}, "peer": {("a",)}}))
    assert err.value.line == 2 and "@async" in str(err.value)
    with pytest.raises(RangeRestrictionError) as err:
        evaluate(
            spark, parse_program("p(X, Y) :- q(X)."), relations_from_rows(spark, {"q": {(1,)}})
        )
    assert err.value.line == 1


def test_rows_given_in_python_keep_identity(spark):
    """1, 1.0 and True are three values even in a Python list: none is silently dropped."""
    rels = relations_from_rows(spark, {"p": [(2,), (2,)], "q": [("a",)]})
    assert evaluate(spark, parse_program("r(X) :- p(X)."), rels).rows("r") == {(2,)}
    mixed = relations_from_rows(spark, {"p": [(1,), (1.0,), (True,), (1,)]})
    got = evaluate(spark, parse_program("r(X) :- p(X)."), mixed).rows("r")
    assert len(got) == 3 and {type(v) for (v,) in got} == {int, float, bool}


def test_a_write_that_fails_part_way_leaves_the_earlier_output_whole(spark, tmp_path):
    """QA: analyze wrote each relation straight over its earlier folder, so a run stopped
    or failed part way left some relations new and some old, and had deleted the earlier
    folder of the one it was writing. Relations are staged and moved into place once all
    are written: here the second relation's job fails for real (Spark's raise_error), and
    the earlier output is unchanged, byte for byte."""
    from merklog.node.spark.analyze import AnalyzeResult, Relation, staging_folder

    out = tmp_path / "out"
    first = relations_from_rows(spark, {"p": [(1,), (2,)], "q": [(3,)]})
    write_outputs(AnalyzeResult(first, {}), ["p", "q"], out, "csv")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    second = relations_from_rows(spark, {"p": [(7,)], "q": [(8,)]})
    failing = second["q"].df.selectExpr("CAST(raise_error('boom') AS BIGINT) AS c0")
    second["q"] = Relation(failing, second["q"].kinds)
    with pytest.raises(Exception, match="boom"):
        write_outputs(AnalyzeResult(second, {}), ["p", "q"], out, "csv")
    staged = staging_folder(out)
    assert {
        p.relative_to(out): p.read_bytes()
        for p in out.rglob("*")
        if p.is_file() and staged not in p.parents
    } == before
    # a whole run replaces both, and leaves no staging folder
    third = relations_from_rows(spark, {"p": [(7,)], "q": [(8,)]})
    import shutil

    shutil.rmtree(staged)  # what the command does after a failure
    write_outputs(AnalyzeResult(third, {}), ["p", "q"], out, "csv")
    assert sorted(p.name for p in out.iterdir()) == ["p", "q"]
    assert (out / "p" / "part-00000.csv").read_text() == "c0\n7\n"
