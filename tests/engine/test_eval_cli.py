"""``merklog eval``: fact files in, sorted TSV results out, precise errors for bad programs."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from merklog.node.cli import cli

TC = "path(X, Y) :- edge(X, Y).\npath(X, Y) :- path(X, Z), edge(Z, Y).\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def invoke(*args: str):
    return CliRunner().invoke(cli, ["eval", *args])


def test_eval_writes_every_derived_relation_sorted(tmp_path: Path) -> None:
    prog = write(tmp_path / "tc.dl", TC + "label(X, N) :- edge(X, _), name(X, N).\n")
    write(tmp_path / "facts" / "edge.facts", "3\t4\n1\t2\n2\t3\n")
    write(tmp_path / "facts" / "name.facts", "1\tone\n2\t2.5\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "path.csv").read_text() == "1\t2\n1\t3\n1\t4\n2\t3\n2\t4\n3\t4\n"
    # fields parse as int, else float, else string
    assert (out / "label.csv").read_text() == "1\tone\n2\t2.5\n"
    assert sorted(p.name for p in out.iterdir()) == ["label.csv", "path.csv"]


def test_eval_of_a_relation_with_no_facts_writes_an_empty_file(tmp_path: Path) -> None:
    prog = write(tmp_path / "tc.dl", TC)
    (tmp_path / "facts").mkdir()
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "path.csv").read_text() == ""


def test_bad_program_reports_line_and_column_and_writes_nothing(tmp_path: Path) -> None:
    prog = write(tmp_path / "bad.dl", "ok(X) :- edge(X, _).\nbad(X, Y) :- edge(X, _).\n")
    write(tmp_path / "facts" / "edge.facts", "1\t2\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out))
    assert result.exit_code == 1
    assert f"{prog}:2:" in result.output
    assert "Y" in result.output
    assert not out.exists()


def test_syntax_error_position(tmp_path: Path) -> None:
    prog = write(tmp_path / "bad.dl", "p(X) :- q(X)\n  r(X) :- q(X).\n")
    result = invoke(str(prog), "--facts", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert f"{prog}:2:3:" in result.output
    assert not (tmp_path / "out").exists()


def test_facts_with_wrong_arity_fail_cleanly(tmp_path: Path) -> None:
    prog = write(tmp_path / "tc.dl", TC)
    write(tmp_path / "facts" / "edge.facts", "1\t2\t3\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out))
    assert result.exit_code == 1
    assert "edge" in result.output
    assert not out.exists()


SOUFFLE = """
.decl edge(x: symbol, y: symbol)
.input edge
.decl path(x: symbol, y: symbol)
.output path
.decl hops(x: symbol, n: number)
.output hops
.decl internal(x: symbol)
path(x, y) :- edge(x, y).
path(x, y) :- path(x, z), edge(z, y).
internal(x) :- path(x, _).
hops(x, n) :- internal(x), n = count : { path(x, _) }.
"""


def test_souffle_program_reads_inputs_and_writes_only_outputs(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", SOUFFLE)
    # typed per .decl: "10" stays the symbol "10", not a number
    write(tmp_path / "facts" / "edge.facts", "a\tb\nb\t10\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--facts", str(tmp_path / "facts"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["hops.csv", "path.csv"]
    assert (out / "path.csv").read_text() == "a\t10\na\tb\nb\t10\n"
    assert (out / "hops.csv").read_text() == "a\t2\nb\t1\n"


def test_souffle_dialect_forced_and_unsupported_construct(tmp_path: Path) -> None:
    prog = write(tmp_path / "p.dl", ".decl a(x: number)\n.output a\na(1).\n")
    out = tmp_path / "out"
    result = invoke(str(prog), "--out", str(out), "--facts", str(tmp_path), "--dialect", "souffle")
    assert result.exit_code == 0, result.output
    assert (out / "a.csv").read_text() == "1\n"
    bad = write(tmp_path / "bad.dl", ".decl a(x: number)\n.output a\na(x) :- x = @f(1).\n")
    result = invoke(str(bad), "--out", str(tmp_path / "o2"), "--facts", str(tmp_path))
    assert result.exit_code == 1
    assert f"{bad}:3:" in result.output
    assert not (tmp_path / "o2").exists()
