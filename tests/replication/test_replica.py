"""Replica unit tests: acceptance rule, writer grants/revokes, persistence, log relations."""

from __future__ import annotations

import os
import stat

import pytest

from merklog.engine import Program
from merklog.replication.blocks import Assert, Grant, Retract, Revoke, build_delta, parse_delta
from merklog.replication.errors import MissingParents, Unauthorized
from merklog.replication.identity import Identity, verify_signature
from merklog.replication.replica import Replica
from merklog.store import Link, MemoryBlockStore, fact_cid, make_fact
from merklog.store.sqlite import SQLiteBlockStore

from .repl_support import memory_conn, new_replicas, pull, seeded_identity

VIEW = """
killed(D, F) :- retracts(_, F, D).
visible(F) :- asserts(D, F), !killed(D, F).
"""


def test_identity_save_load_permissions(tmp_path):
    ident = Identity.generate()
    path = ident.save(tmp_path / "keys" / "node.pem")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = Identity.load(path)
    assert loaded.public_key == ident.public_key
    sig = loaded.sign(b"hello")
    assert verify_signature(ident.public_key, sig, b"hello")
    assert not verify_signature(ident.public_key, sig, b"hellO")
    raw = tmp_path / "seed"
    raw.write_bytes(ident.seed())
    assert Identity.load(raw).public_key == ident.public_key
    assert Identity.load_or_create(tmp_path / "new.pem").public_key != ident.public_key


def test_delta_shape_and_lamport_clock():
    a, b, _ = new_replicas(3)
    d1 = a.assert_facts([make_fact("p", [1])])[0]
    d2 = b.assert_facts([make_fact("p", [2])])[0]
    pull(a, b)
    d3 = a.write([Assert(make_fact("p", [3]))])
    delta = parse_delta(d3, a.blockstore.get(d3))
    assert delta.parents == sorted([d1, d2])
    assert delta.clock == 2 and delta.seq == 2
    assert delta.author == a.identity.public_key
    assert a.heads() == [d3]


def test_add_wins_concurrent_assert_and_retract():
    a, b, c = new_replicas(3)
    fact = make_fact("p", [1])
    a.assert_facts([fact])
    pull(b, a)
    b.retract_facts([fact])  # observes a's assert only
    assert a.assert_facts([fact]) == []  # already visible at a: no new assert
    c.assert_facts([fact])  # concurrent assert by a replica that has not seen it
    pull(a, c)
    pull(a, b)
    pull(b, a)
    assert a.visible_facts() == b.visible_facts() == {fact}
    b.retract_facts([fact])  # now observes both asserts
    pull(a, b)
    assert a.visible_facts() == b.visible_facts() == set()


def test_visible_facts_keep_value_identity():
    """p(1), p(1.0), p(true), p("1") and p(x"01") are five facts (five CIDs): Python's
    == merges the first three, so visible_facts() must not be a plain set of Facts."""
    a, b = new_replicas(2)
    mixed = [make_fact("p", [x]) for x in (1, 1.0, True, "1", b"\x01")]
    a.assert_facts(mixed)
    pull(b, a)
    assert len(a.visible_facts()) == len(b.visible_facts()) == 5
    assert a.visible_facts() == b.visible_facts()
    a.retract_facts([make_fact("p", [1])])
    visible = a.visible_facts()
    assert len(visible) == 4
    assert make_fact("p", [1]) not in visible
    assert make_fact("p", [1.0]) in visible and make_fact("p", [True]) in visible
    assert visible != b.visible_facts()  # b still holds p(1)
    pull(b, a)
    assert b.visible_facts() == visible
    # a Fact's == is value identity: a plain set of them keeps p(1.0) and p(true) apart too
    plain = {make_fact("p", [x]) for x in (1.0, True, "1", b"\x01")}
    assert len(plain) == 4 and visible == plain
    assert [f.args for f in visible] == [f.args for _c, f in a.visible()]  # CID order


def test_concurrent_revoke_is_decided_by_causal_past():
    owner, w, third = new_replicas(3, writers=[1])
    owner.revoke(w.identity.public_key)
    # w has not seen the revoke: its writes are concurrent and accepted everywhere.
    w.assert_facts([make_fact("p", [1])])
    w.assert_facts([make_fact("p", [2])])
    w.assert_facts([make_fact("p", [3])])  # w's clock now exceeds the revoke's
    pull(third, w)
    pull(third, owner)
    pull(owner, w)
    assert (
        owner.visible_facts() == third.visible_facts() == {make_fact("p", [i]) for i in (1, 2, 3)}
    )
    # Having merged the revoke, w can no longer write.
    pull(w, owner)
    assert not w.is_writer(w.identity.public_key)
    with pytest.raises(Unauthorized):
        w.assert_facts([make_fact("p", [4])])
    # A forged delta by w on top of the revoke is rejected by every replica.
    heads = owner.heads()
    clock = 1 + max(owner._clock_of(h) for h in heads)
    d = build_delta(w.identity, owner.dataset, 9, clock, heads, [{"op": "grant", "key": b"k" * 32}])
    with pytest.raises(Unauthorized):
        owner.apply_blocks([(d.cid, d.data)])
    # Re-granting restores w.
    owner.grant(w.identity.public_key)
    pull(w, owner)
    assert w.assert_facts([make_fact("p", [4])])


