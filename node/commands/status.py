"""``merklog status``: dataset, heads, peers, last sync, epoch."""

from __future__ import annotations

import json

import click

from merklog.node.cli import State, pass_state


def register(cli: click.Group) -> None:
    @cli.command("status")
    @click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
    @pass_state
    def status(state: State, as_json: bool) -> None:
        """Show what this node holds and whether it is running."""
        from merklog.node.cliutil import guard, target

        with target(state) as t:
            info = guard(t.status)
        if as_json:
            click.echo(json.dumps(info))
            return
        running = f"running at {info['url']}" if info.get("running") else "not running"
        click.echo(f"home       {state.home} ({running})")
        click.echo(f"dataset    {info['dataset']}")
        click.echo(f"key        {info['key']}")
        click.echo(f"epoch      {info['epoch']}")
        click.echo(f"facts      {info['facts']} stored, {info['derived']} derived")
        click.echo(f"heads      {', '.join(info['heads'])}")
        peers = info.get("peers") or {}
        click.echo(f"peers      {', '.join(f'{n}={p}' for n, p in peers.items()) or '-'}")
        last = info.get("last_sync")
        if last:
            import time

            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last["at"]))
            click.echo(f"last sync  {last['url']} at {when}")
        else:
            click.echo("last sync  -")
