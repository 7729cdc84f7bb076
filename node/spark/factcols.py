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

from merklog.replication.bulk import FACT_PREFIX
from merklog.store import decode_fact

from .schema import VALUE_TYPE, args_array

_ARGS_KEY = np.frombuffer(b"dargs", np.uint8)
_INT, _FLOAT, _STR, _BYTES, _BOOL = 0, 1, 2, 3, 4
_TYPE_NAMES = pa.StringArray.from_buffers(
    5,
    pa.py_buffer(np.array([0, 3, 8, 11, 16, 20], np.int32).tobytes()),
    pa.py_buffer(b"intfloatstrbytesbool"),
)
_INT64_MAX = np.uint64(2**63 - 1)
#: smallest value each extra-byte width may carry in canonical CBOR
_MIN_FOR_WIDTH = {1: 24, 2: 256, 4: 65_536, 8: 2**32}


def _head(
    buf: np.ndarray, pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CBOR item headers at ``pos``: ``(major type, argument, position after, canonical)``.

    The argument is the raw 64-bit value (for major type 7 with 8 extra bytes, the
    bits of a float64). Headers with a reserved or indefinite length, or not in
    the shortest form, are flagged not canonical."""
    first = buf[pos]
    major = first >> 5
    info = (first & 31).astype(np.uint64)
    value = info.copy()
    after = pos + 1
    ok = info < 28
    for width, code in ((1, 24), (2, 25), (4, 26), (8, 27)):
        sel = np.nonzero(info == code)[0]
        if not len(sel):
            continue
        start = pos[sel] + 1
        acc = np.zeros(len(sel), np.uint64)
        for k in range(width):
            acc = (acc << np.uint64(8)) | buf[start + k].astype(np.uint64)
        value[sel] = acc
        after[sel] = start + width
        simple = major[sel] == 7
        ok[sel] &= simple | (acc >= np.uint64(_MIN_FOR_WIDTH[width]))
    return major, value, after, ok


def _gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, bytes]:
    """Variable-length slices of ``buf`` as Arrow offsets (int32) and concatenated bytes."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise OverflowError("batch too large for 32-bit offsets")
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return offsets.astype(np.int32), buf[index].tobytes()


def _bitmap(mask: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(mask, bitorder="little").tobytes())


def _binary(
    typ: pa.DataType, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray
) -> pa.Array:
    offsets, data = _gather(buf, starts[valid], lengths[valid])
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
    n = len(datas)
    lengths = np.fromiter(map(len, datas), np.int64, n)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    buf = np.frombuffer(b"".join(datas) + bytes(16), np.uint8)
    limit = ends  # every item must end inside its own block
    good = lengths >= 7
    good &= np.all(buf[starts[:, None] + np.arange(5)] == np.frombuffer(FACT_PREFIX, np.uint8), 1)
    pos = np.where(good, starts + 5, starts)

    major, rel_len, pos, ok = _head(buf, pos)
    good &= ok & (major == 3) & (rel_len < np.uint64(1 << 31))
    rel_start = pos
    pos = np.where(good, pos + rel_len.astype(np.int64), starts)
    good &= pos + 6 <= limit
    pos = np.where(good, pos, starts)
    good &= np.all(buf[pos[:, None] + np.arange(5)] == _ARGS_KEY, 1)
    major, n_args, pos, ok = _head(buf, pos + 5)
    good &= ok & (major == 4) & (n_args <= np.uint64(1 << 20)) & (pos <= limit)
    n_args = np.where(good, n_args, 0).astype(np.int64)

    arg_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(n_args, out=arg_offsets[1:])
    total = int(arg_offsets[-1])
    codes = np.zeros(total, np.int8)
    ints = np.zeros(total, np.int64)
    floats = np.zeros(total, np.float64)
    bools = np.zeros(total, np.bool_)
    var_start = np.zeros(total, np.int64)
    var_len = np.zeros(total, np.int64)
    for j in range(int(n_args.max(initial=0))):
        facts = np.nonzero(good & (n_args > j))[0]
        if not len(facts):
            break
        at = pos[facts]
        major, value, after, ok = _head(buf, at)
        slot = arg_offsets[facts] + j
        small = value <= _INT64_MAX
        is_int = (major <= 1) & small
        is_var = ((major == 2) | (major == 3)) & (value < np.uint64(1 << 31))
        info = buf[at] & 31
        is_bool = (major == 7) & ((info == 20) | (info == 21))
        is_float = (major == 7) & (info == 27)
        as_float = value.view(np.float64)
        is_float &= np.isfinite(as_float)
        ok &= is_int | is_var | is_bool | is_float
        signed = value.astype(np.int64)  # exact where ``small``
        ints[slot] = np.where(major == 1, -1 - signed, signed)
        floats[slot] = np.where(is_float, as_float, 0.0)
        bools[slot] = info == 21
        codes[slot] = np.select(
            [is_int, is_float, major == 3, major == 2], [_INT, _FLOAT, _STR, _BYTES], _BOOL
        )
        var_start[slot] = after
        var_len[slot] = np.where(is_var, value, 0).astype(np.int64)
        after = after + var_len[slot]
        ok &= after <= limit[facts]
        good[facts[~ok]] = False
        pos[facts] = after
    good &= pos == limit

    keep = np.repeat(good, n_args)
    codes, ints, floats, bools = codes[keep], ints[keep], floats[keep], bools[keep]
    var_start, var_len = var_start[keep], var_len[keep]
    m = len(codes)
    rel_offsets, rel_bytes = _gather(buf, rel_start[good], rel_len[good].astype(np.int64))
    relations = pa.StringArray.from_buffers(
        int(good.sum()), pa.py_buffer(rel_offsets.tobytes()), pa.py_buffer(rel_bytes)
    )
    fields = [
        _TYPE_NAMES.take(
            pa.Array.from_buffers(pa.int8(), m, [None, pa.py_buffer(codes.tobytes())])
        ),
        _fixed(pa.int64(), ints, codes == _INT),
        _fixed(pa.float64(), floats, codes == _FLOAT),
        _binary(pa.string(), buf, var_start, var_len, codes == _STR),
        _binary(pa.binary(), buf, var_start, var_len, codes == _BYTES),
        pa.Array.from_buffers(
            pa.bool_(), m, [_bitmap(codes == _BOOL), _bitmap(bools)], null_count=-1
        ),
        pa.nulls(m, pa.string()),
    ]
    try:
        relations.validate(full=True)
        fields[3].validate(full=True)  # UTF-8
    except pa.ArrowInvalid:
        return None
    offsets = np.zeros(int(good.sum()) + 1, np.int32)
    np.cumsum(n_args[good], out=offsets[1:])
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
