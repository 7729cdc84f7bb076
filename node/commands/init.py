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
        help="Follow the dataset of the node at URL instead of creating one; on an IPFS "
        "store, URL may be the dataset id (its genesis is fetched through the daemon).",
    )
    @click.option(
        "--store",
        "backend",
        type=click.Choice(["sqlite", "ipfs", "memory"]),
        default=None,
        help="Where blocks live (store.backend): a SQLite file, or an IPFS daemon.",
    )
    @click.option(
        "--ipfs-api",
        default=None,
        metavar="URL_OR_MULTIADDR",
        help="RPC API of the IPFS daemon (store.ipfs_api), e.g. http://127.0.0.1:5001.",
    )
    @pass_state
    def init(
        state: State,
        port: int | None,
        host: str | None,
        join_url: str | None,
        backend: str | None,
        ipfs_api: str | None,
    ) -> None:
        """Create (or complete) a node home: Ed25519 key, config.toml, store, dataset."""
        from merklog.node.config import Config, ConfigError
        from merklog.node.node import IDENTITY_FILE, init_home
        from merklog.node.runtime import HomeBusy, HomeLock
        from merklog.node.target import input_errors
        from merklog.node.wiring import check_store

        overrides = dict(state.overrides)
        if port is not None:
            overrides["node.port"] = port
        if host is not None:
            overrides["node.host"] = host
        if backend is not None:
            overrides["store.backend"] = backend
        if ipfs_api is not None:
            overrides["store.ipfs_api"] = ipfs_api
            overrides.setdefault("store.backend", "ipfs")
        try:  # an unusable store (IPFS daemon down) fails before anything is created
            if backend is not None and (state.home / "config.toml").exists():
                current = Config.load(state.home).get("store.backend")
                if current != backend:
                    raise click.ClickException(
                        f"{state.home} already keeps its blocks in {current}; to move it to "
                        f"{backend}, init a new home and import a CAR export of this one"
                    )
            check_store(Config.load(state.home, overrides))
        except (ConfigError, *input_errors()) as exc:
            raise click.ClickException(str(exc)) from None
        join = None
        if join_url is not None and not join_url.startswith(("http://", "https://")):
            from merklog.node.wiring import genesis_from_ipfs

            try:
                join = genesis_from_ipfs(Config.load(state.home, overrides), join_url)
            except input_errors() as exc:
                raise click.ClickException(f"cannot join {join_url}: {exc}") from None
        elif join_url is not None:
            import asyncio

            from merklog.node.wiring import NodeInputError, fetch_genesis

            try:
                join = asyncio.run(fetch_genesis(join_url))
            except (NodeInputError, OSError, Exception) as exc:
                raise click.ClickException(f"cannot join {join_url}: {exc}") from None
        try:
            lock = HomeLock.acquire(state.home)
        except HomeBusy as exc:
            raise click.ClickException(str(exc)) from None
        try:
            cfg, created = init_home(state.home, overrides, join)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            lock.release()
        verb = "initialised" if created else "already initialised"
        click.echo(f"{verb} {state.home}")
        click.echo(f"  config   {state.home / 'config.toml'}")
        click.echo(f"  key      {state.home / IDENTITY_FILE}")
        click.echo(f"  store    {cfg.path('store.path')}")
        click.echo(f"  dataset  {cfg.get('dataset.id')}")
        from merklog.node.wiring import Identity

        key = Identity.load(state.home / IDENTITY_FILE).public_key.hex()
        click.echo(f"  key hex  {key}")
