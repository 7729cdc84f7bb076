"""Opening a home reads no stored fact (ADR 0154): the first epoch, which reads the
visible set, runs when an epoch or a read first needs it. Commands that only write,
read blocks or count (``put``, ``get``, ``export``, ``status`` without a program) on a
stopped home never read the visible set; ``query`` does, and still finds damage.

The proof that a command did not read the facts is a damaged fact block, which any read
of the visible set re-hashes and refuses: real ``merklog`` processes on a real home.
"""

from __future__ import annotations

from pathlib import Path

from merklog.node.failures import ExitCode
from merklog.node.node import Node
from merklog.store import fact_cid, make_fact

from .conftest import Cli, damage_block
from .test_cli_errors import assert_fails, merklog

MIXED = ["p(1).", "p(1.0).", "p(true).", 'p("1").', 'p(x"01").', "edge(1, 2).", "edge(2, 3)."]


def test_writes_and_block_reads_on_a_stopped_home_read_no_stored_fact(tmp_path: Path) -> None:
    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", *MIXED)
    victim = fact_cid(make_fact("edge", (1, 2)))
    damage_block(home, victim)

    put = merklog(home, "put", "edge(5, 6).")
    assert put.returncode == 0, put.stderr
    new_cid, fact = put.stdout.strip().split("\t")
    assert fact == "edge(5, 6)"
    got = merklog(home, "get", new_cid)
    assert got.returncode == 0 and "edge" in got.stdout, got.stderr
    retract = merklog(home, "retract", "p(1.0).")
    assert retract.returncode == 0, retract.stderr
    status = merklog(home, "status")
    assert status.returncode == 0, status.stderr
    # 1, 1.0, true, "1", x"01": five facts; 1.0 retracted; edge(5, 6) added
    assert "7 stored, 0 derived" in status.stdout, status.stdout

    # The first read of the visible set still re-hashes every block it reads.
    failed = assert_fails(merklog(home, "query", "p(X)"), ExitCode.STORE_DAMAGED, str(victim))
    assert "fsck" in failed


def test_status_counts_what_the_first_epoch_reads(tmp_path: Path) -> None:
    """The count from the index before any epoch equals the facts the epoch reads, with
    values that are equal in Python (1, 1.0, true) and a retract written before it."""
    home = tmp_path / "h"
    with Node.open(home) as node:
        node.write(MIXED)
        epoch = node.epoch
    with Node.open(home) as node:
        node.write(["p(2)."], ["p(true)."], evaluate=False)
        assert node.epoch == epoch  # opening and a bulk write evaluate nothing
        before = node.status()
        assert node.epoch == epoch  # no program: status needs no epoch either
        assert before["facts"] == len(MIXED)
        rows = node.query("p(X)").rows
        assert node.epoch == epoch + 1
        assert sorted(map(repr, rows)) == sorted(
            map(repr, [(1,), (1.0,), ("1",), (b"\x01",), (2,)])
        )
        assert node.status()["facts"] == before["facts"]


def test_status_of_a_home_with_a_program_evaluates_it(tmp_path: Path) -> None:
    home = tmp_path / "h"
    with Node.open(home) as node:
        node.write(MIXED)
        node.load_program("path(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n")
    with Node.open(home) as node:
        status = node.status()
        assert (status["facts"], status["derived"]) == (len(MIXED), 3)
