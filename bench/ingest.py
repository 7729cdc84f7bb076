"""Ingest benchmark: facts/s for encode+CID and for durable SQLite ingest, side by side.

    python bench/ingest.py            # 1M facts
    python bench/ingest.py --n 100000 # scaled down

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
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

from merklog.store import Link, fact_block, fact_block_reference, make_fact  # noqa: E402
from merklog.store.codec import encode_facts  # noqa: E402
from merklog.store.sqlite import SQLiteBlockStore  # noqa: E402


def generate(n: int) -> list:
    """Facts shaped like typical app data: a few relations, ints, strings, floats, bools."""
    facts = []
    for i in range(n):
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
