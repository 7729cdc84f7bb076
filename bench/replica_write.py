"""Inner-layer figures of the local write path: ``Replica.write_asserts`` CPU per fact and
the WAL bytes one commit adds, on the facts ``bench/ingest.py`` generates.

    python bench/replica_write.py                 # 1M facts in 200k-fact calls
    python bench/replica_write.py --batch 20000   # a running node's request size
    python bench/replica_write.py --wal           # WAL bytes of one commit into 800k facts

The headline figures of the write path are whole processes (``bench/ingest.py``); these
sit beside them to tell which layer a change moved (ADR 0132). To compare two versions,
run this file under each with ``PYTHONPATH`` pointing at a copy of the other's package.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import generate  # noqa: E402

from merklog.replication.identity import Identity  # noqa: E402
from merklog.replication.replica import Replica  # noqa: E402
from merklog.store.codec import encode_facts  # noqa: E402
from merklog.store.sqlite import SQLiteBlockStore  # noqa: E402


def write_cpu(directory: str, n: int, batch: int) -> list[float]:
    """CPU µs a fact of each ``write_asserts`` call of ``batch`` facts into a new home."""
    store = SQLiteBlockStore(os.path.join(directory, "w.sqlite"))
    replica = Replica.create(store.conn, store, Identity.generate(), "bench")
    out = []
    for start in range(0, n, batch):
        facts = generate(batch, start)
        encoded = encode_facts(facts)
        t = time.process_time()
        replica.write_asserts(facts, encoded)
        out.append((time.process_time() - t) / batch * 1e6)
    store.close()
    return out


def wal_bytes(directory: str, base: int, sizes: list[int]) -> list[tuple[int, int, float]]:
    """``(facts, WAL bytes, CPU µs a fact)`` of single commits into a ``base``-fact home,
    with automatic checkpoints off (each starts from an empty WAL)."""
    path = os.path.join(directory, "wal.sqlite")
    store = SQLiteBlockStore(path)
    replica = Replica.create(store.conn, store, Identity.generate(), "bench")
    for start in range(0, base, 200_000):
        facts = generate(min(200_000, base - start), start)
        replica.write_asserts(facts, encode_facts(facts))
    store.conn.execute("PRAGMA wal_autocheckpoint=0")
    out, at = [], base
    for size in sizes:
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        facts = generate(size, at)
        encoded = encode_facts(facts)
        at += size
        t = time.process_time()
        replica.write_asserts(facts, encoded)
        out.append((size, os.path.getsize(path + "-wal"), (time.process_time() - t) / size * 1e6))
    store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--wal", action="store_true", help="WAL bytes of single commits")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as directory:
        if args.wal:
            for size, wal, cpu in wal_bytes(directory, 800_000, [20_000, 20_000, 200_000]):
                print(
                    f"one commit of {size:,} facts into 800,000: WAL {wal / 1e6:.1f} MB"
                    f" ({wal / size:,.0f} B a fact), CPU {cpu:.1f} µs a fact"
                )
        else:
            calls = write_cpu(directory, args.n, args.batch)
            print("CPU µs a fact per call:", " ".join(f"{c:.2f}" for c in calls))
            print(f"total {sum(calls) / len(calls):.2f} µs a fact")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
