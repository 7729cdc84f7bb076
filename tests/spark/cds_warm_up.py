"""Dump the class-data-sharing archive the test run's Spark JVMs map (ADR 0184).

Run by tests/conftest.py in the background as a test run starts, when the run's cache has
no archive yet. It compacts and analyzes a small generated replica, as the tests' commands
do, so that the JVM loads the classes they need (Parquet, aggregates, joins, code
generation), and ends the way a command ends, by exiting: the JVM writes the archive as
it exits (``spark.stop()`` would end it without one).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from merklog.engine.parser import parse_program
from merklog.node.spark.analyze import evaluate, relations_from_snapshot, write_outputs
from merklog.node.spark.compact import compact, read_ops, snapshot_frame
from merklog.node.spark.export import export
from merklog.node.spark.gen import Simulation
from merklog.node.spark.session import build_session
from merklog.replication.identity import Identity

PROGRAM = """
    path(X, Y) :- edge(X, Y).
    path(X, Z) :- path(X, Y), edge(Y, Z).
    deg(X, N) :- edge(X, _), N := count : edge(X, _).
    cid_of(C, X, Y) :- C := edge(X, Y).
"""


def main() -> None:
    spark = build_session(master="local[2]", app_name="merklog-tests-cds", quiet=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sim = Simulation(peers=2, pool=20, seed=1).run(60)
        inputs = []
        for i in range(2):
            export(sim.log_rows(i), [], work / f"p{i}")
            inputs.append(work / f"p{i}")
        compact(spark, inputs, work / "snap", Identity.generate())
        program = parse_program(PROGRAM)
        result = evaluate(
            spark, program, relations_from_snapshot(snapshot_frame(read_ops(spark, inputs)))
        )
        write_outputs(result, ["path", "deg", "cid_of"], work / "out")


if __name__ == "__main__":
    main()
