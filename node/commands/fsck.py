"""``merklog fsck [--repair-from URL|PEER]``: check a stopped home; repair blocks from a peer."""

from __future__ import annotations

import click

from merklog.node.cli import State, pass_state


def register(cli: click.Group) -> None:
    @cli.command("fsck")
    @click.option(
        "--repair-from",
        metavar="URL|PEER",
        default=None,
        help="Fetch missing or corrupted blocks from this peer (a URL or a name in [peers]).",
    )
    @pass_state
    def fsck_cmd(state: State, repair_from: str | None) -> None:
        """Check the store (SQLite integrity, every block re-hashed, replica tables).

        Exit status 0 if the home is whole (after repairs), 5 if problems remain.
        The node must be stopped.
        """
        from merklog.node.failures import StoreDamaged
        from merklog.node.fsck import fsck
        from merklog.node.runtime import HomeBusy, HomeLock
        from merklog.node.storecheck import precheck
        from merklog.node.target import load_config

        cfg = load_config(state.home, state.overrides)
        precheck(cfg)
        if repair_from is not None and not repair_from.startswith(("http://", "https://")):
            peer = cfg.peers.get(repair_from)
            if not isinstance(peer, dict) or "url" not in peer:
                raise click.UsageError(f"--repair-from: no peer named {repair_from!r}")
            repair_from = str(peer["url"])
        try:
            lock = HomeLock.acquire(state.home)
        except HomeBusy as exc:
            raise HomeBusy(f"{exc}: stop it before `merklog fsck`") from None
        try:
            result = fsck(cfg, repair_from)
        finally:
            lock.release()
        for problem in result.problems[:20]:
            click.echo(f"problem: {problem}")
        if len(result.problems) > 20:
            click.echo(f"… and {len(result.problems) - 20} more")
        repaired = (
            f", {result.repaired} blocks repaired from {repair_from}" if result.repaired else ""
        )
        if not result.ok:
            hint = "" if repair_from else "; run `merklog fsck --repair-from URL` with a peer"
            raise StoreDamaged(f"{len(result.problems)} problems remain{repaired}{hint}")
        click.echo(f"ok: {result.blocks} blocks, {result.deltas} deltas checked{repaired}")
