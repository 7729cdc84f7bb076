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
