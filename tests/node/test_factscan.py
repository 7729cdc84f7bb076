"""The column-wise read of the visible set (node/factscan.py) holds exactly what the
per-fact scan holds: int64 matrices for all-int relations, and every other relation -
mixed value types, links, two arities, no arguments - as the same rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from merklog.node import edb, factscan
from merklog.node.node import Node
from merklog.replication import bulk
from merklog.store import Link, fact_cid, make_fact
from merklog.store.gcpause import gc_paused

N = edb.SCAN_FROM + 300

#: values Python's == merges (1 == 1.0 == True) stay apart; a link; int64 extremes
MIXED = [(1,), (1.0,), (True,), ("1",), (b"\x01",), (fact_cid(make_fact("e", (1,))),)]


def _facts() -> list[tuple[str, tuple]]:
    rng = np.random.default_rng(11)
    facts: list[tuple[str, tuple]] = [("big", (i,)) for i in range(N)]
    facts += [("sale", (i, int(g), int(a))) for i, (g, a) in enumerate(rng.integers(-9, 9, (N, 2)))]
    facts += [("ext", (-(2**63), 2**63 - 1)), ("ext", (0, -1))]
    facts += [("mixed", (i,)) for i in range(2, 40)] + [("mixed", r) for r in MIXED]
    facts += [("arity", (1,)), ("arity", (1, 2))]  # two arities: rows
    facts += [("flag", ())]  # no arguments
    facts += [("txt", ("é", "")), ("flt", (0.5, -0.0, 1e300))]
    return facts


@pytest.fixture
def node(tmp_path: Path):
    with Node.open(tmp_path / "h") as n:
        n.write(_facts())
    with Node.open(tmp_path / "h") as n:
        yield n


def _both(node: Node) -> tuple[dict, dict]:
    replica = node.replica
    offer = replica.blockstore.shared_sqlite()
    cids = [c for page in bulk.iter_visible_cids(replica) for c in page]
    with gc_paused():
        fast = factscan.scan_visible(offer, cids)
        slow = edb._scan(offer, set(cids))
    assert fast is not None and slow is not None
    return (
        {rel: edb._relation(rows) for rel, rows in fast.items()},
        {rel: edb._relation(rows) for rel, rows in slow.items()},
    )


def test_column_scan_holds_what_the_per_fact_scan_holds(node: Node) -> None:
    fast, slow = _both(node)
    assert fast.keys() == slow.keys()
    for rel in slow:
        if isinstance(slow[rel], np.ndarray):
            assert isinstance(fast[rel], np.ndarray), rel
            assert fast[rel].dtype == np.int64 and fast[rel].shape == slow[rel].shape
            key = lambda m: sorted(map(tuple, m.tolist()))  # noqa: E731
            assert key(fast[rel]) == key(slow[rel]), rel
        else:
            assert not isinstance(fast[rel], np.ndarray), rel
            assert fast[rel] == slow[rel], rel
    matrices = {rel for rel, rows in fast.items() if isinstance(rows, np.ndarray)}
    assert matrices == {"big", "sale", "ext"}
    assert len(fast["mixed"]) == 38 + 6  # 1, 1.0, true, "1", x"01" and a link: six rows
    assert any(type(v) is Link for row in fast["mixed"] for v in row)


def test_the_node_opens_through_the_column_scan(node: Node, monkeypatch) -> None:
    calls = []
    real = factscan.scan_visible
    monkeypatch.setattr(factscan, "scan_visible", lambda *a: calls.append(1) or real(*a))
    held = edb.read_visible(node.replica).base()
    assert calls == [1]
    assert isinstance(held["sale"], np.ndarray) and held["sale"].shape == (N, 3)
    assert not isinstance(held["mixed"], np.ndarray)


def test_the_visible_cids_in_one_query_are_those_of_the_ordered_pages(node: Node) -> None:
    """``bulk.visible_cids`` (the node's read) lists each visible fact once, in any order:
    a fact asserted twice, a retracted one and one asserted again after its retract are
    counted as the ordered pages count them; the scan's answer does not depend on the
    order it is given."""
    node.write([("mixed", (1,)), ("mixed", (1.0,))], [("mixed", (True,)), ("big", (3,))])
    node.write([("big", (3,)), ("mixed", (1,))])
    replica = node.replica
    ordered = [c for page in bulk.iter_visible_cids(replica) for c in page]
    got = bulk.visible_cids(replica)
    assert len(got) == len(set(got)) == bulk.visible_count(replica)
    assert sorted(got) == ordered
    offer = replica.blockstore.shared_sqlite()
    with gc_paused():
        shuffled = factscan.scan_visible(offer, got[::-1])
        sorted_scan = factscan.scan_visible(offer, ordered)
    assert shuffled is not None and sorted_scan is not None
    for rel, rows in sorted_scan.items():
        a, b = edb._relation(rows), edb._relation(shuffled[rel])
        assert (a == b).all() if isinstance(a, np.ndarray) else a == b, rel
    visible = set(got)  # by CID: Python's == would take mixed(true) for mixed(1)
    assert fact_cid(make_fact("mixed", (True,))).raw not in visible
    for args in [(1,), (1.0,)]:
        assert fact_cid(make_fact("mixed", args)).raw in visible
    assert fact_cid(make_fact("big", (3,))).raw in visible


def test_a_visible_fact_without_its_block_leaves_it_to_the_per_fact_read(node: Node) -> None:
    replica = node.replica
    offer = replica.blockstore.shared_sqlite()
    cids = [c for page in bulk.iter_visible_cids(replica) for c in page]
    missing = Link.for_dag_cbor(b"\xa2crelanemptyeargs\x80").raw
    assert factscan.scan_visible(offer, sorted([*cids, missing])) is None
    assert factscan.scan_visible(offer, [*cids, b"\x01\x55\x00"]) is None  # another CID kind


def test_relation_names_are_told_apart_without_padding_every_name_to_the_longest() -> None:
    """A fact whose relation name ran to 100,000 bytes (earlier versions let a writer
    make one, and it synced to every peer) made opening a home of 20,000 facts
    allocate a 20,001 × 100,000 array (2 GB; 19 GB on a peer with 40,000 facts): no
    peer could start. Long names are now read one at a time."""
    import tracemalloc

    names = [b"edge", b"n" + b"x" * 99_999, b"edge", b"p", b"n" + b"x" * 99_998 + b"y"]
    names += [b"edge"] * 20_000 + [b"n" + b"x" * 99_999]
    buf = np.frombuffer(b"".join(names), np.uint8)
    lengths = np.array([len(n) for n in names], np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    tracemalloc.start()
    try:
        distinct, code = factscan._names(buf, starts, lengths)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [distinct[i] for i in code.tolist()] == names
    assert len(distinct) == len(set(names)) == 4
    assert peak < 20 << 20, peak  # the padded array alone would be ~2 GB


def test_a_relation_name_over_the_limit_is_refused_at_write(tmp_path: Path) -> None:
    from merklog.store import MAX_RELATION_CHARS, Error

    with Node.open(tmp_path / "h") as n:
        n.write([("r" + "x" * (MAX_RELATION_CHARS - 1), (1,))])  # at the limit: fine
        with pytest.raises(Error, match="256-character limit"):
            n.write([("r" + "x" * MAX_RELATION_CHARS, (1,))])
        with pytest.raises(Error, match="256-character limit"):
            n.write(["r" + "x" * 100_000 + "(1)."])
        assert n.status()["facts"] == 1
