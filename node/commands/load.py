"""``merklog load PROGRAM.dl``: check a program and make it the one evaluated every epoch."""

from __future__ import annotations

from pathlib import Path

import click

from merklog.node.cli import State, pass_state
from merklog.node.clipath import GivenPath


def register(cli: click.Group) -> None:
    @cli.command("load")
    @click.argument("program", type=GivenPath(exists=True, dir_okay=False, path_type=Path))
    @pass_state
    def load(state: State, program: Path) -> None:
        """Check PROGRAM and install it: its text is stored in the home (a block), so
        editing or deleting the file afterwards changes nothing; a program that fails a
        check changes nothing either."""
        from merklog.node.cliutil import guard, target
        from merklog.node.files import read_text_file

        text = read_text_file(program)
        with target(state) as t:
            status = guard(lambda: t.load_program(text, str(program)))
        click.echo(f"loaded {program} (epoch {status['epoch']}, {status['derived']} derived facts)")
