"""Where the time of one cold ``merklog compact`` goes: a phase breakdown.

Runs the compaction the way the CLI does (a fresh process, a fresh JVM through
``build_session``, then :func:`merklog.node.spark.compact.compact`) and wraps the
module's own steps - each Spark write job, the pyarrow re-encoding of the staged
files, the manifest - with timers, so the figures are those of the real code path.
For every phase it prints wall seconds, this process's CPU (the driver: Python,
pyarrow, py4j) and the JVM's CPU (read from /proc), with the load beside them; the
deltas and grants that a driver thread stages beside the facts job (ADR 0136) are
printed on their own line below the table, wall time only (their CPU is in the driver
CPU of the phases they overlap).

    .venv/bin/python bench/compact_phases.py EXPORT_DIR [--light|--jvm-defaults] [--java-opts=...] [--conf K=V] [--threads]

Without a flag the input's size picks the JVM flags, as in the CLI (ADR 0085);
``--light`` puts the light JVM flags on every JVM (``MERKLOG_SPARK_LIGHT_JVM=1``),
``--jvm-defaults`` on none (``=0``: C2, G1); ``--java-opts=...`` passes other flags to
the driver JVM, to compare JIT and GC settings on one export. ``--threads`` also prints
the facts job's JVM CPU by thread (task, C1 compiler, collector, planning threads, read
from ``/proc/<jvm>/task``) and its physical plan (whether it has an ``Exchange``).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()
C0 = time.process_time()

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402


def _jvm_cpu(spark) -> float:
    pid = spark.sparkContext._gateway.proc.pid
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _jvm_threads(spark) -> dict[str, float]:
    """CPU seconds of each live JVM thread, grouped by name without digits (so the
    executor's task threads, the compiler threads and the GC threads add up)."""
    pid = spark.sparkContext._gateway.proc.pid
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        group = "".join(ch for ch in name if not ch.isdigit()).strip(" -#")
        out[group] = out.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class Phases:
    """Consecutive phases: wall, driver CPU and JVM CPU spent since the previous mark."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, float]] = []
        self.t, self.c, self.j = T0, C0, 0.0
        self.spark = None

    def mark(self, name: str) -> None:
        t, c = time.perf_counter(), time.process_time()
        j = _jvm_cpu(self.spark) if self.spark is not None else 0.0
        self.rows.append((name, t - self.t, c - self.c, j - self.j))
        self.t, self.c, self.j = t, c, j


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("export", type=Path)
    ap.add_argument("--light", action="store_true", help="the light JVM flags on every JVM")
    ap.add_argument("--jvm-defaults", action="store_true", help="the JVM's own defaults (C2, G1)")
    ap.add_argument("--java-opts", default=None, help="driver JVM flags to use instead")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--threads",
        action="store_true",
        help="also the facts job's JVM CPU by thread (task, compiler, GC threads) and its plan",
    )
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.light or args.jvm_defaults:
        os.environ["MERKLOG_SPARK_LIGHT_JVM"] = "1" if args.light else "0"
    ph = Phases()
    import merklog.node.spark.compact as mod
    from merklog.node.spark.factargs import read_inputs
    from merklog.node.spark.session import build_session
    from merklog.replication.identity import Identity

    ph.mark("python start + imports")
    conf = dict(item.split("=", 1) for item in args.conf)
    if args.java_opts:
        conf["spark.driver.extraJavaOptions"] = args.java_opts
    # as the CLI does: the inputs' reading starts before the JVM (ADR 0122), and the input's
    # size picks the JVM flags unless --light/--jvm-defaults
    reader = read_inputs([args.export])
    spark = build_session(master=args.master, conf=conf, input_rows=mod.input_rows([args.export]))
    ph.spark = spark
    ph.j = 0.0
    ph.mark("JVM + SparkSession start")

    for name in (
        "_write",
        "_write_facts",
        "_write_tags",
        "stage_partitioned",
        "_write_meta",
        "_place",
        "_place_facts",
        "_read",
        "_find_genesis",
        "build_manifest",
        "file_link",
    ):
        inner = getattr(mod, name)

        def wrapped(*a, _inner=inner, _name=name, **kw):
            ph.mark("(driver, between steps)")
            before = _jvm_threads(spark) if args.threads and _name in ("_write_facts", "_write_tags") else None
            out = _inner(*a, **kw)
            if before is not None:
                after = _jvm_threads(spark)
                spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
                by_thread.append(sorted(spent.items(), key=lambda kv: -kv[1]))
                plans.append(a[0]._jdf.queryExecution().executedPlan().toString())
            label = _name
            if _name == "_write":
                label = f"Spark job: write {Path(str(a[1])).name}"
            elif _name == "_write_meta":
                label = "Spark job: write deltas + acl (meta)"
            elif _name == "_write_facts":
                label = "Spark job: write facts"
            elif _name == "_write_tags":
                label = "Spark job: write live tags (no shuffle, ADR 0196)"
            elif _name == "stage_partitioned":
                label = "driver: partition + sort the live tags (numpy)"
            elif _name == "_place_facts":
                label = "pyarrow split + re-encode of facts (_place_facts)"
            elif _name == "_place":
                label = "pyarrow re-encode (_place)"
            elif _name == "_read":
                label = "pyarrow read of staged columns (heads, support)"
            ph.mark(label)
            return out

        setattr(mod, name, wrapped)

    # the deltas and grants are staged on a driver thread beside the facts job (ADR 0136):
    # its wall time (its CPU is in the driver CPU of the phases it overlaps)
    threads: list[tuple[str, float]] = []
    by_thread: list[list[tuple[str, float]]] = []
    plans: list[str] = []
    staged = mod.stage_meta

    def stage_meta(*a, **kw):
        t = time.perf_counter()
        out = staged(*a, **kw)
        threads.append(("deltas + grants staged (driver thread)", time.perf_counter() - t))
        return out

    mod.stage_meta = stage_meta
    with tempfile.TemporaryDirectory(prefix="merklog-phases-") as tmp:
        key = Identity.from_seed(b"\x01" * 32)
        mod.compact(spark, [args.export], Path(tmp) / "snap", key, reader=reader)
        ph.mark("(driver, between steps)")
    spark.stop()
    ph.mark("session stop")
    merged: dict[str, list[float]] = {}
    for name, w, c, j in ph.rows:
        acc = merged.setdefault(name, [0.0, 0.0, 0.0])
        acc[0] += w
        acc[1] += c
        acc[2] += j
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"load: {load}")
    print("| phase | wall s | driver CPU s | JVM CPU s |")
    print("|---|---:|---:|---:|")
    for name, (w, c, j) in merged.items():
        print(f"| {name} | {w:.2f} | {c:.2f} | {j:.2f} |")
    tw = sum(r[1] for r in ph.rows)
    tc = sum(r[2] for r in ph.rows)
    tj = sum(r[3] for r in ph.rows)
    print(f"| **total** | {tw:.2f} | {tc:.2f} | {tj:.2f} |")
    for name, w in threads:
        print(f"beside them: {name}: {w:.2f} s wall")
    for spent in by_thread:
        print("facts job, JVM CPU by thread:")
        print("  " + ", ".join(f"{k} {v:.2f}" for k, v in spent if v >= 0.01))
    for plan in plans:
        print("facts job, physical plan:")
        print(plan)


if __name__ == "__main__":
    main()
