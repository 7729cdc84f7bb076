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
from merklog.store import Link, encode_fact, encode_facts, fact_cid, make_fact
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
    """Every page of ``rel``, sorted by CID (pages come in id order, ADR 0132: each fact
    once, whatever the page size)."""
    out: list[Link] = []
    after = None
    while page := visible_of_relation_after(replica, rel, after, limit):
        out += page
        after = page[-1]
    assert len(set(out)) == len(out)
    whole = visible_of_relation_after(replica, rel, None, 1_000_000)
    assert out == whole
    return sorted(out)


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
            "SELECT fact, delta FROM repl_assert_cid WHERE ds = ? AND killed = 0", (a.ds,)
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
    # The index names facts by their repl_fact ids (ADR 0132), which their asserts give.
    conn.executemany("INSERT INTO repl_fact (cid) VALUES (?)", [(r,) for r in long + short])
    record(conn, rows)
    record(conn, rows[:2])  # again: ignored
    got = conn.execute(
        "SELECT r.ds, r.rel, f.cid, typeof(f.cid), typeof(r.fact)"
        " FROM repl_rel_fact r JOIN repl_fact f ON f.id = r.fact"
    ).fetchall()
    assert sorted(got) == sorted(
        [(1, "p", r, "blob", "integer") for r in long + short]
        + [(2, "p", long[0], "blob", "integer")]
    )
    conn.close()


def test_one_call_of_several_deltas_with_a_retract_indexes_every_assert(tmp_path) -> None:
    """A local write defers its index rows to its end (ADR 0110) whether or not it holds
    a retract (its assert rows then go in per delta): every asserted fact of every delta
    is indexed once, pages see the visible ones, and a peer accepts the deltas."""
    from merklog.replication.blocks import Assert, Retract
    from merklog.replication.limits import MAX_OPS

    owner = Identity.generate()
    a = _replica(tmp_path, "a", owner)
    rare = [make_fact("rare", [x]) for x in MIXED]
    a.assert_facts(rare[:2])
    common = [make_fact("common", [i, MIXED[i % 5]]) for i in range(2 * MAX_OPS + 10)]
    deltas = a.write_many([Assert(f) for f in common + rare[2:]] + [Retract(rare[0])])
    assert len(deltas) >= 3
    indexed = a.conn.execute(
        "SELECT rel, count(*) FROM repl_rel_member WHERE ds = ? GROUP BY rel", (a.ds,)
    ).fetchall()
    assert sorted(indexed) == [("common", len(common)), ("rare", len(rare))]
    assert _page_all(a, "rare", 2) == sorted(map(fact_cid, rare[1:]))
    assert _page_all(a, "common", 1000) == sorted(map(fact_cid, common))
    assert a.conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    b = _replica(tmp_path, "b", Identity.generate(), a.genesis)
    b.apply_blocks(a.missing_for([a.dataset]))
    assert b.visible_facts() == a.visible_facts()
    assert _page_all(b, "rare", 3) == _page_all(a, "rare", 3)


def test_insert_asserts_cuts_runs_of_any_cid_length_and_refuses_duplicates(tmp_path) -> None:
    """``insert_asserts`` sends each (ds, killed, CID lengths) run as one blob: rows of
    mixed-type facts and CIDs of different lengths all land as BLOBs with their flags,
    and a duplicate primary key fails as a plain INSERT would."""
    import sqlite3

    from merklog.replication.assertrows import insert_asserts
    from merklog.replication.schema import ensure_schema

    conn = sqlite3.connect(tmp_path / "a.sqlite", isolation_level=None)
    ensure_schema(conn)
    facts = [fact_cid(make_fact("p", [x])).raw for x in MIXED]
    delta = fact_cid(make_fact("d", ["delta"])).raw
    short = b"\x01\x55\x00\x03abc"  # an identity-hash raw CID
    rows = [(1, f, delta, i % 2) for i, f in enumerate(facts)]
    rows += [(1, short, delta, 0), (1, facts[0], short, 0), (2, facts[0], delta, 0)]
    assert insert_asserts(conn, rows) == len(rows)
    got = conn.execute(
        "SELECT ds, fact, delta, killed, typeof(fact), typeof(delta) FROM repl_assert_cid"
    ).fetchall()
    assert sorted(got) == sorted((*r, "blob", "blob") for r in rows)
    assert len({r[1] for r in rows[:5]}) == 5  # 1, 1.0, true, "1", x"01": five CIDs
    with pytest.raises(sqlite3.IntegrityError):
        insert_asserts(conn, [(1, facts[2], delta, 0)])
    conn.close()


