"""Incremental engine benchmark: latency of small epochs vs full batch recomputation.

    python bench/incremental.py                  # 1M-fact aggregation + 100k-edge closure
    python bench/incremental.py --scale 0.1      # scaled down
    python bench/incremental.py --only aggregate --repeats 200

Workloads (deterministic, seed 42), each loaded once into an
:class:`~merklog.engine.incremental.IncrementalEngine` as one epoch of int64 arrays
(what a node holds its stored facts as, ADR 0070/0090) and, beside it, into another
as Python tuples in chunks of 100k (skip with ``--no-tuple-load``):

- aggregate: ``stats(G, C, S) :- grp(G), C := count : sale(_, G, _), S := sum A : sale(_, G, A).``
  over 1M ``sale`` facts in 1,000 groups (the workload of ``bench/engine.py``);
- closure:   ``path`` = transitive closure of a 100k-edge forest of 20,000 disjoint
  5-edge chains (300k paths; recursion through the nested fixpoint circuit).

Then, for change sizes k = 1, 10, 100, 1000: epochs that insert k new facts and
epochs that delete them again (aggregate: new sales in random groups; closure:
edges bridging the end of one chain to the start of another, each adding 36
paths; sources and targets are disjoint so bridges never chain). The table gives the median epoch latency (wall; "cpu ms": median process CPU time
of an epoch, robust to a shared machine; "cpu us/change": that divided by k,
beside the goal max(1 ms, k x 2 us)), and the speedup over a full
batch recomputation of the same program on the same data in the same process
(``Program.evaluate`` on numpy columns — the batch evaluator's fastest path).
The header line gives the columnar initial load (wall and CPU) beside one batch
evaluation of the same data, and their ratio; the next line the tuple-fed load,
split into the engine's ``step`` calls and building the tuples from numpy; the
next the CPU of the first change after the load (it builds the base's index). Goals (issue 10): initial load ≤ 2× a batch
evaluation; an epoch of k changes on the 1M aggregation ≤ max(1 ms, k × 2 µs);
cost growing with k, not with the database.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time

import numpy as np
import psutil

from merklog.engine.incremental import IncrementalEngine
from merklog.engine.program import Program

AGG = """
stats(G, C, S) :- grp(G), C := count : sale(_, G, _), S := sum A : sale(_, G, A).
"""

TC = """
path(X, Y) :- edge(X, Y).
path(X, Y) :- path(X, Z), edge(Z, Y).
"""

SIZES = (1, 10, 100, 1000)


def aggregate_data(scale: float) -> tuple[dict[str, np.ndarray], int]:
    rng = np.random.default_rng(42)
    n, groups = int(1_000_000 * scale), 1000
    ids = np.arange(n)
    sale = np.stack([ids, rng.integers(0, groups, size=n), rng.integers(1, 1000, size=n)], axis=1)
    return {"sale": sale, "grp": np.arange(groups).reshape(-1, 1)}, n


def closure_data(scale: float) -> tuple[dict[str, np.ndarray], int]:
    chains, length = int(20_000 * scale), 5
    nodes = np.arange(chains * (length + 1)).reshape(chains, length + 1)
    edges = np.stack([nodes[:, :-1].ravel(), nodes[:, 1:].ravel()], axis=1)
    return {"edge": edges}, chains


def rows(array: np.ndarray) -> list[tuple]:
    return [tuple(r) for r in array.tolist()]


def load(
    engine: IncrementalEngine, data: dict[str, np.ndarray], columnar: bool, chunk: int = 100_000
) -> tuple[float, float, float]:
    """The initial load. ``columnar``: one epoch with the int64 arrays themselves (what a
    node holds its stored facts as and feeds at its first incremental epoch, ADR 0070;
    the engine keeps them columnar, ADR 0090). Otherwise the pre-0090 way: Python
    tuples built from numpy, fed in epochs of ``chunk`` facts.
    Afterwards the loaded objects are frozen out of the cyclic GC (what a long-running
    node does after ingest: otherwise full collections over millions of long-lived
    trace entries land on random small epochs).
    Returns (wall s, CPU s, CPU s inside ``engine.step``: the rest is building tuples)."""
    start, cpu = time.perf_counter(), time.process_time()
    in_step = 0.0
    if columnar:
        engine.step(inserts=dict(data))
        in_step = time.process_time() - cpu
    else:
        for rel, array in data.items():
            for i in range(0, len(array), chunk):
                batch = rows(array[i : i + chunk])
                c0 = time.process_time()
                engine.step(inserts={rel: batch})
                in_step += time.process_time() - c0
                del batch
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    gc.collect()
    gc.freeze()
    return elapsed, cpu, in_step


def first_change(engine: IncrementalEngine, rel: str, batch: list[tuple]) -> float:
    """CPU s of the first epoch after the load (insert then delete ``batch``): after a
    columnar load it builds the base's row-hash index (ADR 0090), once."""
    c0 = time.process_time()
    engine.step(inserts={rel: batch})
    engine.step(deletes={rel: batch})
    return time.process_time() - c0


