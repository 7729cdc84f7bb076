"""Two nodes on IPFS that are never told each other's HTTP address converge through the
daemon: heads announced on pubsub, blocks fetched through IPFS, forged announcements
ignored.

Both nodes use one online js-ipfs daemon: with the packages tests/ipfs installs, two
js-ipfs 0.66.1 daemons cannot connect (their libp2p transports accept no listen address;
see tests/ipfs/daemon.py), so pubsub reaches only the clients of the same daemon.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from pathlib import Path

import aiohttp
import pytest

from merklog.node.ipfs_sync import _multibase, api_url
from merklog.node.node import IDENTITY_FILE, Node
from merklog.replication.identity import Identity
from merklog.replication.pubsub import make_announcement, topic_for
from merklog.store import Link, encode

from .conftest import Cli

pytestmark = [
    pytest.mark.ipfs,
    pytest.mark.filterwarnings("ignore:The 'strict' parameter:FutureWarning"),
]


def _visible(node: Node) -> list[str]:
    return sorted(str(f) for _c, f in node.list_facts())


async def _until(check, what: str, limit: float = 120.0) -> None:
    """Wait for ``check()`` (a bound against hangs, not a performance assertion)."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _publish(api: str, topic: str, data: bytes) -> None:
    form = aiohttp.FormData()
    form.add_field("file", data, filename="x", content_type="application/octet-stream")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{api_url(api)}/pubsub/pub", params={"arg": _multibase(topic.encode())}, data=form
        ) as resp:
            assert resp.status == 200, await resp.text()


@pytest.mark.timeout(900)  # a daemon start and two nodes on a shared, loaded machine
def test_two_nodes_converge_through_ipfs_pubsub(tmp_path: Path, private_daemon) -> None:
    daemon = private_daemon(online=True)
    api = daemon.api_addr
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init", "--store", "ipfs", "--ipfs-api", api)
    dataset = tomllib.loads((a.home / "config.toml").read_text())["dataset"]["id"]
    # B joins by dataset id: the genesis comes through the daemon, not from A over HTTP.
    b("init", "--store", "ipfs", "--ipfs-api", api, "--join", dataset)
    b_key = Identity.load(b.home / IDENTITY_FILE).public_key.hex()

    async def scenario() -> None:
        node_a = Node.open(a.home, sync__ipfs_interval=0.2)
        node_b = Node.open(b.home, sync__ipfs_interval=0.2)
        try:
            async with node_a, node_b:
                node_a.grant(b_key)
                node_a.write(["edge(1, 2).", 'name(1, "1").', "flag(1.0)."])
                want = ["edge(1, 2)", "flag(1.0)", 'name(1, "1")']
                await _until(lambda: _visible(node_b) == want, "B to receive A's facts")
                node_b.write(["edge(7, 8).", "flag(true)."])
                node_a.write(retracts=["flag(1.0)."])
                want = ["edge(1, 2)", "edge(7, 8)", "flag(true)", 'name(1, "1")']
                await _until(lambda: _visible(node_a) == _visible(node_b) == want, "convergence")
                await _until(lambda: node_a.heads() == node_b.heads(), "equal heads")
                heads = node_a.heads()
                failed = node_a.ipfs_sync.stats["failed"], node_b.ipfs_sync.stats["failed"]

                # Forged: a stranger's announcement, and the owner's key with a bad signature,
                # each naming a head nobody has (honouring one would mean a fetch).
                stranger = Identity.generate()
                bogus = Link.for_dag_cbor(encode({"kind": "delta", "bogus": str(tmp_path)}))
                topic = topic_for(Link.parse(dataset))
                await _publish(api, topic, make_announcement(stranger, node_a.dataset, [bogus]))
                import libipld

                real = libipld.decode_dag_cbor(
                    make_announcement(node_a.identity, node_a.dataset, [bogus])
                )
                forged = encode(
                    {
                        **real,
                        "dataset": node_a.dataset,
                        "heads": [bogus],
                        "sig": stranger.sign(b"not this"),
                    }
                )
                await _publish(api, topic, forged)
                await _until(
                    lambda: (
                        node_a.ipfs_sync.stats["ignored"] >= 2
                        and node_b.ipfs_sync.stats["ignored"] >= 2
                    ),
                    "both forged announcements to be ignored",
                )
                assert node_a.heads() == node_b.heads() == heads
                assert _visible(node_a) == _visible(node_b) == want
                # Ignored before any fetch: no new fetch failures.
                assert (
                    node_a.ipfs_sync.stats["failed"],
                    node_b.ipfs_sync.stats["failed"],
                ) == failed
                assert node_a.ipfs_sync.stats["applied"] >= 1
                assert node_b.ipfs_sync.stats["applied"] >= 2
        finally:
            node_a.close()
            node_b.close()

    asyncio.run(scenario())


def test_a_failure_without_a_text_is_named_in_the_log(caplog) -> None:
    """QA: a publish that timed out logged "publishing heads on TOPIC failed: " and no
    reason (a TimeoutError says nothing); the line names it now."""
    import logging

    from merklog.node.ipfs_sync import IPFSHeadSync

    channel = IPFSHeadSync.__new__(IPFSHeadSync)  # only its failure log is used here
    channel._failing = set()
    with caplog.at_level(logging.WARNING, logger="merklog.node.ipfs_sync"):
        channel._failed(
            "publishing heads", "publishing heads on %s failed: %s", "t", TimeoutError()
        )
    assert caplog.messages == [
        "publishing heads on t failed: the IPFS daemon did not answer in time"
    ]
