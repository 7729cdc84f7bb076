"""Export and compaction at scale, as a user runs them, beside DuckDB on the same exports.

For each size N (ops) the bench builds a real node home whose replica holds N ops
(60 % first asserts of distinct facts with mixed value types, 20 % retracts of some
of them, 20 % re-asserts, so supports and removals are both exercised), then times:

- ``merklog parquet export DIR``: the whole process (Python start, store open,
  export), reported as ops/s;
- ``merklog compact DIR --out SNAP``: the whole process (Python and JVM start, the
  Spark job on ``local[2]``, files, signed manifest);
- the same compaction in an already running Spark session (the inner layer: no JVM
  or process start), for scale;
- DuckDB computing the same visible facts with their supports from the same export
  and writing them as zstd Parquet (in process: DuckDB has no start-up to speak of);
- the Python floor: pyarrow alone (hash group-by and anti-join in Arrow), in process;
- with ``--connect``, the compact CLI once more with ``--remote`` against a Spark Connect
  server the bench starts (``local[2]``, JVM defaults) and warms with one untimed
  compaction of the same export: the whole command as a user with a long-lived server
  runs it (the client's CPU only; the server's is not counted), and the same manifest
  CID as the cold command's;
- with ``--other-jvm``, the compact CLI once more on the same export with the JVM flags
  its input size did not pick (C2 and G1 below ``LIGHT_MAX_ROWS`` op rows, C1 and the
  serial collector from there on; ADR 0085).

The compact CLI maps the class-data-sharing archive of its JVM flags (ADR 0114); the
first ``compact`` of a flag set dumps it, so run one ``merklog compact`` per flag set
before timing steady-state figures (or set ``MERKLOG_SPARK_CDS=0`` to time without it).

It checks that every engine finds the same number of visible facts, then prints
the wall times, the CPU times (a command's CPU is its whole process tree, JVM
included, as reaped; the in-session job's is the JVM's own; DuckDB's and
pyarrow's are this process's, all threads) and the Spark/DuckDB ratios, with the
machine load (``uptime``) beside them: on a shared machine, compare ratios from
the same run only.

    .venv/bin/python bench/compact.py                 # 1M and 5M ops
    .venv/bin/python bench/compact.py --ops 200000    # a quick run
    .venv/bin/python bench/compact.py --ops 1000000 --workdir /tmp/spark1m --export-only 3
                                                      # the export command alone, 3 runs
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from merklog.node.spark.session import LIGHT_MAX_ROWS

MERKLOG = [sys.executable, "-m", "merklog.node.cli"]
ENV = dict(
    os.environ,
    SPARK_LOCAL_IP="127.0.0.1",
    PYSPARK_PYTHON=sys.executable,
    MERKLOG_SPARK_MASTER="local[2]",
)


def build_home(home: Path, n_ops: int) -> None:
    """A node home whose replica holds ``n_ops`` ops (not timed)."""
    from merklog.node.node import Node
    from merklog.store import make_fact

    subprocess.run([*MERKLOG, "--home", str(home), "init"], check=True, capture_output=True)
    n_first = int(n_ops * 0.6)
    n_retract = int(n_ops * 0.2)
    n_again = n_ops - n_first - n_retract
    side = int(n_first**0.5) + 1
    facts = [
        make_fact("edge", (i // side, i % side))
        if i % 4
        else make_fact("label", (i, f"n{i % 97}", i % 3 == 0, float(i % 7)))
        for i in range(n_first)
    ]
    node = Node.open(home)
    try:
        rep = node.replica
        rep.assert_facts(facts)
        gone = facts[::3][:n_retract]
        rep.retract_facts(gone)
        rep.assert_facts(gone[:n_again])
    finally:
        node.close()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _jvm_cpu(parent: int) -> dict[int, float]:
    """``pid -> CPU seconds`` (its own plus its reaped children's) of every JVM (``java``)
    child of ``parent`` (Linux /proc). Only JVMs: pyspark's is not waited for by its
    Python process, while every other child (the export's worker processes) is, and is
    in the command's rusage already."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    name, rest = f.read().split("(", 1)[1].rsplit(")", 1)
            except (OSError, ValueError):
                continue
            fields = rest.split()
            if int(fields[1]) == parent and name == "java":
                out[int(entry.name)] = sum(int(x) for x in fields[11:15]) / tick
    return out


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """``(wall, CPU)`` seconds of a whole command. CPU: the command and the children it
    waited for (rusage), plus the last figure polled (every 0.1 s) of the JVM child it
    does not wait for (pyspark's, which exits after the Python process). Dirty pages are
    written back before the clock starts, so that a home copied just before (329 MB at
    1M ops) or an earlier run's files are not written back during the timed command."""
    os.sync()  # the bench's own writes (a copied home, an earlier run's files) flushed first
    cpu = _children_cpu()
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or ENV)
    seen: dict[int, float] = {}
    while proc.poll() is None:
        seen.update(_jvm_cpu(proc.pid))
        time.sleep(0.1)
    _out, err = proc.communicate()
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err.decode()[-3000:]}")
    return elapsed, _children_cpu() - cpu + sum(seen.values())


