"""``merklog query 'path(1, X)'``: answer a query as a table, JSON or CSV."""

from __future__ import annotations

import csv
import json
import sys

import click

from merklog.node.cli import State, pass_state
from merklog.node.jsonvalues import value_from_json
from merklog.store import format_value


def _cell(value: object) -> str:
    """A JSON-form answer value as a Datalog literal (``1``, ``1.0``, ``true``, ``"1"``,
    ``x"01"``, ``cid"…"``): the one way merklog renders a value, so distinct values
    never print alike."""
    return format_value(value_from_json(value))


def register(cli: click.Group) -> None:
    @cli.command("query")
    @click.argument("query")
    @click.option("--json", "fmt", flag_value="json", help="One JSON object {columns, rows}.")
    @click.option("--csv", "fmt", flag_value="csv", help="CSV with a header row.")
    @pass_state
    def query(state: State, query: str, fmt: str | None) -> None:
        """Evaluate QUERY (an atom or comma-separated body) over the current epoch."""
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        from merklog.node.cliutil import guard, target

        with target(state) as t:
            result = guard(lambda: t.query(query))
        columns, rows = result["columns"], result["rows"]
        if fmt == "json":
            click.echo(json.dumps({"columns": columns, "rows": rows}))
        elif fmt == "csv":
            writer = csv.writer(sys.stdout, lineterminator="\n")
            writer.writerow(columns)
            for row in rows:
                writer.writerow([_cell(v) for v in row])
        else:
            if not columns:
                click.echo("true" if rows else "false")
                return
            table = Table(*columns, show_edge=False)
            for row in rows:  # Text: values are never read as rich markup
                table.add_row(*(Text(_cell(v)) for v in row))
            Console(soft_wrap=True).print(table)
            click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
