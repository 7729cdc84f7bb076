"""Accepting a history written by many writers, as a user meets it: ``merklog restore``
of a backup CAR into a fresh home, a whole process (ADR 0219).

The owner grants W writers, then they write D deltas in turn on a linear history (each
on top of the one before, one fact each): a team whose devices each have their own key.
Each W runs on the same number of deltas in the same run, so the ratio to W=1 shows what
the writers cost.

    .venv/bin/python bench/writers.py                          # W = 1, 10, 100; D = 10,000
    .venv/bin/python bench/writers.py --writers 1 1000 --deltas 20000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.replication.turns import turn_taking_blocks, writer_keys
from merklog.replication.txn import connect
from merklog.store import MemoryBlockStore
from merklog.store.car import write_car

MERKLOG = [sys.executable, "-m", "merklog.node.cli"]


def build_car(path: Path, writers: int, deltas: int) -> None:
    """A backup CAR of the history described above (genesis, then every delta with its
    fact, in clock order; the head as its root)."""
    owner_id = Identity.from_seed(b"\xee" * 32)
    owner = Replica.create(connect(":memory:"), MemoryBlockStore(), owner_id, "writers")
    blocks, head = turn_taking_blocks(owner_id, owner.dataset, writer_keys(writers), deltas)
    with open(path, "wb") as out:
        write_car(out, [head], [(owner.genesis.cid, owner.genesis.data), *blocks])


def restore(car: Path, home: Path) -> tuple[float, float, float]:
    """Wall s, CPU s and peak RSS MB of ``merklog restore CAR`` into a fresh home."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [*MERKLOG, "--home", str(home), "restore", str(car)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"restore failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", type=int, nargs="*", default=[1, 10, 100])
    ap.add_argument("--deltas", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3, help="restores per W (median shown)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {args.deltas:,} deltas, one fact each")
    print("| writers | restore wall s (median) | CPU s | peak RSS MB | ÷ 1 writer |")
    print("|---:|---:|---:|---:|---:|")
    first = None
    with tempfile.TemporaryDirectory(prefix="merklog-writers-") as tmp:
        for w in args.writers:
            car = Path(tmp) / f"w{w}.car"
            build_car(car, w, args.deltas)
            runs = [restore(car, Path(tmp) / f"h{w}-{r}") for r in range(args.runs)]
            wall, cpu, rss = sorted(runs)[len(runs) // 2]
            first = first or wall
            print(f"| {w:,} | {wall:.2f} | {cpu:.2f} | {rss:.0f} | {wall / first:.2f} |")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
