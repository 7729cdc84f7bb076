"""``merklog peers add/list/remove``: the peers this node syncs with (stored in config.toml)."""

from __future__ import annotations

import json
from typing import Any

import click

from merklog.node.cli import State, pass_state
from merklog.node.clipath import PEER


def _config(state: State):
    from merklog.node.cliutil import fail
    from merklog.node.target import TargetError, load_config

    try:
        return load_config(state.home, state.overrides)
    except TargetError as exc:
        fail(str(exc))


def _key_from_status(url: str, info: object, dataset: object) -> str:
    """The public key (hex) in peer ``url``'s ``GET /v1/status`` answer ``info``.

    A 200 answer that is not a merklog node's status (``{}``, a list, a number for the
    key) is the peer's fault, not the user's: one ``peer error: URL: …`` line, exit 1,
    as ``sync`` words a peer's bad answer (it crashed with a KeyError, or blamed a
    ``--key`` the user never passed)."""
    from merklog.node.cliutil import fail
    from merklog.store.errors import one_line

    where = f"peer error: {url}: its answer to GET /v1/status"
    offline = "pass --key HEX to add it offline"
    if not isinstance(info, dict):
        fail(f"{where} is not a JSON object ({one_line(json.dumps(info), 60)}); {offline}")
    key = info.get("key")
    try:
        if not isinstance(key, str) or len(bytes.fromhex(key)) != 32:
            raise ValueError
    except ValueError:
        got = "none" if key is None else one_line(json.dumps(key), 60)
        fail(f"{where} names no valid key (64 hex digits; it sent {got}); {offline}")
    if info.get("dataset") != dataset:
        fail(
            f"peer {url} replicates dataset {one_line(str(info.get('dataset')), 80)}, this"
            f" node {dataset}; join it with `merklog init --join {url}`"
        )
    return key


def _sent(exc: ValueError) -> str:
    """What a peer sent that is not JSON, from the decoder's ``exc``: a short excerpt on
    one line (an HTML page without its tags), as ``sync`` quotes a peer's answer
    (:func:`~merklog.store.errors.one_line`). Only the decoder's report was said
    ("Expecting value: line 1 column 1 (char 0)"), which told nothing of the peer."""
    from merklog.store.errors import one_line, what_was_sent

    if isinstance(exc, UnicodeDecodeError):  # bytes that are not UTF-8
        sent = exc.object
    else:
        sent = getattr(exc, "doc", None)  # json.JSONDecodeError: the text it decoded
    if not isinstance(sent, str | bytes) or not sent.strip():
        return one_line(str(exc), 80)
    return what_was_sent(sent)


def _forget_unless_shared(state: State, cfg: Any, url: str) -> None:
    """Forget the sync history of ``url`` (a peer removed, or moved to another URL)
    unless another peer of ``cfg`` still has that URL."""
    from merklog.node.cliutil import guard
    from merklog.node.peersync import peer_entry_url
    from merklog.node.target import forget_sync_history

    if all(peer_entry_url(p) != url for p in cfg.peers.values()):
        guard(lambda: forget_sync_history(state.home, cfg, url))


