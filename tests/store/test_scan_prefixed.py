"""``BlockStore.scan_prefixed``: the generic default (sorted CIDs, batched ``get_many``)
and the SQLite store's one-pass scan give the same pages, so a bulk reader (the Parquet
export) needs no test for which store it holds."""

from __future__ import annotations

from merklog.store import Link, MemoryBlockStore, SQLiteBlockStore, encode, encode_fact, make_fact

#: Facts whose values differ only in type: five facts, five CIDs.
FACTS = [make_fact("v", (x,)) for x in (1, 1.0, True, "1", b"\x01")] + [
    make_fact("edge", (i, i + 1)) for i in range(40)
]


def _blocks() -> list[tuple[Link, bytes]]:
    facts = [encode_fact(f) for f in FACTS]
    others = [(Link.for_dag_cbor(data), data) for data in (encode({"k": i}) for i in range(10))]
    return facts + others


def _pages(store, prefix: bytes, batch: int) -> list[list[tuple[bytes, bytes]]]:
    return [list(map(tuple, page)) for page in store.scan_prefixed(prefix, batch)]


def test_the_default_scan_equals_the_sqlite_scan(tmp_path):
    blocks = _blocks()
    memory = MemoryBlockStore()
    memory.put_many(blocks)
    with SQLiteBlockStore(tmp_path / "s.sqlite") as sqlite:
        sqlite.put_many(blocks)
        prefix = encode_fact(FACTS[0])[1][:5]  # every fact block starts with these bytes
        for batch in (1, 7, 45, 1000):
            want = _pages(sqlite, prefix, batch)
            got = _pages(memory, prefix, batch)
            flat = [row for page in got for row in page]
            assert flat == [row for page in want for row in page]
            assert flat == sorted((c.raw, d) for c, d in blocks if d.startswith(prefix))
            assert len(flat) == len(FACTS)  # 1, 1.0, true, "1", x"01" stay five facts
            assert all(0 < len(page) <= batch for page in got)


def test_a_cid_range_gives_exactly_its_blocks_on_both_stores(tmp_path):
    """``lo``/``hi`` split one scan between processes (the Parquet export's workers): the
    ranges of a split give every block once, in CID order, on both stores, whatever the
    batch (a range's first page starts at ``lo``, later pages after the last CID)."""
    blocks = _blocks()
    memory = MemoryBlockStore()
    memory.put_many(blocks)
    every = sorted(c.raw for c, _d in blocks)
    with SQLiteBlockStore(tmp_path / "s.sqlite") as sqlite:
        sqlite.put_many(blocks)
        for cuts in ([every[20]], [every[0], every[30][:5], every[-1]], [b"\x01\x71\x12\x20\x80"]):
            ranges = list(zip([b"", *cuts], [*cuts, None], strict=True))
            for store in (memory, sqlite):
                for batch in (1, 4, 1000):
                    got = [
                        [cid for page in store.scan_prefixed(b"", batch, lo, hi) for cid, _ in page]
                        for lo, hi in ranges
                    ]
                    assert [cid for part in got for cid in part] == every
                    for (lo, hi), part in zip(ranges, got, strict=True):
                        assert all(lo <= cid and (hi is None or cid < hi) for cid in part)
