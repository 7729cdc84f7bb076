"""What a mixed-type column costs ``merklog analyze``, as a user runs it.

Two real node homes hold the same shape of data, ``k(K)`` and ``kv(K, V)`` with N
``kv`` facts: in one, every ``V`` is an int (a native bigint column in Spark); in the
other, ``V`` cycles through ints, floats, strings, bools, bytes and CIDs (the export's
value struct, ADR 0060). Each home is exported with ``merklog parquet export`` (not
timed); then the bench times the **whole** ``merklog analyze`` process (Python and JVM
start, the Spark job on ``local[2]``, Parquet outputs) over each export, and, as the
peer, the local engine (``Program.evaluate``, in process) over the same visible facts.
It checks that analyze and the engine give the same rows, then prints wall and CPU
times (CPU: the analyze process and its descendants, the JVM included, sampled from
/proc) and the mixed/int ratios, with the machine load (``uptime``) beside them.

    .venv/bin/python bench/analyze_mixed.py --facts 20000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MERKLOG = [sys.executable, "-m", "merklog.node.cli"]
ENV = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)

PROGRAM = """
n(K, N) :- k(K), N := count : kv(K, _).
s(K, S) :- k(K), S := sum V : kv(K, V).
lo(K, M) :- k(K), M := min V : kv(K, V).
hi(K, M) :- k(K), M := max V : kv(K, V).
big(K, V) :- kv(K, V), V > 100.
same(K) :- kv(K, V), kv(K2, V), K < K2.
"""


def _values(n: int, mixed: bool) -> list:
    from merklog.store import Link

    if not mixed:
        return [(i * 7919) % 1000 for i in range(n)]
    out: list = []
    for i in range(n):
        x = (i * 7919) % 1000
        out.append(
            [x, x / 4, str(x), x % 2 == 0, x.to_bytes(2, "big"), Link.for_block(b"%d" % x, 0x55)][
                i % 6
            ]
        )
    return out


def build(home: Path, n: int, mixed: bool) -> dict[str, list]:
    """A home with ``n`` kv facts (not timed); returns its visible facts."""
    import merklog

    groups = max(1, n // 20)
    facts = [("k", (g,)) for g in range(groups)]
    facts += [("kv", (i % groups, v)) for i, v in enumerate(_values(n, mixed))]
    with merklog.open(home) as node:
        for start in range(0, len(facts), 2000):
            node.write(asserts=facts[start : start + 2000], evaluate=False)
        visible: dict[str, list] = {}
        for _cid, fact in node.list_facts():
            visible.setdefault(fact.rel, []).append(tuple(fact.args))
    return visible


def _tree_cpu(root: int, seen: dict[int, float]) -> None:
    """Record the CPU seconds (user + system) of ``root`` and every descendant, from
    /proc: the JVM that pyspark starts is not waited for by the analyze process, so
    ``RUSAGE_CHILDREN`` would not count it."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    for pid, cpu in times.items():
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            seen[pid] = max(seen.get(pid, 0.0), cpu)


def run_analyze(prog: Path, export: Path, out: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one whole ``merklog analyze`` process and its JVM (CPU
    sampled from /proc every 0.1 s: at most that much of each process's last slice is
    missed)."""
    cmd = [*MERKLOG, "analyze", str(prog), "--input", str(export), "--out", str(out)]
    t = time.perf_counter()
    proc = subprocess.Popen(
        [*cmd, "--master", "local[2]"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    seen: dict[int, float] = {}
    while proc.poll() is None:
        _tree_cpu(proc.pid, seen)
        time.sleep(0.1)
    wall = time.perf_counter() - t
    stderr = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"analyze failed:\n{stderr[-3000:]}")
    return wall, sum(seen.values())


def read_outputs(out: Path) -> dict:
    import pyarrow.parquet as pq

    from merklog.engine.rows import RowSet, engine_rows
    from merklog.node.spark.schema import decode_args

    got = {}
    for rel_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        rows = [decode_args(r["args"]) for r in pq.read_table(rel_dir).to_pylist()]
        got[rel_dir.name] = RowSet(engine_rows(rows))
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from merklog.engine.program import Program

    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        prog = tmp / "prog.dl"
        prog.write_text(PROGRAM)
        figures = {}
        for name, mixed in (("int", False), ("mixed", True)):
            visible = build(tmp / f"home-{name}", args.facts, mixed)
            export = tmp / f"export-{name}"
            subprocess.run(
                [*MERKLOG, "--home", str(tmp / f"home-{name}"), "parquet", "export", str(export)],
                check=True,
                capture_output=True,
                env=ENV,
            )
            runs = []
            for i in range(args.repeat):
                out = tmp / f"out-{name}-{i}"
                runs.append(run_analyze(prog, export, out))
            t = time.process_time()
            expected = Program.parse(PROGRAM).evaluate(visible)
            engine_cpu = time.process_time() - t
            got = read_outputs(out)
            for rel in ("n", "s", "lo", "hi", "big", "same"):
                assert got.get(rel, set()) == expected.get(rel, set()), (name, rel)
            walls = sorted(w for w, _c in runs)
            cpus = sorted(c for _w, c in runs)
            figures[name] = (walls[len(walls) // 2], cpus[len(cpus) // 2], engine_cpu)
        load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        print(f"kv facts: {args.facts}, medians of {args.repeat} runs; load: {load}")
        for name, (wall, cpu, eng) in figures.items():
            print(
                f"{name:>5}: merklog analyze wall {wall:6.1f} s, CPU {cpu:6.1f} s;"
                f" local engine (in process) CPU {eng:5.2f} s"
            )
        (w0, c0, e0), (w1, c1, e1) = figures["int"], figures["mixed"]
        print(
            f"mixed/int: analyze wall {w1 / w0:.2f}x, CPU {c1 / c0:.2f}x; engine CPU {e1 / e0:.2f}x"
        )


if __name__ == "__main__":
    main()
