"""``merklog eval PROGRAM --facts DIR --out DIR``: batch-evaluate a program over fact files.

Reads ``<rel>.facts`` (tab-separated, one tuple a line) and writes ``<rel>.csv``
(tab-separated, sorted, no header) for every derived relation — for Soufflé
programs, the ``.input`` and ``.output`` relations, typed per ``.decl``.
A bad program prints ``FILE:line:col: message`` on stderr, exits 1 and writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click


def register(cli: click.Group) -> None:
    @cli.command("eval")
    @click.argument("program", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option(
        "--facts",
        "facts_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help="Directory of <rel>.facts input files.",
    )
    @click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help="Directory to write <rel>.csv results into (created if missing).",
    )
    @click.option(
        "--dialect",
        type=click.Choice(["auto", "merklog", "souffle"]),
        default="auto",
        show_default=True,
        help="Program syntax; auto picks souffle when the program has .decl directives.",
    )
    def eval_(program: Path, facts_dir: Path, out_dir: Path, dialect: str) -> None:
        """Evaluate PROGRAM over the fact files in --facts; write results to --out."""
        from merklog.engine.errors import EngineError
        from merklog.engine.io import read_facts_dir, write_csv
        from merklog.engine.program import Program

        def fail(message: str) -> None:
            click.echo(message, err=True)
            sys.exit(1)

        text = program.read_text(encoding="utf-8")
        try:
            prog = Program.parse(text, dialect=dialect)
        except EngineError as err:
            fail(f"{program}:{err}")
            return
        if not facts_dir.is_dir():
            fail(f"facts directory {facts_dir} does not exist")
        ast = prog.ast
        try:
            if prog.dialect == "souffle":
                types = {d.rel: [t for _n, t in d.columns] for d in ast.declarations}
                facts = read_facts_dir(facts_dir, ast.inputs, types)
                outputs = list(ast.outputs)
            else:
                facts = read_facts_dir(facts_dir)
                outputs = sorted(prog.idb)
            relations = prog.evaluate(facts)
        except EngineError as err:  # edge.facts has 2 columns but the program reads edge/1, …
            fail(f"{program}:{err}" if err.line else f"error: {err}")
            return
        except (ValueError, OSError) as err:
            fail(f"error: {err}")
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        for rel in outputs:
            write_csv(out_dir / f"{rel}.csv", relations[rel] if rel in relations else ())
        click.echo(f"wrote {len(outputs)} relations to {out_dir}", err=True)
