"""Load bench: N concurrent clients writing and querying one node on 127.0.0.1.

Starts a real ``merklog node run`` in a throwaway home (or uses --url/--token),
runs a bounded request loop for --duration seconds with --clients clients, each
alternating a write (POST /v1/facts; Datalog text and typed JSON facts in turn)
and a query (GET /v1/query), every request authenticated with the node's bearer
token as the defaults require, then checks (following the pages of GET
/v1/facts) that every acknowledged write is visible. Prints throughput and
p50/p99 latency per request kind; exits non-zero on any error answer (4xx or
5xx) or lost write.

    .venv/bin/python bench/load.py --clients 50 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

import aiohttp
from _node import start_node as run_node


def start_node(home: Path) -> tuple[subprocess.Popen, str, str]:
    py = sys.executable
    subprocess.run(
        [py, "-m", "merklog.node.cli", "--home", str(home), "init"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    proc, url = run_node([py, "-m", "merklog.node.cli"], home)
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    token = tomllib.loads((home / "config.toml").read_text())["api"]["token"]
    return proc, url, token


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def client(
    n: int, session: aiohttp.ClientSession, url: str, token: str, until: float, stats: dict
) -> None:
    i = 0
    headers = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < until:
        t0 = time.perf_counter()
        # Alternate the two write forms: Datalog text and typed JSON facts.
        body = (
            {"assert": f"load({n}, {i})."}
            if i % 2 == 0
            else {"assert": [{"rel": "load", "args": [n, i]}]}
        )
        async with session.post(url + "/v1/facts", json=body, headers=headers) as resp:
            await resp.read()
            stats["status"].append(resp.status)
            if resp.status == 200:
                stats["acked"].add((n, i))
        stats["write"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        async with session.get(
            url + "/v1/query", params={"q": f"load({n}, X)"}, headers=headers
        ) as resp:
            body = await resp.json()
            stats["status"].append(resp.status)
            if resp.status == 200 and len(body["rows"]) < i + 1:
                stats["stale"] += 1
        stats["query"].append(time.perf_counter() - t0)
        i += 1


async def bench(url: str, token: str, clients: int, duration: float) -> dict:
    stats: dict = {"write": [], "query": [], "status": [], "acked": set(), "stale": 0}
    limit = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=limit) as session:
        until = time.monotonic() + duration
        t0 = time.perf_counter()
        await asyncio.gather(
            *(client(n, session, url, token, until, stats) for n in range(clients))
        )
        stats["elapsed"] = time.perf_counter() - t0
        facts: list[dict] = []
        params = {"rel": "load", "limit": "10000"}
        headers = {"Authorization": f"Bearer {token}"}
        while True:
            async with session.get(url + "/v1/facts", params=params, headers=headers) as resp:
                page = await resp.json()
                if resp.status != 200:  # a wrong token: the node's own words
                    raise SystemExit(f"load.py: GET /v1/facts answered {resp.status}: {page}")
            facts += page["facts"]
            if not page.get("next"):
                break
            params["after"] = page["next"]
    present = set()
    for f in facts:
        a, b = f["fact"][5:-1].split(", ")
        present.add((int(a), int(b)))
    stats["lost"] = len(stats["acked"] - present)
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--url", default=None, help="Use a running node instead of starting one.")
    ap.add_argument("--token", default=os.environ.get("MERKLOG_API_TOKEN", ""))
    args = ap.parse_args()
    if args.clients < 1 or args.duration <= 0:
        ap.error("--clients must be at least 1 and --duration above 0")
    proc = None
    tmp = None
    try:
        if args.url:
            url, token = args.url.rstrip("/"), args.token
        else:
            tmp = tempfile.TemporaryDirectory(prefix="merklog-load-")
            proc, url, token = start_node(Path(tmp.name) / "home")
        s = asyncio.run(bench(url, token, args.clients, args.duration))
    except aiohttp.ClientConnectionError as exc:
        raise SystemExit(f"load.py: cannot reach {url}: {exc}") from None
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if tmp is not None:
            tmp.cleanup()
    e = s["elapsed"]
    n5 = sum(1 for c in s["status"] if c >= 500)
    n4 = sum(1 for c in s["status"] if 400 <= c < 500)
    w, q = s["write"], s["query"]
    print(f"clients={args.clients} duration={e:.1f}s requests={len(w) + len(q)}")
    for name, lat in (("write", w), ("query", q)):
        print(
            f"{name:5s}: {len(lat) / e:8.1f} req/s  p50 {pct(lat, 50) * 1000:7.2f} ms  "
            f"p99 {pct(lat, 99) * 1000:7.2f} ms  (mean {statistics.fmean(lat) * 1000:.2f} ms)"
        )
    print(
        f"total: {(len(w) + len(q)) / e:8.1f} req/s; write/query throughput ratio "
        f"{len(w) / max(1, len(q)):.2f}"
    )
    print(
        f"acknowledged writes {len(s['acked'])}, lost {s['lost']}, errors: 5xx {n5}, 4xx {n4}, "
        f"queries not yet seeing own write {s['stale']}"
    )
    if n5 or n4 or s["lost"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
