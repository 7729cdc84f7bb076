"""``merklog query 'path(1, X)'``: answer a query as a table, JSON or CSV."""

from __future__ import annotations

import csv
import json
import re
import sys
from typing import TYPE_CHECKING

import click

from merklog.node.cli import State, pass_state
from merklog.node.jsonvalues import value_from_json
from merklog.store import format_value

if TYPE_CHECKING:
    from rich.console import Console


def _cell(value: object) -> str:
    """A JSON-form answer value as a Datalog literal (``1``, ``1.0``, ``true``, ``"1"``,
    ``x"01"``, ``cid"…"``): the one way merklog renders a value, so distinct values
    never print alike."""
    return format_value(value_from_json(value))


#: Answers of more rows than this have their rows laid out here (see :func:`print_table`).
RICH_MAX_ROWS = 1000


def print_table(console: Console, columns: list[str], cells: list[list[str]]) -> None:
    """The answer as rich's table (``show_edge=False``), header and rule drawn by rich.

    rich lays out and renders each cell as an object, ~50 s for 250k rows of two
    columns. When every row fits the console's width, rich draws nothing but each
    cell padded to its column's width between ``│`` separators, so an answer longer
    than ``RICH_MAX_ROWS`` rows has those lines joined here (widths in terminal cells,
    by rich's own ``cell_len``) under a header rich draws for those widths: the same
    text, in ~1/100 of the time. An answer that does not fit a terminal (rich folds a
    value wider than its column onto more lines) or holds a character rich renders
    specially (a tab, a control character) is rich's throughout. A console that is not a terminal is widened to the table first,
    so that a query piped to a file never has a value cut with "…"."""
    from rich.cells import cell_len
    from rich.table import Column, Table
    from rich.text import Text

    widths = _widths(columns, cells)
    natural = sum(w + 3 for w in widths) - 1  # " value " per column, "│" between
    if not console.is_terminal:  # a pipe or a file: widened so that no value is cut
        console.width = max(console.width, natural)
    if (
        len(cells) <= RICH_MAX_ROWS
        or natural > console.width
        or _RICH_ONLY.search("".join(map("".join, cells))) is not None
    ):
        # A value wider than its column on the terminal is folded onto more lines, never
        # cut with "…": rows that differ only in what was cut printed alike.
        table = Table(*(Column(name, overflow="fold") for name in columns), show_edge=False)
        for row in cells:  # Text: values are never read as rich markup
            table.add_row(*map(Text, row))
        console.print(table)
        return
    header = Table(*columns, show_edge=False)
    for column, width in zip(header.columns, widths, strict=True):
        column.min_width = width
    console.print(header)
    pads = [[" " * n for n in range(width + 1)] for width in widths]
    lines = (
        "│".join(
            f" {text}{pad[width - cell_len(text)]} "
            for text, pad, width in zip(row, pads, widths, strict=True)
        )
        for row in cells
    )
    console.file.write("\n".join(lines) + "\n")


#: Characters rich renders specially (tabs expanded, control and format characters
#: dropped or escaped): an answer holding one is laid out by rich.
_RICH_ONLY = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def _widths(columns: list[str], cells: list[list[str]]) -> list[int]:
    """Each column's width in terminal cells (rich's ``cell_len``): its widest value or
    its name."""
    from rich.cells import cell_len

    values = zip(*cells, strict=True) if cells else [()] * len(columns)
    return [
        max([cell_len(name), *map(cell_len, col)])
        for name, col in zip(columns, values, strict=True)
    ]


def register(cli: click.Group) -> None:
    @cli.command("query")
    @click.argument("query")
    @click.option("--json", "as_json", is_flag=True, help="One JSON object {columns, rows}.")
    @click.option(
        "--csv",
        "as_csv",
        is_flag=True,
        help="CSV with a header row; each cell is the value in Datalog syntax (strings in"
        ' double quotes, so 1 and "1" stay apart; --json gives typed JSON values: bytes and'
        " CIDs in their DAG-JSON forms). A query with no variables gives one column,"
        " holds, of true or false.",
    )
    @pass_state
    def query(state: State, query: str, as_json: bool, as_csv: bool) -> None:
        """Evaluate QUERY (an atom or comma-separated body) over the current epoch."""
        from merklog.node.cliutil import guard, stdout_console, target

        if as_json and as_csv:  # the last flag used to win silently
            raise click.UsageError("--json and --csv are two output formats: give one")
        fmt = "json" if as_json else "csv" if as_csv else None

        with target(state) as t:
            result = guard(lambda: t.query(query))
        columns, rows = result["columns"], result["rows"]
        if fmt == "json":
            click.echo(json.dumps({"columns": columns, "rows": rows}))
        elif fmt == "csv":
            writer = csv.writer(sys.stdout, lineterminator="\n")
            if not columns:  # a ground query: CSV has no record of zero fields (the empty
                # lines written before read as one empty column), so one column says it
                writer.writerows([["holds"], ["true" if rows else "false"]])
                return
            writer.writerow(columns)
            for row in rows:
                writer.writerow([_cell(v) for v in row])
        else:
            if not columns:
                click.echo("true" if rows else "false")
                return
            print_table(
                stdout_console(soft_wrap=True), columns, [[_cell(v) for v in r] for r in rows]
            )
            click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
