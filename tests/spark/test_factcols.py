"""The column-wise fact decoder gives, value for value, what the generic decoder gives."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from merklog.node.spark.factcols import binary_array, fact_columns, indices
from merklog.node.spark.schema import args_array, decode_args
from merklog.store import Link, make_fact
from merklog.store.codec import fact_block

# every CBOR header width on both sides of each boundary, mixed types that Python's ==
# would merge (1, 1.0, True, "1", b"\x01"), links and CID-shaped bytes (generic path)
VALUES = [
    0, 1, 23, 24, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63 - 1,
    -1, -24, -25, -256, -257, -(2**32), -(2**32) - 1, -(2**63),
    1.0, 0.0, -0.5, 1e300, -1e-300, True, False, "1", b"\x01",
    "", "é漢", "x" * 23, "y" * 24, "z" * 300, "w" * 70_000,
    b"", b"\x00", b"\xff" * 24, b"q" * 256,
    Link.for_dag_cbor(b"\xa0"), b"\x01q\x12 " + b"\x00" * 32,
]  # fmt: skip


def _key(args):
    return [(type(v).__name__, v) for v in args]


def test_decodes_exactly_like_the_generic_decoder():
    rng = random.Random(5)
    facts = [
        make_fact(rng.choice(["e", "rel", "r" * 30]), [rng.choice(VALUES) for _ in range(n)])
        for n in (rng.choice([0, 1, 2, 4, 23, 24, 30]) for _ in range(2000))
    ]
    order, relations, args = fact_columns([fact_block(f) for f in facts])
    assert sorted(order.tolist()) == list(range(len(facts)))
    pairs = zip(relations.to_pylist(), args.to_pylist(), strict=True)
    got = [(r, _key(decode_args(a))) for r, a in pairs]
    assert got == [(facts[i].rel, _key(facts[i].args)) for i in order]
    # the same Arrow data as the row-wise encoder, types and nulls included
    assert args.equals(args_array([facts[i].args for i in order]))
    assert relations.type == pa.string()


def test_links_and_unusual_items_take_the_generic_path():
    plain = make_fact("v", (1, 1.0, True))
    linked = make_fact("v", (Link.for_dag_cbor(b"\xa0"),))
    order, relations, args = fact_columns([fact_block(linked), fact_block(plain)])
    assert order.tolist() == [1, 0]  # decoded column-wise first, the generic ones after
    assert [decode_args(a) for a in args.to_pylist()] == [plain.args, linked.args]
    assert relations.to_pylist() == ["v", "v"]


def test_non_canonical_header_is_not_decoded_column_wise():
    # 5 written with a one-byte argument (0x18 0x05): valid CBOR, not canonical DAG-CBOR;
    # the column parser must not accept it (the generic decoder decides)
    block = b"\xa2crelavdargs\x81\x18\x05"
    with pytest.raises(Exception):  # noqa: B017 - the generic decoder's own error
        fact_columns([block])


def test_arrow_helpers():
    values = [b"", b"\x00", b"abc"]
    assert binary_array(values).to_pylist() == values
    assert indices(np.array([2, 0], np.int64)).to_pylist() == [2, 0]
    assert indices(np.array([1], np.int32)).type == pa.int32()
