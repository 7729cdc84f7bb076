"""Sync benchmark: round trips, wire bytes vs missing-block bytes, wall time.

Two replicas (SQLite files, real aiohttp server on 127.0.0.1 behind a byte-counting
TCP proxy, so "wire" counts every HTTP byte: request lines, headers, bodies) hold
N facts and differ by d facts, either one-way (the server has d facts the caller
lacks) or two-way (each side has d/2 the other lacks; ``SyncClient.sync`` pulls then
pushes). "missing" is the byte size of the blocks (facts + deltas) that had to move;
the naive baseline is shipping every block (a full CAR export). Also: initial sync
of N facts into an empty replica over loopback.

    .venv/bin/python bench/sync.py                 # N = 10k, 100k
    .venv/bin/python bench/sync.py --sizes 10000 100000 1000000
    .venv/bin/python bench/sync.py --sizes --ipfs   # initial sync from SQLite and IPFS peers

With ``--ipfs`` the initial sync also runs from a peer whose blocks live on a js-ipfs
daemon on loopback (``--ipfs-api``, else a private one from tests/ipfs), in the same run
and on the same facts as from the SQLite-backed peer, and prints the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from aiohttp import web

from merklog.replication import AllowList, Identity, Replica, SyncClient, make_sync_app
from merklog.store import make_fact
from merklog.store.car import car_section
from merklog.store.sqlite import SQLiteBlockStore


class CountingProxy:
    """A TCP proxy that counts bytes in both directions (the real wire size)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.up = 0
        self.down = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader, writer, up: bool) -> None:
        try:
            while data := await reader.read(1 << 16):
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _handle(self, reader, writer) -> None:
        r2, w2 = await asyncio.open_connection("127.0.0.1", self.target_port)
        await asyncio.gather(self._pipe(reader, w2, True), self._pipe(r2, writer, False))

    def reset(self) -> None:
        self.up = self.down = 0

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def facts(prefix: str, n: int, start: int = 0):
    return [make_fact(prefix, [i, f"value-{i}", i * 0.5]) for i in range(start, start + n)]


async def serve(replica: Replica, allow: AllowList) -> tuple[web.AppRunner, CountingProxy, str]:
    runner = web.AppRunner(make_sync_app({replica.dataset: replica}, allow))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    proxy = CountingProxy(site._server.sockets[0].getsockname()[1])
    port = await proxy.start()
    return runner, proxy, f"http://127.0.0.1:{port}"


def copy_replica(src: Replica, dst: Replica) -> None:
    dst.apply_blocks(src.missing_for(dst.heads()))


def missing_sizes(src: Replica, dst: Replica) -> tuple[int, int]:
    """Raw block bytes and CAR-section bytes of what ``dst`` lacks from ``src`` (exact)."""
    deltas = src.missing_deltas(dst.heads(), dst.summary(None))
    raw = car = 0
    for cid, data in src.blocks_for(deltas):
        raw += len(data)
        car += len(car_section(cid, data))
    return raw, car


def total_block_bytes(r: Replica) -> int:
    (n,) = r.conn.execute(
        "SELECT coalesce(sum(length(b.data)), 0) FROM blocks b"
        " WHERE b.cid IN (SELECT fact FROM repl_assert_cid WHERE ds = ?)"
        " OR b.cid IN (SELECT cid FROM repl_delta WHERE ds = ? AND clock > 0)",
        (r.ds, r.ds),
    ).fetchone()
    return int(n)


