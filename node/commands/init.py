"""``merklog init``: create keys, the config file with its defaults, and the SQLite store."""

from __future__ import annotations

import click

from merklog.node.cli import State, pass_state


class _StoreChoice(click.Choice):
    """``--store``'s choices, saying why ``memory`` is not one (it is a store.backend of
    the Python API): click's own message only listed the others."""

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):  # noqa: ANN201
        if value == "memory":
            self.fail(
                "a memory store keeps nothing once a command ends, so a home cannot use"
                " it; use sqlite (the default) or ipfs, or the Python API"
                " merklog.open(memory=True) for a throwaway node",
                param,
                ctx,
            )
        return super().convert(value, param, ctx)


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
        type=_StoreChoice(["sqlite", "ipfs"]),
        default=None,
        help="Where blocks live (store.backend): a SQLite file, or an IPFS daemon.",
    )
    @click.option(
        "--ipfs-api",
        default=None,
        metavar="URL_OR_MULTIADDR",
        help="RPC API of the IPFS daemon (store.ipfs_api), e.g. http://127.0.0.1:5001.",
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
        backend: str | None,
        ipfs_api: str | None,
        force: bool,
        token: str | None,
    ) -> None:
        """Create (or complete) a node home: Ed25519 key, config.toml, store, dataset.

        Nothing is left half-created: if any step fails, what this command created is
        removed again. `--join URL` on a home that already follows a dataset refuses
        unless `--force` is given (the home's facts would no longer be visible).
        """
        from merklog.node.config import (
            TOKENS,
            Config,
            check_static_dir,
            check_tokens,
            generated_tokens,
        )
        from merklog.node.dataset import genesis_from_ipfs
        from merklog.node.homeinit import (
            Join,
            changed_settings,
            fetch_join,
            initialise,
            lock_is_new,
            refuse_dataset_switch,
            refuse_store_switch,
            refuse_unusable_store,
        )
        from merklog.node.node import IDENTITY_FILE
        from merklog.node.runtime import HomeLock
        from merklog.node.storage import check_store
        from merklog.node.storecheck import refuse_unfinished_restore
        from merklog.node.target import refuse_memory_store

        # As every other command does: init said "already initialised" and rewrote the
        # config of a home holding a restore stopped part way (QA).
        refuse_unfinished_restore(state.home)
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
            if overrides["store.backend"] != "ipfs":  # QA: a SQLite home that saved the API
                raise click.UsageError(
                    f"--ipfs-api names the daemon of an IPFS home; the store asked for is"
                    f" {overrides['store.backend']} (leave out --ipfs-api, or use --store ipfs)"
                )
        # Another backend or daemon for an initialised home: refused before the daemon
        # is asked anything (it may be down) and before anything is written.
        refuse_store_switch(state.home, overrides)
        if join_url is None:  # a join says which dataset; --force decides below
            refuse_dataset_switch(state.home, overrides)
        # Bad options, the memory store (--set store.backend=memory) and an unusable store
        # (IPFS daemon down) fail before anything exists.
        wanted = Config.load(state.home, overrides)
        refuse_memory_store(wanted, overrides)
        check_tokens(wanted, generated_tokens())  # an empty one is generated below
        given = {key for key in TOKENS if wanted.get(key)}  # the others are generated
        check_static_dir(wanted)  # one that would publish the home: every node run refuses it
        check_store(wanted)
        refuse_unusable_store(wanted)  # a new home's store.sqlite a directory, or not SQLite
        current = (
            Config.load(state.home).get("dataset.id")
            if (state.home / "config.toml").exists()
            else ""
        )
        join = None
        if join_url is not None and not join_url.startswith(("http://", "https://")):
            # A dataset id: its genesis comes through the IPFS daemon (no peer URL).
            dataset, genesis = genesis_from_ipfs(Config.load(state.home, overrides), join_url)
            join = Join("", dataset, genesis, None)
        elif join_url is not None:
            from merklog.node.peersync import check_peer_url

            join = fetch_join(check_peer_url(join_url), token=token or "")
        existed = state.home.exists()
        lock_made = lock_is_new(state.home)  # a failed init removes it again
        # The home's lock first: a running node refuses the init before it is announced
        # as switching datasets (it said "switching …", then refused).
        try:
            lock = HomeLock.acquire(state.home)
        except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
            # a parent that is missing or a file, or a place this user cannot write
            raise click.ClickException(
                f"cannot make {state.home} a merklog home: {exc.strerror} ({exc.filename})"
            ) from None
        try:
            if join is not None and current and str(join.dataset) != current:
                if not force:
                    raise click.ClickException(
                        f"{state.home} already follows dataset {current}; --join {join_url}"
                        f" would switch it to dataset {join.dataset} and its current facts"
                        " would no longer be visible. Add --force to do that, or use a new"
                        " --home."
                    )
                click.echo(
                    f"switching {state.home} from dataset {current} to {join.dataset}: the"
                    " blocks of the old dataset stay in the store but are no longer visible",
                    err=True,
                )
            config = state.home / "config.toml"  # its own values, to say what changed
            before = Config.load(state.home, env={}) if config.exists() else None
            key = state.home / IDENTITY_FILE
            new_key = before is not None and not (key.exists() or key.is_symlink())
            cfg, created = initialise(state.home, overrides, join, existed, lock_made)
        finally:
            lock.release()
        verb = "initialised" if created else "already initialised"
        if join is not None and str(join.dataset) != current and not created:
            verb = "joined"
        click.echo(f"{verb} {state.home}")
        if before is not None:  # what it changed in an initialised home, said
            for change in changed_settings(before, Config.load(state.home, env={}), given):
                click.echo(f"  changed  {change}")
        click.echo(f"  config   {state.home / 'config.toml'}")
        click.echo(f"  key      {state.home / IDENTITY_FILE}")
        if new_key and not created:  # said, not done quietly: the old key is gone for good
            click.echo(
                "  new key  the node key was missing, so this made a new one: it writes only"
                " once a writer of the dataset grants it (`merklog writers grant KEY` on"
                " that writer's home, with the key hex below)"
            )
        click.echo(f"  store    {cfg.path('store.path')}")
        click.echo(f"  dataset  {cfg.get('dataset.id')}")
        if join is not None and join.url:
            click.echo(f"  origin   {join.url} (synced once before the first write)")
        from merklog.replication.identity import Identity

        key = Identity.load(state.home / IDENTITY_FILE).public_key.hex()
        click.echo(f"  key hex  {key}")
