"""Rare-relation pages: ``merklog ls RARE`` through a running node on a home of N facts of
another relation (ADR 0095), the page read in process by the relation index against the
scan it replaced (ADR 0077: forward over every visible fact, other relations' blocks
skipped by their first bytes), and the one-time backfill of a home made before the index.

    .venv/bin/python bench/relpage.py --facts 200000

Prints CPU beside wall (the load average too: the machine is shared) and the ratio of the
two page reads measured in the same process, medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _node import start_node

CLI = [sys.executable, "-m", "merklog.node.cli"]
RARE = ["rare(1).", "rare(1.0).", "rare(true).", 'rare("1").', 'rare(x"01").']


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process, stdout) of one command run to completion."""
    before, start = children_cpu(), time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - start, children_cpu() - before, out


def scan_page(node, rel: str, limit: int):
    """The ADR 0077 page (the code this bench compares with): forward over the visible
    set from the cursor, other relations' blocks skipped by their first bytes."""
    from merklog.replication.paging import visible_after
    from merklog.store import decode_fact, encode

    want = b"\xa2crel" + encode(rel)
    page, cursor = [], None
    while True:
        cids = visible_after(node.replica, cursor, max(limit, 1000))
        for cid, data in node.store.get_many(cids):
            if data.startswith(b"\xa2crel") and not data.startswith(want):
                continue
            fact = decode_fact(data)
            if fact.rel == rel:
                page.append((cid, fact))
                if len(page) == limit:
                    return page
        if len(cids) < max(limit, 1000):
            return page
        cursor = cids[-1]


def median_cpu(fn, repeat: int) -> tuple[float, float, object]:
    cpus, walls, result = [], [], None
    for _ in range(repeat):
        c, w = time.process_time(), time.perf_counter()
        result = fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
    return statistics.median(cpus), statistics.median(walls), result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--facts", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="relpage-") as tmp:
        home = Path(tmp) / "home"
        subprocess.run([*CLI, "--home", str(home), "init"], check=True, capture_output=True)
        src = Path(tmp) / "facts.dl"
        with src.open("w") as f:
            for i in range(args.facts):
                f.write(f'common({i}, {i}.5, "{i}").\n')
            f.write("\n".join(RARE) + "\n")
        wall, cpu, _ = timed([*CLI, "--home", str(home), "put", "-f", str(src)])
        print(f"load: {os.getloadavg()[0]:.1f}; home of {args.facts} + {len(RARE)} facts")
        print(f"put -f (stopped home, index written): wall {wall:.2f} s, CPU {cpu:.2f} s")

        # The one-time backfill of a home made before the index (same tables without it).
        conn = sqlite3.connect(home / "store.sqlite")
        with conn:
            conn.execute("DROP TABLE repl_rel_fact")
            conn.execute("DROP TABLE repl_rel_range")
            conn.execute("DROP TABLE repl_index")
        conn.close()
        wall, cpu, _ = timed([*CLI, "--home", str(home), "status", "--json"])
        again_wall, again_cpu, _ = timed([*CLI, "--home", str(home), "status", "--json"])
        print(
            f"first open of an old home (backfill): wall {wall:.2f} s, CPU {cpu:.2f} s;"
            f" next open: wall {again_wall:.2f} s, CPU {again_cpu:.2f} s"
        )

        proc, url = start_node(CLI, home)
        try:
            runs = []
            for _ in range(args.repeat):
                node_before = proc_cpu(proc.pid)
                wall, cpu, out = timed([*CLI, "--home", str(home), "ls", "rare"])
                runs.append((wall, cpu, proc_cpu(proc.pid) - node_before))
                assert len(out.splitlines()) == len(RARE), out
            wall, cpu, node_cpu = (statistics.median(r[i] for r in runs) for i in range(3))
            print(
                f"`merklog ls rare` through the running node (median of {args.repeat}):"
                f" wall {wall:.3f} s, CLI CPU {cpu:.3f} s, node CPU {node_cpu:.3f} s;"
                f" load {os.getloadavg()[0]:.1f}"
            )
        finally:
            proc.terminate()
            proc.wait()

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import merklog

        with merklog.open(home) as node:
            new_cpu, new_wall, page = median_cpu(
                lambda: node.page_facts("rare", None, 1000)[0], args.repeat
            )
            old_cpu, old_wall, old = median_cpu(lambda: scan_page(node, "rare", 1000), args.repeat)
            assert [c for c, _f in page] == [c for c, _f in old] and len(page) == len(RARE)
        print(
            f"one rel=rare page in process (median of {args.repeat}): index {new_cpu * 1e3:.2f} ms"
            f" CPU ({new_wall * 1e3:.2f} ms wall), ADR 0077 scan {old_cpu * 1e3:.1f} ms CPU"
            f" ({old_wall * 1e3:.1f} ms wall); scan/index CPU ratio {old_cpu / new_cpu:.0f};"
            f" load {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
