"""The node's visible facts read column-wise: all-int relations become int64 matrices
without a Python object per fact or per value (ADR 0118).

Opening a stopped home (``merklog load``, ``merklog query``) reads every visible fact.
The per-fact path (:func:`merklog.node.edb._scan`) keeps the visible CIDs in a Python
set, decodes each block with libipld into a dict, groups the arguments by relation
in lists and turns them into int64 arrays: ~4 s of CPU for 1M facts. Here one ordered
scan of the fact blocks is matched with the visible CIDs by 64 digest bits
(:mod:`.cidsearch`), each page is hash-checked in one comparison, and the blocks are
parsed position by position (:mod:`.factparse`); a fact whose arguments are all
int64 lands in its relation's matrix straight from the parsed int column. Any other
fact (a float, text, bytes, bool or link argument, no arguments, anything the parser
leaves to the generic decoder) is decoded by libipld and kept as a row, and a
relation with any such row is handed over as rows, so :func:`merklog.node.edb._relation`
decides exactly as before (``p(1)``, ``p(1.0)``, ``p(true)``, ``p("1")`` and
``p(x"01")`` stay five facts, never an int64 column).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from itertools import compress
from operator import itemgetter
from typing import Any

import numpy as np

from merklog.replication.bulk import FACT_PREFIX

from .cidsearch import WIDTH, CidIndex, as_rows
from .factparse import INT, parse

#: Blocks per scan query: large enough to amortise it, small enough to keep memory flat.
SCAN_BATCH = 65_536
_PREFIX = np.frombuffer(bytes([0x01, 0x71, 0x12, 0x20]), np.uint8)  # CIDv1 dag-cbor sha2-256
_TAG42 = b"\xd8\x2a"  # DAG-CBOR's link tag: such blocks go to the full fact decoder
_first = itemgetter(0)
_second = itemgetter(1)

#: A relation's facts: an int64 matrix (all facts all-int, one arity) or argument rows.
Relation = np.ndarray | list[Any]
#: ``progress(facts read, facts visible)``, told as a read goes.
Progress = Callable[[int, int], None]


def check_page(cids: Sequence[bytes], datas: Sequence[bytes], joined: bytes | None = None) -> None:
    """Raise (``CIDMismatch``, naming the block) unless every block hashes to its CID:
    all digests joined and compared with the CIDs' digest bytes
    in one numpy comparison; another CID kind, or a mismatch, goes block by block.
    ``joined``: ``b"".join(cids)`` if the caller has it and every CID is 36 bytes."""
    from merklog.store import Link, verify

    if joined is None and bool((np.fromiter(map(len, cids), np.int64, len(cids)) == WIDTH).all()):
        joined = b"".join(cids)
    if joined is not None:
        table = np.frombuffer(joined, np.uint8).reshape(len(cids), WIDTH)
        sha256 = hashlib.sha256
        digests = np.frombuffer(b"".join([sha256(d).digest() for d in datas]), np.uint8)
        if bool((table[:, :4] == _PREFIX).all()) and np.array_equal(
            table[:, 4:].reshape(-1), digests
        ):
            return
    for cid, data in zip(cids, datas, strict=True):
        verify(Link(bytes(cid)), bytes(data), "block store")


#: Relation names up to this many bytes are compared as one padded array; longer ones
#: (which only earlier versions let writers make) one at a time.
_PADDED_MAX = 64


def _names(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[list, np.ndarray]:
    """The distinct relation names of parsed facts and each fact's index among them.

    Names are compared as rows of a zero-padded array as wide as the longest one, so a
    name of 100,000 bytes among 20,000 facts asked for 2 GB: a longer name is read on
    its own instead, at the cost of a Python step per fact that has one."""
    long = lengths > _PADDED_MAX
    if not bool(long.any()):
        return _padded_names(buf, starts, lengths)
    code = np.empty(len(starts), np.int64)
    short = np.nonzero(~long)[0]
    names, code[short] = _padded_names(buf, starts[short], lengths[short])
    index = {name: i for i, name in enumerate(names)}
    for i in np.nonzero(long)[0].tolist():
        name = buf[starts[i] : starts[i] + lengths[i]].tobytes()
        at = index.get(name)
        if at is None:
            at = index[name] = len(names)
            names.append(name)
        code[i] = at
    return names, code


def _padded_names(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> tuple[list, np.ndarray]:
    """:func:`_names` by one ``np.unique`` over the names zero-padded to the longest."""
    width = int(lengths.max(initial=0))
    padded = np.zeros((len(starts), max(width, 1)), np.uint8)
    if width:
        cols = np.arange(width)
        inside = cols < lengths[:, None]
        padded[inside] = buf[(starts[:, None] + cols)[inside]]
    # the length is part of the key: names differing only by trailing zero bytes differ
    keyed = np.concatenate([padded, lengths.astype(">u4").view(np.uint8).reshape(-1, 4)], 1)
    distinct, inverse = np.unique(
        np.ascontiguousarray(keyed).view(np.dtype((np.void, keyed.shape[1]))).ravel(),
        return_inverse=True,
    )
    names = []
    for key in distinct:
        raw = key.tobytes()
        names.append(raw[: int.from_bytes(raw[-4:], "big")])
    return names, inverse.ravel()


class _Grouped:
    """Per relation: int64 matrix chunks by arity, and generic rows."""

    def __init__(self) -> None:
        self.chunks: dict[str, dict[int, list[np.ndarray]]] = {}
        self.rows: dict[str, list[Any]] = {}
        self.count = 0

    def add_parsed(self, datas: list[bytes]) -> list[bytes]:
        """Parse ``datas``; keep the all-int facts as matrix rows, return the others."""
        parsed = parse(datas)
        good_at = np.nonzero(parsed.good)[0]
        n_args = parsed.n_args
        offsets = np.zeros(len(n_args) + 1, np.int64)
        np.cumsum(n_args, out=offsets[1:])
        fact_of_value = np.repeat(np.arange(len(n_args)), n_args)
        not_int = np.bincount(fact_of_value[parsed.codes != INT], minlength=len(n_args))
        all_int = (n_args > 0) & (not_int == 0)  # a fact without arguments is a row
        names, code = _names(parsed.buf, parsed.rel_start, parsed.rel_len)
        for i, raw in enumerate(names):
            try:
                rel = raw.decode("utf-8")
            except UnicodeDecodeError:
                all_int[code == i] = False  # left to the generic decoder, which rejects it
                continue
            sel = np.nonzero(all_int & (code == i))[0]
            for arity in np.unique(n_args[sel]).tolist():
                facts = sel[n_args[sel] == arity]
                at = offsets[facts][:, None] + np.arange(arity)
                chunk = parsed.ints[at]
                self.chunks.setdefault(rel, {}).setdefault(arity, []).append(chunk)
                self.count += len(facts)
        rest = np.ones(len(datas), np.bool_)
        rest[good_at[all_int]] = False
        return [datas[i] for i in np.nonzero(rest)[0].tolist()]

    def add_generic(self, datas: list[bytes]) -> bool:
        """Decode blocks one way or the other (links need the full fact decoder); False
        if a block is not a fact."""
        import libipld

        from merklog.replication.blocks import decode_fact_fast

        plain = [d for d in datas if _TAG42 not in d]
        for data in datas:
            if _TAG42 in data:
                fact = decode_fact_fast(data)
                self.rows.setdefault(fact.rel, []).append(fact.args)
                self.count += 1
        objs = libipld.decode_dag_cbor_multi(b"".join(plain)) if plain else []
        if len(objs) != len(plain):
            return False
        for obj in objs:
            self.rows.setdefault(obj["rel"], []).append(obj["args"])
        self.count += len(objs)
        return True

    def relations(self) -> dict[str, Relation]:
        out: dict[str, Relation] = {}
        for rel in {*self.chunks, *self.rows}:
            by_arity = self.chunks.get(rel, {})
            rows = self.rows.get(rel)
            if not rows and len(by_arity) == 1:
                [chunks] = by_arity.values()
                out[rel] = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
                continue
            rows = list(rows or ())
            for chunks in by_arity.values():
                for chunk in chunks:
                    rows.extend(chunk.tolist())
            out[rel] = rows
        return out


def scan_visible(
    offer: Any, visible: Sequence[bytes], progress: Progress | None = None
) -> dict[str, Relation] | None:
    """The facts whose CIDs are ``visible`` (distinct raw CIDs, any order) by relation, from one ordered
    scan of the fact blocks in the store's ``blocks`` table (the layout
    :class:`merklog.store.SharedSQLite` documents); every block kept is hash-checked.
    None when the fast path does not apply (CIDs of another kind, two visible CIDs
    sharing the 64 digest bits searched, a visible fact without a block): the caller
    then reads the per-fact way, which also says what is wrong. ``progress(read,
    visible)`` is called after each batch of blocks with the visible facts read so far."""
    if not bool((np.fromiter(map(len, visible), np.int64, len(visible)) == WIDTH).all()):
        return None
    index = CidIndex(as_rows(b"".join(visible)))
    if not index.usable:
        return None
    sql = (
        f"SELECT cid, data FROM {offer.blocks_table} WHERE cid > ? AND substr(data, 1, 5) = ?"
        " ORDER BY cid LIMIT ?"
    )
    grouped = _Grouped()
    after = b""
    while True:
        with offer.lock:
            rows = offer.conn.execute(sql, (after, FACT_PREFIX, SCAN_BATCH)).fetchall()
        cids = list(map(_first, rows))
        lengths = np.fromiter(map(len, cids), np.int64, len(cids))
        if not bool((lengths == WIDTH).all()):
            return None
        joined = b"".join(cids)
        _where, found = index.find(as_rows(joined))
        datas = list(map(_second, rows))
        if not bool(found.all()):
            keep = found.tolist()
            cids = list(compress(cids, keep))
            datas = list(compress(datas, keep))
            joined = b"".join(cids)
        check_page(cids, datas, joined)
        if datas and not grouped.add_generic(grouped.add_parsed(datas)):
            return None
        if progress is not None:
            progress(grouped.count, len(visible))
        if len(rows) < SCAN_BATCH:
            break
        after = rows[-1][0]
    return grouped.relations() if grouped.count == len(visible) else None


__all__ = ["SCAN_BATCH", "Progress", "Relation", "check_page", "scan_visible"]