def recompute(
    text: str, data: dict[str, np.ndarray], out: str, runs: int = 3
) -> tuple[float, float]:
    """Median (wall, CPU) seconds of a full batch evaluation of the same data."""
    program = Program.parse(text)
    times, cpus = [], []
    for _ in range(runs):
        gc.collect()
        start, cpu = time.perf_counter(), time.process_time()
        rels = program.evaluate(data)
        rels.count(out)
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(times), statistics.median(cpus)


def measure(
    engine: IncrementalEngine,
    rel: str,
    make: callable,
    repeats: dict[int, int],
    max_k: int | None = None,
) -> dict[int, tuple[float, float, float]]:
    """Median (insert, delete) epoch wall latency and median CPU time per change size."""
    out = {}
    for k in SIZES:
        if max_k is not None and k > max_k:
            continue
        ins_t, del_t, cpu = [], [], []
        for _ in range(repeats[k]):
            batch = make(k)
            c0 = time.process_time()
            start = time.perf_counter()
            engine.step(inserts={rel: batch})
            mid = time.perf_counter()
            c1 = time.process_time()
            engine.step(deletes={rel: batch})
            end = time.perf_counter()
            c2 = time.process_time()
            ins_t.append(mid - start)
            del_t.append(end - mid)
            cpu += [c1 - c0, c2 - c1]
        out[k] = (statistics.median(ins_t), statistics.median(del_t), statistics.median(cpu))
    return out


