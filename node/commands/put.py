"""``merklog put`` / ``merklog retract``: write facts in Datalog syntax, print their CIDs."""

from __future__ import annotations

import click

from merklog.node.cli import State, pass_state


def _write(state: State, facts: tuple[str, ...], file: object, retract: bool) -> None:
    from merklog.node.cliutil import facts_text, guard, target

    text = facts_text(facts, file)
    with target(state) as t:
        result = guard(lambda: t.write("", text) if retract else t.write(text, ""))
    for item in result["retracted" if retract else "asserted"]:
        click.echo(f"{item['cid']}\t{item['fact']}")


def register(cli: click.Group) -> None:
    @cli.command("put")
    @click.argument("facts", nargs=-1)
    @click.option("-f", "--file", type=click.File("r"), help="Read facts from a file (- = stdin).")
    @pass_state
    def put(state: State, facts: tuple[str, ...], file: object) -> None:
        """Assert FACTS such as 'edge(1, 2).'; prints "CID<TAB>fact" for each."""
        _write(state, facts, file, retract=False)

    @cli.command("retract")
    @click.argument("facts", nargs=-1)
    @click.option("-f", "--file", type=click.File("r"), help="Read facts from a file (- = stdin).")
    @pass_state
    def retract(state: State, facts: tuple[str, ...], file: object) -> None:
        """Retract FACTS (every currently visible assertion of each)."""
        _write(state, facts, file, retract=True)