@pytest.mark.parametrize("relations", [1, 3, 17])  # 17: over _FEW_RELATIONS, row by row
def test_bulk_rows_go_in_whichever_way_they_are_split(tmp_path, relations: int) -> None:
    """The bulk forms of ``record`` and ``insert_asserts`` (one dataset, one CID length,
    few relations: split with C-level passes, ADR 0121) store exactly the rows given,
    as the row-by-row form does for anything else."""
    import sqlite3

    from merklog.replication.assertrows import insert_asserts
    from merklog.replication.relindex import record
    from merklog.replication.schema import ensure_schema

    conn = sqlite3.connect(tmp_path / "b.sqlite", isolation_level=None)
    ensure_schema(conn)
    facts = [make_fact(f"r{i % relations}", [i, MIXED[i % 5]]) for i in range(400)]
    raws = [fact_cid(f).raw for f in facts]
    delta = fact_cid(make_fact("d", ["delta"])).raw
    assert insert_asserts(conn, [(1, r, delta, 0) for r in raws]) == len(raws)
    assert insert_asserts(conn, []) == 0
    record(conn, [(1, f.rel, r) for f, r in zip(facts, raws, strict=True)])
    got = conn.execute(
        "SELECT r.ds, r.rel, f.cid, typeof(f.cid) FROM repl_rel_fact r"
        " JOIN repl_fact f ON f.id = r.fact"
    ).fetchall()
    assert sorted(got) == sorted((1, f.rel, r, "blob") for f, r in zip(facts, raws, strict=True))
    got = conn.execute(
        "SELECT ds, fact, delta, killed, typeof(fact) FROM repl_assert_cid"
    ).fetchall()
    assert sorted(got) == sorted((1, r, delta, 0, "blob") for r in raws)
    conn.close()


def _overlaps(replica: Replica) -> int:
    """Index rows of facts that a range of the same dataset and relation also holds."""
    return replica.conn.execute(
        "SELECT count(*) FROM repl_rel_fact r JOIN repl_rel_range g"
        " ON g.ds = r.ds AND g.rel = r.rel AND r.fact BETWEEN g.lo AND g.hi"
    ).fetchone()[0]


def test_ranges_and_rows_page_as_one_index(tmp_path) -> None:
    """A bulk write indexes each relation's new facts as one id range (ADR 0151), other
    writes as rows: pages of any size walk both in id order, each visible fact once;
    a fact a range holds that is asserted again (locally after a retract, or by a peer's
    concurrent delta) gets no row, and a peer that applied the same deltas pages alike."""
    from .repl_support import pull

    owner = Identity.generate()
    a = _replica(tmp_path, "a", owner)
    b = _replica(tmp_path, "b", Identity.generate(), a.genesis)
    a.grant(b.identity.public_key)
    pull(b, a)
    first = [make_fact(f"r{i % 3}", [i, MIXED[i % 5]]) for i in range(1500)]
    a.write_asserts(first, encode_facts(first))  # bulk, all new: one range per relation
    small = [make_fact("r0", ["small", x]) for x in MIXED] + [make_fact("r1", ["small", 1])]
    a.write_asserts(small, encode_facts(small))  # small, two relations: rows
    second = [make_fact(f"r{i % 2}", [i, "second", MIXED[i % 5]]) for i in range(1200)]
    a.write_asserts(second, encode_facts(second))  # bulk again: two more ranges
    ranges = a.conn.execute("SELECT rel, lo, hi FROM repl_rel_range ORDER BY lo").fetchall()
    assert [(rel, hi - lo + 1) for rel, lo, hi in ranges] == [
        ("r0", 500),
        ("r1", 500),
        ("r2", 500),
        ("r0", 600),
        ("r1", 600),
    ]
    assert a.conn.execute("SELECT count(*) FROM repl_rel_fact").fetchone()[0] == len(small)

    gone = [first[0], first[4], second[7]]  # r0 and r1 facts held by ranges
    a.retract_facts(gone)
    a.assert_facts([first[0]])  # asserted again: it has an id, its range still holds it
    # b asserts a fact of a's first range on its own, then both sync both ways.
    b.assert_facts([first[3], make_fact("r2", ["b"])])
    pull(a, b)
    pull(b, a)
    for replica in (a, b):
        assert _overlaps(replica) == 0
        visible = replica.visible_cids()
        for rel in ("r0", "r1", "r2"):
            expected = sorted(
                fact_cid(f)
                for f in first + small + second + [make_fact("r2", ["b"])]
                if f.rel == rel and fact_cid(f) in visible
            )
            for limit in (1, 7, 499, 500, 501, 5000):
                assert _page_all(replica, rel, limit) == expected
    assert fact_cid(first[0]) in a.visible_cids() and fact_cid(first[4]) not in a.visible_cids()
    # A page stops at range ends exactly: the cursor on the last fact of a range.
    (_rel, lo, hi) = ranges[0]
    (last,) = a.conn.execute("SELECT cid FROM repl_fact WHERE id = ?", (hi,)).fetchone()
    after = visible_of_relation_after(a, "r0", Link(bytes(last)), 3)
    (id_after,) = a.conn.execute(
        "SELECT min(fact) FROM repl_rel_member WHERE ds = ? AND rel = 'r0' AND fact > ?",
        (a.ds, hi),
    ).fetchone()
    (want,) = a.conn.execute("SELECT cid FROM repl_fact WHERE id = ?", (id_after,)).fetchone()
    assert after[0] == Link(bytes(want))
    assert a.conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