def test_only_owner_grants():
    owner, w = new_replicas(2, writers=[1])
    with pytest.raises(Unauthorized):
        w.write([Grant(seeded_identity(5).public_key)])
    with pytest.raises(Unauthorized):
        w.write([Revoke(owner.identity.public_key)])


def test_change_callbacks_are_net_and_after_commit():
    a, b, _ = new_replicas(3)
    seen = []
    b.subscribe(lambda w, f, c: seen.append((w, f)))
    f1, f2 = make_fact("p", [1]), make_fact("p", [2])
    a.assert_facts([f1, f2])
    a.retract_facts([f1])
    pull(b, a)  # one batch: f1 appears and disappears -> no event for f1
    assert seen == [(1, f2)]
    a.retract_facts([f2])
    pull(b, a)
    assert seen == [(1, f2), (-1, f2)]


def test_failed_batch_leaves_no_blocks_with_sqlite_store(tmp_path):
    owner = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "a.sqlite")
    r = Replica.create(store.conn, store, owner, "atomic")
    n_blocks = len(store)
    src = Replica.open(memory_conn(), MemoryBlockStore(), owner, r.dataset, r.genesis.data)
    src.assert_facts([make_fact("p", [i]) for i in range(10)])
    blocks = list(src.missing_for([src.dataset]))
    ghost = Link.for_dag_cbor(b"\xa0ghost")
    bad = build_delta(owner, r.dataset, 6, 9, [ghost], [{"op": "grant", "key": b"y" * 32}])
    with pytest.raises(MissingParents):
        r.apply_blocks([*blocks, (bad.cid, bad.data)])
    assert len(store) == n_blocks
    assert r.delta_count() == 0 and r.visible_cids() == set()
    assert store.integrity_check() == []
    store.close()


