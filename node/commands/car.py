"""``merklog export FILE.car`` / ``merklog import FILE.car``: CAR v1 interchange."""

from __future__ import annotations

from pathlib import Path

import click

from merklog.node.cli import State, pass_state


def register(cli: click.Group) -> None:
    @cli.command("export")
    @click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
    @pass_state
    def export(state: State, file: Path) -> None:
        """Write the whole replica (genesis, deltas, facts) as a CAR rooted at the heads."""
        from merklog.node.cliutil import guard, target

        with target(state) as t:
            n = guard(lambda: t.export_car(file))
        click.echo(f"exported {n} blocks to {file}")

    @cli.command("import")
    @click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @pass_state
    def import_(state: State, file: Path) -> None:
        """Verify and apply the deltas in a CAR file (all or nothing)."""
        from merklog.node.cliutil import guard, target

        with target(state) as t:
            stats = guard(lambda: t.import_car(file))
        click.echo(f"imported {file}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
