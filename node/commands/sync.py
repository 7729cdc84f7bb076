"""``merklog sync URL|PEER``: pull from and push to a peer, with a progress bar."""

from __future__ import annotations

import click

from merklog.node.cli import State, pass_state
from merklog.node.clipath import PEER


def register(cli: click.Group) -> None:
    @cli.command("sync")
    @click.argument("peer", type=PEER)
    @pass_state
    def sync(state: State, peer: str) -> None:
        """Exchange missing deltas with PEER (a name from `peers list` or http://HOST:PORT)."""
        from rich.console import Console
        from rich.progress import FileSizeColumn, Progress, SpinnerColumn, TextColumn

        from merklog.node.cliutil import fail, guard, target
        from merklog.node.failures import ExitCode

        if "://" not in peer:  # a name (a URL of another scheme is a malformed URL: exit 2)
            from merklog.node.target import load_config

            cfg = guard(lambda: load_config(state.home, state.overrides))
            if peer not in cfg.peers:
                from merklog.node.config import peer_name_problem

                problem = peer_name_problem(peer)  # no such peer can exist: bad input
                if problem is not None:
                    fail(problem, ExitCode.BAD_INPUT)
                fail(
                    f"unknown peer {peer!r}: give http://HOST:PORT or add it with `merklog peers add`",
                    ExitCode.NOT_FOUND,
                )
            peer = cfg.peers[peer]["url"]
        from merklog.node.peersync import check_peer_url

        peer = check_peer_url(peer)  # a malformed URL is bad input (exit 2), not "unreachable"
        own_timeout = _own_timeout(state)
        console = Console(stderr=True)
        with (
            target(state) as t,
            Progress(
                SpinnerColumn(),
                TextColumn("sync {task.description} {task.fields[direction]}"),
                FileSizeColumn(),
                TextColumn("{task.fields[deltas]} deltas"),
                console=console,
                transient=True,
                disable=not console.is_terminal,
            ) as bar,
        ):
            task = bar.add_task(peer, total=None, direction="", deltas=0)
            moved = {"pull": (0, 0), "push": (0, 0)}

            def progress(direction: str, size: int, deltas: int) -> None:
                if direction == "waiting":  # another sync with this peer runs first
                    bar.update(task, direction="waits for the sync with it already running")
                    return
                # Real units: HTTP body bytes and deltas, pulled and pushed so far.
                moved[direction] = (size, deltas)
                total_bytes = sum(b for b, _d in moved.values())
                total_deltas = sum(d for _b, d in moved.values())
                bar.update(task, completed=total_bytes, direction=direction, deltas=total_deltas)

            stats = guard(lambda: t.sync(peer, progress, own_timeout))
        parts = ", ".join(f"{k} {v}" for k, v in stats.items() if isinstance(v, int | float))
        click.echo(f"synced with {peer}: {parts}")
        if stats.get("held_back"):
            click.echo(
                f"note: {stats['held_back']} of the deltas {peer} lacks were not pushed: this"
                " home keeps them (or their parents) only as a snapshot's metadata (pruned, or"
                " bootstrapped from a snapshot); the peer gets them from a peer that holds them",
                err=True,
            )


def _own_timeout(state: State) -> float | None:
    """This command's ``sync.timeout`` when it set one (``--set sync.timeout=N`` or
    ``MERKLOG_SYNC_TIMEOUT``), sent to a running node, which would otherwise use its
    own; else None: the node's own then holds, which may come from how it was started
    (its environment, its ``--set``), not only from config.toml this command reads."""
    import os

    from merklog.node.cliutil import guard
    from merklog.node.target import load_config

    if "sync.timeout" not in state.overrides and "MERKLOG_SYNC_TIMEOUT" not in os.environ:
        return None
    return float(guard(lambda: load_config(state.home, state.overrides)).get("sync.timeout"))
