"""``sorted_blob`` (ADR 0121) gives the byte order of Python's ``sorted`` on both of its
paths, NUL bytes anywhere in the records included."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from merklog.replication.sqlutil import NUMPY_SORT_MIN, sorted_blob


def _expected(records: list[bytes], unique: bool) -> tuple[bytes, int]:
    ordered = sorted(set(records)) if unique else sorted(records)
    return b"".join(ordered), len(ordered)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(min_value=1, max_value=40),
    seeds=st.lists(st.binary(max_size=40), min_size=0, max_size=60),
    repeat=st.integers(min_value=1, max_value=3 * NUMPY_SORT_MIN // 60 + 1),
    unique=st.booleans(),
)
def test_sorted_blob_is_sorted_bytes(size: int, seeds: list, repeat: int, unique: bool) -> None:
    # Records padded or cut to one size, many ending or starting with NUL bytes.
    base = [(s + b"\x00" * size)[:size] for s in seeds] + [b"\x00" * size, b"\x01" * size]
    records = base * repeat  # duplicates, and past the numpy threshold
    assert sorted_blob(records, size, unique=unique) == _expected(records, unique)


def test_sorted_blob_of_cids_with_a_shared_prefix() -> None:
    cids = [b"\x01\x71\x12\x20" + hashlib.sha256(str(i).encode()).digest() for i in range(5000)]
    cids += cids[:10]
    for unique in (False, True):
        assert sorted_blob(cids, 36, unique=unique) == _expected(cids, unique)
    assert sorted_blob([], 36) == (b"", 0)
