"""Facts ⇄ DAG-CBOR blocks ⇄ CIDs.

A fact ``rel(v1, …, vn)`` is the DAG-CBOR map ``{"rel": rel, "args": [v1, …, vn]}``
and its identity is that block's CIDv1 (dag-cbor, sha2-256).

Two encoders produce the same bytes: the reference one (``dag-cbor`` +
``multiformats``, slow but obviously right) and the fast one (``libipld`` +
``hashlib``). ``libipld`` writes any CID-shaped ``bytes`` as a link, so facts
holding such byte strings take the reference path; tests check byte identity.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from itertools import chain
from math import isfinite as _isfinite
from operator import itemgetter
from typing import Any, NamedTuple

import libipld

from .errors import InvalidBlock, InvalidValue, one_line
from .gcpause import gc_paused
from .link import Link
from .values import (
    INT64_MAX,
    INT64_MIN,
    Value,
    args_texts,
    check_args,
    check_relation,
    format_value,
)


class Fact(NamedTuple):
    """A ground tuple: relation name and argument values.

    Two facts are equal when they are the same fact, the one their CID names: the same
    relation and the same arguments *of the same types*. A tuple's ``==`` takes ``1``,
    ``1.0`` and ``True`` for one value, so ``{Fact("e", (1,)), Fact("e", (True,))}``
    held one fact although the node stores two. The hash stays the tuple's: equal facts
    hash alike, and facts told apart may share a hash, which sets and dicts allow. (A
    checked float is never -0.0, see :func:`~merklog.store.values.check_value`, so the
    types settle it.)"""

    rel: str
    args: tuple[Value, ...]

    def __str__(self) -> str:
        return f"{self.rel}({', '.join(map(format_value, self.args))})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, tuple):
            return NotImplemented
        return tuple.__eq__(self, other) is True and _same_types(self[1], other[1])

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = tuple.__hash__


def _same_types(args: tuple, others: tuple) -> bool:
    """Whether equal argument lists hold values of the same types, place by place."""
    return list(map(type, args)) == list(map(type, others))


def fact_texts(facts: Sequence[Fact]) -> list[str]:
    """``str(fact)`` of each fact, their argument lists rendered together when
    :func:`~merklog.store.values.args_texts` can (ADR 0153): for the commands and answers
    that print every fact of a large write."""
    args = args_texts(list(map(_args_of, facts)))
    if args is None:
        return list(map(str, facts))
    return list(map("{}({})".format, map(_rel_of, facts), args))


def make_fact(rel: str, args: Sequence[Any]) -> Fact:
    """Validate and build a Fact (raises InvalidValue on any bad part)."""
    return Fact(check_relation(rel), check_args(args, f"{rel}(…)"))


_rel_of = itemgetter(0)
_args_of = itemgetter(1)
_chain = chain.from_iterable
#: Relation names already found valid (bounded: names come from user input).
_GOOD_RELS: set[str] = set()
_PLAIN_TYPES = frozenset((int, str, bool, bytes, Link))


def check_facts(facts: Sequence[Any]) -> list[Fact]:
    """``[make_fact(f.rel, f.args) for f in facts]`` for many ``Fact``-shaped items, in
    bulk: types, int64 range, finite floats and ASCII strings are checked column-wise
    with C-level passes (``map``, ``min``/``max``) instead of one call chain per value.
    Anything those passes cannot clear (a non-ASCII string, a float 0.0 that may be
    -0.0, a list of args, an unknown type, …) takes ``make_fact`` per fact, so the
    result and every error are exactly ``make_fact``'s."""
    facts = facts if isinstance(facts, list) else list(facts)
    if not facts:
        return []
    if set(map(type, facts)) != {Fact} or set(map(type, map(_args_of, facts))) != {tuple}:
        return [make_fact(rel, args) for rel, args in facts]
    try:
        rels = set(map(_rel_of, facts))
    except TypeError:  # an unhashable relation: make_fact names it
        return [make_fact(rel, args) for rel, args in facts]
    if not rels <= _GOOD_RELS:
        for rel in rels - _GOOD_RELS:
            try:
                check_relation(rel)
            except InvalidValue:  # make_fact's error for the first bad fact, in input order
                return [make_fact(rel, args) for rel, args in facts]
        if len(_GOOD_RELS) < 100_000:
            _GOOD_RELS.update(rels)
    values = list(_chain(map(_args_of, facts)))
    kinds = set(map(type, values))
    slow = not kinds <= _PLAIN_TYPES | {float}
    if not slow and int in kinds:
        ints = [v for v in values if type(v) is int]
        slow = min(ints) < INT64_MIN or max(ints) > INT64_MAX
    if not slow and str in kinds:
        slow = not all(map(str.isascii, [v for v in values if type(v) is str]))
    if not slow and float in kinds:
        floats = [v for v in values if type(v) is float]
        slow = not all(map(_isfinite, floats)) or 0.0 in floats
    if slow:
        return [make_fact(rel, args) for rel, args in facts]
    return facts