def report(
    title: str,
    db: str,
    load: tuple[float, float, float],
    tuple_load: tuple[float, float, float] | None,
    first: float,
    batch: tuple[float, float],
    lat: dict,
) -> None:
    """Print one workload's table. ``load``: (wall s, CPU s, CPU s in ``step``) of the
    columnar initial load, ``tuple_load`` the same fed as tuples in chunks (None when
    skipped); ``first``: CPU s of the first change after the load; ``batch``: (wall s,
    CPU s) of one full batch evaluation; goal columns per issue 10."""
    (load_s, load_cpu, _step_cpu), (batch_s, batch_cpu) = load, batch
    rss = psutil.Process().memory_info().rss / 2**20
    print(f"\n## {title}  ({db})")
    print(
        f"initial load (int64 arrays, one epoch): {load_s * 1e3:.0f} ms wall, "
        f"{load_cpu * 1e3:.0f} ms cpu   batch evaluation: {batch_s * 1e3:.1f} ms wall, "
        f"{batch_cpu * 1e3:.1f} ms cpu   load/batch: {load_s / batch_s:.1f}x wall, "
        f"{load_cpu / max(batch_cpu, 1e-9):.1f}x cpu (goal <= 2x)   process RSS: {rss:.0f} MiB"
    )
    if tuple_load is not None:
        t_s, t_cpu, t_step = tuple_load
        print(
            f"  fed as tuples in 100k chunks instead: {t_s:.2f} s wall, {t_cpu:.2f} s cpu, "
            f"of which engine.step {t_step:.2f} s cpu ({t_step / max(batch_cpu, 1e-9):.0f}x "
            f"batch cpu), building the tuples from numpy {t_cpu - t_step:.2f} s cpu"
        )
    print(f"  first change after the load (insert+delete 1 fact): {first * 1e3:.1f} ms cpu")
    print(
        f"{'k':>6} {'insert ms':>11} {'delete ms':>11} {'cpu ms':>9} {'cpu us/change':>14} "
        f"{'goal ms':>8} {'ins speedup':>12} {'del speedup':>12}"
    )
    for k, (ins, dele, cpu) in lat.items():
        goal = max(1.0, k * 0.002)  # max(1 ms, k x 2 us)
        print(
            f"{k:>6} {ins * 1e3:>11.3f} {dele * 1e3:>11.3f} {cpu * 1e3:>9.3f} "
            f"{cpu * 1e6 / k:>14.1f} {goal:>8.1f} "
            f"{batch_s / ins:>11.0f}x {batch_s / dele:>11.0f}x"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=101, help="epochs per size for k=1")
    ap.add_argument("--only", choices=["aggregate", "closure"])
    ap.add_argument(
        "--no-tuple-load", action="store_true", help="skip the tuple-fed load beside it"
    )
    args = ap.parse_args()
    repeats = {k: max(5, args.repeats // (1 + k // 10)) for k in SIZES}
    rnd = random.Random(42)

    if args.only in (None, "aggregate"):
        data, n = aggregate_data(args.scale)
        tuple_load = None
        if not args.no_tuple_load:
            engine = IncrementalEngine(Program.parse(AGG).checked)
            tuple_load = load(engine, data, columnar=False)
            gc.unfreeze()
            del engine
            gc.collect()
        engine = IncrementalEngine(Program.parse(AGG).checked)
        load_s = load(engine, data, columnar=True)
        assert engine.count("stats") == 1000
        batch = recompute(AGG, data, "stats")
        counter = [10**9]

        def new_sales(k: int) -> list[tuple]:
            counter[0] += k
            return [(counter[0] + i, rnd.randrange(1000), rnd.randint(1, 999)) for i in range(k)]

        first = first_change(engine, "sale", new_sales(1))
        lat = measure(engine, "sale", new_sales, repeats)
        report("aggregate: count+sum per group", f"{n:,} sale facts, 1,000 groups", load_s,
               tuple_load, first, batch, lat)  # fmt: skip
        gc.unfreeze()
        del engine
        gc.collect()

    if args.only in (None, "closure"):
        data, chains = closure_data(args.scale)
        tuple_load = None
        if not args.no_tuple_load:
            engine = IncrementalEngine(Program.parse(TC).checked)
            tuple_load = load(engine, data, columnar=False)
            gc.unfreeze()
            del engine
            gc.collect()
        engine = IncrementalEngine(Program.parse(TC).checked)
        load_s = load(engine, data, columnar=True)
        assert engine.count("path") == chains * 15
        batch = recompute(TC, data, "path")
        width = 6

        def bridges(k: int) -> list[tuple]:
            # Sources and targets are disjoint chains, so bridges never chain together:
            # every bridge adds exactly 6 x 6 = 36 paths.
            picks = rnd.sample(range(chains), 2 * k)
            return [
                (a * width + width - 1, b * width)
                for a, b in zip(picks[:k], picks[k:], strict=True)
            ]

        first = first_change(engine, "edge", bridges(1))
        lat = measure(engine, "edge", bridges, repeats, max_k=chains // 2)
        assert engine.count("path") == chains * 15  # every bridge was retracted exactly
        report("closure: path over 5-edge chains", f"{len(data['edge']):,} edges, "
               f"{chains * 15:,} paths", load_s, tuple_load, first, batch, lat)  # fmt: skip
    print(f"\npython {sys.version.split()[0]}, repeats for k=1: {repeats[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
