"""A local write of asserts alone, column-wise (``Replica.write_asserts``, ADR 0127): the
same delta bytes as ``build_delta``, the same packing as ``pack_ops``, and the same
deltas, rows, visible set and change notes as ``write_many`` on real SQLite files, with
values Python's ``==`` would merge (``1``, ``1.0``, ``true``) and look-alikes (``"1"``,
``x"01"``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.replication.blocks import (
    Assert,
    Retract,
    build_assert_delta,
    build_delta,
    make_genesis,
    parse_delta,
)
from merklog.replication.errors import TooLarge
from merklog.replication.identity import Identity
from merklog.replication.limits import MAX_FACT_BYTES, MAX_OPS
from merklog.replication.packing import _ASSERT_OP, PlannedOp, pack_asserts, pack_ops
from merklog.replication.replica import Replica
from merklog.store import encode_facts, fact_cid, make_fact
from merklog.store.codec import encode_reference
from merklog.store.sqlite import SQLiteBlockStore

MIXED = [1, 1.0, True, "1", b"\x01"]
OWNER = Identity.from_seed(b"\x05" * 32)
GENESIS = make_genesis(OWNER.public_key, "bulk", nonce=b"\x00" * 16)

values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0.0),
    st.booleans(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.sampled_from(MIXED),
)


def _reference(delta, cids) -> bytes:
    return encode_reference(
        {
            "kind": "delta",
            "dataset": GENESIS.cid,
            "author": OWNER.public_key,
            "seq": delta.seq,
            "clock": delta.clock,
            "parents": sorted(set(delta.parents)),
            "ops": [{"op": "assert", "fact": c} for c in cids],
            "sig": delta.sig,
        }
    )


@pytest.mark.parametrize("n", [1, 5, 23, 24, 255, 256, MAX_OPS])
def test_assert_delta_bytes_equal_build_delta_and_the_reference(n: int) -> None:
    cids = [fact_cid(make_fact("p", [MIXED[i % 5], i])) for i in range(n)]
    parents = [cids[0], GENESIS.cid, cids[0]]
    fast = build_assert_delta(OWNER, GENESIS.cid, 9, 4, parents, cids)
    slow = build_delta(
        OWNER, GENESIS.cid, 9, 4, parents, [{"op": "assert", "fact": c} for c in cids]
    )
    assert fast.data == slow.data == _reference(fast, cids)
    assert fast.cid == slow.cid and fast.parents == slow.parents and fast.asserted == cids
    assert list(fast.ops) == slow.ops and fast.assert_only
    back = parse_delta(fast.cid, fast.data)  # canonical, shaped and signed
    assert back.ops == slow.ops


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(values, min_size=0, max_size=3), min_size=1, max_size=40))
def test_assert_delta_bytes_for_any_facts(argss: list[list]) -> None:
    cids = [fact_cid(make_fact("r", args)) for args in argss]
    fast = build_assert_delta(OWNER, GENESIS.cid, 1, 1, [GENESIS.cid], cids)
    assert fast.data == _reference(fast, cids)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([20, 33, 40, 5000, 70_000, 300_000]), max_size=9000),
    st.integers(min_value=1, max_value=40),
)
def test_pack_asserts_cuts_where_pack_ops_cuts(sizes: list[int], heads: int) -> None:
    planned = [PlannedOp({}, _ASSERT_OP, (None, b"x" * size, None)) for size in sizes]
    groups, at = [], 0
    for group in pack_ops(planned, heads):
        groups.append((at, at + len(group)))
        at += len(group)
    assert pack_asserts(sizes, heads) == groups


def _pair(tmp_path) -> tuple[Replica, Replica]:
    """Two replicas of one dataset with one author: deterministic Ed25519 signatures make
    equal writes produce equal deltas."""
    out = []
    for name in ("slow", "fast"):
        store = SQLiteBlockStore(tmp_path / f"{name}.sqlite")
        out.append(Replica.open(store.conn, store, OWNER, GENESIS, None))
    return out[0], out[1]


def _rows(r: Replica) -> dict[str, list]:
    q = r.conn.execute
    return {
        # Facts by CID: the two paths hand out repl_fact ids in different orders.
        "assert": sorted(q("SELECT ds, fact, delta, killed FROM repl_assert_cid").fetchall()),
        "rel": sorted(
            q(
                "SELECT r.ds, r.rel, f.cid FROM repl_rel_member r JOIN repl_fact f ON f.id = r.fact"
            ).fetchall()
        ),
        "delta": sorted(q("SELECT * FROM repl_delta").fetchall()),
        "parent": sorted(q("SELECT * FROM repl_parent").fetchall()),
        "head": sorted(q("SELECT * FROM repl_head").fetchall()),
        "blocks": sorted(q("SELECT cid, data, typeof(cid), typeof(data) FROM blocks").fetchall()),
    }


def test_write_asserts_equals_write_many(tmp_path) -> None:
    """Several deltas, repeats in the call, facts already visible, mixed types: the same
    delta CIDs, table rows, visible set and subscriber notes; a peer accepts them."""
    slow, fast = _pair(tmp_path)
    notes: dict[str, list] = {"slow": [], "fast": []}
    slow.subscribe(lambda w, f, c: notes["slow"].append((w, c, f.rel, f.args)))
    fast.subscribe(lambda w, f, c: notes["fast"].append((w, c, f.rel, f.args)))
    first = [make_fact("seen", [v]) for v in MIXED]
    assert slow.write_many([Assert(f) for f in first]) == fast.write_asserts(
        first, encode_facts(first)
    )
    calls = [
        [make_fact("p", [i, MIXED[i % 5]]) for i in range(2 * MAX_OPS + 7)],
        first[1:3] + [make_fact("q", [v, v]) for v in MIXED] + [make_fact("q", [1, 1])] * 3,
        first,  # all visible: nothing written
    ]
    for facts in calls:
        encoded = encode_facts(facts)
        assert fast.write_asserts(facts, encoded) == slow.write_many(
            [Assert(f) for f in facts], encoded
        )
    assert _rows(fast) == _rows(slow)
    assert fast.visible_facts() == slow.visible_facts()
    assert sorted(notes["fast"], key=repr) == sorted(notes["slow"], key=repr)
    assert fast.conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    peer_store = SQLiteBlockStore(tmp_path / "peer.sqlite")
    peer = Replica.open(peer_store.conn, peer_store, Identity.generate(), GENESIS, None)
    peer.apply_blocks(fast.missing_for([fast.dataset]))
    assert peer.visible_facts() == fast.visible_facts()


def test_write_asserts_refuses_an_oversized_fact_and_writes_nothing(tmp_path) -> None:
    _slow, fast = _pair(tmp_path)
    facts = [make_fact("p", [1]), make_fact("big", ["x" * (MAX_FACT_BYTES + 1)])]
    with pytest.raises(TooLarge, match="MAX_FACT_BYTES"):
        fast.write_asserts(facts, encode_facts(facts))
    assert fast.delta_count() == 0 and not fast.visible_cids()


def test_bulk_calls_of_several_relations_index_every_fact_by_id(tmp_path) -> None:
    """A bulk call of new facts of several relations gets consecutive ids in CID order and
    indexes each relation from its facts' ranks (ADR 0132); a bulk call that re-asserts
    retracted facts (ids already given) looks them up instead. Both store what
    ``write_many`` stores, and every relation pages each of its visible facts once."""
    from merklog.replication.blocks import Retract
    from merklog.replication.paging import visible_of_relation_after

    slow, fast = _pair(tmp_path)
    new = [make_fact(f"r{i % 3}", [i, MIXED[i % 5]]) for i in range(3000)]
    again = new[::7]
    later = again + [make_fact(f"r{i % 3}", [i, "later"]) for i in range(1200)]
    for facts in (new, None, later):
        if facts is None:  # retract some on both sides: their ids stay in repl_fact
            ops = [Retract(f) for f in again]
            assert fast.write_many(ops) == slow.write_many(ops)
            continue
        encoded = encode_facts(facts)
        assert fast.write_asserts(facts, encoded) == slow.write_many(
            [Assert(f) for f in facts], encoded
        )
    assert _rows(fast) == _rows(slow)
    assert fast.visible_facts() == slow.visible_facts()
    for k in range(3):
        page = visible_of_relation_after(fast, f"r{k}", None, 10_000)
        want = {fact_cid(f) for f in new + later if f.rel == f"r{k}"}
        assert len(page) == len(set(page)) == len(want) and set(page) == want
    assert fast.conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_bulk_new_facts_reach_on_new_as_one_list(tmp_path) -> None:
    """A subscriber with ``on_new`` gets a bulk write's new facts in one call per write
    (ADR 0138), the same facts a per-fact subscriber is told one by one (+1 each), with
    mixed types kept apart; after unsubscribing it hears nothing."""
    _slow, fast = _pair(tmp_path)
    per_fact: list = []
    lists: list[list] = []
    singles: list = []
    fast.subscribe(lambda w, f, c: per_fact.append((w, c, f.rel, f.args)))
    stop = fast.subscribe(lambda w, f, c: singles.append(w), lists.append)
    facts = [make_fact("p", [i, MIXED[i % 5]]) for i in range(MAX_OPS + 9)]
    facts += facts[:3] + [make_fact("q", [v]) for v in MIXED]
    fast.write_asserts(facts, encode_facts(facts))
    assert len(lists) == 1 and singles == []
    new = [(f.rel, f.args, tuple(map(type, f.args))) for f in lists[0]]
    assert len(new) == MAX_OPS + 9 + len(MIXED)
    told = [(rel, args, tuple(map(type, args))) for _w, _c, rel, args in per_fact]
    assert sorted(new, key=repr) == sorted(told, key=repr)
    assert {w for w, _c, _r, _a in per_fact} == {1}
    stop()
    more = [make_fact("r", [v]) for v in MIXED]
    fast.write_asserts(more, encode_facts(more))
    assert len(lists) == 1 and singles == []


def test_facts_whose_blocks_are_stored_but_not_asserted_are_asserted(tmp_path) -> None:
    """A call stores its facts' blocks first and looks visibility up only when some block
    was stored already (ADR 0144): blocks stored without an assert (a bare block put), a
    retracted fact's block and a visible fact's block, beside new ones, give exactly what
    ``write_many`` gives, with mixed types kept apart."""
    from merklog.replication.blocks import Retract

    slow, fast = _pair(tmp_path)
    bare = [make_fact("b", [v]) for v in MIXED]
    for r in (slow, fast):
        r.blockstore.put_encoded(encode_facts(bare))
    first = [make_fact("p", [i, MIXED[i % 5]]) for i in range(40)]
    encoded = encode_facts(first)
    assert fast.write_asserts(first, encoded) == slow.write_many(
        [Assert(f) for f in first], encoded
    )
    ops = [Retract(f) for f in first[::4]]
    assert fast.write_many(ops) == slow.write_many(ops)
    call = bare + first + [make_fact("n", [v, v]) for v in MIXED]
    encoded = encode_facts(call)
    assert fast.write_asserts(call, encoded) == slow.write_many([Assert(f) for f in call], encoded)
    assert _rows(fast) == _rows(slow)
    assert fast.visible_facts() == slow.visible_facts()
    assert {fact_cid(f) for f in call} == fast.visible_cids()


def test_before_commit_runs_with_every_row_stored_and_its_error_rolls_back(tmp_path) -> None:
    """``before_commit`` (of ``write_asserts`` and of ``write_many``) is called inside
    the write's transaction once its blocks, deltas and rows are stored (``put -f`` holds its first chunk there while it reads the rest
    of its input); what it raises rolls the whole write back: no block, delta, assert or
    visible fact is left, and a later write stores what ``write_many`` stores."""
    slow, fast = _pair(tmp_path)
    facts = [make_fact("p", [i, MIXED[i % 5]]) for i in range(2 * MAX_OPS + 3)]
    encoded = encode_facts(facts)
    count = fast.conn.execute

    def refuse_retracts() -> None:
        assert count("SELECT count(*) FROM repl_retract").fetchone()[0] >= 5
        raise KeyboardInterrupt

    def refuse() -> None:
        assert count("SELECT count(*) FROM repl_assert").fetchone() == (len(facts),)
        assert count("SELECT count(*) FROM blocks").fetchone()[0] >= len(facts) + 3
        raise KeyboardInterrupt  # as a Ctrl-C while the rest of the input is read

    before = count("SELECT count(*) FROM blocks").fetchone()
    with pytest.raises(KeyboardInterrupt):
        fast.write_asserts(facts, encoded, before_commit=refuse)
    assert count("SELECT count(*) FROM blocks").fetchone() == before
    assert count("SELECT count(*) FROM repl_assert").fetchone() == (0,)
    assert fast.delta_count() == 0 and not fast.visible_cids()
    called: list[int] = []
    assert fast.write_asserts(
        facts, encoded, before_commit=lambda: called.append(1)
    ) == slow.write_many([Assert(f) for f in facts], encoded)
    assert called == [1]
    assert _rows(fast) == _rows(slow)
    # write_many (retracts, or a call write_asserts hands over) honours it the same way.
    ops = [Retract(f) for f in facts[:5]]
    with pytest.raises(KeyboardInterrupt):
        fast.write_many(ops, before_commit=refuse_retracts)
    assert _rows(fast) == _rows(slow) and fast.visible_cids() == slow.visible_cids()
    assert fast.write_many(ops) == slow.write_many(ops)
