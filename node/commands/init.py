"""``merklog init``: create keys, the config file with its defaults, and the SQLite store."""

from __future__ import annotations

import click

from merklog.node.cli import State, pass_state


def register(cli: click.Group) -> None:
    @cli.command("init")
    @click.option("--port", type=int, default=None, help="HTTP port written to the config.")
    @click.option("--host", default=None, help="Bind address written to the config.")
    @click.option(
        "--join",
        "join_url",
        default=None,
        metavar="URL",
        help="Follow the dataset of the node at URL instead of creating one.",
    )
    @click.option(
        "--force",
        is_flag=True,
        help="With --join on an initialised home: switch it to the joined dataset.",
    )
    @click.option(
        "--token",
        default=None,
        envvar="MERKLOG_PEER_TOKEN",
        help="With --join: the peer's read token (its api.read_token) [$MERKLOG_PEER_TOKEN].",
    )
    @pass_state
    def init(
        state: State,
        port: int | None,
        host: str | None,
        join_url: str | None,
        force: bool,
        token: str | None,
    ) -> None:
        """Create (or complete) a node home: Ed25519 key, config.toml, store, dataset.

        Nothing is left half-created: if any step fails, what this command created is
        removed again. `--join URL` on a home that already follows a dataset refuses
        unless `--force` is given (the home's facts would no longer be visible).
        """
        from merklog.node.config import Config
        from merklog.node.homeinit import fetch_join, initialise
        from merklog.node.node import IDENTITY_FILE
        from merklog.node.runtime import HomeLock

        overrides = dict(state.overrides)
        if port is not None:
            overrides["node.port"] = port
        if host is not None:
            overrides["node.host"] = host
        Config.load(state.home, overrides)  # bad options fail before anything is created
        current = (
            Config.load(state.home).get("dataset.id")
            if (state.home / "config.toml").exists()
            else ""
        )
        join = fetch_join(join_url, token=token or "") if join_url is not None else None
        if join is not None and current and str(join.dataset) != current:
            if not force:
                raise click.ClickException(
                    f"{state.home} already follows dataset {current}; --join {join_url} would"
                    f" switch it to dataset {join.dataset} and its current facts would no"
                    " longer be visible. Add --force to do that, or use a new --home."
                )
            click.echo(
                f"switching {state.home} from dataset {current} to {join.dataset}: the blocks"
                " of the old dataset stay in the store but are no longer visible",
                err=True,
            )
        existed = state.home.exists()
        lock = HomeLock.acquire(state.home)
        try:
            cfg, created = initialise(state.home, overrides, join, existed)
        finally:
            lock.release()
        verb = "initialised" if created else "already initialised"
        if join is not None and str(join.dataset) != current and not created:
            verb = "joined"
        click.echo(f"{verb} {state.home}")
        click.echo(f"  config   {state.home / 'config.toml'}")
        click.echo(f"  key      {state.home / IDENTITY_FILE}")
        click.echo(f"  store    {cfg.path('store.path')}")
        click.echo(f"  dataset  {cfg.get('dataset.id')}")
        if join is not None:
            click.echo(f"  origin   {join.url} (synced once before the first write)")
        from merklog.replication.identity import Identity

        key = Identity.load(state.home / IDENTITY_FILE).public_key.hex()
        click.echo(f"  key hex  {key}")
