"""``merklog fsck [--repair-from URL|PEER] [--json]``: check a stopped home; repair the
missing or corrupted blocks (only those) from a peer, with a progress bar in blocks and
bytes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from merklog.node.cli import State, pass_state
from merklog.node.clipath import PEER


@contextmanager
def _repair_bar() -> Iterator[tuple[Callable[[int, int], None], Callable[[int, int], None]]]:
    """``progress(blocks, bytes)`` of the repaired blocks, then of the blocks imported
    into an IPFS home's daemon again, shown on a terminal (stderr)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn

    console = Console(stderr=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}: {task.completed} blocks, {task.fields[size]} bytes"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task("repair", total=None, size=0)

        def repaired(blocks: int, size: int) -> None:
            bar.update(task, completed=blocks, size=size)

        def reimported(blocks: int, size: int) -> None:
            bar.update(task, description="into the IPFS daemon again", completed=blocks, size=size)

        yield repaired, reimported


def _count(n: int, noun: str) -> str:
    """``1 block``, ``2 blocks``: the summary line counted "1 blocks", "1 problems"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _print_json(result: Any, repair_from: str | None) -> None:
    """The report as one JSON object on standard output (docs/operations.md)."""
    click.echo(
        json.dumps(
            {
                "ok": result.ok,
                "problems": result.problems,
                "blocks": result.blocks,
                "deltas": result.deltas,
                "covered": result.covered,
                "repaired_from": repair_from,
                "repaired": result.repaired,
                "repaired_bytes": result.repaired_bytes,
                "requests": result.requests,
                "bytes_received": result.bytes_received,
                "unavailable": result.unavailable,
                "from_log": result.from_log,
                "repinned": result.repinned,
                "refilled": result.refilled,
            }
        )
    )


def register(cli: click.Group) -> None:
    @cli.command("fsck")
    @click.option(
        "--repair-from",
        metavar="URL|PEER",
        type=PEER,
        default=None,
        help="Fetch missing or corrupted blocks from this peer (a URL or a name in [peers]).",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
    @pass_state
    def fsck_cmd(state: State, repair_from: str | None, as_json: bool) -> None:
        """Check the store (SQLite integrity, every block re-hashed, replica tables).

        With --repair-from, only the blocks found missing or corrupted are fetched
        from the peer (by CID, each verified), then the checks run again. Exit status
        0 if the home is whole (after repairs), 5 if problems remain, 1 if the node is
        running (it must be stopped), 4 if the repair peer cannot be reached."""
        from merklog.node.cliutil import fail
        from merklog.node.failures import ExitCode, StoreDamaged
        from merklog.node.fsck import FsckResult, fsck
        from merklog.node.runtime import HomeBusy, HomeLock
        from merklog.node.storecheck import precheck
        from merklog.node.target import load_config

        cfg = load_config(state.home, state.overrides)
        try:
            precheck(cfg)
        except StoreDamaged as exc:  # a missing or empty store: a report too (one problem)
            if as_json:
                _print_json(FsckResult(problems=[str(exc)]), repair_from)
            raise
        if repair_from is not None and "://" not in repair_from:
            peer = cfg.peers.get(repair_from)
            if not isinstance(peer, dict) or "url" not in peer:
                from merklog.node.config import peer_name_problem

                problem = peer_name_problem(repair_from)  # none can exist: bad input
                if problem is not None:
                    fail(f"--repair-from: {problem}", ExitCode.BAD_INPUT)
                # as `sync NAME` says it: exit 3, not found
                fail(
                    f"--repair-from: unknown peer {repair_from!r}: give http://HOST:PORT or"
                    " add it with `merklog peers add`",
                    ExitCode.NOT_FOUND,
                )
            repair_from = str(peer["url"])
        if repair_from is not None:
            from merklog.node.peersync import check_peer_url

            repair_from = check_peer_url(repair_from)  # malformed: bad input (exit 2)
        try:
            lock = HomeLock.acquire(state.home)
        except HomeBusy as exc:
            raise HomeBusy(f"{exc}: stop it before `merklog fsck`") from None
        try:
            with _repair_bar() as (on_repair, on_reimport):
                result = fsck(cfg, repair_from, on_repair, on_reimport)
        finally:
            lock.release()
        if as_json:
            _print_json(result, repair_from)
        else:
            for problem in result.problems[:20]:
                click.echo(f"problem: {problem}")
            if len(result.problems) > 20:
                click.echo(f"… and {len(result.problems) - 20} more")
        repaired = (
            f", {_count(result.refilled, 'block')} put back from the home's IPFS daemon"
            if result.refilled
            else ""
        )
        repaired += (
            f", {_count(result.repaired, 'block')} repaired from {repair_from}"
            f" ({_count(result.repaired_bytes, 'byte')} in {_count(result.requests, 'request')})"
            if result.repaired
            else ""
        )
        if result.unavailable:
            repaired += f", {_count(result.unavailable, 'block')} not served by {repair_from}"
        if result.repinned:
            repaired += f", {_count(result.repinned, 'block')} imported into the IPFS daemon again"
        if result.page_damage:
            raise StoreDamaged(
                f"{result.problems[0]}; blocks cannot be repaired one by one: restore a"
                " backup (docs/operations.md)"
            )
        if not result.ok:
            hint = ""
            if result.repairable and not repair_from:
                hint = "; run `merklog fsck --repair-from URL` with a peer for the missing or"
                hint += " corrupted blocks"
            if len(result.problems) > result.repairable:
                # "run --repair-from" for tables that lost rows sent operators to a repair
                # that cannot help (QA)
                hint += (
                    "; no peer can repair the others"
                    if result.repairable
                    else "; no peer can repair this"
                )
                hint += (
                    ": restore a backup, or join a peer in a new home (`merklog init --join URL`)"
                )
            remain = "remains" if len(result.problems) == 1 else "remain"
            raise StoreDamaged(
                f"{_count(len(result.problems), 'problem')} {remain}{repaired}{hint}"
            )
        if not as_json:
            covered = (
                f" ({_count(result.covered, 'delta')} kept as a snapshot's metadata only:"
                " pruned or bootstrapped, not lost)"
                if result.covered
                else ""
            )
            click.echo(
                f"ok: {_count(result.blocks, 'block')}, {_count(result.deltas, 'delta')}"
                f" checked{covered}{repaired}"
            )
