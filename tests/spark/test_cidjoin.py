"""CID lookups by 64 digest bits (node/spark/cidjoin.py) answer what pc.index_in answers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merklog.node.cidsearch import search
from merklog.node.spark.cidjoin import first_of_each, lookup, member
from merklog.store import Link


def _cid_array(values) -> pa.Array:
    return pa.array(values, pa.binary())


def test_cid_lookup_equals_index_in():
    cids = [Link.for_dag_cbor(bytes([0xA1, i])).raw for i in range(50)]
    value_set = _cid_array(cids[:40])
    wanted = _cid_array([cids[3], None, cids[45], cids[39], cids[0], cids[3]])
    got = lookup(wanted, value_set)
    assert got.to_pylist() == pc.index_in(wanted, value_set=value_set).to_pylist()
    assert got.to_pylist() == [3, None, None, 39, 0, 3]
    # a slice (non-zero offset) of both sides
    assert lookup(wanted[1:], value_set[5:]).to_pylist() == [None, None, 34, None, None]
    # other widths, and two CIDs sharing the 64 bits searched: index_in's answer still
    short = _cid_array([b"\x01\x55\x00\x01x", *cids[:3]])
    assert lookup(_cid_array([b"\x01\x55\x00\x01x"]), short).to_pylist() == [0]
    twin = cids[7][:12] + bytes(24)
    clash = _cid_array([cids[7], twin])
    assert lookup(_cid_array([twin, cids[7]]), clash).to_pylist() == [1, 0]
    assert lookup(_cid_array([]), value_set).to_pylist() == []
    assert lookup(wanted, _cid_array([])).to_pylist() == [None] * 6


def test_bucket_search_equals_searchsorted():
    rng = np.random.default_rng(7)
    top = np.iinfo(np.uint64).max
    for n in (1, 2, 3, 1000, 70_000):
        keys = np.unique(rng.integers(0, top, n, dtype=np.uint64, endpoint=True))
        keys[0] = 0
        queries = np.concatenate(
            [
                keys,
                keys + np.uint64(1),
                rng.integers(0, top, 5000, dtype=np.uint64),
                np.array([0, top], np.uint64),
            ]
        )
        assert queries.dtype == np.uint64
        assert np.array_equal(search(keys, queries), np.searchsorted(keys, queries))


def test_member_marks_values_in_the_set():
    cids = [Link.for_dag_cbor(bytes([0xA1, i])).raw for i in range(10)]
    got = member(_cid_array([cids[1], None, cids[9]]), _cid_array(cids[:5]))
    assert got.tolist() == [True, False, False]


def test_first_of_each_keeps_the_first_row_of_every_distinct_cid():
    cids = [Link.for_dag_cbor(bytes([0xA2, i])).raw for i in range(20)]
    assert first_of_each(_cid_array(cids)) is None  # distinct already
    values = [cids[4], cids[1], cids[4], cids[9], cids[1], cids[1], cids[0]]
    assert first_of_each(_cid_array(values)).tolist() == [0, 1, 3, 6]
    # two CIDs sharing the 64 bits grouped on, interleaved; other widths; nulls
    twin = cids[7][:12] + bytes(24)
    clash = _cid_array([cids[7], twin, cids[7], twin, cids[2]])
    assert first_of_each(clash).tolist() == [0, 1, 4]
    assert first_of_each(_cid_array([b"ab", b"a", b"ab"])).tolist() == [0, 1]
    assert first_of_each(_cid_array([None, cids[0], None])).tolist() == [0, 1]
    assert first_of_each(_cid_array([])) is None


def test_shares_are_bisect_right_of_the_bounds():
    """The share of each CID (the Parquet export's worker split) is the count of bounds at
    most it, bytewise, as ``bisect.bisect_right`` says: on 36-byte CIDs by integers, on a
    column with other widths value by value; null is share 0. Sliced columns too."""
    from bisect import bisect_right

    from merklog.node.spark.cidjoin import shares
    from merklog.node.spark.export import shares_of

    cids = [Link.for_dag_cbor(bytes([0xA1, i, j])).raw for i in range(40) for j in range(5)]
    for n in (2, 3, 4):
        bounds = shares_of(n)[1].bounds
        column = _cid_array([None, *cids])
        want = [0] + [bisect_right(bounds, c) for c in cids]
        assert shares(column, bounds).tolist() == want
        assert shares(column[7:], bounds).tolist() == want[7:]
        assert set(want) == set(range(n))  # every share holds some of 200 CIDs
        bounds_at_a_cid = (cids[17][:5], cids[17][:5] + b"\xff")  # one bound not 5 bytes
        odd = _cid_array([b"\x01\x55\x12\x20\xff" + bytes(31), b"\x01", cids[17], None])
        for b in (bounds, bounds_at_a_cid):
            assert shares(odd, b).tolist() == [
                0 if v is None else bisect_right(b, v) for v in odd.to_pylist()
            ]
