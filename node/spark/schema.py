"""Parquet schemas of the Spark interchange: op rows, visible facts, snapshots.

Every merklog value is stored as one struct ``value`` whose ``type`` tag says
which single field holds it, so values round-trip exactly (int64 stays int64,
``1`` and ``1.0`` and ``true`` stay distinct, bytes stay bytes, CIDs stay CIDs):

====== ======================= =========================================
type   field                   Python value
====== ======================= =========================================
int    ``int``   (int64)       ``int``
float  ``float`` (double)      ``float`` (finite; -0.0 already normalised)
str    ``str``   (utf8)        ``str``
bytes  ``bytes`` (binary)      ``bytes``
bool   ``bool``  (boolean)     ``bool``
link   ``link``  (utf8)        :class:`~merklog.store.Link`, base32 ``bafy…``
====== ======================= =========================================

All other fields of the struct are null. Spark compares structs field by field
(nulls inside a struct compare equal), so a join on ``args`` or on one value is
an exact join on merklog values.

CIDs that name deltas and facts (``delta_cid``, ``parents``, ``fact_cid``,
``observed``, ``support``) and keys (``author``, ``key``) are binary columns: the
raw CIDv1 / key bytes, 36 and 32 bytes, compared and hashed by Spark as bytes
and never converted to text on the way. Text is kept where a person reads it:
``dataset`` (it names the ``dataset=<cid>`` snapshot directories) and link
*values* inside ``args``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from merklog.store import InvalidValue, Link, Value, check_value

VALUE_TYPE = pa.struct(
    [
        ("type", pa.string()),
        ("int", pa.int64()),
        ("float", pa.float64()),
        ("str", pa.string()),
        ("bytes", pa.binary()),
        ("bool", pa.bool_()),
        ("link", pa.string()),
    ]
)
ARGS_TYPE = pa.list_(VALUE_TYPE)

#: One row per op of every delta (a delta without ops gives one row with op "none").
OPS_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),  # dataset CID (genesis block), base32 text
        ("delta_cid", pa.binary()),  # binary CID
        ("author", pa.binary()),  # the Ed25519 public key (32 bytes)
        ("clock", pa.int64()),  # Lamport clock of the delta
        ("seq", pa.int64()),  # the author's sequence number
        ("parents", pa.list_(pa.binary())),  # parent delta CIDs (same on every op row)
        ("op_index", pa.int32()),  # position of the op inside the delta
        ("op", pa.string()),  # assert | retract | grant | revoke | none
        ("relation", pa.string()),  # fact relation (assert/retract) else null
        ("args", ARGS_TYPE),  # fact arguments (assert/retract) else null
        ("fact_cid", pa.binary()),  # fact CID (assert/retract) else null
        ("observed", pa.list_(pa.binary())),  # retract: delta CIDs whose asserts it removes
        ("key", pa.binary()),  # grant/revoke: the public key (32 bytes)
    ]
)

#: Visible facts, one row per fact (written per relation under facts/relation=<rel>/).
FACTS_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("relation", pa.string()),
        ("fact_cid", pa.binary()),
        ("args", ARGS_TYPE),
    ]
)

#: A compacted snapshot: each visible fact with the asserting deltas that still
#: support it (the OR-set tags), so retracts arriving after the snapshot still
#: remove exactly the asserts they observed.
SNAPSHOT_SCHEMA = pa.schema(
    [
        ("dataset", pa.string()),
        ("relation", pa.string()),
        ("fact_cid", pa.binary()),
        ("args", ARGS_TYPE),
        ("support", pa.list_(pa.binary())),  # sorted delta CIDs of live asserts
    ]
)

_EMPTY = {
    "type": None,
    "int": None,
    "float": None,
    "str": None,
    "bytes": None,
    "bool": None,
    "link": None,
}


def encode_value(value: Value) -> dict[str, Any]:
    """A merklog value as the ``value`` struct (a dict for pyarrow)."""
    row = dict(_EMPTY)
    kind = type(value)
    if kind is bool:
        row["type"], row["bool"] = "bool", value
    elif kind is int:
        row["type"], row["int"] = "int", value
    elif kind is float:
        row["type"], row["float"] = "float", value
    elif kind is str:
        row["type"], row["str"] = "str", value
    elif kind is bytes:
        row["type"], row["bytes"] = "bytes", value
    elif kind is Link:
        row["type"], row["link"] = "link", str(value)
    else:
        check_value(value)  # raises InvalidValue with a precise message
        return encode_value(check_value(value))
    return row


def encode_args(args: Sequence[Value]) -> list[dict[str, Any]]:
    """A fact's arguments as a list of value structs."""
    return [encode_value(v) for v in args]


#: The struct field of each Python value type, in VALUE_TYPE order after ``type``.
_FIELDS: dict[type, int] = {int: 0, float: 1, str: 2, bytes: 3, bool: 4, Link: 5}
_FIELD_NAMES = ("int", "float", "str", "bytes", "bool", "link")
_FIELD_TYPES = [VALUE_TYPE.field(i).type for i in range(1, 7)]


def str_array(values: Sequence[str | None]) -> pa.Array:
    """A string array from Python strings (or None)."""
    return pa.array(values, pa.string())


def args_array(rows: Sequence[Sequence[Value]]) -> pa.ListArray:
    """Many facts' arguments as one ``list<value>`` Arrow array, the columnar twin of
    :func:`encode_args`: one type code per value, then one pass per value type present
    (a column of ints costs one conversion; absent fields are all-null arrays)."""
    offsets = [0]
    values: list[Value] = []
    for args in rows:
        values.extend(args)
        offsets.append(len(values))
    try:
        codes = [_FIELDS[type(v)] for v in values]
    except KeyError:  # an unusual value (e.g. a subclass): normalise it like encode_value
        values = [check_value(v) for v in values]
        codes = [_FIELDS[type(v)] for v in values]
    n = len(values)
    present = set(codes)
    fields = [pa.array(_FIELD_NAMES, pa.string()).take(pa.array(codes, pa.int8()))]
    for code, typ in enumerate(_FIELD_TYPES):
        if code not in present:
            fields.append(pa.nulls(n, typ))
        elif len(present) == 1:
            fields.append(pa.array([str(v) for v in values] if code == 5 else values, typ))
        else:
            fields.append(
                pa.array(
                    [
                        (str(v) if code == 5 else v) if c == code else None
                        for c, v in zip(codes, values, strict=True)
                    ],
                    typ,
                )
            )
    struct = pa.StructArray.from_arrays(fields, fields=list(VALUE_TYPE))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), struct)


def decode_value(row: Any) -> Value:
    """The inverse of :func:`encode_value`; accepts dicts and Spark ``Row`` objects."""
    get = row.get if isinstance(row, dict) else row.__getitem__
    kind = get("type")
    if kind == "int":
        return int(get("int"))
    if kind == "float":
        return float(get("float"))
    if kind == "str":
        return str(get("str"))
    if kind == "bytes":
        return bytes(get("bytes"))
    if kind == "bool":
        return bool(get("bool"))
    if kind == "link":
        return Link.parse(get("link"))
    raise InvalidValue(f"unknown value type tag {kind!r} in Parquet data")


def decode_args(rows: Sequence[Any]) -> tuple[Value, ...]:
    """A list of value structs back to a tuple of merklog values."""
    return tuple(decode_value(r) for r in rows)