def register(cli: click.Group) -> None:
    @cli.group("peers")
    def peers() -> None:
        """Manage known peers."""

    @peers.command("add")
    @click.argument("name")
    @click.argument("url")
    @click.option(
        "--key", default=None, help="The peer's public key (hex); asked from URL if omitted."
    )
    @click.option(
        "--writer", is_flag=True, help="Also grant the peer's key write access (owner only)."
    )
    @click.option(
        "--token",
        default=None,
        envvar="MERKLOG_PEER_TOKEN",
        help="The peer's read token, to ask it for its key [$MERKLOG_PEER_TOKEN].",
    )
    @click.option(
        "--replace",
        is_flag=True,
        help="Let NAME, already a peer with another key, take this key (a reinstalled device).",
    )
    @pass_state
    def add(
        state: State,
        name: str,
        url: str,
        key: str | None,
        writer: bool,
        token: str | None,
        replace: bool,
    ) -> None:
        """Add peer NAME at URL (http://HOST:PORT), or move it to a new URL. NAME with
        another key is refused unless --replace: the device it named could no longer sync."""
        from merklog.node.client import NodeAPIError, NodeClient
        from merklog.node.cliutil import fail, guard, target
        from merklog.node.config import peer_name_problem
        from merklog.node.failures import ExitCode
        from merklog.replication.errors import PLAIN_HTTP_HINT, cannot_reach, handshake_failed

        problem = peer_name_problem(name)
        if problem is not None:
            fail(problem, ExitCode.BAD_INPUT)
        if not name.replace("-", "").replace("_", "").isalnum():
            fail(f"peer name {name!r} must be letters, digits, - or _", ExitCode.BAD_INPUT)
        from merklog.node.peersync import check_peer_url

        url = check_peer_url(url)  # malformed, or user:password@ (shown in status): exit 2
        cfg = _config(state)
        if key is None:
            try:
                info = NodeClient(url, token or "", timeout=10).status()
            except ValueError as exc:  # 200, but not JSON (an HTML page, a cut answer)
                fail(
                    f"peer error: {url}: its answer to GET /v1/status is not JSON"
                    f" ({_sent(exc)}); pass --key HEX to add it offline"
                )
            except NodeAPIError as exc:
                # the peer's answer, not this node's: unreachable is exit 4, any answer
                # refusing the question exit 1 (as `sync` reports a peer's refusal)
                offline = "pass --key HEX to add it offline"
                if exc.reason:  # no connection: worded as `sync` and `init --join` word it
                    line = cannot_reach(url, exc.reason, "to ask its key")
                    if handshake_failed(exc.reason):  # https:// of a plain-HTTP peer
                        fail(f"{line}; {PLAIN_HTTP_HINT}", ExitCode.FAILED)
                    fail(f"{line}; {offline}", ExitCode.PEER_UNREACHABLE)
                unreachable = exc.status == 0
                fail(
                    f"cannot ask {url} for its key ({exc}); {offline}",
                    ExitCode.PEER_UNREACHABLE if unreachable else ExitCode.FAILED,
                )
            key = _key_from_status(url, info, cfg.get("dataset.id"))
        try:
            raw_key = bytes.fromhex(key)
            if len(raw_key) != 32:
                raise ValueError("expected 32 bytes")
        except ValueError as exc:
            fail(f"--key must be a 64-digit hex Ed25519 public key ({exc})", ExitCode.BAD_INPUT)
        from merklog.replication.identity import public_key_problem

        problem = public_key_problem(raw_key)
        if problem is not None:  # no device holds it: it could only sync as a forger
            fail(
                f"{key[:16]}… is not an Ed25519 public key of a node: {problem} (copy the"
                " key `merklog status` prints on the other device)",
                ExitCode.BAD_INPUT,
            )
        from merklog.node.storecheck import load_key

        if raw_key == guard(lambda: load_key(state.home)).public_key:
            fail(
                f"{url} is this node itself (it holds this home's key): a node does not sync"
                " with itself",
                ExitCode.BAD_INPUT,
            )
        old = cfg.peers.get(name)
        old = old if isinstance(old, dict) else {}
        old_key, old_url = str(old.get("key") or ""), str(old.get("url") or "")
        if old_key and old_key.lower() != key.lower() and not replace:
            # a typo'd name silently took another device's place: that device was locked out
            fail(
                f"peer {name} already exists with another key ({old_key[:16]}…, at {old_url});"
                f" it would stop syncing with this node. Use another name, or --replace if"
                f" {name} is that device with a new key",
            )
        granted = None
        if writer:
            with target(state) as t:
                result = guard(lambda: t.grant(key))  # the grant's delta, None: none needed
            granted = bool(result.get("delta") if isinstance(result, dict) else result)
        cfg = _config(state)
        cfg.peers[name] = {"url": url.rstrip("/"), "key": key}
        cfg.save()
        role = " (writer)" if writer else ""
        rekeyed = bool(old_key) and old_key.lower() != key.lower()
        if rekeyed:
            click.echo(f"replaced peer {name}: key {old_key[:16]}… -> {key[:16]}…, {url}{role}")
        elif old and old_url.rstrip("/") != url.rstrip("/"):
            click.echo(f"updated peer {name}: url {old_url} -> {url}{role}")
        moved = old_url.rstrip("/")
        if moved and moved != url.rstrip("/"):
            # QA: the old URL's history stayed in status as an unnamed row
            _forget_unless_shared(state, cfg, moved)
        elif rekeyed:
            pass  # said above; "is already" after it read as "nothing changed" (QA)
        elif old_key:  # the same peer again: said, not "added" (it changed nothing else)
            also = {None: "", True: "; granted it write access", False: "; it can already write"}
            click.echo(f"peer {name} is already {url} key {key[:16]}…{also[granted]}")
        else:
            click.echo(f"added peer {name} {url} key {key[:16]}…{role}")
        same = sorted(
            other
            for other, peer in cfg.peers.items()
            if other != name
            and isinstance(peer, dict)
            and str(peer.get("url", "")).rstrip("/") == url.rstrip("/")
        )
        if same:  # e.g. `origin` from `init --join`: both names stay, one sync per round
            click.echo(
                f"note: {url} is also peer {', '.join(same)}; it is one peer to sync with",
                err=True,
            )

    @peers.command("list")
    @pass_state
    def list_(state: State) -> None:
        """List peers as NAME URL KEY."""
        for name, peer in sorted(_config(state).peers.items()):
            click.echo(f"{name}\t{peer.get('url')}\t{peer.get('key', '')}")

    @peers.command("remove")
    @click.argument("name", type=PEER)
    @pass_state
    def remove(state: State, name: str) -> None:
        """Forget peer NAME, and the sync history of its URL unless another peer has it;
        or, given a URL synced ad hoc (`merklog sync URL`), that URL's sync history, so
        `status` stops listing it."""
        from merklog.node.cliutil import fail, guard
        from merklog.node.failures import ExitCode
        from merklog.node.peersync import peer_entry_url
        from merklog.node.target import forget_sync_history

        cfg = _config(state)
        if "://" in name:
            url = name.rstrip("/")
            named = sorted(n for n, p in cfg.peers.items() if peer_entry_url(p) == url)
            if named:
                fail(
                    f"{url} is peer {', '.join(named)}: remove it by name"
                    f" (`merklog peers remove {named[0]}`)",
                    ExitCode.BAD_INPUT,
                )
            if not guard(lambda: forget_sync_history(state.home, cfg, url)):
                fail(f"no peer and no sync history for {url}", ExitCode.NOT_FOUND)
            click.echo(f"forgot the sync history of {url}")
            return
        if name not in cfg.peers:
            from merklog.node.config import peer_name_problem

            problem = peer_name_problem(name)  # no such peer can exist: bad input
            if problem is not None:
                fail(problem, ExitCode.BAD_INPUT)
            known = ", ".join(sorted(cfg.peers)) or "none"
            fail(f"unknown peer {name!r} (known: {known})", ExitCode.NOT_FOUND)
        url = peer_entry_url(cfg.peers.pop(name))
        cfg.save()
        click.echo(f"removed peer {name}")
        if url:
            _forget_unless_shared(state, cfg, url)
