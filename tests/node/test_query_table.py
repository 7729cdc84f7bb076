"""``merklog query``'s table: rows of long answers are laid out without rich's per-cell
objects, and the text must be exactly rich's (the answer's look does not depend on its
length). Values of every type, wide (CJK) characters, a column name wider than its
values, on a plain file and on a terminal with colours; an answer too wide for the
console (rich folds its cells) stays rich's."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from merklog.node.commands import query as query_cmd
from merklog.store import Link, fact_cid, format_value, make_fact

LINK: Link = fact_cid(make_fact("p", (1,)))
VALUES = [1, 1.0, True, "1", b"\x01", -7, 2**63 - 1, "日本語", 'q"uo', "b\\s", "e\u0301", 0.1]
#: Characters rich renders specially: an answer holding one is rich's.
SPECIAL = ["t\tn", "\x00", "\x7f", "\u2028", "a\u200bb"]


def _render(monkeypatch: pytest.MonkeyPatch, limit: int, columns, cells, **console) -> str:
    monkeypatch.setattr(query_cmd, "RICH_MAX_ROWS", limit)
    out = io.StringIO()
    query_cmd.print_table(Console(file=out, soft_wrap=True, **console), columns, cells)
    return out.getvalue()


@pytest.mark.parametrize(
    "console",
    [{"width": 80}, {"width": 120, "force_terminal": True, "color_system": "truecolor"}],
)
@pytest.mark.parametrize(
    "columns",
    [["X", "Y"], ["AVeryLongColumnName", "Y", "Z"], ["V"]],
)
def test_long_answers_print_exactly_as_rich_does(
    monkeypatch: pytest.MonkeyPatch, console: dict, columns: list[str]
) -> None:
    n = query_cmd.RICH_MAX_ROWS + 7
    cells = [
        [format_value(VALUES[(i * (k + 3)) % len(VALUES)]) for k in range(len(columns))]
        for i in range(n)
    ]
    with monkeypatch.context() as patched:  # the rows must not go through rich here
        patched.setattr(Table, "add_row", None)
        fast = _render(patched, query_cmd.RICH_MAX_ROWS, columns, cells, **console)
    rich = _render(monkeypatch, n, columns, cells, **console)
    assert fast == rich
    assert len(fast.splitlines()) == n + 2


@pytest.mark.parametrize("special", SPECIAL)
def test_an_answer_with_a_character_rich_renders_specially_is_rich_s(
    monkeypatch: pytest.MonkeyPatch, special: str
) -> None:
    n = query_cmd.RICH_MAX_ROWS + 1
    cells = [[format_value(i), format_value(special if i == 500 else "v")] for i in range(n)]
    fast = _render(monkeypatch, query_cmd.RICH_MAX_ROWS, ["X", "S"], cells, width=80)
    assert fast == _render(monkeypatch, n, ["X", "S"], cells, width=80)


@pytest.mark.parametrize("n", [2, query_cmd.RICH_MAX_ROWS + 1])
def test_a_terminal_too_narrow_folds_values_and_cuts_none(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """On a terminal narrower than the answer rich laid the table out and cut each value
    wider than its column with "…", so ``w3("xxxxxxxxxxxxxx", 9007199254740993, …)`` and
    ``w3("xxxxxxxxxxxxxx", 9007199254740992, …)`` printed alike. The values are folded onto
    more lines instead: read column by column, the table holds every value whole."""
    cells = [[format_value(LINK), format_value("x" * (i % 50) + str(2**53 + i))] for i in range(n)]
    tty = {"width": 60, "force_terminal": True}
    fast = _render(monkeypatch, query_cmd.RICH_MAX_ROWS, ["C", "S"], cells, **tty)
    assert fast == _render(monkeypatch, n + 1, ["C", "S"], cells, **tty)
    assert "…" not in fast
    body = [line.split("│") for line in fast.splitlines()[2:]]  # below the header and rule
    for k in range(2):
        assert "".join(piece[k].strip() for piece in body) == "".join(row[k] for row in cells)


def test_a_pipe_or_file_never_cuts_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a terminal: the table is as wide as its widest row, so every CID is whole."""
    for n in (3, query_cmd.RICH_MAX_ROWS + 1):
        cells = [[format_value(LINK), format_value("x" * (i % 50))] for i in range(n)]
        out = _render(monkeypatch, query_cmd.RICH_MAX_ROWS, ["C", "S"], cells, width=80)
        assert "…" not in out
        assert out.count(format_value(LINK)) == n


def test_an_empty_answer_prints_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _render(monkeypatch, 0, ["X"], [], width=80) == _render(
        monkeypatch, 10, ["X"], [], width=80
    )
