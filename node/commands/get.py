"""``merklog get CID`` and ``merklog ls [REL]``: read stored facts and blocks."""

from __future__ import annotations

import json

import click

from merklog.node.cli import State, pass_state


def register(cli: click.Group) -> None:
    @cli.command("get")
    @click.argument("cid")
    @click.option("--json", "as_json", is_flag=True, help="Print the block description as JSON.")
    @pass_state
    def get(state: State, cid: str, as_json: bool) -> None:
        """Print the fact (or block kind) stored under CID."""
        from merklog.node.cliutil import guard, target
        from merklog.node.failures import ExitCode, Failure
        from merklog.node.target import TargetError
        from merklog.store import BlockNotFound, Link, StoreError

        try:
            Link.parse(cid)
        except (ValueError, StoreError) as exc:
            raise Failure(str(exc), ExitCode.BAD_INPUT) from None  # "not a CID: 'x'", once
        with target(state) as t:
            try:
                info = guard(lambda: t.block(cid))
            except (BlockNotFound, TargetError) as exc:
                if isinstance(exc, TargetError) and exc.exit_code != ExitCode.NOT_FOUND:
                    raise
                # the same line whether the home is stopped or a node answered 404
                raise Failure(f"no block {cid} in this store", ExitCode.NOT_FOUND) from None
        if as_json:
            click.echo(json.dumps(info))
        else:
            click.echo(
                info.get("fact") or f"<{info.get('kind', 'block')} block, {info['size']} bytes>"
            )

    @cli.command("ls")
    @click.argument("rel", required=False)
    @pass_state
    def ls(state: State, rel: str | None) -> None:
        """List visible facts (of relation REL) as "CID<TAB>fact".

        Exits 3 when REL has no visible facts (a mistyped name, or every fact retracted)."""
        from merklog.node.cliutil import guard, target
        from merklog.node.failures import ExitCode, Failure

        with target(state) as t:
            facts = guard(lambda: t.facts(rel))
        if rel is not None and not facts:
            # Like ``query`` of an unknown relation: a typo must not look like an empty answer.
            raise Failure(f"no visible facts of relation {rel!r}", ExitCode.NOT_FOUND)
        if facts:  # one write: a call per line cost more than reading the facts
            lines = (f"{i['cid']}\t{i['fact']}" for i in sorted(facts, key=_fact_text))
            click.echo("\n".join(lines))


def _fact_text(item: dict[str, str]) -> str:
    return item["fact"]
