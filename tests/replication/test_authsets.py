"""Writer status from auth sets (ADR 0219): the rows kept grow with the deltas, not with
writers times deltas; revokes and re-grants on concurrent branches decide as the
ancestry-walking statement of the rule does; a file an older merklog wrote is read."""

from __future__ import annotations

import pytest

from merklog.replication.errors import Unauthorized
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.replication.turns import turn_taking_blocks, writer_keys
from merklog.store import MemoryBlockStore, make_fact

from .repl_support import memory_conn, new_replicas, pull, seeded_identity


def _round_robin_log(owner: Replica, writers: list[Identity], deltas: int) -> list:
    """Blocks of a linear history: the owner grants every writer, then the writers assert
    one fact each in turn (each writing on top of the one before)."""
    return turn_taking_blocks(owner.identity, owner.dataset, writers, deltas)[0]


def _fresh(owner: Replica) -> Replica:
    return Replica.open(
        memory_conn(), MemoryBlockStore(), seeded_identity(200), owner.dataset, owner.genesis.data
    )


def test_many_writers_keep_one_row_per_delta():
    owner = new_replicas(1, writers=[])[0]
    writers = writer_keys(60)
    blocks = _round_robin_log(owner, writers, 3000)
    fresh = _fresh(owner)
    res = fresh.apply_blocks(blocks)
    assert res.accepted == 3060
    assert len(fresh.visible_cids()) == 3000
    (kept,) = fresh.conn.execute("SELECT count(*) FROM repl_auth_at").fetchone()
    (sets,) = fresh.conn.execute("SELECT count(*) FROM repl_auth_set").fetchone()
    # The memo this replaced kept a row per writer per delta: 60 x 3,000 here.
    assert kept <= fresh.delta_count()
    assert sets <= len(writers) + 1
    assert all(fresh.is_writer(w.public_key) for w in writers)
    assert not fresh.is_writer(seeded_identity(201).public_key)


def test_revoke_on_a_concurrent_branch_decides_by_the_rule():
    owner, a, b = new_replicas(3, writers=[])
    owner.grant(a.identity.public_key)
    pull(a, owner)
    pull(b, owner)
    # Apart: the owner revokes a; a keeps writing on its own branch.
    owner.revoke(a.identity.public_key)
    a.assert_facts([make_fact("p", [1])])
    # a's delta does not have the revoke in its past: every replica accepts it.
    pull(owner, a)
    pull(b, owner)
    assert b.visible_cids() == owner.visible_cids() and len(b.visible_cids()) == 1
    # Once a has seen the revoke it may not write, on every replica.
    pull(a, owner)
    assert not a.is_writer(a.identity.public_key)
    with pytest.raises(Unauthorized):
        a.assert_facts([make_fact("p", [2])])
    # A re-grant after the revoke wins again (later clock).
    owner.grant(a.identity.public_key)
    pull(a, owner)
    a.assert_facts([make_fact("p", [3])])
    pull(b, a)
    assert len(b.visible_cids()) == 2
    for r in (owner, a, b):
        for delta in r.iter_deltas():
            args = (delta.author, delta.parents, delta.clock)
            assert r._authorized(*args) == r._authorized_reference(*args) is True


def test_a_file_an_older_merklog_wrote_is_read_and_its_memo_dropped():
    owner = new_replicas(1, writers=[])[0]
    writers = writer_keys(5)
    blocks = _round_robin_log(owner, writers, 50)
    conn = memory_conn()
    store = MemoryBlockStore()
    fresh = Replica.open(conn, store, seeded_identity(200), owner.dataset, owner.genesis.data)
    fresh.apply_blocks(blocks)
    # As an older merklog leaves it: no auth sets or bits, its memo instead.
    for table in ("repl_auth_at", "repl_auth_set", "repl_auth_bit"):
        conn.execute(f"DELETE FROM {table}")
    conn.execute("INSERT INTO repl_auth_memo VALUES (?, x'01', x'02', x'')", (fresh.ds,))
    again = Replica.open(conn, store, seeded_identity(200), owner.dataset, owner.genesis.data)
    assert conn.execute("SELECT count(*) FROM repl_auth_memo").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM repl_auth_bit").fetchone() == (5,)
    assert all(again.is_writer(w.public_key) for w in writers)
    # The history goes on from there: more deltas by the same writers are accepted.
    more = _round_robin_log(owner, writers, 60)[len(blocks) :]
    assert again.apply_blocks(more).accepted == 10