async def bench_diff(tmp: Path, n: int, d: int, mode: str) -> dict:
    owner, peer = Identity.generate(), Identity.generate()
    sa = SQLiteBlockStore(tmp / f"a-{n}-{d}-{mode}.sqlite")
    sb = SQLiteBlockStore(tmp / f"b-{n}-{d}-{mode}.sqlite")
    a = Replica.create(sa.conn, sa, owner, "bench", [peer.public_key])
    a.assert_facts(facts("base", n))
    b = Replica.open(sb.conn, sb, peer, a.dataset, a.genesis.data)
    copy_replica(a, b)
    if mode == "one-way":
        a.assert_facts(facts("new", d))
    else:
        a.assert_facts(facts("na", d - d // 2))
        b.assert_facts(facts("nb", d // 2))
    raw_missing, car_missing = missing_sizes(a, b)
    raw2, car2 = missing_sizes(b, a)
    raw_missing += raw2
    car_missing += car2
    runner, proxy, url = await serve(a, AllowList({peer.public_key: None}))
    try:
        async with SyncClient(peer) as client:
            t0, c0 = time.perf_counter(), time.process_time()
            stats = await client.sync(url, b)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await proxy.close()
        await runner.cleanup()
    assert a.heads() == b.heads() and a.visible_cids() == b.visible_cids()
    missing = stats.block_bytes_received + stats.block_bytes_sent
    assert missing == raw_missing, (missing, raw_missing)
    full = total_block_bytes(a)
    sa.close()
    sb.close()
    wire = proxy.up + proxy.down
    return {
        "case": f"N={n:,} d={d:,} {mode}",
        "rtt": stats.round_trips,
        "missing": missing,
        "bodies": stats.bytes_sent + stats.bytes_received,
        "wire": wire,
        "ratio_bodies": (stats.bytes_sent + stats.bytes_received) / missing,
        "ratio_wire": wire / missing,
        "car": car_missing,
        "full": full,
        "wall": wall,
        "cpu": cpu,
    }


async def bench_initial(tmp: Path, n: int, ipfs_api: str | None = None) -> dict:
    """Initial sync of ``n`` facts into an empty SQLite replica, from a peer whose blocks
    are in SQLite, or (``ipfs_api``) on that IPFS daemon (pinned, with its local cache)."""
    owner, peer = Identity.generate(), Identity.generate()
    if ipfs_api is None:
        sa = SQLiteBlockStore(tmp / f"ia-{n}.sqlite")
    else:
        from merklog.store.ipfs_home import IPFSHomeStore

        sa = IPFSHomeStore(tmp / f"ia-ipfs-{n}.sqlite", ipfs_api, timeout=600)
    sb = SQLiteBlockStore(tmp / f"ib-{n}-{ipfs_api is not None}.sqlite")
    a = Replica.create(sa.conn, sa, owner, "bench", [peer.public_key])
    t0 = time.perf_counter()
    a.assert_facts(facts("base", n))
    write_time = time.perf_counter() - t0
    runner, proxy, url = await serve(a, AllowList({peer.public_key: None}))
    try:
        async with SyncClient(peer) as client:
            t0, c0 = time.perf_counter(), time.process_time()
            b, stats = await client.clone(url, a.dataset, sb.conn, sb)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await proxy.close()
        await runner.cleanup()
    assert b.visible_cids() == a.visible_cids() and len(b.visible_cids()) == n
    missing = stats.block_bytes_received
    wire = proxy.up + proxy.down
    result = {
        "case": f"initial sync N={n:,}" + (" from IPFS" if ipfs_api else ""),
        "rtt": stats.round_trips,
        "missing": missing,
        "bodies": stats.bytes_sent + stats.bytes_received,
        "wire": wire,
        "ratio_bodies": (stats.bytes_sent + stats.bytes_received) / missing,
        "ratio_wire": wire / missing,
        "car": sum(len(car_section(c, d)) for c, d in b.blocks_for(b.missing_deltas([b.dataset]))),
        "full": missing,
        "wall": wall,
        "cpu": cpu,
        "write": write_time,
    }
    sa.close()
    sb.close()
    return result


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'case':<28} {'RTs':>3} {'missing B':>11} {'CAR(miss) B':>11} {'wire B':>11}"
        f" {'wire/miss':>9} {'wire/CAR':>8} {'bodies/miss':>11} {'full copy B':>12}"
        f" {'wall s':>7} {'cpu s':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['case']:<28} {r['rtt']:>3} {r['missing']:>11,} {r['car']:>11,} {r['wire']:>11,}"
            f" {r['ratio_wire']:>9.3f} {r['wire'] / r['car']:>8.3f} {r['ratio_bodies']:>11.3f}"
            f" {r['full']:>12,} {r['wall']:>7.3f} {r['cpu']:>6.2f}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--diffs", type=int, nargs="+", default=[1, 100, 10_000])
    parser.add_argument("--modes", nargs="+", default=["one-way", "two-way"])
    parser.add_argument("--initial", type=int, default=100_000)
    parser.add_argument("--ipfs", action="store_true", help="also from an IPFS-backed peer")
    parser.add_argument("--ipfs-api", default=None, help="IPFS daemon API (default: start one)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for n in args.sizes:
            for d in args.diffs:
                if d > n:
                    continue
                for mode in args.modes:
                    if mode == "two-way" and d < 2:
                        continue
                    rows.append(await bench_diff(tmp, n, d, mode))
                    print(f"  done: {rows[-1]['case']}", flush=True)
        initial = await bench_initial(tmp, args.initial)
        rows.append(initial)
        from_ipfs = None
        if args.ipfs:
            import sys

            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from _ipfs import ipfs_api

            with ipfs_api(args.ipfs_api) as api:
                from_ipfs = await bench_initial(tmp, args.initial, api)
            rows.append(from_ipfs)
    print_table(rows)
    if from_ipfs is not None:
        ratio = from_ipfs["wall"] / initial["wall"]
        print(
            f"\ninitial sync of {args.initial:,} facts from an IPFS-backed peer:"
            f" {from_ipfs['wall']:.2f} s wall = {ratio:.2f}x the SQLite-backed peer"
            f" (goal <= 2x: {'met' if ratio <= 2 else 'NOT met'}); writing them into the"
            f" IPFS-backed peer took {from_ipfs['write']:.2f} s"
            f" (SQLite: {initial['write']:.2f} s)"
        )
    print(
        f"\ninitial sync of {args.initial:,} facts over loopback: {initial['wall']:.2f} s wall,"
        f" {initial['cpu']:.2f} s CPU (local write of the same facts: {initial['write']:.2f} s;"
        f" goal <= 5 s); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        "missing = raw bytes of the blocks that had to move; CAR(miss) = the same blocks as CAR"
        " sections (+CID +varint); wire = every TCP byte both ways incl. HTTP headers."
    )


if __name__ == "__main__":
    asyncio.run(main())
