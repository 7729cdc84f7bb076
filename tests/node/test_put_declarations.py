"""``put`` honours the loaded program's ``.decl`` declarations: a fact that does not
fit is refused with one clear line (CLI exit 2, HTTP 400 JSON) and nothing of the
write is stored; undeclared relations and fitting facts are stored as before."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import Cli

PROGRAM = ".decl edge(src: int, dst: int).\npath(X, Y) :- edge(X, Y).\n"


def _rows(run: Cli, query: str) -> list:
    return json.loads(run("query", "--json", query).output)["rows"]


def test_cli_put_refuses_a_misfit_and_stores_nothing(run: Cli, tmp_path: Path) -> None:
    run("init")
    prog = tmp_path / "p.dl"
    prog.write_text(PROGRAM)
    run("load", str(prog))
    run("put", "edge(1, 2).", "other(1.5).")
    data = tmp_path / "facts.dl"
    data.write_text("edge(3, 4).\nedge(5, 6).\nedge(7, 1.0).\n")
    result = run("put", "-f", str(data), ok=False)
    assert result.exit_code == 2
    assert "edge(7, 1.0) does not fit: column dst of edge is int" in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert _rows(run, "edge(X, Y)") == [[1, 2]]  # not even edge(3, 4) of the same put
    result = run("put", 'edge(1, 2, "x").', ok=False)
    assert result.exit_code == 2 and "edge has arity 2" in result.output
    assert _rows(run, "edge(X, Y)") == [[1, 2]]
    assert _rows(run, "other(X)") == [[1.5]]


def test_http_put_refuses_a_misfit_with_400_json(home: Path, node_factory, tmp_path: Path) -> None:
    run = Cli(home)
    run("init")
    prog = tmp_path / "p.dl"
    prog.write_text(PROGRAM)
    run("load", str(prog))
    node = node_factory(home).start()
    status, body = node.request("POST", "/v1/facts", {"assert": 'edge(1, 2). edge(2, "3").'})
    assert status == 400 and body["error"] == "bad input"
    assert 'edge(2, "3") does not fit: column dst of edge is int' in body["detail"]
    json_facts = [{"rel": "edge", "args": [1, 2]}, {"rel": "edge", "args": [True, 2]}]
    status, body = node.request("POST", "/v1/facts", {"assert": json_facts})
    assert status == 400 and "edge(true, 2) does not fit" in body["detail"]
    status, body = node.request("GET", "/v1/facts")
    assert body["facts"] == []
    status, body = node.request("POST", "/v1/facts", {"assert": "edge(1, 2). misc(true)."})
    assert status == 200 and len(body["asserted"]) == 2
    # The CLI through the running node: exit 2, one line, nothing more stored.
    result = run("put", "edge(4, 5).", 'edge(5, x"00").', ok=False)
    assert result.exit_code == 2 and "does not fit" in result.output
    assert "Traceback" not in result.output
    status, body = node.request("GET", "/v1/facts")
    assert sorted(f["fact"] for f in body["facts"]) == ["edge(1, 2)", "misc(true)"]


# edge(7, 1) comes first: Python's == takes it for edge(7, true), value identity does not.
MISFIT_FILES = {
    "lines": ("edge(7, 1).\n\nother(1.0).\nedge(7, true).\n", "4:1"),
    "clauses": ("% edges\nedge(7, 1). edge(7, true).\n", "2:13"),
}


def test_a_refused_fact_of_a_file_is_named_by_its_line(
    home: Path, node_factory, tmp_path: Path
) -> None:
    """A fact that parses but does not fit the program's declarations is named by its
    ``FILE:LINE:COL``, on a stopped home and through a running node (whose 400 body
    carries the refused fact in the typed JSON form), for one fact per line and for
    clauses the parser reads; not the line of a fact Python's == takes for it."""
    run = Cli(home)
    run("init")
    prog = tmp_path / "p.dl"
    prog.write_text(PROGRAM)
    run("load", str(prog))
    files = {}
    for name, (text, _at) in MISFIT_FILES.items():
        files[name] = tmp_path / f"{name}.dl"
        files[name].write_text(text)
    for running in (False, True):
        if running:
            node = node_factory(home).start()
        for name, (_text, at) in MISFIT_FILES.items():
            result = run("put", "-f", str(files[name]), ok=False)
            assert result.exit_code == 2, result.output
            lines = result.output.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in result.output, result.output
            assert f"{files[name]}:{at}: edge(7, true) does not fit" in lines[0], lines[0]
    status, body = node.request("POST", "/v1/facts", {"assert": "edge(7, 1). edge(7, true)."})
    assert status == 400 and body["fact"] == {"rel": "edge", "args": [7, True]}
    assert _rows(run, "edge(X, Y)") == []


def test_a_fact_over_the_limit_in_a_file_is_named_by_its_line(run: Cli, tmp_path: Path) -> None:
    """A fact over the 1 MiB limit every peer keeps, refused when it is written, is
    named by its ``FILE:LINE:COL``; nothing of the put is stored."""
    run("init")
    data = tmp_path / "facts.dl"
    data.write_text('v(1).\nv("1").\nbig("' + "x" * (1 << 20) + '").\nv(1.0).\n')
    result = run("put", "-f", str(data), ok=False)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert f"{data}:3:1: fact big/1 encodes to" in lines[0], lines[0]
    assert "1048576-byte limit" in lines[0]
    assert run("ls", "v", ok=False).exit_code == 3  # no visible v fact


def test_a_refused_fact_given_as_arguments_is_named_by_its_line(
    home: Path, node_factory, tmp_path: Path
) -> None:
    """QA: ``put 'e(1, "x").<newline>e(2, 3).'`` refused e(2, 3) without a place, although
    a syntax error in the arguments says its ``LINE:COL`` and the same fact read with
    ``put -f`` says ``FILE:LINE:COL``. The arguments' ``LINE:COL`` now leads the line, on
    a stopped home and through a running node."""
    run = Cli(home)
    run("init")
    prog = tmp_path / "p.dl"
    prog.write_text(PROGRAM)
    run("load", str(prog))
    for running in (False, True):
        if running:
            node_factory(home).start()
        one = run("put", "edge(7, 1).\nedge(7, true).", ok=False)
        assert one.exit_code == 2, one.output
        assert one.output.startswith("Error: 2:1: edge(7, true) does not fit"), one.output
        two = run("put", "edge(7, 1)", "edge(8, true)", ok=False)
        assert two.output.startswith("Error: 2:1: edge(8, true) does not fit"), two.output
    assert _rows(run, "edge(X, Y)") == []
