"""What the per-relation fact index (ADR 0095) costs the write paths, inner layer:
``Replica.assert_facts`` of N facts (a local write) and ``apply_blocks`` of the same
blocks on a second replica (a sync or an import), each on a real SQLite file, with the
index insert and with it replaced by a no-op, interleaved in one process.

    .venv/bin/python bench/relindex_cost.py --facts 100000 --rounds 7

Prints CPU medians and the with/without ratios, and the load average: the machine is
shared, so compare ratios measured in the same run. The user-path figure is
``bench/ingest.py`` (``merklog put -f`` as a subprocess), which includes this insert.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from merklog.replication import relindex
from merklog.replication.identity import Identity
from merklog.replication.replica import Replica
from merklog.store import make_fact
from merklog.store.sqlite import SQLiteBlockStore


def one_round(n: int, indexed: bool, where: Path) -> tuple[float, float]:
    """(CPU s of the local write, CPU s of applying its blocks on a peer)."""
    relindex.record = REAL if indexed else (lambda conn, rows: None)
    a_store = SQLiteBlockStore(where / "a.sqlite")
    b_store = SQLiteBlockStore(where / "b.sqlite")
    try:
        a = Replica.create(a_store.conn, a_store, Identity.generate(), "d")
        facts = [make_fact("e", [i, float(i), str(i)]) for i in range(n)]
        start = time.process_time()
        a.assert_facts(facts)
        local = time.process_time() - start
        b = Replica.open(b_store.conn, b_store, Identity.generate(), a.genesis.cid, a.genesis.data)
        blocks = list(a.missing_for([a.dataset]))
        start = time.process_time()
        b.apply_blocks(blocks)
        return local, time.process_time() - start
    finally:
        relindex.record = REAL
        a_store.close()
        b_store.close()


REAL = relindex.record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--facts", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    print(f"load before: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="relindex-cost-") as tmp:
        for r in range(args.rounds):
            for indexed in (False, True):
                where = Path(tmp) / f"{r}-{int(indexed)}"
                where.mkdir()
                runs[indexed].append(one_round(args.facts, indexed, where))
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in runs.items()}
    for what, i in (("local write", 0), ("apply on a peer", 1)):
        print(
            f"{what} of {args.facts} facts: without index {med[False][i]:.3f} s CPU,"
            f" with {med[True][i]:.3f} s CPU, ratio {med[True][i] / med[False][i]:.3f}"
            f" (medians of {args.rounds})"
        )
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
