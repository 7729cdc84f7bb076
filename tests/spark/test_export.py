"""The column-wise replica export equals the replica's own per-op log, value for value."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from merklog.node.spark.export import export_replica
from merklog.node.spark.schema import decode_args
from merklog.replication.bulk import iter_log_batches
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import CIDMismatch, Fact, Link, MemoryBlockStore, SQLiteBlockStore, make_fact

# mixed value types that Python's == would merge (1 == 1.0 == True) stay apart
MIXED = [
    make_fact("v", (1,)),
    make_fact("v", (1.0,)),
    make_fact("v", (True,)),
    make_fact("v", ("1",)),
    make_fact("v", (b"\x01",)),
    make_fact("v", (Link.for_dag_cbor(b"\xa0"),)),
    make_fact("v", (-(2**63), 2**63 - 1, -0.5, "", b"")),
    make_fact("edge", (1, 2)),
    make_fact("edge", (2, 3)),
]


def _replica(tmp_path, kind: str) -> Replica:
    ident = Identity.from_seed(b"\x11" * 32)
    if kind == "sqlite":  # the node's layout: block store and replica on one connection
        store = SQLiteBlockStore(tmp_path / "store.db")
        return Replica.create(store.conn, store, ident, "export", writers=[b"\x22" * 32])
    return Replica.create(tmp_path / "r.db", MemoryBlockStore(), ident, "export")


def _reference(replica: Replica) -> list[tuple]:
    """``Replica.iter_log()`` (per-op reads, signatures checked) in the export's shape."""
    return [
        (
            r.delta,
            r.author,
            r.clock,
            r.seq,
            r.index,
            r.op,
            r.relation,
            r.args,
            r.fact,
            list(r.observed) if r.op == "retract" else None,
            r.key,
        )
        for r in replica.iter_log()
    ]


def _exported(directory) -> list[tuple]:
    rows = pq.read_table(directory / "ops").to_pylist()
    hexed = lambda b: b.hex() if b is not None else None  # noqa: E731
    return [
        (
            str(Link(r["delta_cid"])),
            r["author"].hex(),
            r["clock"],
            r["seq"],
            r["op_index"],
            r["op"],
            r["relation"],
            decode_args(r["args"]) if r["args"] is not None else None,
            str(Link(r["fact_cid"])) if r["fact_cid"] is not None else None,
            [str(Link(o)) for o in r["observed"]] if r["observed"] is not None else None,
            hexed(r["key"]),
        )
        for r in rows
    ]


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_export_equals_the_replica_log(tmp_path, kind):
    rep = _replica(tmp_path, kind)
    rep.assert_facts(MIXED)
    rep.retract_facts(MIXED[:2] + [make_fact("edge", (1, 2))])
    rep.assert_facts([make_fact("v", (1,))])  # re-assert after the retract: visible again
    rep.grant(b"\x33" * 32)
    rep.revoke(b"\x33" * 32)
    summary = export_replica(rep, tmp_path / "out")
    got = _exported(tmp_path / "out")
    want = _reference(rep)
    assert got == want
    assert summary["ops"] == len(want) == len(MIXED) + 3 + 1 + 2
    assert {r[5] for r in got} == {"assert", "retract", "grant", "revoke"}
    # visible facts, per relation, typed values intact
    facts = {}
    for rel in ("v", "edge"):
        table = pq.read_table(tmp_path / "out" / "facts" / f"relation={rel}").to_pylist()
        assert len({r["fact_cid"] for r in table}) == len(table)  # each visible fact once
        facts.update({Link(r["fact_cid"]): Fact(rel, decode_args(r["args"])) for r in table})
    assert facts == dict(rep.visible())
    assert summary["facts"] == {"v": 6, "edge": 1}
    assert (tmp_path / "out" / "genesis.cbor").read_bytes() == rep.genesis.data
    # partitioned (spilled) join: the same rows and facts, in another order
    again = export_replica(rep, tmp_path / "parts", partition_ops=4)
    assert again == summary | {"facts": again["facts"]} and again["facts"] == summary["facts"]
    assert sorted(_exported(tmp_path / "parts"), key=repr) == sorted(want, key=repr)
    assert not [p for p in (tmp_path / "parts").iterdir() if p.name.startswith(".export-")]


def test_batches_cover_the_log_in_causal_order(tmp_path):
    rep = _replica(tmp_path, "sqlite")
    for i in range(7):
        rep.assert_facts([make_fact("n", (i,))])
    batches = list(iter_log_batches(rep, batch=3))
    assert [len(b) for b in batches] == [3, 3, 1]
    assert [d.clock for b in batches for d in b] == list(range(1, 8))
    assert [Link(d.cid) for b in batches for d in b] == [d.cid for d in rep.iter_deltas()]


def test_corrupted_block_is_detected_not_exported(tmp_path):
    rep = _replica(tmp_path, "sqlite")
    [cid] = rep.assert_facts([make_fact("n", (1,))])
    rep.conn.execute("UPDATE blocks SET data = ? WHERE cid = ?", (b"\xa0", cid.raw))
    with pytest.raises(CIDMismatch):
        export_replica(rep, tmp_path / "out")
