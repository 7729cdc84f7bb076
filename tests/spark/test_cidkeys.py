"""64-bit CID keys (ADR 0131): the digest bits in CID byte order, null where a CID has none,
list for list, and an injectivity check that sees two CIDs sharing their bits."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from merklog.node.spark.cidkeys import (
    KEY_COLUMNS,
    cid_keys,
    injective,
    keys_name_cids,
    list_keys,
)
from merklog.node.spark.export import export
from merklog.node.spark.gen import Simulation

PREFIX = bytes.fromhex("01711220")


def _cid(i: int) -> bytes:
    return PREFIX + hashlib.sha256(str(i).encode()).digest()


def test_keys_sort_as_the_cids_and_only_dag_cbor_sha256_cids_have_one() -> None:
    cids = [_cid(i) for i in range(2000)]
    random.Random(5).shuffle(cids)
    keys = np.asarray(cid_keys(pa.array(cids, pa.binary())))
    assert [cids[i] for i in np.argsort(keys)] == sorted(cids)
    assert keys[0] == int.from_bytes(cids[0][4:12], "big") - (1 << 63)
    odd = pa.array([cids[1], None, b"\x01\x55\x12\x20" + cids[2][4:], cids[3][:20], b""])
    got = cid_keys(odd.slice(0))
    assert got.is_valid().to_pylist() == [True, False, False, False, False]
    assert cid_keys(odd.slice(1, 3)).to_pylist() == [None, None, None]
    assert cid_keys(pa.chunked_array([odd.slice(0, 1), odd.slice(3)])).to_pylist()[0] == int(
        keys[1]
    )


def test_list_keys_follow_the_lists_and_injectivity_sees_shared_bits() -> None:
    lists = pa.array([[_cid(1), _cid(2)], None, [], [_cid(3)]], pa.list_(pa.binary()))
    for arr in (lists, lists.slice(1), pa.chunked_array([lists.slice(0, 2), lists.slice(2)])):
        got = list_keys(arr).to_pylist()
        flat = arr.to_pylist()
        assert got == [
            None if v is None else [cid_keys(pa.array([c])).to_pylist()[0] for c in v] for v in flat
        ]
    a = _cid(7)
    twin = a[:12] + bytes(24)  # the same 64 key bits, another CID
    cids = pa.array([a, _cid(8), a])
    assert injective(cids, cid_keys(cids))
    both = pa.array([a, twin, _cid(8)])
    assert not injective(both, cid_keys(both))
    other = pa.array([a, b"\x01\x55" + a[2:]])  # a raw-codec CID has no key
    assert not injective(other, cid_keys(other))
    # the sort-based check the compaction runs: the same answers, nulls left out
    many = pa.array([_cid(i % 500) for i in range(3000)] + [None])
    assert keys_name_cids(many) and keys_name_cids(many.slice(7))
    shared = pa.array([_cid(i) for i in range(8, 108)] + [twin, None, a])
    assert not keys_name_cids(shared) and keys_name_cids(shared.slice(0, 101))
    assert not keys_name_cids(other) and not keys_name_cids(pa.array([a, a[:20]]))


def test_the_export_writes_the_keys_of_its_cids(tmp_path) -> None:
    sim = Simulation(peers=2, pool=30, seed=4).run(80)
    export(sim.log_rows(0), [(sim.dataset, f) for f in sim.visible(0)], tmp_path / "e")
    ops = pq.read_table(tmp_path / "e" / "ops")
    assert ops.schema.names[-3:] == KEY_COLUMNS
    assert ops.column("fact_key").to_pylist() == cid_keys(ops.column("fact_cid")).to_pylist()
    assert ops.column("delta_key").to_pylist() == cid_keys(ops.column("delta_cid")).to_pylist()
    assert ops.column("observed_keys").to_pylist() == list_keys(ops.column("observed")).to_pylist()
    assert any(v for v in ops.column("observed_keys").to_pylist())
