"""``merklog token [--write]``: print this home's API token, for curl, apps and peers."""

from __future__ import annotations

import click

from merklog.node.cli import State, pass_state


def register(cli: click.Group) -> None:
    @cli.command("token")
    @click.option("--write", is_flag=True, help="The write token (api.token) instead.")
    @pass_state
    def token(state: State, write: bool) -> None:
        """Print the read token (api.read_token): what another device needs to `init --join`
        or `peers add` this node, or to read over HTTP. Both tokens are secrets."""
        from merklog.node.cliutil import guard
        from merklog.node.target import load_config

        cfg = guard(lambda: load_config(state.home, state.overrides))
        click.echo(cfg.get("api.token" if write else "api.read_token"))
