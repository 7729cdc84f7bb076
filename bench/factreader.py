"""Micro-benchmark of the ground-fact reader alone (engine/factreader.py, ADR 0035/0100).

    python bench/factreader.py            # 200k facts, median of 5
    python bench/factreader.py --n 50000 --runs 3

Times, in one process on the same texts, the entry points that read Datalog ground
facts: ``parse_facts`` (``merklog put``, the node's Datalog write bodies) and
``parse_program`` (programs with inline facts, ``merklog eval``'s ``.dl`` fact files),
on two shapes:

- ``bulk``: the shape of ``bench/ingest.py`` (one fact per line; ints, strings, floats,
  bools), the shape ``merklog put -f`` is almost always given;
- ``mixed``: every literal spelling (hex, binary, exponents, ``-0.0``, escapes, ``x"…"``
  bytes, comments between facts, two facts on a line).

Figures are CPU seconds (``time.process_time``), median of ``--runs``, with µs per fact.
The headline figure of the write path is ``bench/ingest.py``'s ``put -f`` process; this
one isolates the reader inside it. Run ``uptime`` beside it: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too


def bulk_text(n: int) -> str:
    """``bench/ingest.py``'s facts written one per line, as ``put -f`` reads them."""
    lines = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            lines.append(f"edge({i}, {i + 1}).")
        elif kind == 1:
            lines.append(f'name({i}, "user-{i}").')
        elif kind == 2:
            lines.append(f"score({i}, {i * 0.25!r}, {'true' if i % 7 == 0 else 'false'}).")
        else:
            lines.append(f'event({i}, "click", "/page/{i % 1000}", {1_700_000_000 + i}).')
    return "\n".join(lines) + "\n"


def mixed_text(n: int) -> str:
    """Every literal spelling the reader handles, some layouts the JSON tier refuses."""
    lines = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            lines.append(f"h({i:#x}, {-i:#b}, -9223372036854775808, 9223372036854775807).")
        elif kind == 1:
            lines.append(f'b(x"{i:08x}", "tab\\there \\"q\\" \\u{{e9}}", -0.0, 1.5e-7).')
        elif kind == 2:
            lines.append(f"f({i}.0, -{i}e3, 1E+2, true). % trailing comment")
        elif kind == 3:
            lines.append(f'p({i}, "a"). q({i}, 1.0).')
        else:
            lines.append(f'// row {i}\nr({i}, false, "", x"").')
    return "\n".join(lines) + "\n"


def cpu_median(fn, text: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.process_time()
        fn(text)
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200_000, help="facts per text (default 200k)")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (median)")
    args = parser.parse_args()

    from merklog.engine.parser import parse_facts, parse_program

    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    texts = {"bulk": bulk_text(args.n), "mixed": mixed_text(args.n)}
    counts = {name: len(parse_facts(text)) for name, text in texts.items()}
    print(f"{'entry point':<14} {'shape':<6} {'facts':>8} {'CPU s':>8} {'µs/fact':>8}")
    for label, fn in (("parse_facts", parse_facts), ("parse_program", parse_program)):
        for name, text in texts.items():
            cpu = cpu_median(fn, text, args.runs)
            n = counts[name]
            print(f"{label:<14} {name:<6} {n:>8} {cpu:>8.3f} {cpu / n * 1e6:>8.2f}")


if __name__ == "__main__":
    main()
