"""Relations are name/arity at the node too: a program reading another arity than
some stored facts loads and matches only the facts of its arity, without an internal
error, and a program mixing arities of one name is refused with both positions."""

from __future__ import annotations

import json
from pathlib import Path


def test_program_reads_only_facts_of_its_arity(run, tmp_path: Path) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).", "edge(7, 8, 9).")
    prog = tmp_path / "r.dl"
    prog.write_text("r(X, Y, Z) :- edge(X, Y, Z).\n")
    loaded = run("load", str(prog))
    assert "Traceback" not in loaded.output and "internal error" not in loaded.output
    data = json.loads(run("query", "--json", "r(X, Y, Z)").output)
    assert data["rows"] == [[7, 8, 9]]
    prog.write_text("s(X) :- edge(X, _).\n")
    run("load", str(prog))
    assert json.loads(run("query", "--json", "s(X)").output)["rows"] == [[1], [2]]


def test_one_name_with_two_arities_is_refused_and_the_old_program_stays(
    run, tmp_path: Path
) -> None:
    run("init")
    run("put", "edge(1, 2).")
    good = tmp_path / "good.dl"
    good.write_text("s(X) :- edge(X, _).\n")
    run("load", str(good))
    bad = tmp_path / "bad.dl"
    bad.write_text("r(X) :- edge(X, _).\nq(X) :-\n  edge(X, _, _).\n")
    result = run("load", str(bad), ok=False)
    assert result.exit_code != 0
    assert f"{bad}:3:3: edge has arity 2 at 1:9 and 3 at 3:3" in result.output
    assert "Traceback" not in result.output
    assert json.loads(run("query", "--json", "s(X)").output)["rows"] == [[1]]
