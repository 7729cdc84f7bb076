"""``GET /v1/facts?rel=`` on a rare relation reads that relation's index, never the other
relations' facts (ADR 0095): for local writes, synced facts and restored CARs alike, and
on a home made before the index existed (backfilled when it opens). A relation's pages
come in the order the node first stored its facts (ids, ADR 0132): each fact once."""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path

import pytest

import merklog
from merklog.replication.errors import NotFound
from merklog.store import fact_cid, make_fact

from .conftest import Cli, all_pages, peered_pair

#: Five values that Python's == would merge into fewer: each is its own fact and CID.
MIXED = [1, 1.0, True, "1", b"\x01"]
RARE = [make_fact("rare", [x]) for x in MIXED] + [make_fact("rare", [x, "y"]) for x in MIXED]


def _drop_blocks_of(store: Path, rel_other_than: str) -> int:
    """Delete every fact block not of ``rel_other_than`` from the store file (a fault the
    page must not meet: reading any of those blocks raises BlockNotFound)."""
    from merklog.replication.relindex import fact_relation

    conn = sqlite3.connect(store)
    with conn:
        doomed = [
            cid
            for cid, data in conn.execute("SELECT cid, data FROM blocks")
            if fact_relation(data) not in (None, rel_other_than)
        ]
        conn.executemany("DELETE FROM blocks WHERE cid = ?", [(c,) for c in doomed])
    conn.close()
    return len(doomed)


