"""Writer revocation from the CLI and over HTTP, with two real nodes on 127.0.0.1: a
revoked key's earlier writes stay, its later writes are refused saying it was revoked."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import Cli


def _joined_writer(tmp_path: Path, node_factory) -> tuple[Cli, object, Cli, str]:
    """Owner home ``a`` (its node running), home ``b`` joined to it and granted as a
    writer (as peer ``b``), and ``b``'s key."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    key = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--writer", "--key", key)
    return a, na, b, key


def test_a_revoked_writer_is_told_it_was_revoked(tmp_path: Path, node_factory) -> None:
    a, na, b, key = _joined_writer(tmp_path, node_factory)
    b("put", "x(1).", "x(1.0).", 'x("1").')  # syncs with the origin first: granted
    b("sync", "origin")
    status, body = na.request("DELETE", f"/v1/writers/{key}")  # revoke over HTTP
    assert status == 200 and body["delta"]
    b("sync", "origin")
    refused = b("put", "x(true).", ok=False)
    assert refused.exit_code == 7 and "Traceback" not in refused.output
    assert "revoked" in refused.output and body["delta"] in refused.output
    assert "has not been made" not in refused.output
    assert "its earlier writes stay" in refused.output  # it wrote x(1) … before
    assert sorted(line.split("\t")[1] for line in a("ls").output.splitlines()) == [
        'x("1")',
        "x(1)",
        "x(1.0)",
    ]
    # Granted again from the CLI: the key writes again after a sync.
    a("writers", "grant", "b")
    b("sync", "origin")
    b("put", "x(true).")

    # A key never granted keeps the old answer (ask for a grant), not "revoked".
    c = Cli(tmp_path / "c")
    c("init", "--join", na.url, "--token", na.read_token)
    never = c("put", "x(2).", ok=False)
    assert never.exit_code == 7 and "revoked" not in never.output
    # Granted, then revoked before it ever wrote: no "earlier writes" to keep (QA). The
    # key given in capitals is echoed as every other output shows keys.
    c_key = json.loads(c("status", "--json").output)["key"]
    a("peers", "add", "c", "http://127.0.0.1:9", "--key", c_key)  # lets c sync with a
    a("writers", "grant", c_key.upper())
    revoked = a("writers", "revoke", c_key.upper())
    assert revoked.output.startswith(f"revoked {c_key[:16]}…"), revoked.output
    c("sync", "origin")
    refused = c("put", "x(3).", ok=False)
    assert refused.exit_code == 7 and "revoked its key" in refused.output
    assert "earlier writes" not in refused.output


def test_the_owner_cannot_revoke_itself(tmp_path: Path, node_factory) -> None:
    """Revoking the owner's key answered 200 with a revoke delta that changed nothing
    (the owner always writes). It is refused, from the CLI and over HTTP, and no delta
    is written."""
    owner = Cli(tmp_path / "owner")
    owner("init")
    key = json.loads(owner("status", "--json").output)["key"]
    heads = json.loads(owner("status", "--json").output)["heads"]
    refused = owner("writers", "revoke", key, ok=False)
    assert refused.exit_code == 2 and "owner" in refused.output
    node = node_factory(owner.home).start()
    try:
        status, body = node.request("DELETE", f"/v1/writers/{key}")
        assert status == 400 and "cannot be revoked" in body["detail"], body
    finally:
        node.stop()
    assert json.loads(owner("status", "--json").output)["heads"] == heads
    owner("put", "v(1).")


def test_grants_and_revokes_that_change_nothing_write_no_delta(
    tmp_path: Path, node_factory
) -> None:
    """Granting the owner or a key granted before, and revoking a key that was never
    granted or was revoked already, each wrote a new signed delta that every peer then
    synced. They change nothing, and now say so, from the CLI and over HTTP."""
    owner = Cli(tmp_path / "owner")
    owner("init")
    me = json.loads(owner("status", "--json").output)["key"]
    other = "cd" * 32  # a point of the curve ("ab" * 32 is none: see the next test)
    heads = json.loads(owner("status", "--json").output)["heads"]
    assert "nothing to grant" in owner("writers", "grant", me).output
    assert "nothing to revoke" in owner("writers", "revoke", other).output
    assert json.loads(owner("status", "--json").output)["heads"] == heads
    assert "granted" in owner("writers", "grant", other).output  # a real change
    heads = json.loads(owner("status", "--json").output)["heads"]
    node = node_factory(owner.home).start()
    try:
        status, body = node.request("POST", "/v1/writers", {"key": other.upper()})
        assert status == 200 and body["delta"] is None, body
        status, body = node.request("DELETE", f"/v1/writers/{other}")
        assert status == 200 and body["delta"], body
        status, again = node.request("DELETE", f"/v1/writers/{other}")
        assert status == 200 and again["delta"] is None, again
        heads = [body["delta"]]
    finally:
        node.stop()
    assert json.loads(owner("status", "--json").output)["heads"] == heads


