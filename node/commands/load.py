"""``merklog load PROGRAM.dl``: check a program and make it the one evaluated every epoch."""

from __future__ import annotations

from pathlib import Path

import click

from merklog.node.cli import State, pass_state


def register(cli: click.Group) -> None:
    @cli.command("load")
    @click.argument("program", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @pass_state
    def load(state: State, program: Path) -> None:
        """Check PROGRAM and install it (recorded as node.program in the config)."""
        from merklog.node.cliutil import guard, target

        text = program.read_text()
        path = program.resolve()
        with target(state) as t:
            status = guard(lambda: t.load_program(text, str(program)))
            # Recorded only once the program was accepted: a bad file changes nothing.
            cfg = t.config if hasattr(t, "config") else t.node.config  # type: ignore[attr-defined]
            cfg.data["node"]["program"] = str(path)
            cfg.save()
        click.echo(f"loaded {program} (epoch {status['epoch']}, {status['derived']} derived facts)")
