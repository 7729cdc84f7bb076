"""The epoch state a node commits each epoch: exact values, and resumed on reopen."""

from __future__ import annotations

from pathlib import Path

import pytest

from merklog.node.epochstate import EpochState
from merklog.node.errors import NotSettled
from merklog.node.node import Node
from merklog.store import Fact, Link, fact_cid, make_fact
from merklog.store.errors import Error

MEMORY = "mem(X)@next :- mem(X).\nmem(X) :- ev(X).\n"


def test_epoch_state_round_trips_every_value_type() -> None:
    cid = fact_cid(make_fact("e", (1,)))
    rows = {(1, -2.5, "s", b"\x00\xff", True, cid), (2, 0.0, "", b"", False, cid)}
    state = EpochState(7, "abc", {"r": rows, "q": {()}}, {Fact("ping", ("b", 1))})
    back = EpochState.decode(state.encode())
    assert back == state
    assert {type(v) for r in back.next["r"] for v in r} == {int, float, str, bytes, bool, Link}


def test_next_state_resumes_when_the_node_reopens(tmp_path: Path) -> None:
    home = tmp_path / "h"
    cid = fact_cid(make_fact("e", (1,)))
    with Node.open(home) as node:
        node.load_program(MEMORY, "mem.dl")
        node.assert_(("ev", (b"\x01",)), ("ev", (cid,)), "ev(3).")
        node.run_epoch()
        node.retract(("ev", (b"\x01",)), ("ev", (cid,)), "ev(3).")
        node.run_epoch()
        node.run_epoch()
        assert node.relation("ev") == set()
        assert node.relation("mem") == {(b"\x01",), (cid,), (3,)}  # only @next keeps them
        epoch = node.epoch
    (home / "mem.dl").write_text(MEMORY)
    # The program is recorded in the config by `merklog load`; here set it by hand.
    cfg = (home / "config.toml").read_text().replace('program = ""', f'program = "{home}/mem.dl"')
    (home / "config.toml").write_text(cfg)
    with Node.open(home) as node:
        assert node.epoch == epoch  # opening evaluates nothing; the first read does
        assert node.relation("mem") == {(b"\x01",), (cid,), (3,)}
        assert node.epoch == epoch + 1
        # A different program that still has mem/1 keeps its carried tuples (ADR 0175);
        # one that has mem only with another arity does not.
        node.load_program(MEMORY + "other(1).\n", "other.dl")
        node.run_epoch()
        assert node.relation("mem") == {(b"\x01",), (cid,), (3,)}
        node.load_program("mem(X, Y)@next :- mem(X, Y).\n", "two.dl")
        node.run_epoch()
        assert node.relation("mem") == set()


SENDER = "ping(@P, X)@async :- peer(P), want(X).\n"
RUNAWAY = "n(X) :- seed(X).\nn(X + 1) :- n(X).\n"
KEPT = "[(1,), (1.0,)]"  # repr: 1 and 1.0 are two values (an int sorts before an equal float)


def test_loading_a_program_keeps_next_tuples_and_sent_messages(tmp_path: Path, low_limit) -> None:
    """Loading the same program again, or one that is refused (its first epoch does not
    reach a fixpoint), wiped every ``@next`` tuple and forgot which ``@async`` tuples
    were sent, so each load queued them all again under fresh CIDs (ADR 0175). A plain
    ``with`` node delivers nothing: ``outbox_pending`` counts what was queued."""
    program = MEMORY + SENDER
    with Node.open(tmp_path / "h") as node:
        node.load_program(program, "p.dl")
        node.write(asserts=["ev(1).", "ev(1.0).", 'peer("http://127.0.0.1:9").', "want(1)."])
        node.retract("ev", 1)
        node.retract("ev", 1.0)
        assert repr(node.query("mem(X)").rows) == KEPT  # only @next keeps them
        assert node.status()["outbox_pending"] == 1
        node.load_program(program, "p.dl")  # the same program
        assert repr(node.query("mem(X)").rows) == KEPT
        assert node.status()["outbox_pending"] == 1
        with pytest.raises(Error, match="did not reach a fixpoint"):
            node.load_program(program + RUNAWAY + "seed(0).\n", "runaway.dl")
        assert repr(node.query("mem(X)").rows) == KEPT
        node.run_epoch()
        assert repr(node.query("mem(X)").rows) == KEPT
        assert node.status()["outbox_pending"] == 1
        # Another program still deriving ping("http://…", 1) does not send it again; a
        # tuple it newly derives is sent.
        node.load_program(program + "want(2).\n", "more.dl")
        assert repr(node.query("mem(X)").rows) == KEPT
        assert node.status()["outbox_pending"] == 2
    with Node.open(tmp_path / "h") as node:  # and the same after a restart
        node.load_program(program + "want(2).\n", "more.dl")
        assert repr(node.query("mem(X)").rows) == KEPT
        assert node.status()["outbox_pending"] == 2


def test_an_epoch_that_failed_keeps_the_next_tuples(tmp_path: Path, low_limit) -> None:
    """The epoch after a failed one re-derives from scratch; it lost the ``@next`` tuples
    the per-epoch engine of the failed epoch carried."""
    with Node.open(tmp_path / "h") as node:
        node.load_program(MEMORY + RUNAWAY, "p.dl")
        node.assert_("ev", "kept")
        node.retract("ev", "kept")
        assert node.query("mem(X)").rows == [("kept",)]
        with pytest.raises(NotSettled):
            node.assert_("seed", 0)
        node.retract("seed", 0)
        assert node.query("mem(X)").rows == [("kept",)]
