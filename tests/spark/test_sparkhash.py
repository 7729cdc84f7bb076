"""ADR 0196: Spark's hash partitioning of ``bigint`` keys restated in numpy equals
Spark's own ``hash()`` and ``repartition``, so the tags the driver stages land in the
files Spark's shuffle would have given them."""

from __future__ import annotations

import numpy as np
import pytest

from merklog.node.spark.sparkhash import long_partition, spark_hash_long

pytestmark = pytest.mark.spark


def test_long_hash_and_partition_equal_sparks(spark) -> None:
    from pyspark.sql import functions as F

    rng = np.random.default_rng(5)
    values = [0, 1, -1, 2**31, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 255, -256]
    values += rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64).tolist()
    df = spark.createDataFrame([(v,) for v in values], "k bigint")
    got = {r["k"]: r["h"] for r in df.select("k", F.hash("k").alias("h")).collect()}
    mine = spark_hash_long(np.array(values, np.int64))
    assert [int(h) for h in mine] == [got[v] for v in values]
    for n in (1, 4, 7):
        placed = df.repartition(n, "k").select("k", F.spark_partition_id().alias("p")).collect()
        parts = long_partition(np.array(values, np.int64), n)
        assert {r["k"]: r["p"] for r in placed} == dict(zip(values, parts.tolist(), strict=True))
    assert spark_hash_long(np.zeros(0, np.int64)).size == 0


def test_staged_tags_are_partitioned_sorted_and_each_once(tmp_path) -> None:
    """``stage_partitioned`` writes what the shuffled job stages: a file per partition
    that holds tags, named by the partition, sorted by ``(fact_key, dataset, delta_key)``,
    each tag once although two files repeat it; nothing (but the folder) for no tags."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from merklog.node.spark.livetags import TAG_COLUMNS, stage_partitioned

    rng = np.random.default_rng(9)
    rows = {(int(f), int(d), int(t)) for f, d, t in rng.integers(-50, 50, (400, 3))}
    rows |= {(2**63 - 1, 0, -(2**63)), (-(2**63), 1, 2**63 - 1)}
    listed = sorted(rows)
    rng.shuffle(listed)
    source = tmp_path / "tags"
    source.mkdir()
    for i, part in enumerate((listed[:300], listed[200:])):  # 100 tags in both files
        table = pa.table(
            {
                "fact_key": pa.array([r[0] for r in part], pa.int64()),
                "dataset": pa.array([r[1] for r in part], pa.int16()),
                "delta_key": pa.array([r[2] for r in part], pa.int64()),
            }
        )
        pq.write_table(table, source / f"part-{i:05d}-x.parquet")
    dest = tmp_path / "facts"
    assert stage_partitioned(source, dest, 5) == len(rows)
    assert not source.exists()
    seen = []
    for f in sorted(dest.glob("part-*.parquet")):
        got = [tuple(r[c] for c in TAG_COLUMNS) for r in pq.read_table(f).to_pylist()]
        assert got == sorted(got) and got
        p = int(f.name[5:10])
        assert set(long_partition(np.array([r[0] for r in got], np.int64), 5).tolist()) == {p}
        seen += got
    assert sorted(seen) == sorted(rows) and len(seen) == len(rows)
    (tmp_path / "none").mkdir()
    assert stage_partitioned(tmp_path / "none", tmp_path / "empty", 3) == 0
    assert (tmp_path / "empty").is_dir() and not list((tmp_path / "empty").iterdir())


def test_tags_of_one_dataset_staged_without_its_column_are_staged_as_with_it(tmp_path) -> None:
    """The one-dataset job writes ``(fact_key, delta_key)`` alone: ``stage_partitioned``
    adds the dataset code 0 as ``int16`` (the type the shuffled job stages), so its files
    are those of the same tags written with the column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from merklog.node.spark.livetags import stage_partitioned

    rng = np.random.default_rng(11)
    fact, delta = rng.integers(-(2**63), 2**63 - 1, (2, 500), dtype=np.int64)
    for name, columns in (
        ("bare", {"fact_key": fact, "delta_key": delta}),
        ("coded", {"fact_key": fact, "dataset": np.zeros(500, np.int16), "delta_key": delta}),
    ):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table(columns), tmp_path / name / "part-00000-x.parquet")
        assert stage_partitioned(tmp_path / name, tmp_path / f"{name}-staged", 4) == 500
    bare = sorted((tmp_path / "bare-staged").iterdir())
    coded = sorted((tmp_path / "coded-staged").iterdir())
    assert [f.name for f in bare] == [f.name for f in coded] and len(bare) > 1
    for b, c in zip(bare, coded, strict=True):
        assert pq.read_table(b).equals(pq.read_table(c))
        assert pq.read_table(b).schema.field("dataset").type == pa.int16()
