"""A reload epoch (opening a home, loading a program) is one batch evaluation over the
stored facts read in bulk (ADR 0070); the incremental engine gets the facts only at
the first epoch that changes something, or when the node runs. Answers, deltas,
``@next`` carry-over and value identity are those of the incremental path."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import psutil
import pytest

from merklog.engine.batch import Relations
from merklog.engine.program import Program
from merklog.node.edb import SCAN_FROM
from merklog.node.node import Node
from merklog.store import CIDMismatch, Link, fact_cid, make_fact

from .conftest import damage_block

#: Above the bulk scan threshold, so the home is read by the sequential block scan.
N = SCAN_FROM + 500

PROGRAM = """
q(X) :- big(X), X < 3.
c(N) :- N := count : big(_).
s(G, C, T) :- grp(G), C := count : sale(_, G, _), T := sum A : sale(_, G, A).
w(X) :- mixed(X), X == 1.
n(N) :- N := count : mixed(_).
"""

#: Five values Python calls equal or alike, and a CID (its block holds a DAG-CBOR link).
MIXED = [(1,), (1.0,), (True,), ("1",), (b"\x01",), (fact_cid(make_fact("e", (1,))),)]


def _facts() -> list[tuple[str, tuple]]:
    rng = np.random.default_rng(5)
    facts: list[tuple[str, tuple]] = [("big", (i,)) for i in range(N)]
    facts += [("sale", (i, int(g), int(a))) for i, (g, a) in enumerate(rng.integers(0, 9, (N, 2)))]
    facts += [("grp", (g,)) for g in range(12)]  # groups 9..11 have no sales: count/sum 0
    # ints beside 1.0, true, "1" and x"01": one relation that must stay a set of values
    facts += [("mixed", (i,)) for i in range(2, 40)] + [("mixed", r) for r in MIXED]
    return facts


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "h"
    with Node.open(home) as node:
        node.write(_facts())
        node.load_program(PROGRAM, "p.dl")
    return home


def _expected() -> Relations:
    grouped: dict[str, list[tuple]] = {}
    for rel, args in _facts():
        grouped.setdefault(rel, []).append(args)
    return Program.parse(PROGRAM).evaluate(grouped)


def test_opening_answers_from_the_batch_snapshot_over_int_columns(tmp_path: Path) -> None:
    home = _home(tmp_path)
    expected = _expected()
    with Node.open(home) as node:
        node.epochs.ready()  # the first epoch, which reads the stored facts (ADR 0154)
        assert node.engine.snapshot  # opened: nothing fed to the incremental engine
        held = node.epochs.edb.base()
        assert isinstance(held["big"], np.ndarray) and held["big"].shape == (N, 1)
        assert isinstance(held["sale"], np.ndarray) and held["sale"].shape == (N, 3)
        assert not isinstance(held["mixed"], np.ndarray)  # floats and bools never in int64
        for rel in ("q", "c", "s", "w", "n", "mixed"):
            assert node.relation(rel) == expected.engine(rel), rel
        rows = {json.dumps(r) for r in node.query("mixed(X)").to_json()["rows"]}
        assert len(rows) == 38 + 6
        assert {"[1]", "[1.0]", "[true]", '["1"]', '[{"/": {"bytes": "AQ"}}]'} <= rows
        assert any(type(r[0]) is Link for r in node.query("mixed(X)").rows)
        # == compares numbers exactly (1 == 1.0), never a bool with a number
        assert sorted(json.dumps(r) for r in node.query("w(X)").to_json()["rows"]) == [
            "[1.0]",
            "[1]",
        ]
        assert node.query("n(N)").rows == [(44,)]
        assert node.status()["facts"] == 2 * N + 12 + 44
        assert node.status()["derived"] == sum(expected.count(r) for r in ("q", "c", "s", "w", "n"))
        node.run_epoch()  # an epoch that changes nothing keeps the snapshot
        assert node.engine.snapshot


def test_first_change_feeds_the_engine_and_deltas_are_against_the_snapshot(
    tmp_path: Path,
) -> None:
    home = _home(tmp_path)
    with Node.open(home) as node:
        node.epochs.ready()  # the opening epoch (a sink added before it sees every tuple)
        changes: list[tuple[str, tuple, int]] = []
        node.add_sink(lambda _epoch, out: changes.extend((f.rel, f.args, w) for f, w in out))
        live: list[tuple[str, list, list]] = []
        node.subscribe("q(X)", lambda ev, added, removed: live.append((ev, added, removed)))
        # 2.0 beside the int column of big: a new, different value (the array becomes a set)
        node.write(
            [("big", (-1,)), ("big", (2.0,)), ("mixed", (1.5,))],
            [("big", (1,)), ("mixed", (True,))],
        )
        node.run_epoch()
        assert not node.engine.snapshot
        assert sorted(map(repr, changes)) == sorted(
            map(
                repr,
                [
                    ("big", (-1,), 1),
                    ("big", (2.0,), 1),
                    ("q", (2.0,), 1),
                    ("c", (N,), -1),
                    ("c", (N + 1,), 1),
                    ("big", (1,), -1),
                    ("q", (-1,), 1),
                    ("q", (1,), -1),
                    ("mixed", (1.5,), 1),
                    ("mixed", (True,), -1),
                    # n keeps its value: mixed keeps its size
                ],
            )
        )
        assert repr(live) == repr(
            [("result", [(0,), (1,), (2,)], []), ("delta", [(-1,), (2.0,)], [(1,)])]
        )
        # and from here on the incremental engine agrees with a batch evaluation
        facts = _facts()
        facts = [f for f in facts if f not in (("big", (1,)),)]
        facts = [f for f in facts if not (f[0] == "mixed" and f[1][0] is True)]
        facts += [("big", (-1,)), ("big", (2.0,)), ("mixed", (1.5,))]
        grouped: dict[str, list[tuple]] = {}
        for rel, args in facts:
            grouped.setdefault(rel, []).append(args)
        expected = Program.parse(PROGRAM).evaluate(grouped)
        for rel in ("q", "c", "s", "w", "n", "mixed"):
            assert node.relation(rel) == expected.engine(rel), rel


def test_next_tuples_of_the_snapshot_hold_at_the_following_epoch(tmp_path: Path) -> None:
    home = tmp_path / "h"
    with Node.open(home) as node:
        node.write([("ev", (i,)) for i in range(N)] + [("ev", (1.0,)), ("ev", (True,))])
        # The load runs the new program's first epoch, a reload (ADR 0163).
        node.load_program("seen(X)@next :- ev(X).\nprev(X) :- seen(X).\n", "n.dl")
        assert node.engine.snapshot
        assert len(node.relation("prev")) == 0  # nothing was seen before this epoch
        node.run_epoch()  # the snapshot's @next tuples are now true: not an idle epoch
        assert not node.engine.snapshot
        assert len(node.relation("prev")) == N + 2  # 1, 1.0 and true are three tuples


def test_a_running_node_builds_its_incremental_state_at_once(tmp_path: Path) -> None:
    home = _home(tmp_path)

    async def main() -> None:
        async with Node.open(home, node__epoch_interval=0.05) as node:
            assert node.engine.snapshot
            for _ in range(200):
                if not node.engine.snapshot:
                    break
                await asyncio.sleep(0.05)
            assert not node.engine.snapshot
            assert node.query("c(N)").rows == [(N,)]
            await node.write_async(node.coerce_facts(["big(-5)."]), [])
            await node.settled()
            assert node.query("c(N)").rows == [(N + 1,)]
            # A program loaded while running answers from its snapshot; the first change
            # after it feeds the incremental engine.
            node.load_program(PROGRAM + "d(X) :- big(X), X < 0.\n", "p2.dl")
            node.run_epoch()
            await asyncio.sleep(0.3)  # idle loop epochs keep the snapshot
            assert node.engine.snapshot
            assert node.query("d(X)").rows == [(-5,)]
            await node.write_async(node.coerce_facts(["big(-6)."]), [])
            await node.settled()
            assert not node.engine.snapshot
            assert sorted(node.query("d(X)").rows) == [(-6,), (-5,)]

    asyncio.run(main())


def test_a_damaged_block_stops_the_bulk_read(tmp_path: Path) -> None:
    home = _home(tmp_path)
    victim = fact_cid(make_fact("big", (7,)))
    damage_block(home, victim)
    # Opening reads no fact (ADR 0154): a write goes through, the first read stops.
    with Node.open(home) as node:
        node.write([("big", (-9,))], evaluate=False)
        for _ in range(2):  # and stops again: the read is not marked done
            with pytest.raises(CIDMismatch):
                node.query("big(X)")
        with pytest.raises(CIDMismatch):
            node.status()


def test_the_batch_fallback_takes_over_from_the_snapshot_too(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with Node.open(home) as node:
        node.load_program(PROGRAM, "p.dl", engine="batch", persist=False)
        node.run_epoch()
        assert node.engine.mode == "batch" and node.engine.snapshot
        changes: list[tuple[str, tuple, int]] = []
        node.add_sink(lambda _epoch, out: changes.extend((f.rel, f.args, w) for f, w in out))
        node.write([("big", (-2,))], [("big", (0,))])
        node.run_epoch()
        assert not node.engine.snapshot
        assert sorted(map(repr, changes)) == sorted(
            map(repr, [("big", (-2,), 1), ("big", (0,), -1), ("q", (-2,), 1), ("q", (0,), -1)])
        )
        assert node.query("c(N)").rows == [(N,)]


def test_a_failed_open_leaves_no_store_handle_behind(tmp_path: Path) -> None:
    """An app that catches the error of a failed ``Node.open`` (here: a damaged genesis
    block) keeps running; the store file must not stay open in its process."""
    home = _home(tmp_path)
    with Node.open(home) as node:
        victim = node.dataset
    damage_block(home, victim)
    store = str((home / "store.sqlite").resolve())

    def open_store_files() -> list[str]:
        return [f.path for f in psutil.Process().open_files() if f.path.startswith(store)]

    assert open_store_files() == []
    for _ in range(3):
        with pytest.raises(CIDMismatch):
            Node.open(home)
        assert open_store_files() == []
