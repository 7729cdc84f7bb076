"""Column-wise delta decoding (node/spark/deltacols.py) equals libipld's, shape by shape."""

from __future__ import annotations

import pytest

from merklog.node.spark import deltacols
from merklog.node.spark.deltacols import delta_columns
from merklog.replication import Assert, Retract
from merklog.replication.bulk import iter_delta_blocks
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import SQLiteBlockStore, make_fact

# values Python's == would merge stay distinct facts (and distinct fact CIDs)
MIXED = [make_fact("v", (x,)) for x in (1, 1.0, True, "1", b"\x01")]


def _pair(tmp_path) -> tuple[Replica, Replica]:
    """Two peers of one dataset in the node's layout (store and replica on one file)."""
    a_id, b_id = Identity.from_seed(b"\x11" * 32), Identity.from_seed(b"\x12" * 32)
    sa = SQLiteBlockStore(tmp_path / "a.db")
    a = Replica.create(sa.conn, sa, a_id, "deltas", writers=[b_id.public_key])
    sb = SQLiteBlockStore(tmp_path / "b.db")
    b = Replica.open(sb.conn, sb, b_id, a.dataset, a.genesis.data)
    return a, b


def replica_with_every_shape(tmp_path, mixed: bool = True) -> Replica:
    """A replica whose log holds every op shape: asserts, retracts observing one and two
    asserts, grant, revoke, and (if ``mixed``) a delta mixing asserts and retracts."""
    a, b = _pair(tmp_path)
    a.assert_facts(MIXED)
    b.apply_blocks(a.missing_for(b.heads()))
    a.assert_facts([make_fact("w", (7,))])
    b.assert_facts([make_fact("w", (7,))])  # concurrent: two asserts of one fact
    a.apply_blocks(b.missing_for([b.dataset]))  # everything b has
    a.retract_facts([make_fact("w", (7,))])  # observes both asserts
    a.retract_facts(MIXED[:2])  # observes one assert each
    if mixed:
        a.write([Assert(make_fact("m", (-(2**63), 2**63 - 1))), Retract(MIXED[2])])
    a.grant(b"\x33" * 32)
    a.revoke(b"\x33" * 32)
    return a


def test_every_delta_decodes_as_libipld_does(tmp_path, monkeypatch):
    rep = replica_with_every_shape(tmp_path)
    blocks = [block for batch in iter_delta_blocks(rep, batch=4) for block in batch]
    fallbacks: list[bytes] = []
    real = deltacols._generic
    monkeypatch.setattr(deltacols, "_generic", lambda data: fallbacks.append(data) or real(data))
    shapes = set()
    for _cid, data in blocks:
        got, want = delta_columns(data), real(data)
        assert got[:4] == want[:4]
        for mine, theirs in zip(got[4:], want[4:], strict=True):
            assert mine.type == theirs.type
            assert mine.equals(theirs)
        shapes.add(
            (
                tuple(got.op.to_pylist()[:1]),
                tuple(len(o or ()) for o in got.observed.to_pylist()[:1]),
            )
        )
    # asserts, retracts of one and of two asserts, grant and revoke take the fast path;
    # only the mixed delta goes to libipld
    assert len(fallbacks) == 1
    assert set(real(fallbacks[0]).op.to_pylist()) == {"assert", "retract"}
    assert {s[0] for s in shapes} >= {("assert",), ("retract",), ("grant",), ("revoke",)}
    assert (("retract",), (2,)) in shapes and (("retract",), (1,)) in shapes


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:-1],  # truncated
        lambda d: d.replace(b"fassert", b"fassers", 1),  # another op word
        lambda d: d.replace(b"dfact", b"dfacu"),  # another key in every op
    ],
)
def test_irregular_op_rows_are_left_to_libipld(tmp_path, monkeypatch, damage):
    """Bytes that do not match an op shape exactly never come out of the fast path."""
    rep = replica_with_every_shape(tmp_path)
    [(_cid, data)] = next(iter_delta_blocks(rep, batch=1))
    bad = damage(data)
    seen = []
    monkeypatch.setattr(deltacols, "_generic", lambda d: seen.append(d))
    delta_columns(bad)
    assert seen == [bad]
