"""Ingest benchmark: facts/s for encode+CID and for durable SQLite ingest, side by side.

    python bench/ingest.py            # 1M facts
    python bench/ingest.py --n 100000 # scaled down
    python bench/ingest.py --put-n 20000 --ipfs-api /ip4/127.0.0.1/tcp/5001/http

The user's path, whole processes on the same facts (``--put-n``, 0 = skip): ``merklog
put -f`` into a SQLite home and into an IPFS home (blocks on a js-ipfs daemon on
loopback: the one at ``--ipfs-api``, else a private one from tests/ipfs), beside the
daemon's floor: one raw ``dag/import`` of the same blocks, no merklog, no pins.

Measures in one run, on the same generated facts:
- reference encode+CID (dag-cbor + multiformats; on a sample, it is slow),
- fast encode+CID (libipld + hashlib, what the stores use),
- raw sha2-256 of the same block bytes (the upper limit of any encode+CID),
- durable ingest into SQLiteBlockStore (WAL, synchronous=FULL) in batch transactions,
and prints each rate with its ratio to the others. Goals: ≥200k facts/s encode+CID,
≥100k facts/s durable ingest.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

from merklog.store import Link, fact_block, fact_block_reference, make_fact  # noqa: E402
from merklog.store.codec import encode_facts  # noqa: E402
from merklog.store.sqlite import SQLiteBlockStore  # noqa: E402


def generate(n: int, start: int = 0) -> list:
    """Facts shaped like typical app data: a few relations, ints, strings, floats, bools."""
    facts = []
    for i in range(start, start + n):
        kind = i % 4
        if kind == 0:
            facts.append(make_fact("edge", [i, i + 1]))
        elif kind == 1:
            facts.append(make_fact("name", [i, f"user-{i}"]))
        elif kind == 2:
            facts.append(make_fact("score", [i, i * 0.25, i % 7 == 0]))
        else:
            facts.append(make_fact("event", [i, "click", f"/page/{i % 1000}", 1_700_000_000 + i]))
    return facts


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


class Timer:
    """Wall-clock and process-CPU seconds of a block (the machine may be shared: both matter)."""

    def __enter__(self) -> Timer:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def bench_reference(facts: list) -> Timer:
    with Timer() as t:
        for fact in facts:
            Link.for_dag_cbor(fact_block_reference(fact))
    return t


def bench_fast(facts: list) -> Timer:
    with Timer() as t:
        encode_facts(facts)
    return t


def bench_sha256(blocks: list[bytes]) -> Timer:
    sha256 = hashlib.sha256
    with Timer() as t:
        for data in blocks:
            sha256(data).digest()
    return t


def bench_sqlite(facts: list, batch: int, directory: str) -> tuple[Timer, int]:
    store = SQLiteBlockStore(os.path.join(directory, "ingest.sqlite"))
    with Timer() as t:
        for i in range(0, len(facts), batch):
            store.put_facts(facts[i : i + batch])
    stored = store.count_facts()
    store.close()
    return t, stored


class ChildTimer:
    """Wall-clock and child-process CPU seconds of a block that runs a subprocess."""

    def __enter__(self) -> ChildTimer:
        self.wall = time.perf_counter()
        t = os.times()
        self.cpu = t.children_user + t.children_system
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        t = os.times()
        self.cpu = t.children_user + t.children_system - self.cpu


def merklog(home: Path, *args: str) -> str:
    """Run the ``merklog`` CLI as a user would (a new process); its stdout."""
    cmd = [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"merklog {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def bench_put(facts: list, tmp: Path, name: str, *init: str) -> ChildTimer:
    """``merklog put -f`` of ``facts`` into a fresh home (``merklog init *init``)."""
    import json

    home = tmp / name
    merklog(home, "init", *init)
    src = tmp / f"{name}.dl"
    src.write_text("".join(f"{f}.\n" for f in facts))
    with ChildTimer() as t:
        merklog(home, "put", "-f", str(src))
    stored = json.loads(merklog(home, "status", "--json"))["facts"]
    if stored != len(set(facts)):
        raise SystemExit(f"{name}: {stored} facts visible, expected {len(set(facts))}")
    return t


def bench_dag_import_floor(n: int, api: str) -> Timer:
    """The daemon alone: one ``dag/import`` (no pins) of ``n`` fact blocks shaped like the
    benchmark's (``generate`` from offset 10**7, so the daemon has none of them yet and
    the IPFS home's own blocks stay new to it too)."""
    from merklog.store.ipfs import IPFSBlockStore

    blocks = encode_facts(generate(n, start=10**7))
    store = IPFSBlockStore(api, timeout=600, pin=False)
    try:
        with Timer() as t:
            store.import_blocks(blocks)
    finally:
        store.close()
    return t


