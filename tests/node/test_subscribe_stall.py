"""A live-query client that stays connected but stops reading (a frozen tab, a phone
that lost its network): the node ends its stream instead of holding every later event
in memory, and stops promptly meanwhile. A real node served in this process
(``merklog.serve``) and a raw socket that never reads."""

from __future__ import annotations

import asyncio
import socket
import tomllib
from urllib.parse import urlsplit

import aiohttp

import merklog
from merklog.node import handlers


async def _subscribers(session: aiohttp.ClientSession, url: str, token: str) -> float:
    async with session.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"}) as r:
        for line in (await r.text()).splitlines():
            if line.startswith("merklog_subscribers "):
                return float(line.split()[-1])
    raise AssertionError("no merklog_subscribers metric")


def test_a_subscriber_that_stops_reading_is_ended(tmp_path, monkeypatch) -> None:
    """Its stream stayed open for good, each later event queued in the node (about +90 MB
    over 400k changed rows), and the node's shutdown waited out aiohttp's timeouts. Now a
    write it leaves untaken for SSE_STALL_SECONDS (1 s here) ends the stream; the node
    keeps serving the others."""
    monkeypatch.setattr(handlers, "SSE_STALL_SECONDS", 1.0)
    home = tmp_path / "h"

    async def main() -> None:
        async with merklog.open(home) as node, merklog.serve(node) as url:
            token = tomllib.loads((home / "config.toml").read_text())["api"]["token"]
            where = urlsplit(url)
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect((where.hostname, where.port))
            client.sendall(
                f"GET /v1/subscribe?q=p(X,%20Y)&access_token={token} HTTP/1.1\r\n"
                f"Host: {where.netloc}\r\n\r\n".encode()
            )  # and never reads
            async with aiohttp.ClientSession() as session:
                for _ in range(100):
                    if await _subscribers(session, url, token) == 1:
                        break
                    await asyncio.sleep(0.1)
                assert await _subscribers(session, url, token) == 1
                pad = "x" * 200
                for batch in range(40):  # ~10 MB of events, far beyond the socket buffers
                    node.write([("p", (batch * 1000 + i, pad)) for i in range(1000)])
                    await node.settled()
                for _ in range(300):
                    if await _subscribers(session, url, token) == 0:
                        break
                    await asyncio.sleep(0.1)
                assert await _subscribers(session, url, token) == 0
                # the node serves on: a live query that reads gets its result
                q = {"q": "p(0, Y)", "access_token": token}
                async with session.get(url + "/v1/subscribe", params=q) as stream:
                    assert stream.status == 200
                    line = await stream.content.readline()
                    assert line.startswith(b"event: result"), line
            client.close()

    asyncio.run(main())
