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
- the Python floor: pyarrow alone (hash group-by and anti-join in Arrow), in process.

It checks that every engine finds the same number of visible facts, then prints
the times and the Spark/DuckDB ratios, with the machine load (``uptime``)
beside them: on a shared machine, compare ratios from the same run only.

    .venv/bin/python bench/compact.py                 # 1M and 5M ops
    .venv/bin/python bench/compact.py --ops 200000    # a quick run
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return elapsed


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


def run_spark_job(spark, export: Path, out: Path) -> float:
    from merklog.node.spark.compact import compact
    from merklog.replication.identity import Identity

    t = time.perf_counter()
    compact(spark, [export], out, Identity.from_seed(b"\x01" * 32))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ops", type=int, nargs="*", default=[1_000_000, 5_000_000])
    ap.add_argument("--no-session", action="store_true", help="skip the in-session Spark job")
    args = ap.parse_args()

    spark = None
    if not args.no_session:
        from merklog.node.spark.session import build_session

        spark = build_session(master="local[2]")
    rows = []
    for n in args.ops:
        tmp = Path(tempfile.mkdtemp(prefix="merklog-bench-compact-"))
        try:
            home = tmp / "home"
            build_home(home, n)
            export = tmp / "export"
            t_export = timed([*MERKLOG, "--home", str(home), "parquet", "export", str(export)])
            snap = tmp / "snap"
            t_cli = timed(
                [*MERKLOG, "--home", str(home), "compact", str(export), "--out", str(snap)]
            )
            [manifest] = snap.glob("dataset=*/MANIFEST_CID")
            n_spark = sum(
                pq.ParquetFile(p).metadata.num_rows for p in manifest.parent.glob("facts/*.parquet")
            )
            t_job = run_spark_job(spark, export, tmp / "snap2") if spark else float("nan")
            t_duck, n_duck = run_duckdb(export, tmp / "duck.parquet")
            t_arrow, n_arrow = run_arrow(export, tmp / "arrow.parquet")
            assert n_spark == n_duck == n_arrow, (n_spark, n_duck, n_arrow)
            rows.append((n, t_export, t_cli, t_job, t_duck, t_arrow, n_spark))
            print(
                f"{n} ops: export {t_export:.1f}s ({n / t_export:,.0f} ops/s), compact CLI"
                f" {t_cli:.1f}s, in-session {t_job:.1f}s, DuckDB {t_duck:.1f}s,"
                f" pyarrow {t_arrow:.1f}s, visible {n_spark}",
                flush=True,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if spark is not None:
        spark.stop()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"\nload: {load}")
    print(
        "| ops | export s | export ops/s | compact CLI s | Spark job s (warm) | DuckDB s |"
        " pyarrow s | CLI/DuckDB | job/DuckDB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, te, tc, tj, td, ta, _v in rows:
        print(
            f"| {n:,} | {te:.1f} | {n / te:,.0f} | {tc:.1f} | {tj:.1f} | {td:.2f} | {ta:.2f}"
            f" | {tc / td:.1f}× | {tj / td:.1f}× |"
        )


if __name__ == "__main__":
    main()
