"""Spark jobs over exported replicas: Parquet export, compaction to signed snapshots,
program analysis (Datalog in DataFrames), and the session/cluster configuration."""
