"""Block formats of docs/crdt.md: dataset genesis, signed deltas and their ops.

Pure functions: build, sign, decode and check the *shape* of blocks. Whether a
delta is acceptable in a replica (parents known, author authorised) is decided
by :mod:`merklog.replication.replica`.

Decoding uses libipld (fast) and then re-encodes the parsed block: a block is
accepted only if it is the canonical DAG-CBOR of what it parsed to, which also
rejects byte strings smuggled where a CID link belongs.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import libipld

from merklog.store import Fact, InvalidBlock, InvalidValue, Link, decode_fact, encode, make_fact
from merklog.store.codec import fact_block, is_cid_shaped
from merklog.store.errors import one_line

from .errors import CycleError, InvalidDelta, InvalidSignature, MalformedBlock, TooLarge
from .identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, verify_signature
from .limits import MAX_DELTA_BYTES, MAX_OPS, MAX_PARENTS, RECEIVE_MAX_OBSERVED

GENESIS_KEYS = {"kind", "name", "owner", "writers", "nonce"}
DELTA_KEYS = {"kind", "dataset", "author", "seq", "clock", "parents", "ops", "sig"}


# ---------------------------------------------------------------- ops


@dataclass(frozen=True)
class Assert:
    """Make ``fact`` visible (add-wins)."""

    fact: Fact


@dataclass(frozen=True)
class Retract:
    """Remove the currently observed assertions of ``fact``."""

    fact: Fact


@dataclass(frozen=True)
class Grant:
    """Owner only: make ``key`` a writer."""

    key: bytes


@dataclass(frozen=True)
class Revoke:
    """Owner only: stop ``key`` from writing (in the causal future of this delta)."""

    key: bytes


Op = Assert | Retract | Grant | Revoke


# ---------------------------------------------------------------- genesis


@dataclass(frozen=True)
class Genesis:
    """A dataset's genesis block; the dataset id is the block's CID."""

    cid: Link
    name: str
    owner: bytes
    writers: tuple[bytes, ...]
    nonce: bytes
    data: bytes


def make_genesis(
    owner: bytes, name: str, writers: Sequence[bytes] = (), nonce: bytes | None = None
) -> Genesis:
    """Build a genesis block for a new dataset owned by ``owner``."""
    ws = sorted(set(writers))
    obj = {
        "kind": "dataset",
        "name": name,
        "owner": owner,
        "writers": ws,
        "nonce": os.urandom(16) if nonce is None else nonce,
    }
    data = encode(obj)
    return parse_genesis(Link.for_dag_cbor(data), data)


def parse_genesis(cid: Link, data: bytes) -> Genesis:
    """Decode and check a genesis block (MalformedBlock on any deviation)."""
    if not cid.verifies(data):
        raise MalformedBlock(f"genesis block does not hash to {cid}", code="cid_mismatch")
    obj = _decode(data, "genesis")
    if not isinstance(obj, dict) or set(obj) != GENESIS_KEYS or obj.get("kind") != "dataset":
        raise MalformedBlock(
            "a genesis block is a map {kind: 'dataset', name, owner, writers, nonce}"
        )
    name, owner, writers, nonce = obj["name"], obj["owner"], obj["writers"], obj["nonce"]
    if not isinstance(name, str) or not _is_key(owner) or not isinstance(nonce, bytes):
        raise MalformedBlock("genesis: name must be text, owner a 32-byte key, nonce bytes")
    if not isinstance(writers, list) or not all(_is_key(w) for w in writers):
        raise MalformedBlock("genesis: writers must be a list of 32-byte keys")
    if writers != sorted(set(writers)):
        raise MalformedBlock("genesis: writers must be sorted and unique")
    if encode(obj) != bytes(data):
        raise MalformedBlock("genesis block is not canonical DAG-CBOR")
    return Genesis(cid, name, owner, tuple(writers), nonce, bytes(data))


# ---------------------------------------------------------------- deltas


@dataclass
class Delta:
    """A decoded, shape-checked delta. ``ops`` hold Links; facts travel as separate blocks."""

    cid: Link
    dataset: Link
    author: bytes
    seq: int
    clock: int
    parents: list[Link]
    ops: list[dict[str, Any]]
    sig: bytes
    data: bytes
    asserted: list[Link] = field(default_factory=list)
    #: Built by :func:`build_assert_delta`: every op asserts (``ops`` is then an
    #: :class:`AssertOps` view of ``asserted``), so acceptance need not look at each op.
    assert_only: bool = False

    def unsigned(self) -> dict[str, Any]:
        return {
            "kind": "delta",
            "dataset": self.dataset,
            "author": self.author,
            "seq": self.seq,
            "clock": self.clock,
            "parents": self.parents,
            "ops": self.ops,
        }


def signing_bytes(unsigned: dict[str, Any]) -> bytes:
    """The bytes a delta signature covers: the DAG-CBOR encoding without ``sig``."""
    return encode(unsigned)


def build_delta(
    identity: Identity,
    dataset: Link,
    seq: int,
    clock: int,
    parents: Sequence[Link],
    ops: list[dict[str, Any]],
) -> Delta:
    """Sign and encode a delta from wire-form ops (see :func:`op_to_wire`)."""
    if not ops:
        raise InvalidDelta("a delta carries at least one op")
    if len(ops) > MAX_OPS:
        raise InvalidDelta(f"a delta carries at most {MAX_OPS} ops, got {len(ops)}")
    unsigned = {
        "kind": "delta",
        "dataset": dataset,
        "author": identity.public_key,
        "seq": seq,
        "clock": clock,
        "parents": sorted(set(parents)),
        "ops": ops,
    }
    keys = [op["key"] for op in ops if "key" in op]
    if is_cid_shaped(identity.public_key) or any(is_cid_shaped(k) for k in keys):
        sig = identity.sign(signing_bytes(unsigned))
        data = encode({**unsigned, "sig": sig})
    else:
        # Fast path: libipld writes the raw CID bytes of links as links.
        raw = {**unsigned, "dataset": dataset.raw, "parents": [p.raw for p in unsigned["parents"]]}
        raw["ops"] = [_raw_op(op) for op in ops]
        unsigned_bytes = libipld.encode_dag_cbor(raw)
        sig = identity.sign(unsigned_bytes)
        data = _with_sig(unsigned_bytes, raw, sig)
    if len(data) > MAX_DELTA_BYTES:
        raise TooLarge(f"delta of {len(data)} bytes exceeds {MAX_DELTA_BYTES}")
    cid = Link.for_dag_cbor(data)
    asserted = [op["fact"] for op in ops if op["op"] == "assert"]
    return Delta(
        cid, dataset, identity.public_key, seq, clock, unsigned["parents"], ops, sig, data, asserted
    )


class AssertOps(Sequence[dict[str, Any]]):
    """The wire ops ``{"op": "assert", "fact": cid}`` of a list of fact CIDs, made only
    when read: a local bulk write never reads them (ADR 0127)."""

    __slots__ = ("_facts",)

    def __init__(self, facts: list[Link]) -> None:
        self._facts = facts

    def __len__(self) -> int:
        return len(self._facts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [{"op": "assert", "fact": f} for f in self._facts[i]]
        return {"op": "assert", "fact": self._facts[i]}

    def __eq__(self, other: object) -> bool:
        return list(self) == other if isinstance(other, list | AssertOps) else NotImplemented


#: One assert op in canonical DAG-CBOR up to its fact CID: a map of 2 (``op`` sorts
#: before ``fact``: shorter key first), ``"op": "assert"``, ``"fact":`` tag 42 and a
#: byte string of 37 bytes (the multibase identity prefix 0x00, then a 36-byte CID).
_ASSERT_OP_HEAD = b"\xa2\x62op\x66assert\x64fact\xd8\x2a\x58\x25\x00"
#: How a delta map of 7 keys with ``"ops": []`` starts (``ops`` is its first key).
_EMPTY_OPS_SHELL = b"\xa7\x63ops\x80"


#: CBOR major types (RFC 8949 §3.1) whose heads the splicing encoders write.
_BYTES, _ARRAY = 2, 4


def _cbor_head(major: int, n: int) -> bytes:
    """The CBOR head of major type ``major`` with argument ``n``, in shortest form (a
    byte string of ``n`` bytes, an array of ``n`` items)."""
    top = major << 5
    if n < 24:
        return bytes((top | n,))
    if n < 0x100:
        return bytes((top | 24, n))
    if n < 0x10000:
        return bytes((top | 25,)) + n.to_bytes(2, "big")
    return bytes((top | 26,)) + n.to_bytes(4, "big")


def build_assert_delta(
    identity: Identity,
    dataset: Link,
    seq: int,
    clock: int,
    parents: Sequence[Link],
    asserted: list[Link],
) -> Delta:
    """``build_delta`` of ``[{"op": "assert", "fact": c} for c in asserted]``, the same
    bytes, without a Python object per op: the ops array is the fixed op head joined
    with the raw CIDs, spliced into the encoding of the delta with ``"ops": []``
    (``ops`` is the map's first key). Anything but 36-byte CIDs and an author key that
    libipld encodes as bytes takes :func:`build_delta` (ADR 0127)."""
    raws = [c.raw for c in asserted]
    if (
        not 0 < len(raws) <= MAX_OPS
        or set(map(len, raws)) != {36}
        or is_cid_shaped(identity.public_key)
    ):
        delta = build_delta(
            identity, dataset, seq, clock, parents, [{"op": "assert", "fact": c} for c in asserted]
        )
        delta.assert_only = True
        return delta
    ordered = sorted(set(parents))
    raw = {
        "kind": "delta",
        "dataset": dataset.raw,
        "author": identity.public_key,
        "seq": seq,
        "clock": clock,
        "parents": [p.raw for p in ordered],
        "ops": [],
    }
    shell = libipld.encode_dag_cbor(raw)
    if shell[:6] != _EMPTY_OPS_SHELL:
        raise InvalidDelta("an unsigned delta map starts with its ops")
    ops = _cbor_head(_ARRAY, len(raws)) + _ASSERT_OP_HEAD + _ASSERT_OP_HEAD.join(raws)
    unsigned_bytes = shell[:5] + ops + shell[6:]
    sig = identity.sign(unsigned_bytes)
    data = _with_sig(unsigned_bytes, raw, sig)
    if len(data) > MAX_DELTA_BYTES:
        raise TooLarge(f"delta of {len(data)} bytes exceeds {MAX_DELTA_BYTES}")
    return Delta(
        Link.for_dag_cbor(data),
        dataset,
        identity.public_key,
        seq,
        clock,
        ordered,
        AssertOps(asserted),  # type: ignore[arg-type]
        sig,
        data,
        asserted,
        True,
    )


#: The keys that sort after ``sig`` in a delta's canonical DAG-CBOR map (keys order by
#: length, then bytewise: ``ops`` < ``seq`` < ``sig`` < ``kind`` < ``clock`` < …).
_AFTER_SIG = ("kind", "clock", "author", "dataset", "parents")
_SIG_KEY = b"\x63sig"  # the text string "sig"


def _with_sig(unsigned_bytes: bytes, raw: dict[str, Any], sig: bytes) -> bytes:
    """The signed delta's DAG-CBOR from the unsigned one's, with ``sig`` spliced in at its
    sorted place instead of encoding the whole delta (4,096 ops) a second time.

    The signature is written as a byte string whatever it holds: encoding it through
    libipld would turn a signature that happens to parse as a binary CID (about one in
    a thousand) into a link, which sent such deltas (~1.3 s for 4,096 ops) through the
    reference encoder (ADR 0121). ``raw``: the unsigned map as encoded (7 keys)."""
    if unsigned_bytes[0] != 0xA7:
        raise InvalidDelta("an unsigned delta is a map of 7 keys")
    tail = libipld.encode_dag_cbor({k: raw[k] for k in _AFTER_SIG})  # a map of 5: 1-byte head
    at = len(unsigned_bytes) - (len(tail) - 1)
    entry = _SIG_KEY + _cbor_head(_BYTES, len(sig)) + sig
    return b"\xa8" + unsigned_bytes[1:at] + entry + unsigned_bytes[at:]


def _raw_op(op: dict[str, Any]) -> dict[str, Any]:
    kind = op["op"]
    if kind == "assert":
        return {"op": kind, "fact": op["fact"].raw}
    if kind == "retract":
        return {"op": kind, "fact": op["fact"].raw, "observed": [o.raw for o in op["observed"]]}
    return op


def _decode(data: bytes, what: str) -> Any:
    try:
        return libipld.decode_dag_cbor(bytes(data))
    except Exception as exc:  # libipld raises ValueError and others on malformed input
        raise MalformedBlock(f"{what}: malformed DAG-CBOR: {one_line(exc)}") from exc


_DAG_CBOR_PREFIX = bytes([0x01, 0x71, 0x12, 0x20])


def fast_link(raw: bytes) -> Link:
    """A Link from raw CID bytes; dag-cbor/sha2-256 CIDs skip the generic parser."""
    if len(raw) == 36 and raw[:4] == _DAG_CBOR_PREFIX:
        return Link._trusted(raw)
    return Link(raw)


def fast_verifies(cid: Link, data: bytes) -> bool:
    """``cid.verifies(data)`` with a fast path for dag-cbor/sha2-256 CIDs."""
    raw = cid.raw
    if len(raw) == 36 and raw[:4] == _DAG_CBOR_PREFIX:
        return raw[4:] == hashlib.sha256(data).digest()
    return cid.verifies(data)


def _is_key(value: Any) -> bool:
    return isinstance(value, bytes) and len(value) == PUBLIC_KEY_SIZE


def _link(value: Any, where: str) -> Link:
    if not isinstance(value, bytes):
        raise MalformedBlock(f"{where} must be a CID link")
    try:
        return fast_link(value)
    except (InvalidValue, ValueError) as exc:
        raise MalformedBlock(f"{where} is not a valid CID: {exc}") from exc


def _links(value: Any, where: str, limit: int) -> list[Link]:
    if not isinstance(value, list):
        raise MalformedBlock(f"{where} must be a list of CID links")
    if len(value) > limit:
        raise InvalidDelta(f"{where} lists {len(value)} CIDs, more than {limit}")
    links = [_link(v, where) for v in value]
    if links != sorted(set(links)):
        raise MalformedBlock(f"{where} must be sorted and free of duplicates")
    return links


def _parse_op(raw: Any, i: int) -> dict[str, Any]:
    where = f"op {i}"
    if not isinstance(raw, dict):
        raise MalformedBlock(f"{where} must be a map")
    kind = raw.get("op")
    if kind == "assert" and len(raw) == 2 and "fact" in raw:
        return {"op": "assert", "fact": _link(raw["fact"], f"{where} fact")}
    if kind == "retract" and set(raw) == {"op", "fact", "observed"}:
        return {
            "op": "retract",
            "fact": _link(raw["fact"], f"{where} fact"),
            "observed": _links(raw["observed"], f"{where} observed", RECEIVE_MAX_OBSERVED),
        }
    if kind in ("grant", "revoke") and set(raw) == {"op", "key"}:
        if not _is_key(raw["key"]):
            raise MalformedBlock(f"{where} key must be a 32-byte Ed25519 public key")
        return {"op": kind, "key": raw["key"]}
    raise MalformedBlock(f"{where}: unknown op or wrong fields {sorted(raw)}")


def looks_like_delta(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("kind") == "delta"


def parse_delta(cid: Link, data: bytes, obj: Any | None = None) -> Delta:
    """Decode and check a delta's shape and signature (not its place in the DAG).

    Raises MalformedBlock (not canonical / wrong shape), InvalidDelta (limits),
    CycleError (names itself), InvalidSignature.
    """
    if len(data) > MAX_DELTA_BYTES:
        raise TooLarge(f"delta block of {len(data)} bytes exceeds {MAX_DELTA_BYTES}")
    if obj is None:
        obj = _decode(data, "delta")
    if not isinstance(obj, dict) or set(obj) != DELTA_KEYS or obj.get("kind") != "delta":
        raise MalformedBlock(
            "a delta is a map with exactly the keys " + ", ".join(sorted(DELTA_KEYS))
        )
    dataset = _link(obj["dataset"], "delta dataset")
    author, sig, seq, clock = obj["author"], obj["sig"], obj["seq"], obj["clock"]
    if not _is_key(author):
        raise MalformedBlock("delta author must be a 32-byte Ed25519 public key")
    if not isinstance(sig, bytes) or len(sig) != SIGNATURE_SIZE:
        raise MalformedBlock("delta sig must be a 64-byte Ed25519 signature")
    if type(seq) is not int or seq < 1 or type(clock) is not int or clock < 1:
        raise MalformedBlock("delta seq and clock must be positive integers")
    parents = _links(obj["parents"], "delta parents", MAX_PARENTS)
    if not parents:
        raise MalformedBlock("a delta has at least one parent (the genesis for the first)")
    ops_raw = obj["ops"]
    if not isinstance(ops_raw, list) or not ops_raw:
        raise MalformedBlock("delta ops must be a non-empty list")
    if len(ops_raw) > MAX_OPS:
        raise InvalidDelta(f"a delta carries at most {MAX_OPS} ops, got {len(ops_raw)}")
    ops = [_parse_op(op, i) for i, op in enumerate(ops_raw)]
    if cid in parents:
        raise CycleError(f"delta {cid} names itself as a parent")
    for op in ops:
        if op["op"] == "retract" and cid in op["observed"]:
            raise CycleError(f"delta {cid} observes itself")
    delta = Delta(cid, dataset, author, seq, clock, parents, ops, sig, bytes(data))
    delta.asserted = [op["fact"] for op in ops if op["op"] == "assert"]
    plain_bytes = [author, sig] + [op["key"] for op in ops if "key" in op]
    if any(is_cid_shaped(b) for b in plain_bytes):
        # libipld would write these byte strings as links: use the reference path.
        unsigned = delta.unsigned()
        canonical = encode({**unsigned, "sig": sig})
        signed_part = signing_bytes(unsigned)
    else:
        # ``obj`` came from libipld (links as bytes): re-encoding it is the canonical form.
        canonical = libipld.encode_dag_cbor(obj)
        signed_part = libipld.encode_dag_cbor({k: v for k, v in obj.items() if k != "sig"})
    if canonical != delta.data:
        raise MalformedBlock("delta block is not canonical DAG-CBOR")
    if not verify_signature(author, sig, signed_part):
        raise InvalidSignature(f"signature of delta {cid} does not verify for its author")
    return delta


# ---------------------------------------------------------------- facts


_REL_OK: dict[str, bool] = {}
_INT64 = (-(2**63), 2**63 - 1)


def _plain_args(args: list[Any]) -> bool:
    """True if every arg is a valid value with one unambiguous libipld encoding."""
    for v in args:
        t = type(v)
        if t is str or t is bool:
            continue
        if t is int:
            if not _INT64[0] <= v <= _INT64[1]:
                return False
        elif t is float:
            if not math.isfinite(v) or (v == 0.0 and math.copysign(1.0, v) < 0):
                return False
        elif t is bytes:
            if is_cid_shaped(v):
                return False
        else:
            return False
    return True


def decode_fact_fast(data: bytes, obj: Any = None) -> Fact:
    """Decode and validate a fact block: libipld, falling back to the reference decoder
    for anything unusual (links, out-of-range values) so the rules stay in one place.
    ``obj`` is the libipld decoding of ``data`` when the caller already has it."""
    if obj is None:
        try:
            obj = libipld.decode_dag_cbor(bytes(data))
        except Exception as exc:
            raise MalformedBlock(f"fact block: malformed DAG-CBOR: {one_line(exc)}") from exc
    if type(obj) is dict and len(obj) == 2:
        rel, args = obj.get("rel"), obj.get("args")
        if type(rel) is str and type(args) is list and _plain_args(args):
            ok = _REL_OK.get(rel)
            if ok is None:
                try:
                    make_fact(rel, [])
                    ok = True
                except InvalidValue:
                    ok = False
                if len(_REL_OK) < 100_000:
                    _REL_OK[rel] = ok
            if ok and libipld.encode_dag_cbor(obj) == bytes(data):
                return Fact(rel, tuple(args))
    if (
        not isinstance(obj, dict)
        or set(obj) != {"rel", "args"}
        or not isinstance(obj["args"], list)
    ):
        raise MalformedBlock("a fact block is a map {rel, args: [...]}")
    try:
        fact = make_fact(obj["rel"], obj["args"])
    except InvalidValue as exc:
        raise MalformedBlock(f"fact block holds an invalid value: {exc}") from exc
    if fact_block(fact) == bytes(data):
        return fact
    try:  # links decode as bytes in libipld; the reference decoder restores them
        fact = decode_fact(bytes(data))
    except (InvalidBlock, InvalidValue) as exc:
        raise MalformedBlock(str(exc)) from exc
    if fact_block(fact) != bytes(data):
        raise MalformedBlock("fact block is not canonical DAG-CBOR")
    return fact
