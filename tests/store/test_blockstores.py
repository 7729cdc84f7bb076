"""The BlockStore contract, run against the memory, SQLite and real-IPFS stores."""

from __future__ import annotations

import os

import pytest

from merklog.store import (
    BlockNotFound,
    CIDMismatch,
    Link,
    MemoryBlockStore,
    encode,
    encode_fact,
    make_fact,
)
from merklog.store.link import RAW


def fresh_blocks(n: int) -> list[tuple[Link, bytes]]:
    """Blocks no other test (nor an earlier run against a shared daemon) has stored."""
    token = os.urandom(8).hex()
    return [encode_fact(make_fact("t", [token, i])) for i in range(n)]


def test_put_get_round_trip(any_store):
    blocks = fresh_blocks(5)
    assert any_store.put_many(blocks) == 5
    for cid, data in blocks:
        assert any_store.get(cid) == data
        assert any_store.has(cid) and cid in any_store
    assert any_store.put_many(blocks) == 0, "second put of the same blocks adds nothing"
    assert list(any_store.get_many([c for c, _ in blocks])) == blocks


def test_put_block_names_block_by_its_cid(any_store):
    data = encode({"kind": "test", "nonce": os.urandom(8)})
    cid = any_store.put_block(data)
    assert cid == Link.for_dag_cbor(data)
    assert any_store.get(cid) == data


def test_raw_codec_block(any_store):
    data = os.urandom(32)
    cid = Link.for_block(data, RAW)
    assert any_store.put(cid, data) is True
    assert any_store.get(cid) == data


def test_missing_block(any_store):
    cid, _ = fresh_blocks(1)[0]
    assert not any_store.has(cid)
    with pytest.raises(BlockNotFound, match=str(cid)):
        any_store.get(cid)


def test_put_refuses_block_under_wrong_cid(any_store):
    (cid, _), (_, other) = fresh_blocks(2)
    with pytest.raises(CIDMismatch):
        any_store.put(cid, other)
    assert not any_store.has(cid)


def test_has_many_and_iter_cids(any_store):
    blocks = fresh_blocks(4)
    any_store.put_many(blocks[:3])
    cids = [c for c, _ in blocks]
    assert any_store.has_many(cids) == set(cids[:3])
    held = set(any_store.iter_cids())
    assert set(cids[:3]) <= held and cids[3] not in held


def test_delete_many(any_store):
    blocks = fresh_blocks(3)
    any_store.put_many(blocks)
    cids = [c for c, _ in blocks]
    assert any_store.delete_many(cids[:2] + [fresh_blocks(1)[0][0]]) == 2
    assert not any_store.has(cids[0]) and not any_store.has(cids[1])
    assert any_store.get(cids[2]) == blocks[2][1]
    assert cids[0] not in set(any_store.iter_cids())


def test_memory_store_detects_tampering():
    store = MemoryBlockStore()
    (cid, data), (_, other) = fresh_blocks(2)
    store.put(cid, data)
    store.corrupt(cid, other)
    with pytest.raises(CIDMismatch) as err:
        store.get(cid)
    assert err.value.expected == cid


def test_put_encoded_stores_like_put_many(any_store):
    """The trusted bulk path of local writes stores the same blocks, once."""
    blocks = fresh_blocks(4)
    assert any_store.put_encoded(blocks) == 4
    assert any_store.put_encoded(blocks) == 0
    assert list(any_store.get_many([c for c, _ in blocks])) == blocks


def test_sizes_of_present_blocks(any_store):
    """``sizes`` gives each present block's stored size (a server plans a bounded
    answer from them, ADR 0097); absent CIDs are left out."""
    token = os.urandom(8).hex()
    blocks = [encode_fact(make_fact("t", [token, v])) for v in (1, 1.0, True, "1", b"\x01")]
    big = encode_fact(make_fact("t", [token, os.urandom(200_000)]))
    any_store.put_many([*blocks, big])
    absent = encode_fact(make_fact("t", [token, "never stored"]))[0]
    sizes = any_store.sizes([c for c, _ in blocks] + [big[0], absent])
    assert sizes == {cid: len(data) for cid, data in [*blocks, big]}
    assert len(sizes) == 6  # five values == would merge into three, each its own block


def test_dag_cbor_digests_and_links_round_trip_and_refuse_other_links() -> None:
    """``put -f``'s helper sends CIDs as digests (ADR 0147): 1, 1.0, true, "1" and
    x"01" keep five distinct CIDs through the round trip; a raw-codec link is refused."""
    from merklog.store import InvalidValue, encode_facts, make_fact

    facts = [make_fact("v", [value]) for value in (1, 1.0, True, "1", b"\x01")]
    links = [cid for cid, _data in encode_facts(facts)]
    digests = Link.dag_cbor_digests(links)
    assert len(digests) == 32 * 5
    assert Link.dag_cbor_links(digests) == links and len(set(links)) == 5
    with pytest.raises(InvalidValue):
        Link.dag_cbor_digests([Link.for_block(b"x", 0x55)])
    with pytest.raises(InvalidValue):
        Link.dag_cbor_links(digests[:-1])