# ---------------------------------------------------------------- generic IPLD


def to_reference_ipld(obj: Any) -> Any:
    """Convert merklog objects (Link, tuples) to what ``dag_cbor.encode`` expects."""
    from multiformats import CID  # the reference codec is imported only when used

    if type(obj) is Link:
        return CID.decode(obj.raw)
    if isinstance(obj, dict):
        return {k: to_reference_ipld(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_reference_ipld(v) for v in obj]
    return obj


def from_reference_ipld(obj: Any) -> Any:
    """Convert ``dag_cbor.decode`` output back: CIDs become Links, lists stay lists."""
    from multiformats import CID

    if isinstance(obj, CID):
        return Link(bytes(obj))
    if isinstance(obj, dict):
        return {k: from_reference_ipld(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_reference_ipld(v) for v in obj]
    return obj


def is_cid_shaped(data: bytes) -> bool:
    """True if ``data`` parses as a binary CID (libipld would encode it as a link, not bytes)."""
    try:
        libipld.decode_cid(data)
    except Exception:  # libipld raises ValueError/others for non-CIDs
        return False
    return True


def _to_fast_ipld(obj: Any) -> Any:
    """Convert for ``libipld.encode_dag_cbor``; raises _NeedsReference on ambiguous bytes."""
    kind = type(obj)
    if kind is Link:
        return obj.raw
    if kind is bytes:
        if is_cid_shaped(obj):
            raise _NeedsReference
        return obj
    if kind is dict:
        return {k: _to_fast_ipld(v) for k, v in obj.items()}
    if kind is list or kind is tuple:
        return [_to_fast_ipld(v) for v in obj]
    return obj


class _NeedsReference(Exception):
    pass


def encode_reference(obj: Any) -> bytes:
    """Canonical DAG-CBOR of ``obj`` with the reference codec (Links become CID tags)."""
    import dag_cbor  # imports multiformats (~0.2 s): only the reference paths need it

    try:
        return dag_cbor.encode(to_reference_ipld(obj))
    except (dag_cbor.encoding.DAGCBOREncodingError, TypeError, ValueError) as exc:
        raise InvalidValue(f"cannot encode as DAG-CBOR: {exc}") from exc


def encode(obj: Any) -> bytes:
    """Canonical DAG-CBOR of ``obj`` (fast path, byte-identical to encode_reference)."""
    try:
        return libipld.encode_dag_cbor(_to_fast_ipld(obj))
    except _NeedsReference:
        return encode_reference(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidValue(f"cannot encode as DAG-CBOR: {exc}") from exc


def decode(data: bytes) -> Any:
    """Decode a DAG-CBOR block; CID tags become Links (reference decoder: exact types)."""
    import dag_cbor

    try:
        return from_reference_ipld(dag_cbor.decode(bytes(data)))
    except Exception as exc:  # dag_cbor raises many decoding error types
        raise InvalidBlock(f"malformed DAG-CBOR: {one_line(exc)}") from exc


# ---------------------------------------------------------------- facts


def fact_block_reference(fact: Fact) -> bytes:
    """Encode a fact with the reference codec."""
    return encode_reference({"rel": fact.rel, "args": list(fact.args)})


_encode_dag_cbor = libipld.encode_dag_cbor
_decode_dag_cbor = libipld.decode_dag_cbor
_sha256 = hashlib.sha256
_DAG_CBOR_SHA256 = bytes([0x01, 0x71, 0x12, 0x20])  # CIDv1, dag-cbor, sha2-256, 32 bytes
#: Argument types libipld cannot encode unambiguously on its own (see fact_block).
_NEEDS_CARE = frozenset((bytes, Link))


def fact_block(fact: Fact) -> bytes:
    """Encode a fact with the fast codec (same bytes as fact_block_reference)."""
    args = fact.args
    if _NEEDS_CARE.isdisjoint(map(type, args)):  # the common case: no bytes, no links
        return _encode_dag_cbor({"rel": fact.rel, "args": list(args)})
    for v in args:
        if type(v) is bytes and is_cid_shaped(v):
            return fact_block_reference(fact)
    return encode({"rel": fact.rel, "args": list(args)})


def fact_cid(fact: Fact) -> Link:
    """The CID identifying a fact on every peer."""
    return Link.for_dag_cbor(fact_block(fact))


def encode_fact(fact: Fact) -> tuple[Link, bytes]:
    """Block bytes and CID of a fact, computed once (the hot path of ingest)."""
    data = fact_block(fact)
    return Link._trusted(_DAG_CBOR_SHA256 + _sha256(data).digest()), data


def encode_facts(facts: Iterable[Fact]) -> list[tuple[Link, bytes]]:
    """Encode many facts: ``[encode_fact(f) for f in facts]``, inlined (the hot loop of ingest)."""
    out: list[tuple[Link, bytes]] = []
    append = out.append
    encode_map = _encode_dag_cbor
    sha256 = _sha256
    prefix = _DAG_CBOR_SHA256
    trusted = Link._trusted
    needs_care = _NEEDS_CARE
    with gc_paused():
        for fact in facts:
            args = fact.args
            if needs_care.isdisjoint(map(type, args)):
                data = encode_map({"rel": fact.rel, "args": list(args)})
            else:
                data = fact_block(fact)
            append((trusted(prefix + sha256(data).digest()), data))
    return out


def decode_fact(data: bytes) -> Fact:
    """Decode and validate a fact block.

    Fast path: libipld decodes, which is exact unless an argument is a byte string
    (libipld returns links as bytes too); the result is accepted only if it
    re-encodes to exactly ``data``. Everything else takes the reference decoder.
    """
    try:
        obj = _decode_dag_cbor(data)
    except Exception:  # malformed for libipld: let the reference decoder say why
        obj = None
    if type(obj) is dict and type(obj.get("args")) is list and bytes not in map(type, obj["args"]):
        try:
            fact = make_fact(obj["rel"], obj["args"])
        except (InvalidValue, KeyError):
            pass
        else:
            if len(obj) == 2 and fact_block(fact) == data:
                return fact
    return _decode_fact_reference(data)


def _decode_fact_reference(data: bytes) -> Fact:
    obj = decode(data)
    if not isinstance(obj, dict) or set(obj) != {"rel", "args"}:
        raise InvalidBlock("a fact block is a map with exactly the keys 'rel' and 'args'")
    if not isinstance(obj["args"], list):
        raise InvalidBlock("a fact block's 'args' must be a list")
    try:
        return make_fact(obj["rel"], obj["args"])
    except InvalidValue as exc:
        raise InvalidBlock(f"fact block holds an invalid value: {exc}") from exc
