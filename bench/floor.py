"""The plain-Python floor of bench/engine.py: one workload from TSV files to a CSV file.

    python bench/floor.py WORKLOAD FACTS_DIR OUT_FILE

Tuple-at-a-time semi-naive evaluation with dict indexes, no numpy, no merklog:
what a short hand-written Python program achieves. It reads ``<rel>.facts``
(tab-separated ints), evaluates the workload's query and writes its result as
tab-separated lines, like ``merklog eval`` and the DuckDB child do.
"""

from __future__ import annotations

import sys
from pathlib import Path


def read(directory: Path, rel: str) -> list[tuple[int, ...]]:
    with open(directory / f"{rel}.facts", encoding="utf-8") as fh:
        return [tuple(int(f) for f in line.rstrip("\n").split("\t")) for line in fh if line.strip()]


def closure(edges: list[tuple[int, ...]]) -> set[tuple[int, int]]:
    succ: dict[int, list[int]] = {}
    for x, y in edges:
        succ.setdefault(x, []).append(y)
    result = {(x, y) for x, y in edges}
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
    return result


def same_generation(parent: list[tuple[int, ...]]) -> set[tuple[int, int]]:
    children: dict[int, list[int]] = {}
    for c, p in parent:
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
    return result


def unreachable(edge, node, source) -> set[tuple[int]]:
    succ: dict[int, list[int]] = {}
    for x, y in edge:
        succ.setdefault(x, []).append(y)
    reach = {s for (s,) in source}
    delta = set(reach)
    while delta:
        new = set()
        for x in delta:
            for y in succ.get(x, ()):
                if y not in reach:
                    new.add(y)
        reach |= new
        delta = new
    return {(x,) for (x,) in node if x not in reach}


def stats(sale, grp) -> set[tuple[int, int, int]]:
    count: dict[int, int] = {}
    total: dict[int, int] = {}
    for _id, g, a in set(sale):
        count[g] = count.get(g, 0) + 1
        total[g] = total.get(g, 0) + a
    return {(g, count.get(g, 0), total.get(g, 0)) for (g,) in grp}


def main() -> None:
    name, facts, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if name in ("tc_chain", "tc_random"):
        result = closure(read(facts, "edge"))
    elif name == "same_gen":
        result = same_generation(read(facts, "parent"))
    elif name == "negation":
        result = unreachable(read(facts, "edge"), read(facts, "node"), read(facts, "source"))
    elif name == "aggregate":
        result = stats(read(facts, "sale"), read(facts, "grp"))
    else:
        raise SystemExit(f"unknown workload {name}")
    with open(out, "w", encoding="utf-8") as fh:
        fh.writelines("\t".join(map(str, row)) + "\n" for row in result)


if __name__ == "__main__":
    main()
