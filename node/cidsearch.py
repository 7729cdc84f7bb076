"""Find 36-byte CIDs among sorted ones by 64 bits of their sha2-256 digest (numpy only).

A dag-cbor/sha2-256 CID already *is* a hash: its bytes 4-11 (the digest's first
eight) read as a uint64 are spread uniformly, so a set of CIDs sorted by those keys is
searched with a bucket search - a key's top bits name a bucket of about one key - and
every hit is confirmed on all 36 bytes. Hashing the CIDs again (a Python set, Arrow's
``index_in``) costs several times more. Used by the Parquet export's joins
(``node/spark/cidjoin.py``) and the node's read of its visible facts
(``node/factscan.py``).
"""

from __future__ import annotations

import numpy as np

WIDTH = 36  # CIDv1, dag-cbor, sha2-256
ROW = np.dtype((np.void, WIDTH))


def keys(rows: np.ndarray) -> np.ndarray:
    """CID bytes 4-11 of each 36-byte row (void or an ``(n, 36)`` uint8 matrix) as
    uint64, in byte order (so sorting the keys sorts the CIDs by digest)."""
    raw = rows.view(np.uint8).reshape(-1, WIDTH)[:, 4:12]
    return np.ascontiguousarray(raw).view(">u8").ravel().astype(np.uint64)


def bucket_starts(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.uint64]:
    """The bucket table of :func:`search`: where each bucket of the keys' top bits starts
    (about one key a bucket, so as long as the keys), and the shift that names a key's
    bucket. Built once per set of keys and reused by every search in it."""
    bits = max(1, min(24, int(len(sorted_keys)).bit_length()))
    shift = np.uint64(64 - bits)
    starts = np.zeros((1 << bits) + 1, np.int64)
    counts = np.bincount((sorted_keys >> shift).astype(np.int64), minlength=1 << bits)
    np.cumsum(counts, out=starts[1:])
    return starts, shift


def search(
    sorted_keys: np.ndarray,
    queries: np.ndarray,
    buckets: tuple[np.ndarray, np.uint64] | None = None,
) -> np.ndarray:
    """``np.searchsorted(sorted_keys, queries)`` for uniformly spread keys: bucket starts
    from the keys' top bits (``buckets``, from :func:`bucket_starts`; built here when not
    given), then a step forward while the bucket's key is smaller (about one key per
    bucket, so a few steps over a shrinking set)."""
    starts, shift = buckets if buckets is not None else bucket_starts(sorted_keys)
    bucket = (queries >> shift).astype(np.int64)
    pos = starts[bucket]
    end = starts[bucket + 1]
    active = np.nonzero(pos < end)[0]
    while len(active):
        step = sorted_keys[pos[active]] < queries[active]
        active = active[step]
        pos[active] += 1
        active = active[pos[active] < end[active]]
    return pos


class CidIndex:
    """Distinct 36-byte CIDs (void rows), ready for many lookups: the keys are sorted and
    the bucket table built once, not per :meth:`find`."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        key = keys(rows)
        self.order = np.argsort(key, kind="stable")  # sorted input: nearly free
        self.sorted_keys = key[self.order]
        #: False when two CIDs share the 64 bits searched: callers use an exact fallback
        self.usable = not (
            len(key) > 1 and bool((self.sorted_keys[1:] == self.sorted_keys[:-1]).any())
        )
        self._buckets: tuple[np.ndarray, np.uint64] | None = None

    def find(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, found)`` of each query row among ``rows`` (positions are
        meaningless where not found). Only when ``usable``."""
        if not len(self.order):
            return np.zeros(len(queries), np.int64), np.zeros(len(queries), np.bool_)
        if self._buckets is None:
            self._buckets = bucket_starts(self.sorted_keys)
        at = search(self.sorted_keys, keys(queries), self._buckets)
        where = self.order[np.minimum(at, len(self.order) - 1)]
        return where, self.rows[where] == queries.view(ROW).ravel()


def as_rows(raw: bytes) -> np.ndarray:
    """Concatenated 36-byte CIDs as void rows (zero-copy)."""
    return np.frombuffer(raw, np.uint8).view(ROW)


__all__ = ["ROW", "WIDTH", "CidIndex", "as_rows", "bucket_starts", "keys", "search"]
