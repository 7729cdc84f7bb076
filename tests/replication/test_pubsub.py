"""Head announcements (signed, writers only) and the fetch walk behind announced heads."""

from __future__ import annotations

import pytest

from merklog.replication.errors import MalformedBlock
from merklog.replication.identity import Identity
from merklog.replication.pubsub import (
    HeadFetch,
    make_announcement,
    parse_announcement,
    topic_for,
)
from merklog.store import encode, make_fact

from .repl_support import new_replicas


def test_owner_announcement_round_trips() -> None:
    (a,) = new_replicas(1)
    a.assert_facts([make_fact("v", [1])])
    data = make_announcement(a.identity, a.dataset, a.heads())
    ann = parse_announcement(data, a.dataset, a.is_writer)
    assert list(ann.heads) == a.heads() and ann.key == a.identity.public_key
    assert topic_for(a.dataset).endswith(str(a.dataset))


def test_forged_and_unauthorised_announcements_are_refused() -> None:
    a, b = new_replicas(2, writers=[])
    stranger = Identity.generate()
    # A stranger's honest signature: not a writer of the dataset.
    data = make_announcement(stranger, a.dataset, a.heads())
    with pytest.raises(MalformedBlock, match="not a writer"):
        parse_announcement(data, a.dataset, a.is_writer)
    # The owner's key with the stranger's signature: forged.
    good = make_announcement(a.identity, a.dataset, a.heads())
    import libipld

    obj = libipld.decode_dag_cbor(good)
    obj["sig"] = stranger.sign(b"something else")
    forged = encode({**obj, "dataset": a.dataset, "heads": a.heads()})
    with pytest.raises(MalformedBlock, match="signature"):
        parse_announcement(forged, a.dataset, a.is_writer)
    # Another dataset, garbage, extra fields.
    (other,) = new_replicas(1, writers=[])
    other = type(a).create(other.conn, other.blockstore, a.identity, "another dataset")
    with pytest.raises(MalformedBlock, match="dataset"):
        parse_announcement(good, other.dataset, other.is_writer)
    for junk in (b"", b"\xff\x00", encode({"kind": "heads"}), encode([1, 2])):
        with pytest.raises(MalformedBlock):
            parse_announcement(junk, a.dataset, a.is_writer)


def test_head_fetch_walks_to_known_deltas_and_orders_for_apply() -> None:
    a, b = new_replicas(2)
    a.assert_facts([make_fact("v", [x]) for x in (1, 1.0, True, "1", b"\x01")])
    b.apply_blocks(a.missing_for(b.heads()))
    a.assert_facts([make_fact("w", [i]) for i in range(3)])
    a.retract_facts([make_fact("v", [True])])
    a.assert_facts([make_fact("w", [i]) for i in range(2, 5)])
    walk = HeadFetch(a.heads(), b.has_delta, b.blockstore.has)
    fetched = 0
    while want := walk.wanted():
        for cid in want:
            walk.receive(cid, a.blockstore.get(cid))
            fetched += 1
    # Three new deltas, and the 5 new facts (w(2) twice asserted, fetched once).
    assert fetched == 3 + 5
    result = b.apply_blocks(walk.blocks())
    assert result.accepted == 3
    assert b.heads() == a.heads() and b.visible_cids() == a.visible_cids()
    assert len(b.visible_cids()) == 4 + 5  # v(true) retracted; 1, 1.0, "1", x"01" distinct
    assert HeadFetch(a.heads(), b.has_delta, b.blockstore.has).wanted() == []


def test_an_announcement_of_many_heads_is_one_every_receiver_takes(monkeypatch) -> None:
    """QA: 5,000 concurrent deltas left 5,000 heads, and the announcement naming them all
    was refused by every receiver (over MAX_HEADS and over MAX_ANNOUNCEMENT bytes). Each
    announcement now names at most MAX_HEADS of them, a window that changes second by
    second, so every head is announced within a few rounds."""
    import hashlib
    import time

    from merklog.replication import pubsub
    from merklog.store import Link

    me = Identity.generate()
    dataset = Link.for_dag_cbor(b"dataset")
    heads = [Link.for_dag_cbor(hashlib.sha256(str(i).encode()).digest()) for i in range(2500)]
    seen: set = set()
    for second in range(3):
        monkeypatch.setattr(time, "time_ns", lambda s=second: s * 1_000_000_000 + 7)
        data = pubsub.make_announcement(me, dataset, heads)
        assert len(data) <= pubsub.MAX_ANNOUNCEMENT
        got = pubsub.parse_announcement(data, dataset, lambda _key: True)
        assert 0 < len(got.heads) <= pubsub.MAX_HEADS
        seen |= set(got.heads)
    assert seen == set(heads)
