"""A signed delta's bytes are the canonical DAG-CBOR of its fields, whatever its signature
holds (ADR 0121: the signature is spliced into the unsigned encoding, never encoded as
a link even when its 64 bytes happen to parse as a binary CID)."""

from __future__ import annotations

from merklog.replication.blocks import build_delta, parse_delta
from merklog.replication.identity import Identity
from merklog.store import Link, fact_block, make_fact
from merklog.store.codec import encode_reference, is_cid_shaped

AUTHOR = Identity.from_seed(b"\x07" * 32)
DATASET = Link.for_dag_cbor(b"\xa1\x64kind\x67genesis")
# Values that Python's == merges (1, 1.0, true) and look-alikes ("1", x"01"): five facts.
FACTS = [make_fact("p", [v]) for v in (1, 1.0, True, "1", b"\x01")]
CIDS = [Link.for_dag_cbor(fact_block(f)) for f in FACTS]


def _ops() -> list[dict]:
    ops: list[dict] = [{"op": "assert", "fact": c} for c in CIDS]
    ops.append({"op": "retract", "fact": CIDS[0], "observed": [DATASET]})
    return ops


def _reference(delta) -> bytes:
    """The same delta encoded field by field with the reference codec."""
    return encode_reference(
        {
            "kind": "delta",
            "dataset": DATASET,
            "author": AUTHOR.public_key,
            "seq": delta.seq,
            "clock": delta.clock,
            "parents": sorted(set(delta.parents)),
            "ops": _ops(),
            "sig": delta.sig,
        }
    )


def test_delta_bytes_match_the_reference_encoder() -> None:
    for seq, parents in ((1, [DATASET]), (300, [CIDS[1], DATASET, CIDS[1]])):
        delta = build_delta(AUTHOR, DATASET, seq, seq + 1, parents, _ops())
        assert delta.data == _reference(delta)
        assert delta.cid == Link.for_dag_cbor(delta.data)
        back = parse_delta(delta.cid, delta.data)  # canonical, shape and signature checked
        assert back.sig == delta.sig and back.ops == delta.ops


def test_a_signature_that_parses_as_a_cid_stays_a_byte_string() -> None:
    # About one Ed25519 signature in a thousand parses as a binary CID: sign deltas that
    # differ only in seq until one does (deterministic signatures: always the same seq).
    for seq in range(1, 20_000):
        delta = build_delta(AUTHOR, DATASET, seq, 1, [DATASET], _ops())
        if is_cid_shaped(delta.sig):
            break
    else:
        raise AssertionError("no CID-shaped signature in 20,000 deltas")
    assert delta.data == _reference(delta)
    back = parse_delta(delta.cid, delta.data)
    assert back.sig == delta.sig and isinstance(back.sig, bytes)
