"""Fact blocks parsed column-wise with numpy: no Python object per fact or per value.

Every fact block has one shape, the canonical DAG-CBOR map ``{"rel": text, "args":
[value, ...]}`` (docs/storage.md), so a batch of blocks is parsed *position by
position*: the CBOR header of the j-th argument of every fact is read at once, and
each value lands in a column by kind (int64, float64, text or bytes slices, bool).
The Parquet export builds Arrow columns from the result (``node/spark/factcols.py``,
ADR 0056); the node's read of its visible set builds int64 matrices from it
(``node/factscan.py``, ADR 0118). numpy only: the node path imports no pyarrow.

Exactness first: a fact counts as parsed (``good``) only when every item is one this
parser knows in its canonical (shortest) form and the block ends where its last item
does; anything else - a CID link, an int beyond int64, a non-finite float, a nested
item, any non-canonical header - is left to the generic decoder by the caller. Text
is *not* checked as UTF-8 here: callers that keep text validate it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from merklog.replication.bulk import FACT_PREFIX

_ARGS_KEY = np.frombuffer(b"dargs", np.uint8)
#: value kinds, in the ``codes`` column
INT, FLOAT, STR, BYTES, BOOL = 0, 1, 2, 3, 4
_INT, _FLOAT, _STR, _BYTES, _BOOL = INT, FLOAT, STR, BYTES, BOOL
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


def gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, bytes]:
    """Variable-length slices of ``buf`` as offsets (int32, Arrow's layout) and their bytes."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise OverflowError("batch too large for 32-bit offsets")
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return offsets.astype(np.int32), buf[index].tobytes()


class Parsed(NamedTuple):
    """Parsed fact blocks. ``good[i]``: block i was parsed exactly; every other array
    covers the good blocks only, in order: ``rel_start``/``rel_len`` (the relation
    name's bytes in ``buf``), ``n_args``; then one entry per argument of those facts:
    ``codes`` (INT, FLOAT, STR, BYTES, BOOL) and the value in ``ints``, ``floats``,
    ``bools`` or, for text and bytes, ``buf[var_start : var_start + var_len]``."""

    buf: np.ndarray
    good: np.ndarray
    rel_start: np.ndarray
    rel_len: np.ndarray
    n_args: np.ndarray
    codes: np.ndarray
    ints: np.ndarray
    floats: np.ndarray
    bools: np.ndarray
    var_start: np.ndarray
    var_len: np.ndarray


def parse(datas: Sequence[bytes]) -> Parsed:
    """Parse fact blocks column-wise (see the module docstring)."""
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
    return Parsed(
        buf,
        good,
        rel_start[good],
        rel_len[good].astype(np.int64),
        n_args[good],
        codes[keep],
        ints[keep],
        floats[keep],
        bools[keep],
        var_start[keep],
        var_len[keep],
    )


__all__ = ["BOOL", "BYTES", "FLOAT", "INT", "STR", "Parsed", "gather", "parse"]
