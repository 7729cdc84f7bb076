"""Engine benchmark: merklog vs DuckDB vs a plain-Python semi-naive floor, side by side.

    python bench/engine.py                 # every standard workload
    python bench/engine.py --only tc_chain --scale 0.5

Workloads (generated deterministically, seed 42):
- tc_chain:   transitive closure of a chain of 2,000 nodes (~2M paths, 2,000 iterations)
- tc_random:  transitive closure of a random graph, n=2,000, m=4,000
- same_gen:   same-generation over a complete binary tree of depth 10 (2,047 nodes)
- negation:   nodes unreachable from node 0 in a random graph of 1M nodes, 1.5M edges
- aggregate:  count and sum per group over 1M facts in 1,000 groups

Each (engine, workload) runs in its own subprocess (merklog and DuckDB ``--repeat``
times, fastest kept) on the same data (written once
to an .npz file), so wall time covers evaluation only (data is in memory before
the clock starts: numpy arrays for merklog, DuckDB tables, Python tuple lists) and
peak RSS is the whole child's (imports and data included). DuckDB runs
recursive CTEs with ``SET threads=1``; merklog's columnar executor is numpy
(single-threaded). Every engine's result is summarised as (row count, checksum)
and the run fails loudly if they disagree. Goals: merklog ≤ 1.5× DuckDB's time,
≥ 3× faster than the Python floor.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout too

ENGINES = ("merklog", "duckdb", "python")

# ----------------------------------------------------------------------------- workloads

TC = """
path(X, Y) :- edge(X, Y).
path(X, Y) :- path(X, Z), edge(Z, Y).
"""
TC_SQL = """
CREATE TABLE result AS
WITH RECURSIVE path(x, y) AS (
    SELECT x, y FROM edge
    UNION
    SELECT path.x, edge.y FROM path JOIN edge ON path.y = edge.x
) SELECT x, y FROM path
"""

SG = """
sg(X, Y) :- parent(X, P), parent(Y, P), X != Y.
sg(X, Y) :- parent(X, A), sg(A, B), parent(Y, B).
"""
SG_SQL = """
CREATE TABLE result AS
WITH RECURSIVE sg(x, y) AS (
    SELECT a.c, b.c FROM parent a JOIN parent b ON a.p = b.p WHERE a.c <> b.c
    UNION
    SELECT a.c, b.c FROM parent a JOIN sg ON a.p = sg.x JOIN parent b ON b.p = sg.y
) SELECT x, y FROM sg
"""

NEG = """
reach(X) :- source(X).
reach(Y) :- reach(X), edge(X, Y).
unreachable(X) :- node(X), !reach(X).
"""
NEG_SQL = """
CREATE TABLE result AS
WITH RECURSIVE reach(x) AS (
    SELECT x FROM source
    UNION
    SELECT edge.y FROM reach JOIN edge ON reach.x = edge.x
) SELECT x FROM node WHERE x NOT IN (SELECT x FROM reach)
"""

AGG = """
stats(G, C, S) :- grp(G), C := count : sale(_, G, _), S := sum A : sale(_, G, A).
"""
AGG_SQL = """
CREATE TABLE result AS
SELECT grp.g, count(sale.id), coalesce(sum(sale.a), 0)
FROM grp LEFT JOIN sale ON sale.g = grp.g GROUP BY grp.g
"""

WORKLOADS = {
    "tc_chain": (TC, TC_SQL, "path"),
    "tc_random": (TC, TC_SQL, "path"),
    "same_gen": (SG, SG_SQL, "sg"),
    "negation": (NEG, NEG_SQL, "unreachable"),
    "aggregate": (AGG, AGG_SQL, "stats"),
}

COLUMNS = {
    "edge": ("x", "y"),
    "parent": ("c", "p"),
    "source": ("x",),
    "node": ("x",),
    "grp": ("g",),
    "sale": ("id", "g", "a"),
}


def generate(name: str, scale: float) -> dict[str, np.ndarray]:
    """The input relations of a workload as 2-D int64 arrays."""
    rng = np.random.default_rng(42)
    if name == "tc_chain":
        n = int(2000 * scale)
        return {"edge": np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)}
    if name == "tc_random":
        n, m = int(2000 * scale), int(4000 * scale)
        edges = np.unique(rng.integers(0, n, size=(m, 2)), axis=0)
        return {"edge": edges}
    if name == "same_gen":
        depth = 10
        nodes = np.arange(1, 2 ** (depth + 1) - 1)  # every non-root node of a heap-numbered tree
        return {"parent": np.stack([nodes, (nodes - 1) // 2], axis=1)}
    if name == "negation":
        n, m = int(1_000_000 * scale), int(1_500_000 * scale)
        edges = np.unique(rng.integers(0, n, size=(m, 2)), axis=0)
        return {
            "edge": edges,
            "node": np.arange(n).reshape(-1, 1),
            "source": np.array([[0]]),
        }
    if name == "aggregate":
        n, groups = int(1_000_000 * scale), 1000
        ids = np.arange(n)
        return {
            "sale": np.stack(
                [ids, rng.integers(0, groups, size=n), rng.integers(1, 1000, size=n)], axis=1
            ),
            "grp": np.arange(groups + 10).reshape(-1, 1),  # 10 empty groups: count/sum = 0
        }
    raise ValueError(name)


def summarise(cols: list[np.ndarray]) -> tuple[int, int]:
    """(row count, order-independent checksum) of a result given as int64 columns."""
    if not cols or len(cols[0]) == 0:
        return 0, 0
    h = np.zeros(len(cols[0]), dtype=np.uint64)
    for c in cols:
        h = (h * np.uint64(1_000_003)) ^ c.astype(np.uint64)
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
    return len(cols[0]), int(np.bitwise_xor.reduce(h) ^ np.uint64(len(cols[0])))


# ----------------------------------------------------------------------------- engines


def run_merklog(name: str, data: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    from merklog.engine import Program, checks, columnar, parser  # noqa: F401  (imported, like duckdb)

    text, _sql, out = WORKLOADS[name]
    data = {rel: np.asfortranarray(arr) for rel, arr in data.items()}  # columnar load
    start = time.perf_counter()
    rels = Program.parse(text).evaluate(data)
    count = rels.count(out)
    elapsed = time.perf_counter() - start
    cols = rels.columns(out)
    if cols is None:
        rows = rels.sorted(out)
        cols = [np.array(c, dtype=np.int64) for c in zip(*rows, strict=True)] if rows else []
    assert count == (len(cols[0]) if cols else 0)
    return elapsed, cols


def run_duckdb(name: str, data: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    import duckdb

    _text, sql, _out = WORKLOADS[name]
    con = duckdb.connect()
    con.execute("SET threads=1")
    import pyarrow as pa

    for rel, arr in data.items():
        names = COLUMNS[rel]
        table = pa.table({c: np.ascontiguousarray(arr[:, j]) for j, c in enumerate(names)})
        con.register("input_view", table)
        con.execute(f"CREATE TABLE {rel} AS SELECT * FROM input_view")
        con.unregister("input_view")
    start = time.perf_counter()
    con.execute(sql)
    con.execute("SELECT count(*) FROM result").fetchone()
    elapsed = time.perf_counter() - start
    table = con.execute("SELECT * FROM result").fetchnumpy()
    return elapsed, [np.asarray(v, dtype=np.int64) for v in table.values()]


def run_python(name: str, data: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    """The floor: plain-Python, tuple-at-a-time semi-naive evaluation with dict indexes."""
    rows = {rel: [tuple(r) for r in arr.tolist()] for rel, arr in data.items()}
    start = time.perf_counter()
    if name in ("tc_chain", "tc_random"):
        succ: dict[int, list[int]] = {}
        for x, y in rows["edge"]:
            succ.setdefault(x, []).append(y)
        result = set(rows["edge"])
        delta = set(result)
        while delta:
            new = set()
            for x, z in delta:
                for y in succ.get(z, ()):
                    t = (x, y)
                    if t not in result:
                        new.add(t)
            result |= new
            delta = new
    elif name == "same_gen":
        children: dict[int, list[int]] = {}
        for c, p in rows["parent"]:
            children.setdefault(p, []).append(c)
        result = {(x, y) for kids in children.values() for x in kids for y in kids if x != y}
        delta = set(result)
        while delta:
            new = set()
            for a, b in delta:
                for x in children.get(a, ()):
                    for y in children.get(b, ()):
                        t = (x, y)
                        if t not in result:
                            new.add(t)
            result |= new
            delta = new
    elif name == "negation":
        succ = {}
        for x, y in rows["edge"]:
            succ.setdefault(x, []).append(y)
        reach = {s for (s,) in rows["source"]}
        delta = set(reach)
        while delta:
            new = set()
            for x in delta:
                for y in succ.get(x, ()):
                    if y not in reach:
                        new.add(y)
            reach |= new
            delta = new
        result = {(x,) for (x,) in rows["node"] if x not in reach}
    elif name == "aggregate":
        count: dict[int, int] = {}
        total: dict[int, int] = {}
        for _id, g, a in set(rows["sale"]):
            count[g] = count.get(g, 0) + 1
            total[g] = total.get(g, 0) + a
        result = {(g, count.get(g, 0), total.get(g, 0)) for (g,) in rows["grp"]}
    else:
        raise ValueError(name)
    elapsed = time.perf_counter() - start
    arr = np.array(sorted(result), dtype=np.int64)
    return elapsed, [arr[:, j] for j in range(arr.shape[1])] if len(arr) else []


RUNNERS = {"merklog": run_merklog, "duckdb": run_duckdb, "python": run_python}


# ----------------------------------------------------------------------------- driver


def child(engine: str, name: str, data_path: str) -> None:
    import resource

    with np.load(data_path) as npz:
        data = {k: npz[k] for k in npz.files}
    elapsed, cols = RUNNERS[engine](name, data)
    count, checksum = summarise(cols)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps({"time": elapsed, "rows": count, "checksum": checksum, "rss_mb": peak_kb / 1024})
    )


def measure(engine: str, name: str, data_path: str, timeout: float) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", engine, name, data_path],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{engine}/{name} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--scale", type=float, default=1.0, help="shrink/grow the inputs")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="fresh-process runs of merklog and DuckDB; the fastest counts (the shared "
        "machine is noisy); the Python floor runs once",
    )
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "WORKLOAD", "DATA"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    names = args.only or list(WORKLOADS)
    rows = []
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = str(Path(tmp) / f"{name}.npz")
            np.savez(path, **generate(name, args.scale))
            res = {}
            for engine in ENGINES:
                runs = [
                    measure(engine, name, path, args.timeout)
                    for _ in range(1 if engine == "python" else args.repeat)
                ]
                if len({(r["rows"], r["checksum"]) for r in runs}) != 1:
                    raise RuntimeError(f"{engine}/{name}: runs disagree with each other")
                res[engine] = min(runs, key=lambda r: r["time"])
            agree = len({(r["rows"], r["checksum"]) for r in res.values()}) == 1
            ok &= agree
            rows.append((name, res, agree))
            m, d, p = res["merklog"], res["duckdb"], res["python"]
            print(
                f"{name:10s} rows={m['rows']:>9,d} agree={'yes' if agree else 'NO'}  "
                f"merklog {m['time']:7.3f}s {m['rss_mb']:6.0f}MB | "
                f"duckdb {d['time']:7.3f}s {d['rss_mb']:6.0f}MB | "
                f"python {p['time']:7.3f}s {p['rss_mb']:6.0f}MB | "
                f"merklog/duckdb time {m['time'] / d['time']:5.2f}x rss "
                f"{m['rss_mb'] / d['rss_mb']:4.2f}x | python/merklog {p['time'] / m['time']:5.1f}x",
                flush=True,
            )
    print()
    print(
        "| workload | rows | merklog s | duckdb s | python s | merklog/duckdb | python/merklog "
        "| RSS MB merklog/duckdb/python | agree |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for name, res, agree in rows:
        m, d, p = res["merklog"], res["duckdb"], res["python"]
        print(
            f"| {name} | {m['rows']:,} | {m['time']:.3f} | {d['time']:.3f} | {p['time']:.3f} "
            f"| {m['time'] / d['time']:.2f}x | {p['time'] / m['time']:.1f}x "
            f"| {m['rss_mb']:.0f}/{d['rss_mb']:.0f}/{p['rss_mb']:.0f} | {'yes' if agree else 'NO'} |"
        )
    if not ok:
        print("RESULTS DISAGREE", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
