"""Values keep their identity through the node: ``1``, ``1.0``, ``true``, ``"1"`` and
``x"01"`` are five facts with five CIDs, and every query, program and retraction on a
home keeps them apart (the node used to hold stored facts in Python sets, where
``True == 1 == 1.0`` merged them before the engine saw them)."""

from __future__ import annotations

import json
from pathlib import Path

MIXED = ("p(1).", "p(1.0).", "p(true).", 'p("1").', 'p(x"01").')


def rows(run, query: str) -> list[str]:
    """The answer rows as their JSON text: ``[1]``, ``[1.0]`` and ``[true]`` stay apart
    (Python's ``==`` would call them equal)."""
    return sorted(json.dumps(r) for r in json.loads(run("query", "--json", query).output)["rows"])


def test_put_and_query_keep_mixed_values_apart(run) -> None:
    run("init")
    cids = run("put", *MIXED).output.split()[::2]
    assert len(set(cids)) == 5
    assert rows(run, "p(X)") == sorted(
        ["[1]", "[1.0]", "[true]", '["1"]', '[{"/": {"bytes": "AQ"}}]']
    )
    # a bool compares equal to nothing but itself
    assert rows(run, "p(X), X == true") == ["[true]"]
    table = run("query", "p(X)").output
    for literal in ("1.0", "true", '"1"', 'x"01"'):
        assert literal in table


def test_answers_come_in_the_one_value_order(run) -> None:
    """Rows were sorted by their values' Python type names (Link, bool, bytes, float,
    int, str), so 1e300 came before -5 and 1.0 before 1; they now follow the value order
    eval --sorted writes: bool < number (an int just before an equal float) < str <
    bytes < CID."""
    run("init")
    cid = "bafyreihhnb7eljqc2zkwknddrdqvmuov4xidiqqqlahqej3u7fuwa3hjuy"
    values = ["1e300", "true", 'x"01"', f'cid"{cid}"', "-5", '"a"', "1.0", "1", "false"]
    run("put", *(f"s({v})." for v in values))
    got = [json.dumps(r) for r in json.loads(run("query", "--json", "s(X)").output)["rows"]]
    assert got == ["[false]", "[true]", "[-5]", "[1]", "[1.0]", "[1e+300]", '["a"]',
                   '[{"/": {"bytes": "AQ"}}]', f'[{{"/": "{cid}"}}]']  # fmt: skip


def test_programs_and_retraction_on_a_home_keep_identity(run, tmp_path: Path) -> None:
    run("init")
    run("put", *MIXED)
    prog = tmp_path / "p.dl"
    prog.write_text(
        "q(X) :- p(X), X == 1.\n"
        "c(N) :- N := count : p(_).\n"
        "n(X) :- p(X), !r(X).\n"
        "r(1).\n"
    )
    run("load", str(prog))
    # == compares numbers exactly (1 == 1.0), never a bool with a number
    assert rows(run, "q(X)") == ["[1.0]", "[1]"]
    assert rows(run, "c(N)") == ["[5]"]
    assert rows(run, "n(X)") == sorted(["[1.0]", "[true]", '["1"]', '[{"/": {"bytes": "AQ"}}]'])
    run("retract", "p(1).")
    assert rows(run, "p(X)") == sorted(["[1.0]", "[true]", '["1"]', '[{"/": {"bytes": "AQ"}}]'])
    assert rows(run, "c(N)") == ["[4]"]


def test_a_carriage_return_in_a_string_is_the_same_value_from_a_file(
    run, tmp_path: Path
) -> None:
    """``put -f`` read its file as text mode does, so a lone CR inside a string became a
    line end: ``"mid\\rdle"`` was refused as an unterminated string from a file, while
    the same text as an argument (or a write body) stored it. A CRLF line end is still
    one line end."""
    run("init")
    fact = 'cr("mid\rdle").'
    by_argument = run("put", fact).output.split()[0]
    path = tmp_path / "facts.dl"
    path.write_bytes(f"{fact}\r\ncr(2).\r\n".encode())
    by_file = run("put", "-f", str(path)).output.split()[::2]
    assert by_file[0] == by_argument and len(by_file) == 2
    assert rows(run, "cr(X)") == ['["mid\\rdle"]', "[2]"]
