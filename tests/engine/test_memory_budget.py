"""The memory budget of an evaluation (ADR 0207): a recursion that derives new values
every round (a counter over a cycle) grows the process until the machine runs out long
before MAX_FIXPOINT_ITERATIONS stops it. Every evaluator checks the process's resident
memory once per round and stops past the budget with EvaluationTooLarge.

Budgets here are a few tens of MB above the test process's own resident memory, so no
test grows it by more than that."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from merklog.engine import interrupt
from merklog.engine.errors import EngineError, EvaluationTooLarge
from merklog.engine.incremental import IncrementalEngine
from merklog.engine.program import Program

#: The runaway: on a cycle every round derives a distance one larger.
RUNAWAY = "d(X, 0) :- start(X).\nd(Y, D) :- d(X, D0), edge(X, Y), D == D0 + 1.\n"
CYCLE = {"start": {(1,)}, "edge": {(1, 2), (2, 1)}}
#: A normal recursion: it reaches its fixpoint.
CLOSURE = "p(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).\n"
CHAIN = {"e": {(i, i + 1) for i in range(200)}}
MIB = 1024 * 1024


def budget(above_mb: int = 48) -> int:
    """A budget ``above_mb`` MiB above this process's resident memory now."""
    gc.collect()
    rss = interrupt.resident_bytes()
    assert rss is not None, "/proc/self/statm is readable on Linux"
    return rss + above_mb * MIB


def check_message(err: EvaluationTooLarge, setting: str) -> None:
    text = str(err)
    assert "the recursion deriving d" in text and "past its memory budget of" in text
    assert err.rounds > 0 and f"after {err.rounds:,} rounds" in text
    assert "counter over a cycle" in text and setting in text
    assert err.code == "evaluation_too_large" and isinstance(err, EngineError)


@pytest.mark.parametrize("backend", ["auto", "tuple"])
def test_batch_evaluator_stops_a_runaway_recursion_at_the_budget(backend: str) -> None:
    limit = budget(24)  # the batch evaluator grows ~120 bytes a round on a 2-cycle
    with interrupt.memory_budget(limit, "test.budget"), pytest.raises(EvaluationTooLarge) as err:
        Program.parse(RUNAWAY, backend=backend).evaluate(CYCLE)
    check_message(err.value, "test.budget")
    assert err.value.limit == limit and err.value.size > limit
    # a program that reaches its fixpoint under the same budget is unaffected
    with interrupt.memory_budget(budget(), "test.budget"):
        got = Program.parse(CLOSURE, backend=backend).evaluate(CHAIN)
    assert len(got["p"]) == 200 * 201 // 2


def test_incremental_engine_stops_at_the_budget_and_lets_go_of_the_rounds() -> None:
    limit = budget()
    engine = IncrementalEngine(Program.parse(RUNAWAY).checked)
    with interrupt.memory_budget(limit, "test.budget"), pytest.raises(EvaluationTooLarge) as err:
        engine.step(inserts=CYCLE)
    check_message(err.value, "test.budget")
    del err
    gc.collect()
    interrupt.release_memory()
    # The engine is still referenced, but not what its rounds built (the failed
    # recursion's traces held 740 MB after a round limit): well under the budget again.
    assert interrupt.resident_bytes() < limit - 16 * MIB
    assert engine.relation("d").engine == set()  # nothing of the failed epoch
    with pytest.raises(RuntimeError, match="cannot evaluate another epoch"):
        engine.step(inserts={"start": {(2,)}})
    # A normal program under the same budget is unaffected.
    fine = IncrementalEngine(Program.parse(CLOSURE).checked)
    with interrupt.memory_budget(budget(), "test.budget"):
        fine.step(inserts=CHAIN)
        fine.step(deletes={"e": {(100, 101)}})
    assert fine.count("p") == 100 * 101 // 2 + 99 * 100 // 2


def test_the_default_budget_is_half_the_memory_or_the_environment(monkeypatch) -> None:
    monkeypatch.setattr(interrupt, "_default", None)
    monkeypatch.delenv(interrupt.ENV_MEMORY_MB, raising=False)
    limit, setting = interrupt.default_budget()
    assert limit == interrupt.available_memory() // 2 and setting == "MERKLOG_EVAL_MEMORY_MB"
    monkeypatch.setattr(interrupt, "_default", None)
    monkeypatch.setenv(interrupt.ENV_MEMORY_MB, "300")
    assert interrupt.default_budget() == (300 * MIB, "MERKLOG_EVAL_MEMORY_MB")
    monkeypatch.setattr(interrupt, "_default", None)


def _eval(tmp_path: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    facts = tmp_path / "facts"
    facts.mkdir(exist_ok=True)
    (facts / "start.facts").write_text("1\n")
    (facts / "edge.facts").write_text("1\t2\n2\t1\n")
    (facts / "e.facts").write_text("".join(f"{i}\t{i + 1}\n" for i in range(200)))
    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "eval", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd=tmp_path,
    )


#: A budget for `merklog eval`: ~50 MB above what it takes itself (~80 MB: numpy, pyarrow).
EVAL_BASE_MB = 130


def test_eval_stops_at_its_budget_with_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "d.dl").write_text(RUNAWAY)
    (tmp_path / "p.dl").write_text(CLOSURE)
    for extra, env in [
        (("--memory-mb", str(EVAL_BASE_MB)), None),
        ((), {"MERKLOG_EVAL_MEMORY_MB": str(EVAL_BASE_MB)}),
    ]:
        done = _eval(tmp_path, "d.dl", "--facts", "facts", "--out", "out", *extra, env=env)
        assert done.returncode == 1, done.stderr
        first, hint = done.stderr.splitlines()  # the error and its hint, no traceback
        assert first.startswith("Error: the evaluation stopped after "), done.stderr
        assert f"past its memory budget of {EVAL_BASE_MB} MB" in first
        assert "--memory-mb, MERKLOG_EVAL_MEMORY_MB" in first
        assert "counter over a cycle" in hint and "Traceback" not in done.stderr
        assert not (tmp_path / "out").exists()
    done = _eval(
        tmp_path, "p.dl", "--facts", "facts", "--out", "out", "--memory-mb", str(EVAL_BASE_MB)
    )
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "out" / "p.csv").read_text().splitlines()) == 200 * 201 // 2


def test_eval_says_a_memory_error_in_one_line(tmp_path: Path) -> None:
    """The machine (or ulimit -v) can run out inside a round, before the budget: the CLI's
    boundary says it in one line that names the runaway recursion among the causes."""
    code = (
        "import sys\n"
        "from merklog.engine.program import Program\n"
        "def out_of_memory(self, facts=None):\n"
        "    raise MemoryError\n"
        "Program.evaluate = out_of_memory\n"
        "from merklog.node.cli import main\n"
        "sys.argv = ['merklog', *sys.argv[1:]]\n"
        "main()\n"
    )
    (tmp_path / "d.dl").write_text(RUNAWAY)
    (tmp_path / "facts").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", code, "eval", "d.dl", "--facts", "facts", "--out", "out"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Error: out of memory: "), done.stderr
    assert "a counter over a cycle" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_eval_refuses_a_budget_that_is_not_a_number(tmp_path: Path) -> None:
    (tmp_path / "d.dl").write_text(RUNAWAY)
    done = _eval(tmp_path, "d.dl", "--facts", "facts", "--memory-mb", "lots")
    assert done.returncode == 2 and "--memory-mb" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
