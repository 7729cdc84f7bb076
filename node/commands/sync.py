"""``merklog sync URL|PEER``: pull from and push to a peer, with a progress bar."""

from __future__ import annotations

import click

from merklog.node.cli import State, pass_state


def register(cli: click.Group) -> None:
    @cli.command("sync")
    @click.argument("peer")
    @pass_state
    def sync(state: State, peer: str) -> None:
        """Exchange missing deltas with PEER (a name from `peers list` or http://HOST:PORT)."""
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

        from merklog.node.cliutil import fail, guard, target

        if not peer.startswith(("http://", "https://")):
            from merklog.node.target import load_config

            cfg = guard(lambda: load_config(state.home, state.overrides))
            if peer not in cfg.peers:
                fail(
                    f"unknown peer {peer!r}: give http://HOST:PORT or add it with `merklog peers add`"
                )
            peer = cfg.peers[peer]["url"]
        with (
            target(state) as t,
            Progress(
                TextColumn("sync {task.description}"), BarColumn(), DownloadColumn(), transient=True
            ) as bar,
        ):
            task = bar.add_task(peer, total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total or None)

            stats = guard(lambda: t.sync(peer, progress))
        parts = ", ".join(f"{k} {v}" for k, v in stats.items() if isinstance(v, int | float))
        click.echo(f"synced with {peer}: {parts}")