def in_process(fn, *args) -> tuple[float, float, int]:
    """``(wall, CPU of this process, visible rows)`` of an in-process run."""
    cpu = time.process_time()
    t = time.perf_counter()
    _elapsed, n = fn(*args)
    return time.perf_counter() - t, time.process_time() - cpu, n


def jvm_cpu(spark) -> float:
    """CPU seconds the session's JVM has used so far (Linux /proc)."""
    pid = spark.sparkContext._gateway.proc.pid
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


DUCKDB_SQL = """
COPY (
  WITH ops AS (SELECT * FROM read_parquet({files})),
  asserted AS (SELECT DISTINCT dataset, fact_cid, delta_cid FROM ops WHERE op = 'assert'),
  removed AS (
    SELECT DISTINCT dataset, fact_cid, unnest(observed) AS delta_cid
    FROM ops WHERE op = 'retract'
  ),
  live AS (SELECT * FROM asserted ANTI JOIN removed USING (dataset, fact_cid, delta_cid)),
  support AS (
    SELECT dataset, fact_cid, list_sort(list(delta_cid)) AS support
    FROM live GROUP BY dataset, fact_cid
  ),
  facts AS (
    SELECT DISTINCT ON (dataset, fact_cid) dataset, fact_cid, relation, args
    FROM ops WHERE op = 'assert'
  )
  SELECT dataset, relation, fact_cid, args, support
  FROM support JOIN facts USING (dataset, fact_cid) ORDER BY dataset, fact_cid
) TO '{out}' (FORMAT parquet, COMPRESSION zstd)
"""


def run_duckdb(export: Path, out: Path) -> tuple[float, int]:
    import duckdb

    files = [str(p) for p in sorted((export / "ops").glob("*.parquet"))]
    con = duckdb.connect()
    t = time.perf_counter()
    con.execute(DUCKDB_SQL.format(files=files, out=out))
    elapsed = time.perf_counter() - t
    n = con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0]
    con.close()
    return elapsed, n


def run_arrow(export: Path, out: Path) -> tuple[float, int]:
    """The Python floor: the same result with pyarrow's C++ kernels, no engine."""
    t = time.perf_counter()
    ops = pq.read_table(export / "ops")
    asserts = ops.filter(pc.equal(ops["op"], "assert"))
    retracts = ops.filter(pc.equal(ops["op"], "retract"))
    tags = (
        asserts.select(["dataset", "fact_cid", "delta_cid"])
        .group_by(["dataset", "fact_cid", "delta_cid"])
        .aggregate([])
    )
    parent = pc.list_parent_indices(retracts["observed"])
    removed = pa.table(
        {
            "dataset": retracts["dataset"].take(parent),
            "fact_cid": retracts["fact_cid"].take(parent),
            "delta_cid": pc.list_flatten(retracts["observed"]),
        }
    )
    live = tags.join(removed, ["dataset", "fact_cid", "delta_cid"], join_type="left anti")
    support = live.group_by(["dataset", "fact_cid"]).aggregate([("delta_cid", "list")])
    support = support.append_column("at", pa.array(range(support.num_rows), pa.int64()))
    asserts = asserts.append_column("row", pa.array(range(asserts.num_rows), pa.int64()))
    first = asserts.group_by(["dataset", "fact_cid"]).aggregate([("row", "min")])
    # Acero joins no list columns: join positions, then gather the lists
    keyed = support.select(["dataset", "fact_cid", "at"]).join(first, ["dataset", "fact_cid"])
    visible = pa.table(
        {
            "dataset": keyed["dataset"],
            "relation": asserts["relation"].take(keyed["row_min"]),
            "fact_cid": keyed["fact_cid"],
            "args": asserts["args"].take(keyed["row_min"]),
            "support": support["delta_cid_list"].take(keyed["at"]),
        }
    )
    pq.write_table(visible, out, compression="zstd")
    return time.perf_counter() - t, visible.num_rows


