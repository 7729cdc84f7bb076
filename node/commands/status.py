"""``merklog status``: dataset, heads, peers, last sync, epoch."""

from __future__ import annotations

import json
import re
from typing import Any

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
        writer = info.get("writer")
        may = "" if writer is None else ("; it may write" if writer else "; it may not write")
        click.echo(f"key        {info['key']}{may}")
        click.echo(f"epoch      {info['epoch']}")
        click.echo(f"facts      {info['facts']} stored, {info['derived']} derived")
        if info.get("program_error"):
            click.echo(f"program    failing: {info['program_error']}")
        click.echo(f"heads      {', '.join(info['heads'])}")
        if "outbox_pending" in info:
            dropped = info.get("outbox_dropped") or 0
            click.echo(
                f"outbox     {info['outbox_pending']} @async messages pending"
                + (f", {dropped} dropped (not retried)" if dropped else "")
            )
        peers = info.get("peers") or []
        if not peers:
            click.echo("peers      -")
            return
        click.echo("peers")
        _peer_table(peers)


def _when(ts: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


#: Terminal control characters (C0, DEL, C1): shown as ``\x1b``-style escapes.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _cell(text: str) -> Any:
    """``text`` as a table cell, shown as written: rich reads no markup in it
    (``[bold red]``, ``[link=…]``) and a control character is shown escaped (``\x1b``).
    A peer's error answer and a peer's URL are that peer's words: QA made `status` print
    real bold, blinking text and a clickable link to another site from a peer's 500 body
    (and a URL holding ``[blink]`` show another URL than the real one)."""
    from rich.text import Text

    return Text(_CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text))


def _peer_table(peers: list[dict]) -> None:
    """One row per peer: sync state as a table (the running node's view when it runs)."""
    from rich.table import Table

    from merklog.node.cliutil import stdout_console

    table = Table(show_edge=False)
    # "last started" (JSON last_attempt) is when the last sync started, "last success"
    # when the last good one ended: a long sync that worked shows a success later than
    # its start. "last incoming" is when the peer last synced with this node (pulled from
    # or pushed to it).
    headers = ("name", "url", "last started", "last success", "last incoming", "behind")
    for header in (*headers, "last error"):
        table.add_column(header, no_wrap=header != "last error")
    for p in peers:
        behind = p.get("deltas_behind")
        table.add_row(
            *map(
                _cell,
                (
                    p.get("name") or "-",
                    p["url"],
                    _when(p.get("last_attempt")),
                    _when(p.get("last_success")),
                    _when(p.get("last_incoming")),
                    "?" if behind is None else str(behind),
                    p.get("last_error") or "-",
                ),
            )
        )
    import sys

    # Not a terminal (a pipe, a log): wide enough that rows never wrap.
    stdout_console(width=None if sys.stdout.isatty() else 200).print(table)