def test_a_key_that_is_no_ed25519_point_is_never_granted(tmp_path: Path, node_factory) -> None:
    """QA: ``POST /v1/writers {"key": "ff" * 32}`` was granted although no signature can
    ever verify against it (``cryptography`` loads any 32 bytes as a key), and ``DELETE
    /v1/writers/%20<key>`` was taken for the key (``bytes.fromhex`` skips spaces). Both
    are bad input now, from the CLI and over HTTP; a revoke still takes any 32 bytes, so
    that a grant made before this check can be undone."""
    owner = Cli(tmp_path / "owner")
    owner("init")
    refused = owner("writers", "grant", "ab" * 32, ok=False)
    assert refused.exit_code == 2 and "no point of the curve" in refused.output, refused.output
    heads = json.loads(owner("status", "--json").output)["heads"]
    node = node_factory(owner.home).start()
    try:
        for key in ("ff" * 32, "ab" * 32):
            status, body = node.request("POST", "/v1/writers", {"key": key})
            assert status == 400 and "no point of the curve" in body["detail"], body
        status, body = node.request("DELETE", "/v1/writers/%20" + "cd" * 32)
        assert status == 400 and "64-digit hex" in body["detail"], body
        status, body = node.request("DELETE", "/v1/writers/" + "ff" * 32)  # never granted
        assert status == 200 and body["delta"] is None, body
    finally:
        node.stop()
    assert json.loads(owner("status", "--json").output)["heads"] == heads


def test_a_writer_that_is_not_the_owner_granting_exits_1_not_7(
    tmp_path: Path, node_factory
) -> None:
    """QA: ``writers grant`` on a home that may write but is not the dataset owner said
    "only the dataset owner grants or revokes writers" with exit 7, which means "this
    node's key is not (yet) a writer": it is one. The operation is refused: exit 1 on a
    stopped home and through its running node alike, and the home still writes."""
    _a, _na, b, _key = _joined_writer(tmp_path, node_factory)
    b("put", "x(1).")  # syncs with the origin first: granted
    other = "cd" * 32
    stopped = b("writers", "grant", other, ok=False)
    assert stopped.exit_code == 1, stopped.output
    assert "only the dataset owner grants or revokes writers" in stopped.output
    node_factory(b.home).start()
    running = b("writers", "grant", other, ok=False)
    assert running.exit_code == 1 and "Traceback" not in running.output, running.output
    # the same line as on the stopped home (it said "not owner: only …", QA)
    assert running.output == stopped.output
    b("put", "x(2).")


def test_a_node_that_is_not_the_owner_is_refused_revoking_the_owner_as_any_revoke(
    tmp_path: Path, node_factory
) -> None:
    """QA: ``DELETE /v1/writers/<owner key>`` on a node that is not the owner answered 400
    "the owner cannot be revoked", while every other revoke there is 403 (not the
    owner); the owner's key is refused for what it is only on the owner's node."""
    owner = Cli(tmp_path / "owner")
    owner("init")
    no = node_factory(owner.home).start()
    key = json.loads(owner("status", "--json").output)["key"]
    other = Cli(tmp_path / "other")
    other("init", "--join", no.url, "--token", no.read_token)
    node = node_factory(other.home).start()
    status, body = node.request("DELETE", f"/v1/writers/{key}")
    assert status == 403, body
    assert status == node.request("DELETE", f"/v1/writers/{'ab' * 32}")[0]


def test_who_may_write_is_listed_and_in_status(tmp_path: Path, node_factory) -> None:
    """QA as a team lead: after grants and revokes the only way to learn who may write
    was to try a write, or read repl_auth with sqlite3. ``merklog writers list`` (through
    the running node, and on a stopped home), ``GET /v1/writers`` with the read token,
    and ``status`` (``writer``) say it, from the replica's own heads."""
    a, na, b, key = _joined_writer(tmp_path, node_factory)
    b("sync", "origin")  # b has the grant in its past
    status, body = na.request("GET", "/v1/writers", token=na.read_token)
    assert status == 200
    owner_key = json.loads(a("status", "--json").output)["key"]
    assert [(w["key"], w["writer"], w["owner"]) for w in body["writers"]] == [
        (owner_key, True, True),
        (key, True, False),
    ]
    lines = [line.split("\t") for line in a("writers", "list").output.splitlines()]
    assert [line[:3] for line in lines] == [
        [owner_key, "owner", "this node"],
        [key, "writer", "b"],
    ]
    revoked = a("writers", "revoke", "b").output
    delta = revoked.split("(delta ")[1].rstrip(")\n")
    listed = json.loads(a("writers", "list", "--json").output)["writers"]
    assert listed[1] == {"key": key, "writer": False, "owner": False, "delta": delta}
    assert json.loads(a("status", "--json").output)["writer"] is True
    assert "; it may write" in a("status").output
    # b, stopped, before and after it merged the revoke
    assert json.loads(b("status", "--json").output)["writer"] is True
    assert "; it may write" in b("status").output
    b("sync", "origin")
    assert json.loads(b("status", "--json").output)["writer"] is False
    assert "; it may not write" in b("status").output
    assert b("writers", "list").output.splitlines()[1].split("\t")[1] == "revoked"
