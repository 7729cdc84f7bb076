"""Differential fuzzing of the node against clingo: ``load_program``, ``assert_`` /
``retract`` in random epochs, then ``query`` of every relation.

The cases are those of the engine's clingo fuzzer (``tests/engine/clingo_fuzz.py``:
random stratified programs with recursion, negation, count/sum/min/max, arithmetic
and comparisons over mixed values — ``1``, ``1.0``, ``true``, ``"1"``, ``x"31"``
together). Each case runs on a real node, ``merklog.open(memory=True)``: the
program is loaded, every epoch of the case is written through the public API (one
``assert_``/``retract`` call per fact, or ``write`` batches, chosen at random per
epoch), and after each epoch every relation is queried — whole (``p2(X0, X1)``) and
with a constant taken from the expected answer (``p2(X0, 1.0)``: constants select
by value identity), and a live query (``subscribe``) of every defined relation is
kept from its events — and compared with clingo's stable model and with a fresh
batch evaluation of the same facts. A few cases also go through the real CLI in a
subprocess on a home on disk (``merklog init``/``load``/``put``/``retract``/
``query --json``).

CI runs every ``STEP``-th seed of the engine fuzzer's first 1,000 (``NODE_CASES``
cases, about 20 s) and ``CLI_CASES`` through the CLI. Long mode:
``MERKLOG_FUZZ_CASES=20000`` (or ``MERKLOG_LONG=1``) runs every seed of that range
through the node (``MERKLOG_FUZZ_START=N`` starts at seed N, for chunks) and
``MERKLOG_FUZZ_CLI_CASES`` (default 20 in long mode) through the CLI.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import merklog
from merklog.engine.errors import EngineError
from merklog.engine.program import Program

from ..engine.clingo_check import run_seeds
from ..engine.clingo_fuzz import EDB, Case, Generator, Rows, canon, canon_rows, merklog_const, solve

LONG = "MERKLOG_FUZZ_CASES" in os.environ or os.environ.get("MERKLOG_LONG") == "1"
START = int(os.environ.get("MERKLOG_FUZZ_START", "0"))
CASES = int(os.environ.get("MERKLOG_FUZZ_CASES", "20000" if LONG else "1000"))
STEP = 1 if LONG else 5  # CI: every 5th seed (200 node cases)
CLI_CASES = int(os.environ.get("MERKLOG_FUZZ_CLI_CASES", "20" if LONG else "1"))
CLI_EPOCHS = 3 if LONG else 2
MAX_REPORTED = 20
MERKLOG = [str(Path(sys.executable).with_name("merklog"))]


def _heads(case: Case) -> set[str]:
    """Relations the case's program defines (a relation no rule defines is unknown to
    the node's query unless it holds facts; clingo's answer for it is empty)."""
    return {rule.split("(", 1)[0] for rule in case.rules}


def _query_text(rel: str, arity: int, const: tuple[int, Any] | None = None) -> str:
    args = [f"X{i}" for i in range(arity)]
    if const is not None:
        args[const[0]] = merklog_const(const[1])
    return f"{rel}({', '.join(args)})"


def _select(want: set[tuple], pos: int, value: Any) -> set[tuple]:
    """Rows of ``want`` (canonical keys) whose column ``pos`` is ``value`` by identity."""
    key = canon(value)
    return {row for row in want if row[pos] == key}


def _diff(path: str, epoch: int, query: str, want: set, got: set) -> str:
    return (
        f"{path} epoch {epoch} {query}: missing {sorted(want - got, key=repr)}, "
        f"extra {sorted(got - want, key=repr)}"
    )


def _write_epoch(node: Any, ins: dict[str, Rows], dels: dict[str, Rows], rnd: random.Random):
    """Write one epoch of the case through the public API, in a randomly chosen style."""
    retracts = [(rel, row) for rel, rows in dels.items() for row in rows]
    asserts = [(rel, row) for rel, rows in ins.items() for row in rows]
    style = rnd.randrange(3)
    if style == 0:  # one call per fact, retractions first (each runs an epoch)
        for rel, row in retracts:
            node.retract(rel, *row)
        for rel, row in asserts:
            node.assert_(rel, *row)
    elif style == 1:  # two deltas, one epoch
        node.write(retracts=retracts)
        node.write(asserts=asserts)
        node.run_epoch()
    else:  # one delta per side, in random order, then one epoch
        sides = [("r", retracts), ("a", asserts)]
        if not (_keys(retracts) & _keys(asserts)):
            rnd.shuffle(sides)  # order matters only when a fact is on both sides
        for side, facts in sides:
            node.write(**{"retracts" if side == "r" else "asserts": facts})
        node.run_epoch()


class _Live:
    """A live query (``node.subscribe``) whose answer is kept from its events alone."""

    def __init__(self, node: Any, text: str) -> None:
        self.rows: set[tuple] = set()
        self.errors: list[str] = []
        node.subscribe(text, self.event)

    def event(self, kind: str, added: list[tuple], removed: list[tuple]) -> None:
        if kind == "result":
            self.rows = set()
        for row in canon_rows(removed):
            if row not in self.rows:
                self.errors.append(f"removed {row}, which it never added")
            self.rows.discard(row)
        self.rows |= canon_rows(added)

    def failure(self, path: str, epoch: int, text: str, want: set[tuple]) -> str | None:
        """None when the live answer is ``want`` and every removal was of a row it held."""
        if self.errors:
            return f"{path} epoch {epoch} {text}: {self.errors[0]}"
        return None if self.rows == want else _diff(path, epoch, text, want, self.rows)


def _keys(facts: list[tuple[str, tuple]]) -> set:
    return {(rel, tuple(canon(v) for v in row)) for rel, row in facts}


def check_node_case(case: Case, seed: int, stats: dict[str, int]) -> str | None:
    """None when the node agrees with clingo and with a fresh batch run after every epoch;
    else a description of the first mismatch (a crash inside merklog is one too)."""
    try:
        return _check_node(case, seed, stats)
    except AssertionError:
        raise
    except Exception as exc:  # noqa: BLE001 - any crash is a finding, reported with its seed
        return f"node raised {exc!r}"


def _check_node(case: Case, seed: int, stats: dict[str, int]) -> str | None:
    stats["cases"] += 1
    try:
        Program.parse(case.merklog, dialect="merklog", backend="tuple")
    except EngineError:
        stats["rejected"] += 1
        return None
    rnd = random.Random(seed)
    heads = _heads(case)
    facts: dict[str, Rows] = {rel: Rows() for rel in EDB}
    with merklog.open(memory=True) as node:
        node.load_program(case.merklog, source="fuzz.dl")
        live = {rel: _Live(node, _query_text(rel, len(case.kinds[rel]))) for rel in heads}
        for epoch, (ins, dels) in enumerate(case.epochs):
            for rel, rows in dels.items():
                facts[rel] -= rows
            for rel, rows in ins.items():
                facts[rel] |= rows
            _write_epoch(node, ins, dels, rnd)
            stats["epochs"] += 1
            model = solve(case, facts)
            batch = Program.parse(case.merklog, dialect="merklog", backend="tuple").evaluate(
                {r: list(rows) for r, rows in facts.items()}
            )
            for rel, kinds in case.kinds.items():
                want = canon_rows(model[rel])
                fresh = canon_rows(batch[rel]) if rel in batch else set()
                if rel not in EDB and fresh != want:
                    return _diff("batch", epoch, rel, want, fresh)
                if rel not in heads and rel not in EDB:
                    continue  # unknown to the node: its query is an error, clingo's answer empty
                text = _query_text(rel, len(kinds))
                if rel in live and (bad := live[rel].failure("live query", epoch, text, want)):
                    return bad
                try:
                    got = canon_rows(node.query(text).rows)
                except merklog.Error:
                    if rel in EDB and not facts[rel]:
                        continue  # a relation never written nor named: unknown, not empty
                    raise
                stats["queries"] += 1
                if got != want:
                    return _diff("node", epoch, text, want, got)
                if model[rel]:  # select by a constant from the answer: identity, not ==
                    row = rnd.choice(model[rel])
                    pos = rnd.randrange(len(row))
                    text = _query_text(rel, len(kinds), (pos, row[pos]))
                    got = canon_rows(node.query(text).rows)
                    sel = {tuple(r[:pos] + r[pos + 1 :]) for r in _select(want, pos, row[pos])}
                    stats["queries"] += 1
                    if got != sel:
                        return _diff("node", epoch, text, sel, got)
    return None


# ----------------------------------------------------------------------------- CLI


def _json_value(value: Any) -> Any:
    """A value of ``merklog query --json`` (DAG-JSON forms) as a Python value."""
    if isinstance(value, dict):
        data = value["/"]["bytes"]
        return base64.b64decode(data + "=" * (-len(data) % 4))
    return value


def _cli(home: Path, *args: str) -> str:
    proc = subprocess.run(
        [*MERKLOG, "--home", str(home), *args], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"merklog {' '.join(args)}: {proc.stdout}{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def _fact_text(rel: str, row: tuple) -> str:
    return f"{rel}({', '.join(merklog_const(v) for v in row)})."


def check_cli_case(case: Case, home: Path) -> str | None:
    """The case through ``merklog`` subprocesses on a home on disk: init, load, then per
    epoch ``retract`` and ``put`` of the changed facts and ``query --json`` of every
    relation the program defines, compared with clingo."""
    heads = _heads(case)
    prog = home.parent / f"{home.name}.dl"
    prog.write_text(case.merklog, encoding="utf-8")
    _cli(home, "init")
    _cli(home, "load", str(prog))
    facts: dict[str, Rows] = {rel: Rows() for rel in EDB}
    for epoch, (ins, dels) in enumerate(case.epochs):
        for rel, rows in dels.items():
            facts[rel] -= rows
        for rel, rows in ins.items():
            facts[rel] |= rows
        gone = [_fact_text(rel, row) for rel, rows in dels.items() for row in rows]
        new = [_fact_text(rel, row) for rel, rows in ins.items() for row in rows]
        if gone:
            _cli(home, "retract", *gone)
        if new:
            _cli(home, "put", *new)
        model = solve(case, facts)
        for rel in sorted(heads):
            text = _query_text(rel, len(case.kinds[rel]))
            answer = json.loads(_cli(home, "query", "--json", text))
            got = canon_rows(tuple(_json_value(v) for v in row) for row in answer["rows"])
            want = canon_rows(model[rel])
            if got != want:
                return _diff("cli", epoch, text, want, got)
    return None


# ----------------------------------------------------------------------------- tests


@pytest.mark.timeout(0 if LONG else 300)  # long mode runs for as long as it takes
def test_node_put_retract_query_match_clingo() -> None:
    stats = {"cases": 0, "rejected": 0, "epochs": 0, "queries": 0}
    failures = run_seeds(
        "node fuzz",
        range(START, START + CASES, STEP),
        lambda seed, case, counts: check_node_case(case, seed, counts),
        stats,
        max_reported=MAX_REPORTED,
        progress_every=1000 if LONG else None,
    )
    if failures:
        pytest.fail(f"{len(failures)} failing seeds\n" + "\n\n".join(failures))
    assert stats["rejected"] < stats["cases"] // 10, stats
    assert stats["queries"] > 3 * stats["cases"], stats


@pytest.mark.timeout(0 if LONG else 300)
def test_cli_put_retract_query_match_clingo(tmp_path: Path) -> None:
    """A few cases through the real CLI: cases with at least one derived row, few
    defined relations and epochs (each CLI call is a process start, about a second)."""
    done = 0
    for seed in range(START, START + CASES):
        case = Generator(seed, True).case()
        case.epochs = case.epochs[:CLI_EPOCHS]
        if len(_heads(case)) > CLI_EPOCHS or not case.epochs[-1][1]:
            continue  # too slow, or no retraction to exercise
        facts: dict[str, Rows] = {rel: Rows() for rel in EDB}
        for ins, _dels in case.epochs[:1]:
            for rel, rows in ins.items():
                facts[rel] |= rows
        model = solve(case, facts)
        if not any(model[rel] for rel in _heads(case)):
            continue
        failure = check_cli_case(case, tmp_path / f"home{seed}")
        assert failure is None, f"seed {seed}: {failure}\ncase:\n{case.describe()}"
        done += 1
        if done >= CLI_CASES:
            break
    assert done == CLI_CASES
