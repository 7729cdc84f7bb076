"""Epoch cost on a node: the incremental engine vs re-running the batch evaluator.

Two in-process nodes (memory store) hold the same graph and the transitive-closure
program; each then takes --epochs single-fact writes (an edge inserted, or the last
one retracted), one epoch each, and the mean wall time per epoch is printed for both
engines side by side, with their ratio. Results are checked equal after every epoch.

    .venv/bin/python bench/node_epoch.py --nodes 300 --edges 600 --epochs 20
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from merklog.node.node import Node

PROGRAM = "path(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=300)
    ap.add_argument("--edges", type=int, default=600)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    # A DAG (edges go forward) so the closure is large but finite to compute.
    edges = set()
    while len(edges) < args.edges:
        a, b = sorted(rng.sample(range(args.nodes), 2))
        edges.add((a, b))
    changes = []
    extra = []
    for _ in range(args.epochs):
        if extra and rng.random() < 0.5:
            changes.append(("retract", extra.pop()))
        else:
            a, b = sorted(rng.sample(range(args.nodes), 2))
            extra.append((a, b))
            changes.append(("assert", (a, b)))
    with tempfile.TemporaryDirectory() as tmp:
        nodes = {}
        for mode in ("auto", "batch"):
            node = Node.open(Path(tmp) / mode, store__backend="memory")
            node.write([("edge", e) for e in sorted(edges)], evaluate=False)
            t0 = time.perf_counter()
            node.load_program(PROGRAM, "closure.dl", engine=mode)  # runs its first epoch
            load = time.perf_counter() - t0
            nodes[mode] = (node, load, [])
        size = len(nodes["auto"][0].relation("path"))
        for kind, edge in changes:
            for node, _load, times in nodes.values():
                if kind == "assert":
                    node.write([("edge", edge)], evaluate=False)  # the epoch is timed below
                else:
                    node.write(retracts=[("edge", edge)], evaluate=False)
                t0 = time.perf_counter()
                node.run_epoch()
                times.append(time.perf_counter() - t0)
            a, b = (nodes[m][0].relation("path") for m in ("auto", "batch"))
            assert a == b, "incremental and batch results differ"
        print(
            f"graph: {args.nodes} vertices, {args.edges} edges, path/2 = {size} tuples; "
            f"{args.epochs} epochs of one write each"
        )
        for node, load, times in nodes.values():
            label = node.engine.mode
            print(
                f"{label:12s} first epoch {load * 1000:9.1f} ms   per write epoch "
                f"mean {statistics.mean(times) * 1000:8.2f} ms  "
                f"p50 {statistics.median(times) * 1000:8.2f} ms"
            )
        inc = statistics.mean(nodes["auto"][2])
        bat = statistics.mean(nodes["batch"][2])
        print(f"batch / incremental time per epoch: {bat / inc:.1f}x")
        for node, _, _ in nodes.values():
            node.close()


if __name__ == "__main__":
    main()
