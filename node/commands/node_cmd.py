"""``merklog node run``: the peer in the foreground (HTTP server + epoch loop)."""

from __future__ import annotations

from pathlib import Path

import click

from merklog.node.cli import State, pass_state
from merklog.node.clipath import GivenPath


def register(cli: click.Group) -> None:
    @cli.group("node")
    def node() -> None:
        """Run the peer."""

    @node.command("run")
    @click.option("--host", default=None, help="Bind address [node.host, 127.0.0.1].")
    @click.option("--port", type=int, default=None, help="TCP port, 0 = any [node.port, 7420].")
    @click.option("--epoch-interval", type=float, default=None, help="Seconds between idle epochs.")
    @click.option(
        "--program",
        type=GivenPath(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="Check this Datalog program and store it in the home before serving.",
    )
    @click.option(
        "--static-dir",
        type=GivenPath(file_okay=False, path_type=Path),
        default=None,
        help="Folder whose index.html is served at / [node.static_dir].",
    )
    @click.option("--tick", is_flag=True, default=None, help="Feed a tick(N) fact every epoch.")
    @click.option("--init", "do_init", is_flag=True, help="Initialise the home first if needed.")
    @pass_state
    def run(
        state: State,
        host: str | None,
        port: int | None,
        epoch_interval: float | None,
        program: Path | None,
        static_dir: Path | None,
        tick: bool | None,
        do_init: bool,
    ) -> None:
        """Serve this node until SIGINT/SIGTERM; /healthz answers 200 once ready."""
        import asyncio
        import sys
        from contextlib import nullcontext

        from merklog.node.cliutil import load_bar
        from merklog.node.config import CONFIG_FILE, Config, check_tokens, generated_tokens
        from merklog.node.config import static_dir as checked_static_dir
        from merklog.node.files import read_text_file
        from merklog.node.handlers import body_worker
        from merklog.node.homeinit import initialise, lock_is_new, refuse_unusable_store
        from merklog.node.node import Node
        from merklog.node.runtime import HomeBusy, HomeLock, remove_runfile
        from merklog.node.server import serve
        from merklog.node.storecheck import precheck
        from merklog.node.target import load_config, refuse_memory_store

        # Forked first, while this process runs one thread and holds neither the home's
        # lock nor its database (ADR 0148); ended whatever happens next.
        with body_worker() or nullcontext() as worker:
            overrides = dict(state.overrides)
            for key, value in (
                ("node.host", host),
                ("node.port", port),
                ("node.epoch_interval", epoch_interval),
                ("node.static_dir", str(static_dir.resolve()) if static_dir else None),
                ("node.tick", tick),
            ):
                if value is not None:
                    overrides[key] = value
            # The memory store would serve a dataset that dies with the node: refused
            # before --init makes a home (load_config below refuses it too).
            wanted = Config.load(state.home, overrides)
            refuse_memory_store(wanted, overrides)
            if do_init and not (state.home / CONFIG_FILE).exists():  # refused before it is made
                check_tokens(wanted, generated_tokens())
                refuse_unusable_store(wanted)
            elif not do_init:  # not a home: said before the lock makes or changes anything
                load_config(state.home, overrides)
            existed = state.home.exists()  # before the lock makes it
            lock_made = lock_is_new(state.home)
            try:
                lock = HomeLock.acquire_for_node(state.home)
            except HomeBusy as exc:
                raise click.ClickException(str(exc)) from None
            remove_runfile(state.home)  # a node killed with -9 left its old URL behind
            try:
                if do_init:
                    # As `merklog init` does it: what a failed init created is removed again
                    # (an IPFS daemon down left identity.pem and node.lock behind, a home
                    # every later command called "not a merklog home").
                    # with this command's settings, as `merklog --set … init` takes them
                    # (QA: --set store.backend=ipfs made a SQLite home, then refused it)
                    initialise(state.home, overrides, None, existed, lock_made)
                cfg = load_config(state.home, overrides)
                precheck(cfg)
                checked_static_dir(cfg, must_exist=True)  # missing, or publishing the home: exit 2
                node = Node(cfg, lock)
                if program is not None:  # checked, stored in the home, then swapped in
                    try:
                        node.load_program(read_text_file(program), str(program))
                    except BaseException:
                        node.close()
                        lock = None
                        raise
            except BaseException:
                if lock is not None:  # the CLI's error boundary reports what went wrong
                    lock.release()
                raise

            from merklog.node.logs import announce as say

            def announce(url: str) -> None:
                token = cfg.get("api.token")
                say(f"merklog node {cfg.get('dataset.id')} listening on {url}", state.log_format)
                if cfg.path("node.static_dir"):
                    # The URL with the write token is for the person at the terminal; a
                    # log (a service's journal, a file) gets the URL without the secret.
                    if sys.stderr.isatty() and state.log_format != "json":
                        say(f"app: {url}/#token={token}", state.log_format)
                    else:
                        say(
                            f"app: {url}/ (open it as {url}/#token=WRITE_TOKEN;"
                            " `merklog token --write` prints the token)",
                            state.log_format,
                        )

            try:
                # A large home's stored facts are read before the node listens: a bar on
                # a terminal shows that read (not in JSON log mode).
                bar = load_bar(node) if state.log_format != "json" else nullcontext()
                with bar:
                    asyncio.run(
                        serve(
                            node, cfg.get("node.host"), int(cfg.get("node.port")), announce, worker
                        )
                    )
            except OSError as exc:  # a host that does not resolve, a port in use, …
                if not _address_problem(exc):
                    # a full disk writing node.json said "cannot serve on HOST:PORT" (QA):
                    # the CLI's error boundary names the file and exits 6
                    raise
                where = f"{cfg.get('node.host')}:{cfg.get('node.port')}"
                raise click.ClickException(
                    f"cannot serve on {where}: {exc.strerror or exc}"
                ) from None
            finally:
                node.close()
                # Everything is committed and closed: keep the interpreter's last collection
                # from walking the whole (possibly huge) heap on the way out (ADR 0078).
                import gc

                gc.freeze()
            say("stopped", state.log_format)


def _address_problem(exc: OSError) -> bool:
    """Whether ``exc`` is about the address the node binds (a host that does not resolve,
    a port in use or not allowed), not a file it writes (those name their file)."""
    import errno
    import socket

    if isinstance(exc, socket.gaierror):
        return True
    return exc.filename is None and exc.errno in (
        errno.EADDRINUSE,
        errno.EADDRNOTAVAIL,
        errno.EACCES,
        errno.EPERM,
        errno.EAFNOSUPPORT,
        errno.EINVAL,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
    )
