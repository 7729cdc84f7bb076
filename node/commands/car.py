"""``merklog export FILE.car`` / ``import FILE.car`` / ``restore FILE.car``: CAR v1
interchange, backup and restore (docs/operations.md, "Backup and restore")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from merklog.node.cli import State, pass_state
from merklog.node.clipath import GivenPath


@contextmanager
def _blocks_bar(verb: str) -> Iterator[Callable[[int], None]]:
    """A progress callback counting blocks, shown on a terminal (stderr)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn

    console = Console(stderr=True)
    with Progress(
        SpinnerColumn(),
        TextColumn(f"{verb} {{task.completed}} blocks"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(verb, total=None)
        yield lambda n: bar.update(task, completed=n)


@contextmanager
def _car_file(file: Path) -> Iterator[Path]:
    """``file``, or for ``-`` standard input spooled to a private temporary file (removed
    after): import and restore read a CAR more than once (its roots, then its blocks),
    and a pipe is read once (``gunzip -c backup.car.gz | merklog restore -``)."""
    if str(file) != "-":
        yield file
        return
    import shutil
    import sys
    import tempfile

    if sys.stdin is None or sys.stdin.isatty():
        raise click.UsageError("FILE - reads a CAR from standard input: pipe one into it")
    # Named so that an error about its content says where it came from.
    folder = Path(tempfile.mkdtemp(prefix="merklog-stdin-"))
    path = folder / "standard-input.car"
    try:
        with open(path, "wb") as spool:
            shutil.copyfileobj(click.get_binary_stream("stdin"), spool, 1 << 20)
        if path.stat().st_size == 0:
            raise click.UsageError("FILE -: standard input held no CAR (nothing was piped)")
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _named(file: Path) -> str:
    return "standard input" if str(file) == "-" else str(file)


def register(cli: click.Group) -> None:
    @cli.command("export")
    @click.argument("file", type=GivenPath(dir_okay=False, allow_dash=True, path_type=Path))
    @pass_state
    def export(state: State, file: Path) -> None:
        """Write the whole replica (genesis, deltas, facts) as a CAR rooted at the heads.

        FILE `-` is standard output (the summary line then goes to standard error); a
        symbolic link is written through, a FIFO as the CAR is made."""
        from merklog.node.cliutil import target

        with target(state) as t, _blocks_bar("export") as progress:
            n = t.export_car(file, progress)
        to_stdout = str(file) == "-"
        click.echo(
            f"exported {n} blocks to {'standard output' if to_stdout else file}", err=to_stdout
        )

    @cli.command("import")
    @click.argument(
        "file", type=GivenPath(exists=True, dir_okay=False, allow_dash=True, path_type=Path)
    )
    @pass_state
    def import_(state: State, file: Path) -> None:
        """Verify and apply the deltas in a CAR file (all or nothing); FILE `-` reads it
        from standard input."""
        from merklog.node.cliutil import target

        with target(state) as t, _car_file(file) as car:
            with _blocks_bar("import") as progress:
                stats = t.import_car(car, progress)
            visible = t.status()["facts"]
        # "asserts N": the accepted deltas' assert ops (the result's "facts"), retracted
        # ones too; "facts M visible": what `status` counts after the import, as `restore`
        # says it (QA: "facts 40008" for a CAR that left 9 facts visible)
        click.echo(
            f"imported {_named(file)}: accepted {stats['accepted']}, duplicates"
            f" {stats['duplicates']}, asserts {stats['facts']}; facts {visible} visible"
        )

    @cli.command("restore")
    @click.argument(
        "file", type=GivenPath(exists=True, dir_okay=False, allow_dash=True, path_type=Path)
    )
    @click.option(
        "--identity",
        type=GivenPath(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="The node key (identity.pem) saved with the backup; else a new key is made.",
    )
    @pass_state
    def restore(state: State, file: Path, identity: Path | None) -> None:
        """Create a new home from a backup CAR (made by `merklog export`); FILE `-` reads
        it from standard input."""
        from merklog.node.backup import restore as do_restore
        from merklog.node.node import Node

        with _car_file(file) as car:
            stats = do_restore(state.home, car, identity, dict(state.overrides), Node)
        # "facts N visible": the count `status` shows, not every fact ever asserted
        click.echo(
            f"restored {state.home} from {_named(file)}: dataset {stats['dataset']}, accepted"
            f" {stats['accepted']}, duplicates {stats['duplicates']}, facts {stats['facts']}"
            " visible"
        )