def test_a_rare_relation_pages_without_reading_other_relations(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with merklog.open(home) as node:
        node.write(asserts=[("common", (i, float(i), str(i))) for i in range(3000)])
        node.write(asserts=[(f.rel, f.args) for f in RARE])
        node.retract("rare", True)
        node.retract("rare", 1.0, "y")
        node.retract("common", 5, 5.0, "5")
    # By CID, never by ==: rare(1), rare(1.0) and rare(true) are three facts.
    gone = {fact_cid(make_fact("rare", [True])), fact_cid(make_fact("rare", [1.0, "y"]))}
    expected = sorted(c for c in map(fact_cid, RARE) if c not in gone)
    assert len(expected) == 8
    with merklog.open(home) as node:
        # Once open (which reads every visible fact), the other relations' blocks go.
        assert _drop_blocks_of(home / "store.sqlite", "rare") == 3000  # retracted ones too
        order = [c for c, _f in node.page_facts("rare", None, 1000)[0]]
        assert sorted(order) == expected
        for limit in (1, 3, 8, 1000):
            listed, pages = all_pages(node, "rare", limit)
            assert [c for c, _f in listed] == order
            assert pages == -(-len(expected) // limit)
        assert {c: f for c, f in listed} == {
            c: f for c, f in zip(map(fact_cid, RARE), RARE, strict=True) if c in expected
        }
        assert [c for c, _f in node.list_facts("rare")] == expected
        assert node.page_facts("nonesuch", None, 10) == ([], None)
        # a cursor in the middle continues in the index's order
        page, cursor = node.page_facts("rare", order[2], 3)
        assert [c for c, _f in page] == order[3:6] and cursor == order[5]
        # a cursor this node never stored has no place in the index: refused, not guessed
        with pytest.raises(NotFound):
            node.page_facts("rare", fact_cid(make_fact("rare", ["never"])), 3)


def test_an_old_home_is_indexed_when_it_opens(tmp_path: Path, caplog) -> None:
    """A store made before ``repl_rel_fact`` existed (the same tables without it) is
    backfilled at open; a block that cannot be read leaves the index unfinished until
    the block is back, and the home still opens."""
    home = tmp_path / "home"
    with merklog.open(home) as node:
        node.write(asserts=[("common", (i,)) for i in range(2500)])
        node.write(asserts=[(f.rel, f.args) for f in RARE])
        node.retract("rare", "1")
    store = home / "store.sqlite"
    gone = fact_cid(make_fact("rare", ["1"]))
    expected = sorted(c for c in map(fact_cid, RARE) if c != gone)
    conn = sqlite3.connect(store)
    with conn:
        conn.execute("DROP TABLE repl_rel_fact")
        conn.execute("DROP TABLE repl_rel_range")
        conn.execute("DROP TABLE repl_index")
        # The retracted fact's block goes missing: the home still opens (no visible fact
        # lacks its block), but the backfill cannot tell that fact's relation yet.
        (kept,) = conn.execute("SELECT data FROM blocks WHERE cid = ?", (gone.raw,)).fetchone()
        conn.execute("DELETE FROM blocks WHERE cid = ?", (gone.raw,))
    conn.close()
    with merklog.open(home) as node:
        listed, _ = all_pages(node, "rare", 4)
        assert sorted(c for c, _f in listed) == expected and len(listed) == len(expected)
    assert "1 asserted fact block(s) could not be read while indexing" in caplog.text
    conn = sqlite3.connect(store)
    with conn:
        assert conn.execute("SELECT count(*) FROM repl_index").fetchone()[0] == 0
        conn.execute("INSERT INTO blocks (cid, data) VALUES (?, ?)", (gone.raw, kept))
    conn.close()
    with merklog.open(home) as node:
        listed, _ = all_pages(node, "rare", 4)
        assert sorted(c for c, _f in listed) == expected and len(listed) == len(expected)
        common, _ = all_pages(node, "common", 1000)
        assert len(common) == 2500
    conn = sqlite3.connect(store)
    assert conn.execute("SELECT count(*) FROM repl_index").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM repl_rel_fact").fetchone()[0] == 2500 + 10
    conn.close()


def _http_pages(proc, rel: str, limit: int) -> list[dict]:
    out, after = [], None
    while True:
        query = {"rel": rel, "limit": str(limit)}
        if after:
            query["after"] = after
        status, body = proc.request("GET", "/v1/facts?" + urllib.parse.urlencode(query))
        assert status == 200, body
        out += body["facts"]
        after = body["next"]
        if after is None:
            return out


def _by_cid(facts: list[dict]) -> list[dict]:
    return sorted(facts, key=lambda f: merklog.Link.parse(f["cid"]))


def test_synced_and_restored_homes_page_a_relation_like_the_writer(
    tmp_path: Path, node_factory
) -> None:
    a, b, na, nb = peered_pair(tmp_path, node_factory)
    lines = [f'common({i}, {i}.0, "{i}").' for i in range(1500)]
    lines += ["rare(1).", "rare(1.0).", "rare(true).", 'rare("1").', 'rare(x"01").']
    src = tmp_path / "facts.dl"
    src.write_text("\n".join(lines) + "\n")
    a("put", "-f", str(src))
    a("retract", "rare(true).")
    b("put", 'rare("from b").')  # b writes too: a learns it by sync
    b("sync", "a")
    writer = _by_cid(_http_pages(na, "rare", 2))
    assert sorted(f["fact"] for f in writer) == sorted(
        ["rare(1)", "rare(1.0)", 'rare("1")', 'rare(x"01")', 'rare("from b")']
    )
    assert _by_cid(_http_pages(nb, "rare", 2)) == writer
    never = fact_cid(make_fact("rare", ["never"]))
    status, body = na.request("GET", f"/v1/facts?rel=rare&after={never}")
    assert status == 400 and body["error"] == "bad input", body
    assert len(_http_pages(nb, "common", 400)) == len(_http_pages(na, "common", 1000)) == 1500
    # a backup restored into a fresh home pages the same (facts applied from a CAR)
    backup = tmp_path / "a.car"
    a("export", str(backup))
    c = Cli(tmp_path / "c")
    c("restore", str(backup))
    nc = node_factory(c.home).start()
    assert _by_cid(_http_pages(nc, "rare", 3)) == writer


def test_a_client_that_leaves_mid_block_stream_is_no_server_error(
    tmp_path: Path, node_factory
) -> None:
    """``POST /v1/datasets/{id}/blocks`` streams (ADR 0097): a caller that closes the
    connection after the first chunk of a ~16 MB answer leaves a healthy node and no
    error or traceback in its log; the next caller gets every block."""
    import asyncio
    import hashlib
    import json
    import os

    import aiohttp

    from merklog.replication.auth import sign_headers
    from merklog.replication.client import SyncClient
    from merklog.replication.identity import Identity

    home = tmp_path / "home"
    caller = Identity.generate()
    with merklog.open(home) as node:
        for i in range(4):
            node.write(asserts=[("big", (i, j, os.urandom(800_000))) for j in range(5)])
        wanted = [c for c, _f in node.list_facts("big")]
        dataset = node.dataset
    with (home / "config.toml").open("a") as f:
        f.write(
            f'\n[peers.repair]\nurl = "http://127.0.0.1:9"\nkey = "{caller.public_key.hex()}"\n'
        )
    proc = node_factory(home).start()
    path = f"/v1/datasets/{dataset}/blocks"
    body = json.dumps({"cids": [str(c) for c in wanted]}).encode()

    async def leave_early() -> int:
        headers = {"Content-Type": "application/json"}
        headers.update(sign_headers(caller, "POST", path, hashlib.sha256(body).hexdigest()))
        async with aiohttp.ClientSession() as session:
            resp = await session.post(proc.url + path, data=body, headers=headers)
            assert resp.status == 200 and "Content-Length" not in resp.headers
            first = await resp.content.read(1 << 16)
            resp.close()  # drop the connection with most of the answer unsent
            return len(first)

    async def fetch_all():
        async with SyncClient(caller) as client:
            return await client.get_blocks(proc.url, dataset, wanted)

    assert asyncio.run(leave_early()) > 0
    fetch = asyncio.run(fetch_all())
    assert set(fetch.found) == set(wanted) and fetch.requests == 1
    status, _ = proc.request("GET", "/healthz", token=None)
    assert status == 200
    proc.stop()
    assert "Traceback" not in proc.stderr_text and "ERROR" not in proc.stderr_text


def test_a_cursor_of_another_relation_is_refused_not_a_silent_skip(tmp_path: Path) -> None:
    """``page_facts("a", after=<CID of b(1)>)`` answered a page that started after b(1)'s
    id and so left out a(3), a(4) and a(5). A fact of another relation is not a cursor
    of this relation's pages; the Python API also takes the cursor as a string, and a
    limit below 1 is an error (it returned an empty last page)."""
    import merklog
    from merklog.store import fact_cid, make_fact

    with merklog.open(memory=True) as node:
        for fact in ("a(1).", "a(2).", "a(3).", "b(1).", "a(4).", "a(5)."):
            node.write(asserts=[fact])
        other = fact_cid(make_fact("b", [1]))
        with pytest.raises(merklog.Error, match="^fact .* is not a cursor of the pages of relation 'a'$"):
            node.page_facts("a", other, 10)
        first, cursor = node.page_facts("a", None, 2)
        rest, end = node.page_facts("a", str(cursor), 10)
        assert [f.args for _c, f in first + rest] == [(1,), (2,), (3,), (4,), (5,)]
        assert end is None
        for bad in (0, -1, True):
            with pytest.raises(merklog.Error, match="limit"):
                node.page_facts("a", None, bad)
        with pytest.raises(merklog.Error, match="not a CID|not a base32"):
            node.page_facts("a", "notacid", 10)