def test_write_of_several_deltas_stores_every_block_and_assert(tmp_path):
    """One call packed into several deltas stores its blocks and assert rows once, at the
    end (ADR 0080): every fact is visible, every block is there, the file is sound and a
    peer accepts all of it; a call that also retracts keeps the per-delta path. Facts are
    compared by CID: Python's == would merge p(1), p(1.0) and p(true)."""
    from merklog.replication.limits import MAX_OPS

    owner = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "w.sqlite")
    r = Replica.create(store.conn, store, owner, "bulk")
    values = [1, 1.0, True, "1", b"\x01"]  # five values, five facts each round
    facts = [make_fact("p", [i // 5, values[i % 5]]) for i in range(2 * MAX_OPS + 10)]
    cids = r.assert_facts(facts)
    assert len(cids) == 3
    assert r.visible_cids() == {fact_cid(f) for f in facts}
    assert len(r.visible_cids()) == len(facts)
    assert store.has_many(r.visible_cids()) == r.visible_cids()
    assert all(store.has(c) for c in cids)
    assert store.integrity_check() == []
    gone, new = facts[:7], [make_fact("q", [v]) for v in values]
    r.write_many([Assert(f) for f in new] + [Retract(f) for f in gone])
    expected = {fact_cid(f) for f in facts[7:] + new}
    assert r.visible_cids() == expected and len(expected) == len(facts) - 7 + 5
    peer = Replica.open(memory_conn(), MemoryBlockStore(), owner, r.dataset, r.genesis.data)
    assert pull(peer, r) == 4
    assert peer.visible_cids() == expected and peer.heads() == r.heads()
    store.close()


def test_bulk_write_of_visible_facts_adds_no_assert(tmp_path):
    """A write of thousands of facts looks their visibility up in one blob query
    (ADR 0110): the already-visible ones (mixed types, so ``==`` would merge them) add
    no assert row, the others one each, and a retracted one is asserted again."""
    from merklog.replication.orset import _BLOB_LOOKUP

    owner = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "v.sqlite")
    r = Replica.create(store.conn, store, owner, "bulk")
    values = [1, 1.0, True, "1", b"\x01"]
    old = [make_fact("p", [i // 5, values[i % 5]]) for i in range(2 * _BLOB_LOOKUP)]
    r.assert_facts(old)
    r.retract_facts(old[:3])
    (before,) = r.conn.execute("SELECT count(*) FROM repl_assert").fetchone()
    new = [make_fact("p", [i, values[i % 5]]) for i in range(10**6, 10**6 + _BLOB_LOOKUP)]
    assert len(r.visible_among([fact_cid(f) for f in old + new])) == len(old) - 3
    r.write_many([Assert(f) for f in old + new])
    (after,) = r.conn.execute("SELECT count(*) FROM repl_assert").fetchone()
    assert after - before == len(new) + 3
    assert r.visible_cids() == {fact_cid(f) for f in old + new}
    store.close()


def test_state_survives_reopen(tmp_path):
    ident = Identity.generate()
    store = SQLiteBlockStore(tmp_path / "r.sqlite")
    r = Replica.create(store.conn, store, ident, "durable")
    r.assert_facts([make_fact("p", [i]) for i in range(5)])
    r.retract_facts([make_fact("p", [0])])
    heads, visible = r.heads(), r.visible_facts()
    store.close()
    store = SQLiteBlockStore(tmp_path / "r.sqlite")
    again = Replica.open(store.conn, store, ident, r.dataset)
    assert again.heads() == heads and again.visible_facts() == visible
    again.assert_facts([make_fact("p", [9])])
    assert len(again.visible_facts()) == 5
    store.close()


def test_log_relations_datalog_view_equals_state():
    reps = new_replicas(4)
    facts = [make_fact("p", [i]) for i in range(8)]
    reps[0].assert_facts(facts[:5])
    reps[1].assert_facts(facts[3:])
    pull(reps[2], reps[0])
    pull(reps[2], reps[1])
    reps[2].retract_facts(facts[2:5])
    assert reps[0].assert_facts([facts[3]]) == []  # visible there: nothing to assert
    reps[3].assert_facts([facts[3]])  # concurrent with the retract: survives
    for r in reps[1:]:
        pull(reps[0], r)
    rels = reps[0].relations()
    out = Program.parse(VIEW).evaluate(
        {name: rels[name] for name in ("asserts", "retracts", "delta", "parent")}
    )
    view = {row[0] for row in out["visible"]}
    assert view == reps[0].visible_cids()
    assert {f for _c, f in reps[0].visible()} == set(facts) - {facts[2], facts[4]}
    assert len(rels["delta"]) == reps[0].delta_count()
    assert all(len(t) == 4 for t in rels["delta"]) and all(len(t) == 3 for t in rels["retracts"])


def test_iter_log_rows():
    a, *_ = new_replicas(2)
    a.assert_facts([make_fact("p", [1, "x"])])
    a.write([Retract(make_fact("p", [1, "x"])), Grant(seeded_identity(7).public_key)])
    rows = list(a.iter_log())
    assert [r.op for r in rows] == ["assert", "retract", "grant"]
    assert rows[0].relation == "p" and rows[0].args == (1, "x")
    assert rows[1].observed == (rows[0].delta,)
    assert rows[1].fact == rows[0].fact and rows[1].relation == "p"
    assert rows[2].key == seeded_identity(7).public_key.hex()
    assert rows[0].clock == 1 and rows[1].clock == 2 and rows[1].index == 0
    assert all(r.dataset == str(a.dataset) for r in rows)


def test_legacy_transaction_mode_connection_is_refused():
    import sqlite3

    legacy = sqlite3.connect(":memory:")  # implicit BEGIN: writes would stay uncommitted
    with pytest.raises(ValueError, match="autocommit"):
        Replica.create(legacy, MemoryBlockStore(), Identity.generate(), "x")


def test_granted_writer_history_is_checked_incrementally():
    owner, w = new_replicas(2, writers=[])
    owner.grant(w.identity.public_key)
    pull(w, owner)
    for i in range(200):
        w.assert_facts([make_fact("p", [i])])
    pull(owner, w)
    assert len(owner.visible_cids()) == 200
    # Each acceptance kept one auth set per delta instead of walking the history.
    (kept,) = owner.conn.execute("SELECT count(*) FROM repl_auth_at").fetchone()
    assert 0 < kept <= owner.delta_count() + 1
    owner.revoke(w.identity.public_key)
    pull(w, owner)
    with pytest.raises(Unauthorized):
        w.assert_facts([make_fact("p", [999])])


def test_transactions_of_two_threads_on_one_connection_do_not_nest() -> None:
    """On a connection no block store shares (a memory node's), ``transaction`` opened a
    SAVEPOINT without the connection's lock. A second thread's savepoint then nested in
    the first, the first's RELEASE released both, and the second failed with "no such
    savepoint" (an epoch saving while a write ran: the Python API's documented app failed
    one run in five). The second now waits for the first, and both commit."""
    import threading

    from merklog.replication.txn import connect, transaction

    conn = connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    first_in, second_in = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with transaction(conn):
                conn.execute("INSERT INTO t VALUES (1)")
                first_in.set()
                second_in.wait(2)  # a second transaction nested here would start now
        except BaseException as exc:  # reported below
            errors.append(exc)

    def second() -> None:
        first_in.wait(10)
        try:
            with transaction(conn):
                second_in.set()
                conn.execute("INSERT INTO t VALUES (2)")
                a.join(10)  # the first one ends while this one is open, if nested
        except BaseException as exc:  # reported below
            errors.append(exc)

    a, b = threading.Thread(target=first), threading.Thread(target=second)
    a.start()
    b.start()
    a.join(30)
    b.join(30)
    assert errors == []
    assert sorted(r[0] for r in conn.execute("SELECT x FROM t")) == [1, 2]
    assert not conn.in_transaction