def run_spark_job(spark, export: Path, out: Path) -> tuple[float, float]:
    """``(wall, JVM CPU)`` of the compaction in an already running session."""
    from merklog.node.spark.compact import compact
    from merklog.replication.identity import Identity

    cpu = jvm_cpu(spark)
    t = time.perf_counter()
    compact(spark, [export], out, Identity.from_seed(b"\x01" * 32))
    return time.perf_counter() - t, jvm_cpu(spark) - cpu


def export_only(sizes: list[int], workdir: Path | None, runs: int) -> None:
    """Time the whole ``merklog parquet export`` command ``runs`` times per size on a copy
    of the home (opening a home may write to it; the original stays untouched)."""
    import statistics

    for n in sizes:
        keep = workdir / str(n) if workdir else None
        tmp = Path(tempfile.mkdtemp(prefix="merklog-bench-export-"))
        try:
            home = tmp / "home"
            if keep and (keep / "home" / "config.toml").exists():
                shutil.copytree(keep / "home", home)
            else:
                build_home(home, n)
            # one untimed run first: a home built by an older version gets its per-relation
            # fact index on first open (ADR 0095), a one-time migration, not the export
            warm = [*MERKLOG, "--home", str(home), "parquet", "export", str(tmp / "warm")]
            subprocess.run(warm, check=True, capture_output=True, env=ENV)
            shutil.rmtree(tmp / "warm")
            times = []
            for _ in range(runs):
                shutil.rmtree(tmp / "export", ignore_errors=True)
                cmd = [*MERKLOG, "--home", str(home), "parquet", "export", str(tmp / "export")]
                times.append(timed(cmd))
                load = subprocess.run(["uptime"], capture_output=True, text=True).stdout
                print(
                    f"{n:,} ops: export {times[-1][0]:.2f}s wall, {times[-1][1]:.2f}s CPU,"
                    f" {n / times[-1][0]:,.0f} ops/s; load {load.split('average:')[-1].strip()}",
                    flush=True,
                )
            wall = statistics.median(t[0] for t in times)
            cpu = statistics.median(t[1] for t in times)
            print(
                f"{n:,} ops, median of {runs}: {wall:.2f}s wall, {cpu:.2f}s CPU,"
                f" {n / wall:,.0f} ops/s (wall), {n / cpu:,.0f} ops per CPU second"
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ops", type=int, nargs="*", default=[1_000_000, 5_000_000])
    ap.add_argument("--no-session", action="store_true", help="skip the in-session Spark job")
    ap.add_argument(
        "--other-jvm",
        action="store_true",
        help="also time the compact CLI with the JVM flags its input size did not pick"
        " (MERKLOG_SPARK_LIGHT_JVM=1 or 0, ADR 0085)",
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the built homes here and reuse them on the next run (building is not timed)",
    )
    ap.add_argument(
        "--connect",
        action="store_true",
        help="also time the compact CLI against a warm Spark Connect server (local[2], started"
        " by the bench; one untimed compaction per size first, as a server that has run"
        " before): `merklog compact --remote sc://…`",
    )
    ap.add_argument(
        "--export-only",
        type=int,
        default=0,
        metavar="RUNS",
        help="time only `merklog parquet export`, RUNS times per size (median printed)",
    )
    args = ap.parse_args()
    from _bytecode import compile_merklog  # beside this script, first on sys.path

    compile_merklog()  # each timed process reads bytecode, as an installed merklog does
    if args.export_only:
        export_only(args.ops, args.workdir, args.export_only)
        return

    stack = contextlib.ExitStack()
    remote = None
    if args.connect:
        from _connect import connect_server

        remote = stack.enter_context(connect_server())
    spark = None
    if not args.no_session:
        from merklog.node.spark.session import build_session

        spark = build_session(master="local[2]")
    rows = []
    for n in args.ops:
        keep = args.workdir / str(n) if args.workdir else None
        tmp = Path(tempfile.mkdtemp(prefix="merklog-bench-compact-"))
        try:
            home = keep / "home" if keep else tmp / "home"
            if not (home / "config.toml").exists():
                build_home(home, n)
            export = tmp / "export"
            t_export = timed([*MERKLOG, "--home", str(home), "parquet", "export", str(export)])
            snap = tmp / "snap"
            t_cli = timed(
                [*MERKLOG, "--home", str(home), "compact", str(export), "--out", str(snap)]
            )
            nan = (float("nan"), float("nan"))
            t_warm = nan
            if remote is not None:
                warm = [*MERKLOG, "--home", str(home), "compact", str(export), "--remote", remote]
                timed([*warm, "--out", str(tmp / "warm-up")])  # the server's first job: untimed
                t_warm = timed([*warm, "--out", str(tmp / "warm")])
                [warm_manifest] = (tmp / "warm").glob("dataset=*/MANIFEST_CID")
            t_c2 = nan
            if args.other_jvm:
                t_c2 = timed(
                    [
                        *MERKLOG,
                        "--home",
                        str(home),
                        "compact",
                        str(export),
                        "--out",
                        str(tmp / "c2"),
                    ],
                    env=dict(ENV, MERKLOG_SPARK_LIGHT_JVM="0" if n < LIGHT_MAX_ROWS else "1"),
                )
            [manifest] = snap.glob("dataset=*/MANIFEST_CID")
            n_spark = sum(
                pq.ParquetFile(p).metadata.num_rows for p in manifest.parent.glob("facts/*.parquet")
            )
            if remote is not None:  # the same snapshot, whichever Spark ran it
                assert warm_manifest.read_text() == manifest.read_text()
            t_job = run_spark_job(spark, export, tmp / "snap2") if spark else nan
            *t_duck, n_duck = in_process(run_duckdb, export, tmp / "duck.parquet")
            *t_arrow, n_arrow = in_process(run_arrow, export, tmp / "arrow.parquet")
            assert n_spark == n_duck == n_arrow, (n_spark, n_duck, n_arrow)
            rows.append((n, t_export, t_cli, t_job, t_duck, t_arrow, t_c2, t_warm))
            print(
                f"{n} ops: export {t_export[0]:.1f}s ({n / t_export[0]:,.0f} ops/s), compact CLI"
                f" {t_cli[0]:.1f}s, in-session {t_job[0]:.1f}s, DuckDB {t_duck[0]:.1f}s,"
                f" pyarrow {t_arrow[0]:.1f}s, compact CLI on a warm Connect server"
                f" {t_warm[0]:.1f}s, visible {n_spark}",
                flush=True,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if spark is not None:
        spark.stop()
    stack.close()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"\nload: {load}")
    print("wall s (CPU s)")
    print(
        "| ops | export | export ops/s | compact CLI | Spark job in a running session | DuckDB | pyarrow |"
        " CLI/DuckDB wall | CLI/DuckDB CPU | job/DuckDB wall | compact CLI, other JVM flags |"
        " compact CLI, warm Connect server (client CPU) | warm CLI/DuckDB wall |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, te, tc, tj, td, ta, t2, tw in rows:
        print(
            f"| {n:,} | {te[0]:.1f} ({te[1]:.1f}) | {n / te[0]:,.0f} | {tc[0]:.1f} ({tc[1]:.1f})"
            f" | {tj[0]:.1f} ({tj[1]:.1f}) | {td[0]:.2f} ({td[1]:.2f}) | {ta[0]:.2f} ({ta[1]:.2f})"
            f" | {tc[0] / td[0]:.1f}× | {tc[1] / td[1]:.1f}× | {tj[0] / td[0]:.1f}×"
            f" | {t2[0]:.1f} ({t2[1]:.1f}) | {tw[0]:.1f} ({tw[1]:.1f}) | {tw[0] / td[0]:.1f}× |"
        )


if __name__ == "__main__":
    main()
