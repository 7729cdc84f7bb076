"""``merklog query 'path(1, X)'``: answer a query as a table, JSON or CSV."""

from __future__ import annotations

import csv
import json
import sys

import click

from merklog.node.cli import State, pass_state


def _cell(value: object) -> str:
    if isinstance(value, dict) and isinstance(value.get("/"), str):
        return f'cid"{value["/"]}"'
    if isinstance(value, dict) and isinstance(value.get("/"), dict):
        return f"b64:{value['/']['bytes']}"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


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
            for row in rows:
                table.add_row(*(_cell(v) for v in row))
            Console(soft_wrap=True).print(table)
            click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
