"""``merklog put`` / ``merklog retract``: write facts in Datalog syntax, print their CIDs."""

from __future__ import annotations

import click

from merklog.node.cli import State, pass_state


def _write(state: State, facts: tuple[str, ...], file: object, retract: bool) -> None:
    from merklog.node.cliutil import facts_text, guard, target
    from merklog.node.failures import NotVisible

    text = facts_text(facts, file)
    with target(state) as t:
        result = guard(lambda: t.write("", text) if retract else t.write(text, ""))
    missing = {item["cid"] for item in result.get("not_visible") or []}
    for item in result["retracted" if retract else "asserted"]:
        if item["cid"] not in missing:
            click.echo(f"{item['cid']}\t{item['fact']}")
    if missing:
        shown = ", ".join(item["fact"] for item in result["not_visible"][:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise NotVisible(f"not visible, nothing to retract: {shown}{more}")


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
