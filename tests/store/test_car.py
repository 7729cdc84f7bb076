"""CAR v1: round trips, rejection of bad input, and interop with npm ipfs-car and js-ipfs."""

from __future__ import annotations

import io
import os

import pytest

from merklog.store import (
    CIDMismatch,
    InvalidBlock,
    Link,
    MemoryBlockStore,
    encode,
    encode_fact,
    make_fact,
)
from merklog.store.car import CarDecoder, car_header, car_section, iter_car, read_car, write_car
from merklog.store.ipfs import IPFSBlockStore
from merklog.store.sqlite import SQLiteBlockStore


def sample_dag(n: int = 20) -> tuple[Link, list[tuple[Link, bytes]]]:
    """A root block linking n fact blocks (the shape of a delta), root first."""
    token = os.urandom(6).hex()
    facts = [
        encode_fact(make_fact("edge", [token, i, i * 0.5, b"\x01" * (i % 5)])) for i in range(n)
    ]
    root_data = encode({"kind": "test", "facts": [cid for cid, _ in facts]})
    root = Link.for_dag_cbor(root_data)
    return root, [(root, root_data), *facts]


def car_bytes(roots: list[Link], blocks: list[tuple[Link, bytes]]) -> bytes:
    out = io.BytesIO()
    write_car(out, roots, blocks)
    return out.getvalue()


def test_round_trip_file_and_stream(tmp_path):
    root, blocks = sample_dag()
    path = tmp_path / "dag.car"
    with open(path, "wb") as f:
        assert write_car(f, [root], blocks) == len(blocks)
    assert path.read_bytes() == b"".join(iter_car([root], blocks))
    with open(path, "rb") as f:
        roots, it = read_car(f, chunk_size=7)
        assert roots == [root]
        assert list(it) == blocks


def test_decoder_accepts_any_chunking():
    root, blocks = sample_dag(5)
    data = car_bytes([root], blocks)
    decoder = CarDecoder()
    got = []
    for i in range(len(data)):
        got.extend(decoder.feed(data[i : i + 1]))
    decoder.close()
    assert decoder.roots == [root] and got == blocks


def test_round_trip_through_stores(tmp_path):
    root, blocks = sample_dag()
    source = SQLiteBlockStore(tmp_path / "a.sqlite")
    source.put_many(blocks)
    exported = car_bytes([root], source.get_many([cid for cid, _ in blocks]))
    target = MemoryBlockStore()
    roots, it = read_car(io.BytesIO(exported))
    assert target.put_many(it) == len(blocks)
    assert roots == [root]
    assert {cid: target.get(cid) for cid, _ in blocks} == dict(blocks)
    source.close()


@pytest.mark.parametrize("cut", [1, 5, 40, -1, -30])
def test_truncated_car_is_rejected(cut):
    root, blocks = sample_dag(3)
    data = car_bytes([root], blocks)
    with pytest.raises(InvalidBlock, match="ended"):
        _, it = read_car(io.BytesIO(data[:cut]))
        list(it)


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00",
        b"\xff" * 12,
        b"\x05hello",
        car_header([])[:-1] + b"\x02",  # header map truncated into a bad one
    ],
)
def test_garbage_is_rejected(garbage):
    with pytest.raises(InvalidBlock):
        _, it = read_car(io.BytesIO(garbage))
        list(it)


def test_header_must_be_version_1():
    header = encode({"roots": [], "version": 2})
    data = bytes([len(header)]) + header
    with pytest.raises(InvalidBlock, match="version"):
        read_car(io.BytesIO(data))


def test_tampered_section_is_rejected():
    root, blocks = sample_dag(3)
    cid, data = blocks[2]
    bad = (
        car_header([root])
        + car_section(blocks[1][0], blocks[1][1])
        + car_section(cid, data[:-1] + b"\x00")
    )
    with pytest.raises(CIDMismatch):
        _, it = read_car(io.BytesIO(bad))
        list(it)


def test_oversized_section_is_rejected_before_buffering():
    decoder = CarDecoder(max_section=1024)
    decoder.feed(car_header([]))
    with pytest.raises(InvalidBlock, match="exceeds"):
        decoder.feed(b"\x80\x80\x04")  # varint 65536


# ------------------------------------------------------------ npm ipfs-car


def test_ipfs_car_reads_and_verifies_our_car(tmp_path, ipfs_car):
    root, blocks = sample_dag()
    path = tmp_path / "ours.car"
    path.write_bytes(car_bytes([root], blocks))
    listed = ipfs_car("blocks", "--verify", str(path))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [str(cid) for cid, _ in blocks]
    roots = ipfs_car("roots", str(path))
    assert roots.returncode == 0, roots.stderr
    assert roots.stdout.split() == [str(root)]


def test_ipfs_car_rejects_a_tampered_car(tmp_path, ipfs_car):
    """Shows the verification above is real: the same tool fails on one flipped byte."""
    root, blocks = sample_dag(3)
    cid, data = blocks[1]
    blocks[1] = (cid, data[:-1] + bytes([data[-1] ^ 1]))
    path = tmp_path / "bad.car"
    path.write_bytes(car_bytes([root], blocks))
    result = ipfs_car("blocks", "--verify", str(path))
    assert result.returncode != 0
    assert "does not match" in result.stderr


# ------------------------------------------------------------ js-ipfs daemon


@pytest.mark.ipfs
def test_daemon_dag_export_imports_into_merklog(ipfs_daemon_handle, tmp_path):
    root, blocks = sample_dag()
    store = IPFSBlockStore(ipfs_daemon_handle.api_addr, timeout=5)
    store.put_many(blocks)
    exported = ipfs_daemon_handle.call("dag/export", str(root))
    roots, it = read_car(io.BytesIO(exported), chunk_size=1000)
    assert roots == [root]
    target = SQLiteBlockStore(tmp_path / "imported.sqlite")
    assert target.put_many(it) == len(blocks)
    assert set(target.iter_cids()) == {cid for cid, _ in blocks}
    assert target.integrity_check() == []
    target.close()
    store.close()


@pytest.mark.ipfs
def test_daemon_dag_import_accepts_our_car(ipfs_daemon_handle):
    root, blocks = sample_dag()
    ipfs_daemon_handle.call("dag/import", data=car_bytes([root], blocks))
    store = IPFSBlockStore(ipfs_daemon_handle.api_addr, timeout=5)
    for cid, data in blocks:
        assert store.get(cid) == data
    store.close()
