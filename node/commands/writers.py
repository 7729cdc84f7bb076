"""``merklog writers grant|revoke KEY|PEER`` (owner only) and ``merklog writers list``:
who may write to this dataset."""

from __future__ import annotations

import json

import click

from merklog.node.cli import State, pass_state
from merklog.node.clipath import GivenText

#: What KEY_OR_PEER asks for when it is empty.
_KEY_OR_PEER = GivenText("name a peer of [peers] or give its 64-digit hex key")


def _key(state: State, key_or_peer: str) -> str:
    """A peer name from ``[peers]`` stands for its key; anything else must be a hex key."""
    from merklog.node.cliutil import fail, guard
    from merklog.node.failures import ExitCode
    from merklog.node.target import load_config

    cfg = guard(lambda: load_config(state.home, state.overrides))
    peer = cfg.peers.get(key_or_peer)
    if isinstance(peer, dict) and peer.get("key"):
        return str(peer["key"]).lower()
    try:
        if len(bytes.fromhex(key_or_peer)) == 32:
            return key_or_peer.lower()  # echoed as every other output shows keys (QA)
    except ValueError:
        pass
    # A name that is not a peer is not found (exit 3), as in `sync NAME`; hex of the
    # wrong length is a malformed key (exit 2). Short hex is a name: `C`, `cafe` or
    # `deadbeef` are peer names a user may give (they said exit 2, "malformed"), while a
    # key cut short is at least the 16 digits the CLI shows of a key.
    keylike = len(key_or_peer) >= KEY_PREFIX_DIGITS and all(
        c in "0123456789abcdefABCDEF" for c in key_or_peer
    )
    if keylike:
        fail(
            f"{key_or_peer!r} is no peer in [peers], and as a key it has"
            f" {len(key_or_peer)} hex digits where a key has 64 (`merklog status` shows"
            " a node's whole key)",
            ExitCode.BAD_INPUT,
        )
    from merklog.node.config import peer_name_problem

    problem = peer_name_problem(key_or_peer)
    if problem is not None:  # too long for a peer name: bad input
        fail(f"{problem}, and it is no 64-digit hex key", ExitCode.BAD_INPUT)
    fail(
        f"{key_or_peer!r} is neither a peer with a key in [peers] nor a 64-digit hex key",
        ExitCode.NOT_FOUND,
    )


#: Hex digits of a key the CLI shows (``granted 0123…``): a hex argument this long or
#: longer is taken for a key, a shorter one for a peer name.
KEY_PREFIX_DIGITS = 16


def register(cli: click.Group) -> None:
    @cli.group("writers")
    def writers() -> None:
        """Grant or revoke write access to this dataset (the owner's node only), or list it."""

    @writers.command("grant")
    @click.argument("key_or_peer", type=_KEY_OR_PEER)
    @pass_state
    def grant(state: State, key_or_peer: str) -> None:
        """Let KEY_OR_PEER (hex public key or peer name) write; a signed delta that syncs."""
        from merklog.node.cliutil import guard, target

        key = _key(state, key_or_peer)
        with target(state) as t:
            delta = guard(lambda: t.grant(key))
        if _delta(delta) == "none":
            click.echo(f"{key[:16]}… can already write: nothing to grant (no delta)")
        else:
            click.echo(f"granted {key[:16]}… (delta {_delta(delta)})")

    @writers.command("list")
    @click.option("--json", "as_json", is_flag=True, help="Print the list as one JSON object.")
    @pass_state
    def list_(state: State, as_json: bool) -> None:
        """Who may write on top of this node's heads, and who was revoked: the owner
        first, each key with its peer name and the grant or revoke that decides."""
        from merklog.node.cliutil import guard, target
        from merklog.node.storecheck import load_key
        from merklog.node.target import load_config

        with target(state) as t:
            listed = guard(t.writers)
        if as_json:
            click.echo(json.dumps({"writers": listed}))
            return
        own = guard(lambda: load_key(state.home)).public_key.hex()  # said "this node"
        cfg = guard(lambda: load_config(state.home, state.overrides))
        names: dict[str, list[str]] = {}
        for name, peer in cfg.peers.items():
            if isinstance(peer, dict) and peer.get("key"):
                names.setdefault(str(peer["key"]).lower(), []).append(name)
        for w in listed:
            state_word = "owner" if w["owner"] else ("writer" if w["writer"] else "revoked")
            who = ", ".join(names.get(w["key"], [])) or ("this node" if w["key"] == own else "-")
            click.echo(f"{w['key']}\t{state_word}\t{who}\t{w['delta']}")

    @writers.command("revoke")
    @click.argument("key_or_peer", type=_KEY_OR_PEER)
    @pass_state
    def revoke(state: State, key_or_peer: str) -> None:
        """Stop KEY_OR_PEER from writing. Its earlier deltas stay; peers refuse its deltas
        made after it merged the revoke (sync it out). A delta it makes without having
        merged the revoke (offline, or from an old backup) counts as concurrent and is
        kept: a revoke does not stop a leaked key."""
        from merklog.node.cliutil import guard, target

        key = _key(state, key_or_peer)
        with target(state) as t:
            delta = guard(lambda: t.revoke(key))
        if _delta(delta) == "none":
            click.echo(f"{key[:16]}… cannot write: nothing to revoke (no delta)")
        else:
            click.echo(f"revoked {key[:16]}… (delta {_delta(delta)})")


def _delta(result: object) -> str:
    if isinstance(result, dict):
        result = result.get("delta")
    return str(result) if result else "none"
