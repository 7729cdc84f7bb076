"""The per-relation fact index (``repl_rel_fact``, ADR 0095) on real SQLite files: filled
by local writes, applied batches and snapshot bootstraps alike, read from its relation's
rows only, and the relation of a fact block read from its first bytes."""

from __future__ import annotations

import libipld
import pytest

from merklog.replication.identity import Identity
from merklog.replication.paging import visible_of_relation_after
from merklog.replication.relindex import fact_relation
from merklog.replication.replica import Replica
from merklog.replication.snapshot import AclEntry, CoveredDelta, install_snapshot_state
from merklog.store import Link, encode_fact, fact_cid, make_fact
from merklog.store.sqlite import SQLiteBlockStore

MIXED = [1, 1.0, True, "1", b"\x01"]


@pytest.mark.parametrize("name", ["r", "x" * 23, "y" * 24, "z" * 255, "w" * 256, "é" * 200])
def test_fact_relation_reads_the_name_from_the_canonical_prefix(name: str) -> None:
    _cid, data = encode_fact(make_fact(name, [1, 1.0, True]))
    assert fact_relation(data) == name


def test_fact_relation_of_other_blocks() -> None:
    assert fact_relation(libipld.encode_dag_cbor({"kind": "delta"})) is None
    assert fact_relation(libipld.encode_dag_cbor({"rel": 3, "args": []})) is None
    assert fact_relation(b"\xa2crel\x7f") is None  # truncated: not a fact
    assert fact_relation(b"") is None


def _replica(tmp_path, name: str, identity: Identity, genesis=None) -> Replica:
    store = SQLiteBlockStore(tmp_path / f"{name}.sqlite")
    if genesis is None:
        return Replica.create(store.conn, store, identity, "d")
    return Replica.open(store.conn, store, identity, genesis.cid, genesis.data)


def _page_all(replica: Replica, rel: str, limit: int) -> list[Link]:
    out: list[Link] = []
    after = None
    while page := visible_of_relation_after(replica, rel, after, limit):
        out += page
        after = page[-1]
    return out


def test_local_applied_and_bootstrapped_replicas_index_alike(tmp_path) -> None:
    owner = Identity.generate()
    a = _replica(tmp_path, "a", owner)
    rare = [make_fact("rare", [x]) for x in MIXED]
    a.assert_facts([make_fact("common", [i]) for i in range(1200)] + rare)
    a.retract_facts([make_fact("rare", [1.0]), make_fact("common", [3])])
    expected = sorted(c for c in map(fact_cid, rare) if c != fact_cid(make_fact("rare", [1.0])))
    assert _page_all(a, "rare", 2) == expected
    assert len(_page_all(a, "common", 500)) == 1199
    assert _page_all(a, "missing", 10) == []

    # A peer that applied a's blocks (a sync or an import).
    b = _replica(tmp_path, "b", Identity.generate(), a.genesis)
    b.apply_blocks(a.missing_for([a.dataset]))
    assert _page_all(b, "rare", 3) == expected
    assert _page_all(b, "common", 1000) == _page_all(a, "common", 1000)

    # A peer bootstrapped from a's OR-set state (what a Spark snapshot installs).
    c = _replica(tmp_path, "c", Identity.generate(), a.genesis)
    with a._lock:
        support: dict[bytes, list[Link]] = {}
        for fact, delta in a.conn.execute(
            "SELECT fact, delta FROM repl_assert WHERE ds = ? AND killed = 0", (a.ds,)
        ):
            support.setdefault(bytes(fact), []).append(Link(bytes(delta)))
    facts = [(cid, fact, support[cid.raw]) for cid, fact in a.visible()]
    covered = [
        CoveredDelta(d.cid, d.author, d.seq, d.clock, tuple(d.parents)) for d in a.iter_deltas()
    ]
    acl: list[AclEntry] = []
    install_snapshot_state(c, facts, covered, acl, a.heads())
    assert _page_all(c, "rare", 4) == expected
    assert _page_all(c, "common", 700) == _page_all(a, "common", 1000)


def test_record_stores_every_cid_as_a_blob_whatever_its_length(tmp_path) -> None:
    """One insert per (dataset, relation) run cuts a concatenated blob into rows: CIDs of
    different lengths go in separate runs, duplicates are ignored, values stay BLOBs."""
    import sqlite3

    from merklog.replication.relindex import record
    from merklog.replication.schema import ensure_schema

    conn = sqlite3.connect(tmp_path / "r.sqlite", isolation_level=None)
    ensure_schema(conn)
    long = [fact_cid(make_fact("p", [x])).raw for x in MIXED]
    short = [b"\x01\x55\x00\x03abc", b"\x01\x55\x00\x03abd"]  # identity-hash raw CIDs
    rows = [(1, "p", r) for r in long] + [(1, "p", r) for r in short] + [(2, "p", long[0])]
    record(conn, rows)
    record(conn, rows[:2])  # again: ignored
    got = conn.execute("SELECT ds, rel, fact, typeof(fact) FROM repl_rel_fact").fetchall()
    assert sorted(got) == sorted(
        [(1, "p", r, "blob") for r in long + short] + [(2, "p", long[0], "blob")]
    )
    conn.close()
