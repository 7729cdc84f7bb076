"""pyarrow arrays from numpy buffers and back, without pandas.

pyarrow imports pandas (about half a second of CPU, more than a small evaluation)
the first time ``pa.array()``, ``pa.scalar()`` or ``.to_numpy()`` runs. ``merklog
eval`` never needs pandas, so its readers and writers (:mod:`merklog.engine.tsv`,
:mod:`merklog.engine.outcols`) move data through raw buffers with these helpers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def to_numpy(arr: Any, dtype: Any) -> np.ndarray:
    """A null-free int64/float64 pyarrow (chunked) array as a numpy array (no pandas)."""
    if hasattr(arr, "combine_chunks"):
        arr = arr.combine_chunks()
    if len(arr) == 0:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * 8)


def from_ints(values: np.ndarray) -> Any:
    """An int64 numpy array as a pyarrow array (zero-copy, no pandas)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def from_mask(mask: np.ndarray) -> Any:
    """A numpy bool array as a pyarrow boolean array (no pandas)."""
    import pyarrow as pa

    bits = np.packbits(mask, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])


def from_strs(values: Sequence[str]) -> Any:
    """Python strings as a pyarrow string array (no pandas)."""
    import pyarrow as pa

    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    if offsets[-1] >= 2**31:
        return pa.Array.from_buffers(
            pa.large_string(),
            len(encoded),
            [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
        )
    return pa.Array.from_buffers(
        pa.string(),
        len(encoded),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))],
    )


def str_scalar(text: str) -> Any:
    return from_strs([text])[0]


__all__ = ["from_ints", "from_mask", "from_strs", "str_scalar", "to_numpy"]