def put_paths(facts: list, api_arg: str | None, with_ipfs: bool, directory: str | None) -> list:
    """Rows (name, count, timer) for the whole-process ``put -f`` comparison."""
    rows = []
    with tempfile.TemporaryDirectory(dir=directory, prefix="merklog-put-") as tmpdir:
        tmp = Path(tmpdir)
        rows.append(
            ("merklog put -f, SQLite home (process)", len(facts), bench_put(facts, tmp, "sqlite"))
        )
        if with_ipfs:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from _ipfs import ipfs_api

            with ipfs_api(api_arg) as api:
                floor = bench_dag_import_floor(len(facts), api)
                home = bench_put(facts, tmp, "ipfs", "--store", "ipfs", "--ipfs-api", api)
            rows.append(("merklog put -f, IPFS home (process)", len(facts), home))
            rows.append(("floor: raw dag/import, as many blocks, no pins", len(facts), floor))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="facts to ingest (default 1M)")
    parser.add_argument(
        "--batch",
        type=int,
        default=200_000,
        help="facts per SQLite transaction (fewer, larger commits rewrite fewer B-tree pages)",
    )
    parser.add_argument(
        "--reference-sample", type=int, default=50_000, help="facts for the slow reference codec"
    )
    parser.add_argument("--dir", default=None, help="directory for the SQLite file (default tmp)")
    parser.add_argument(
        "--put-n", type=int, default=20_000, help="facts for the merklog put -f runs (0 = skip)"
    )
    parser.add_argument("--ipfs-api", default=None, help="IPFS daemon API (default: start one)")
    parser.add_argument("--no-ipfs", action="store_true", help="skip the IPFS home")
    args = parser.parse_args(argv)

    print(f"generating {args.n:,} facts …", flush=True)
    facts = generate(args.n)
    sample = facts[: min(args.n, args.reference_sample)]
    blocks = [fact_block(f) for f in facts]
    mean_size = sum(map(len, blocks)) / len(blocks)
    print(f"mean block size {mean_size:.1f} bytes", flush=True)

    # The generated input is long-lived: keep the cyclic GC from re-walking it in every run.
    gc.collect()
    gc.freeze()
    reference = bench_reference(sample)
    fast = bench_fast(facts)
    sha = bench_sha256(blocks)
    del blocks
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="merklog-bench-") as tmp:
        durable, stored = bench_sqlite(facts, args.batch, tmp)
    if stored != len(set(facts)):
        print(f"error: stored {stored} facts, expected {len(set(facts))}", file=sys.stderr)
        return 1
    put_rows = []
    if args.put_n:
        print(f"merklog put -f of {args.put_n:,} facts (whole processes) …", flush=True)
        put_rows = put_paths(facts[: args.put_n], args.ipfs_api, not args.no_ipfs, args.dir)

    rows = [
        (f"encode+CID reference (dag-cbor, {len(sample):,} facts)", len(sample), reference),
        ("encode+CID fast (libipld + hashlib)", len(facts), fast),
        ("raw sha2-256 of the same bytes (limit)", len(facts), sha),
        (f"durable SQLite ingest, batches of {args.batch:,}", len(facts), durable),
    ]
    fast_rate = rate(len(facts), fast.wall)
    sha_rate = rate(len(facts), sha.wall)
    print()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'measure':<50} {'facts/s wall':>13} {'facts/s CPU':>12} {'÷ fast':>7} {'÷ sha256':>9}")
    for name, count, t in rows:
        wall = rate(count, t.wall)
        print(
            f"{name:<50} {wall:>13,.0f} {rate(count, t.cpu):>12,.0f} "
            f"{wall / fast_rate:>7.2f} {wall / sha_rate:>9.3f}"
        )
    if put_rows:
        print()
        sqlite_put = rate(put_rows[0][1], put_rows[0][2].wall)
        print(
            f"{'user path (CPU = the merklog process)':<50} {'facts/s wall':>13} {'facts/s CPU':>12} {'÷ SQLite':>9}"
        )
        for name, count, t in put_rows:
            wall = rate(count, t.wall)
            print(
                f"{name:<50} {wall:>13,.0f} {rate(count, t.cpu):>12,.0f} {wall / sqlite_put:>9.3f}"
            )
        if len(put_rows) == 3:
            ipfs_put = rate(put_rows[1][1], put_rows[1][2].wall)
            floor = rate(put_rows[2][1], put_rows[2][2].wall)
            print(
                f"IPFS home / daemon floor: {ipfs_put / floor:.2f} (goal: IPFS home >= 5,000 facts/s:"
                f" {'met' if ipfs_put >= 5000 else 'NOT met'})"
            )
    durable_rate = rate(len(facts), durable.wall)
    print()
    print(f"fast / reference encode+CID: {fast_rate / rate(len(sample), reference.wall):.1f}x")
    print(f"durable ingest / fast encode+CID: {durable_rate / fast_rate:.2f}")
    goals = [
        ("encode+CID >= 200k/s", fast_rate >= 200_000),
        ("durable ingest >= 100k/s", durable_rate >= 100_000),
    ]
    print(
        "goals (wall clock): " + ", ".join(f"{g}: {'met' if ok else 'NOT met'}" for g, ok in goals)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
