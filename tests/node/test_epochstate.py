"""The epoch state a node commits each epoch: exact values, and resumed on reopen."""

from __future__ import annotations

from pathlib import Path

from merklog.node.epochstate import EpochState
from merklog.node.node import Node
from merklog.store import Fact, Link, fact_cid, make_fact

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
        # A different program does not inherit the carry-over.
        node.load_program(MEMORY + "other(1).\n", "other.dl")
        node.run_epoch()
        assert node.relation("mem") == set()
