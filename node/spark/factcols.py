"""Fact blocks → Arrow columns, decoded column-wise with numpy (no Python object per value).

An export reads every fact block of the store. Decoding them one by one (libipld,
then a Python loop over the values to build ``list<value>``) cost ~10 µs per fact,
most of the export's time. The blocks share one shape, the DAG-CBOR map
``{"rel": text, "args": [value, ...]}`` (docs/storage.md), so the batch is parsed
*position by position* instead: the CBOR header of the j-th argument of every fact
is read at once with numpy, and each kind of value (int, float, text, bytes, bool)
lands in its own column, which becomes a field of the ``value`` struct
(:data:`~.schema.VALUE_TYPE`) without a Python object per value.

Exactness first: a fact is decoded here only when every item is one this parser
knows in its canonical (shortest) form; anything else - a CID link, an int beyond
int64, a non-finite float, a nested item, any non-canonical header - sends that
fact to the generic decoder (:func:`merklog.store.decode_fact`), so the result is
value for value what the generic decoder gives (tests/spark/test_factcols.py).
Text is checked as UTF-8 by Arrow; a batch with invalid text is decoded the generic
way, which rejects it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from merklog.node.factparse import BOOL, BYTES, FLOAT, INT, STR, gather, parse
from merklog.replication.bulk import FACT_PREFIX
from merklog.store import decode_fact

from .schema import VALUE_TYPE, args_array

_TYPE_NAMES = pa.StringArray.from_buffers(
    5,
    pa.py_buffer(np.array([0, 3, 8, 11, 16, 20], np.int32).tobytes()),
    pa.py_buffer(b"intfloatstrbytesbool"),
)


def _bitmap(mask: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(mask, bitorder="little").tobytes())


def _binary(
    typ: pa.DataType, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray
) -> pa.Array:
    offsets, data = gather(buf, starts[valid], lengths[valid])
    full = np.zeros(len(valid) + 1, np.int32)
    full[1:][valid] = np.diff(offsets)
    np.cumsum(full, out=full)
    return pa.Array.from_buffers(
        typ,
        len(valid),
        [_bitmap(valid), pa.py_buffer(full.tobytes()), pa.py_buffer(data)],
        null_count=int(len(valid) - valid.sum()),
    )


def _fixed(typ: pa.DataType, values: np.ndarray, valid: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(
        typ,
        len(valid),
        [_bitmap(valid), pa.py_buffer(np.ascontiguousarray(values).tobytes())],
        null_count=int(len(valid) - valid.sum()),
    )


def _parse(datas: Sequence[bytes]) -> tuple[np.ndarray, pa.Array, pa.ListArray] | None:
    """``(decoded mask, relations, args)`` for the facts this parser decodes exactly
    (the arrays hold those facts only, in order), or None to decode all generically."""
    parsed = parse(datas)
    buf, good, n_args = parsed.buf, parsed.good, parsed.n_args
    codes, ints, floats, bools = parsed.codes, parsed.ints, parsed.floats, parsed.bools
    var_start, var_len = parsed.var_start, parsed.var_len
    m = len(codes)
    rel_offsets, rel_bytes = gather(buf, parsed.rel_start, parsed.rel_len)
    relations = pa.StringArray.from_buffers(
        int(good.sum()), pa.py_buffer(rel_offsets.tobytes()), pa.py_buffer(rel_bytes)
    )
    fields = [
        _TYPE_NAMES.take(
            pa.Array.from_buffers(pa.int8(), m, [None, pa.py_buffer(codes.tobytes())])
        ),
        _fixed(pa.int64(), ints, codes == INT),
        _fixed(pa.float64(), floats, codes == FLOAT),
        _binary(pa.string(), buf, var_start, var_len, codes == STR),
        _binary(pa.binary(), buf, var_start, var_len, codes == BYTES),
        pa.Array.from_buffers(
            pa.bool_(), m, [_bitmap(codes == BOOL), _bitmap(bools)], null_count=-1
        ),
        pa.nulls(m, pa.string()),
    ]
    try:
        relations.validate(full=True)
        fields[3].validate(full=True)  # UTF-8
    except pa.ArrowInvalid:
        return None
    offsets = np.zeros(int(good.sum()) + 1, np.int32)
    np.cumsum(n_args, out=offsets[1:])
    struct = pa.StructArray.from_arrays(fields, fields=list(VALUE_TYPE))
    args = pa.ListArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets.tobytes())]),
        struct,
    )
    return good, relations, args


def indices(values: np.ndarray) -> pa.Array:
    """A numpy int32/int64 array as an Arrow array, zero-copy (``pa.array`` on numpy data
    would import pandas first, ~0.3 s of CPU, to check for pandas types)."""
    typ = pa.int32() if values.dtype == np.int32 else pa.int64()
    values = np.ascontiguousarray(values, np.int32 if typ == pa.int32() else np.int64)
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def binary_array(values: Sequence[bytes]) -> pa.Array:
    """Byte strings (no None) as an Arrow binary array: one join, no per-value conversion."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.binary(),
        len(values),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values))],
    )


def valid_mask(array: pa.Array) -> np.ndarray:
    """Which values of ``array`` are not null, as a numpy bool array read from the validity
    bitmap (``to_numpy`` on an Arrow array imports pandas first)."""
    n = len(array)
    bitmap = array.buffers()[0]
    if bitmap is None or not array.null_count:
        return np.ones(n, np.bool_)
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
    return bits[array.offset : array.offset + n].astype(np.bool_)


def int_values(array: pa.Array) -> np.ndarray:
    """The values of an int32/int64 Arrow array without nulls as a numpy view."""
    dtype = np.int32 if array.type == pa.int32() else np.int64
    data = np.frombuffer(array.buffers()[1], dtype)
    return data[array.offset : array.offset + len(array)]


def repeat_string(word: str, n: int) -> pa.Array:
    """``n`` copies of ``word`` as a string array, built from buffers (``pa.repeat`` needs
    a ``pa.scalar``, which imports pandas)."""
    raw = word.encode()
    offsets = np.arange(n + 1, dtype=np.int64) * len(raw)
    if offsets[-1] > np.iinfo(np.int32).max:
        raise OverflowError("too many values for 32-bit offsets")
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(raw * n)
    )


def fact_columns(datas: Sequence[bytes]) -> tuple[np.ndarray, pa.Array, pa.ListArray]:
    """Decode fact blocks (each a valid, hash-checked fact block) into ``(order,
    relations, args)``: ``relations[i]`` and ``args[i]`` belong to ``datas[order[i]]``.

    Facts the column-wise parser cannot decode exactly (links, unusual encodings)
    are decoded by :func:`merklog.store.decode_fact` and come last."""
    parsed = _parse(datas) if datas else None
    if parsed is None:
        good = np.zeros(len(datas), np.bool_)
        relations: pa.Array = pa.nulls(0, pa.string())
        args: pa.Array = pa.nulls(0, VALUE_TYPE)
        args = pa.ListArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), 1, [None, pa.py_buffer(bytes(4))]), args
        )
    else:
        good, relations, args = parsed
    rest = np.nonzero(~good)[0]
    order = np.concatenate([np.nonzero(good)[0], rest])
    if len(rest):
        facts = [decode_fact(datas[i]) for i in rest]
        relations = pa.concat_arrays([relations, pa.array([f.rel for f in facts], pa.string())])
        args = pa.concat_arrays([args, args_array([f.args for f in facts])])
    return order, relations, args


__all__ = [
    "FACT_PREFIX",
    "binary_array",
    "fact_columns",
    "indices",
    "int_values",
    "repeat_string",
    "valid_mask",
]
