"""Compaction at scale: Spark (local[*]) vs single-process DuckDB on the same Parquet exports.

Generates merged replica exports of N ops (two overlapping replicas, so ~40 % of
the rows are duplicates; 75 % asserts over a pool of N/4 facts, 25 % retracts
observing earlier asserting deltas), then computes the OR-set visible set with
supports and writes it as Parquet, with both engines, side by side. Prints the
times, the ratio and checks both agree on the visible facts.

    .venv/bin/python bench/compact.py                 # 1M and 5M ops
    .venv/bin/python bench/compact.py --ops 200000    # a quick run

Fact CIDs here are unique synthetic strings (hashing 5M blocks would time the
generator, not the compaction); the row shape is exactly OPS_SCHEMA.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from merklog.node.spark.schema import OPS_SCHEMA, VALUE_TYPE

OPS_PER_DELTA = 8


def _args(a: np.ndarray, b: np.ndarray) -> pa.Array:
    n = len(a)
    nulls = pa.nulls(2 * n)
    vals = np.empty(2 * n, dtype=np.int64)
    vals[0::2], vals[1::2] = a, b
    struct = pa.StructArray.from_arrays(
        [
            pa.array(["int"] * (2 * n)),
            pa.array(vals),
            nulls.cast(pa.float64()),
            nulls.cast(pa.string()),
            nulls.cast(pa.binary()),
            nulls.cast(pa.bool_()),
            nulls.cast(pa.string()),
        ],
        fields=list(VALUE_TYPE),
    )
    return pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), struct)


def generate(n_ops: int, out: Path, seed: int = 0) -> list[Path]:
    """Two replica exports whose union holds ``n_ops`` distinct ops."""
    rng = np.random.default_rng(seed)
    n_assert = int(n_ops * 0.75)
    n_retract = n_ops - n_assert
    pool = max(1, n_ops // 4)
    side = int(pool**0.5) + 1
    fact = np.concatenate([rng.integers(0, pool, n_assert), np.zeros(n_retract, dtype=np.int64)])
    idx = np.arange(n_ops)
    delta = idx // OPS_PER_DELTA
    op_index = (idx % OPS_PER_DELTA).astype(np.int32)
    observed_of = rng.integers(0, n_assert, n_retract)  # each retract observes one earlier assert
    fact[n_assert:] = fact[observed_of]
    is_assert = idx < n_assert
    fact_cid = np.char.add("bafyfact", fact.astype(str))
    delta_cid = np.char.add("bafydelta", delta.astype(str))
    author = (delta % 4).astype(str)
    observed = pa.array(
        [None] * n_assert
        + [[s] for s in np.char.add("bafydelta", (observed_of // OPS_PER_DELTA).astype(str))],
        type=pa.list_(pa.string()),
    )
    parents = pa.array(
        [[f"bafydelta{d - 1}"] if d else [] for d in range(int(delta[-1]) + 1)],
        type=pa.list_(pa.string()),
    ).take(pa.array(delta))
    table = pa.table(
        {
            "dataset": pa.array(np.full(n_ops, "bafydataset")),
            "delta_cid": pa.array(delta_cid),
            "author": pa.array(author),
            "clock": pa.array(delta + 1),
            "seq": pa.array(delta // 4 + 1),
            "parents": parents,
            "op_index": pa.array(op_index),
            "op": pa.array(np.where(is_assert, "assert", "retract")),
            "relation": pa.array(np.full(n_ops, "edge")),
            "args": _args(fact // side, fact % side),
            "fact_cid": pa.array(fact_cid),
            "observed": observed,
            "key": pa.nulls(n_ops, pa.string()),
        },
        schema=OPS_SCHEMA,
    )
    # replica A holds the first 80 % of the log, replica B the last 60 %: 40 % overlap
    a_end, b_start = int(n_ops * 0.8), int(n_ops * 0.4)
    dirs = []
    for name, part in (("a", table.slice(0, a_end)), ("b", table.slice(b_start))):
        d = out / name / "ops"
        d.mkdir(parents=True)
        pq.write_table(part, d / "part-00000.parquet", compression="zstd", row_group_size=256_000)
        dirs.append(out / name)
    return dirs


DUCKDB_SQL = """
COPY (
  WITH ops AS (
    SELECT DISTINCT ON (delta_cid, op_index) dataset, delta_cid, op_index, op, relation, args,
           fact_cid, observed
    FROM read_parquet({files})
  ),
  asserts AS (SELECT dataset, fact_cid, delta_cid, relation, args FROM ops WHERE op = 'assert'),
  removed AS (
    SELECT DISTINCT dataset, fact_cid, unnest(observed) AS delta_cid FROM ops WHERE op = 'retract'
  ),
  live AS (SELECT a.* FROM asserts a ANTI JOIN removed r USING (dataset, fact_cid, delta_cid))
  SELECT dataset, first(relation) AS relation, fact_cid, first(args) AS args,
         list_sort(list(DISTINCT delta_cid)) AS support
  FROM live GROUP BY dataset, fact_cid ORDER BY fact_cid
) TO '{out}' (FORMAT parquet, COMPRESSION zstd)
"""


def run_duckdb(dirs: list[Path], out: Path) -> tuple[float, int]:
    import duckdb

    files = [str(p) for d in dirs for p in sorted((d / "ops").glob("*.parquet"))]
    con = duckdb.connect()
    t = time.perf_counter()
    con.execute(DUCKDB_SQL.format(files=files, out=out))
    elapsed = time.perf_counter() - t
    n = con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0]
    con.close()
    return elapsed, n


def run_spark(spark, dirs: list[Path], out: Path) -> tuple[float, int]:
    from merklog.node.spark.compact import read_ops, snapshot_frame

    t = time.perf_counter()
    snapshot_frame(read_ops(spark, dirs)).sortWithinPartitions("fact_cid").write.mode(
        "overwrite"
    ).parquet(str(out))
    elapsed = time.perf_counter() - t
    n = pq.ParquetDataset(str(out)).read(columns=["fact_cid"]).num_rows
    return elapsed, n


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ops", type=int, nargs="*", default=[1_000_000, 5_000_000])
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args()

    from merklog.node.spark.session import build_session

    spark = build_session(
        master=args.master, conf={"spark.driver.memory": "3g", "spark.sql.shuffle.partitions": "8"}
    )
    spark.sparkContext.setLogLevel("ERROR")
    warm = Path(tempfile.mkdtemp(prefix="merklog-bench-warm-"))
    try:  # warm the JVM once so the first size is not charged for it
        run_spark(spark, generate(10_000, warm), warm / "out")
    finally:
        shutil.rmtree(warm, ignore_errors=True)
    print(
        f"{'ops':>10} {'rows in':>10} {'visible':>9} {'spark s':>9} {'duckdb s':>9} {'spark/duckdb':>13}"
    )
    for n in args.ops:
        tmp = Path(tempfile.mkdtemp(prefix="merklog-bench-compact-"))
        try:
            dirs = generate(n, tmp)
            rows_in = sum(
                pq.ParquetFile(p).metadata.num_rows
                for d in dirs
                for p in (d / "ops").glob("*.parquet")
            )
            ts, ns = run_spark(spark, dirs, tmp / "spark-out")
            td, nd = run_duckdb(dirs, tmp / "duckdb.parquet")
            assert ns == nd, f"engines disagree: spark {ns} vs duckdb {nd} visible facts"
            print(
                f"{n:>10} {rows_in:>10} {ns:>9} {ts:>9.2f} {td:>9.2f} {ts / td:>13.2f}", flush=True
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
