"""IPFSBlockStore against a real offline js-ipfs daemon: same CIDs, pins, tamper detection."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import time

import pytest

from merklog.store import (
    BlockNotFound,
    CIDMismatch,
    Link,
    StoreError,
    encode,
    encode_fact,
    make_fact,
)
from merklog.store.ipfs import IPFSBlockStore

pytestmark = [
    pytest.mark.ipfs,
    # ipfshttpclient passes urllib3 an argument it deprecates; nothing merklog can change
    pytest.mark.filterwarnings("ignore:The 'strict' parameter:FutureWarning"),
]


def test_daemon_names_blocks_with_our_cids(ipfs_store):
    token = os.urandom(8).hex()
    facts = [
        make_fact("edge", [1, 2]),
        make_fact("mixed", [token, -(2**63), 2.5, b"\x00\xff", True, "héllo"]),
    ]
    blocks = [encode_fact(f) for f in facts]
    blocks.append((Link.for_dag_cbor(d := encode({"facts": [c for c, _ in blocks]})), d))
    for cid, data in blocks:
        answer = ipfs_store.client.block.put(io.BytesIO(data), opts={"format": "dag-cbor"})
        assert answer["Key"] == str(cid)
        assert ipfs_store.get(cid) == data


def test_put_pins_directly_and_survives_gc(ipfs_store, ipfs_daemon_handle):
    cid, data = encode_fact(make_fact("pinned", [os.urandom(8).hex()]))
    assert ipfs_store.put(cid, data) is True
    assert ipfs_store.put(cid, data) is False
    pins = ipfs_store.client.pin.ls(str(cid), type="direct")["Keys"]
    assert [Link.parse(k) for k in pins] == [cid]
    ipfs_daemon_handle.call("repo/gc")
    assert ipfs_store.get(cid) == data


def test_block_linking_to_absent_blocks_is_stored(ipfs_store):
    """A delta may arrive before its parents: a direct pin must not try to fetch them."""
    absent, _ = encode_fact(make_fact("absent", [os.urandom(8).hex()]))
    data = encode({"kind": "delta", "parents": [absent]})
    started = time.monotonic()
    cid = ipfs_store.put_block(data)
    assert time.monotonic() - started < 2
    assert ipfs_store.get(cid) == data


def test_missing_block_times_out_as_not_found(ipfs_daemon):
    store = IPFSBlockStore(ipfs_daemon, timeout=0.5)
    cid, _ = encode_fact(make_fact("never", [os.urandom(8).hex()]))
    started = time.monotonic()
    with pytest.raises(BlockNotFound):
        store.get(cid)
    assert time.monotonic() - started < 5


def test_tampered_block_on_the_daemon_is_rejected(ipfs_store, ipfs_daemon_handle):
    """Overwrite the daemon's own copy on disk: it then serves bytes the CID does not name."""
    cid, data = encode_fact(make_fact("tamper", [os.urandom(8).hex()]))
    _, evil = encode_fact(make_fact("tamper", ["evil"]))
    ipfs_store.put(cid, data)
    key = base64.b32encode(cid.raw[2:]).decode().rstrip("=")  # flatfs key: the multihash
    paths = list((ipfs_daemon_handle.repo / "blocks").glob(f"*/{key}.data"))
    assert len(paths) == 1
    paths[0].write_bytes(evil)
    with pytest.raises(CIDMismatch) as err:
        ipfs_store.get(cid)
    assert err.value.expected == cid


class _LyingBlockSection:
    """Fault we cannot make a real daemon produce: it names a block with another CID."""

    def __init__(self, real, key: str) -> None:
        self._real = real
        self._key = key

    def put(self, *args, **kwargs):
        return {"Key": self._key, "Size": 0}

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_daemon_answering_another_cid_is_rejected(ipfs_store):
    (cid, data), (other, _) = (encode_fact(make_fact("lie", [i])) for i in range(2))
    ipfs_store.client.block = _LyingBlockSection(ipfs_store.client.block, str(other))
    with pytest.raises(CIDMismatch):
        ipfs_store.put(cid, data)


def test_unreachable_daemon_is_a_store_error():
    with socket.socket() as sock:  # a port nobody listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = IPFSBlockStore(f"/ip4/127.0.0.1/tcp/{port}/http", timeout=1)
    cid, data = encode_fact(make_fact("x", [1]))
    with pytest.raises(StoreError, match="is not reachable"):
        store.put(cid, data)


def test_daemon_is_js_ipfs_0_66(ipfs_daemon_handle):
    # js-ipfs core 0.18.1 is what npm ipfs@0.66.1 ships
    assert json.loads(ipfs_daemon_handle.call("version"))["Version"] == "0.18.1"
