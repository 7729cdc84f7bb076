"""A running node whose program runs away on a write (a counter over a cycle) fails that
epoch at its memory budget (``node.eval_memory_mb``, ADR 0207), like one that runs out
of rounds: it logs the error once, ``status`` shows the program failing, queries keep
the last good epoch, and the memory the failed evaluation took is let go. A node
grew to 21 GB and stopped answering."""

from __future__ import annotations

import time
from pathlib import Path

from .conftest import Cli

RUNAWAY = (
    "d(X, 0) :- start(X).\nd(Y, D) :- d(X, D0), edge(X, Y), D == D0 + 1.\nr(X) :- edge(X, _).\n"
)


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _rows(node, q: str) -> list:
    status, body = node.request("GET", f"/v1/query?q={q.replace(' ', '%20')}")
    assert status == 200, body
    return body["rows"]


def test_a_running_node_fails_the_epoch_at_its_budget_and_keeps_answering(
    run: Cli, home: Path, tmp_path: Path, node_factory
) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 1).")
    program = tmp_path / "d.dl"
    program.write_text(RUNAWAY)
    run("load", str(program))
    # The node's own resident memory, idle with this program, sets the budget: 64 MB more.
    probe = node_factory(home).start()
    time.sleep(0.5)
    base = _rss_mb(probe.proc.pid)
    probe.stop()
    budget = int(base) + 64
    node = node_factory(home, env={"MERKLOG_NODE_EVAL_MEMORY_MB": str(budget)}).start()
    assert _rows(node, "r(X)") == [[1], [2]] and _rows(node, "d(X, D)") == []
    t0 = time.monotonic()
    status, body = node.request("POST", "/v1/facts", {"assert": "start(1)."})
    assert status == 200, body  # the write is durable; its epoch fails at the budget
    while True:
        _, st = node.request("GET", "/v1/status")  # answered while the epoch runs
        if st["program_error"] or time.monotonic() - t0 > 60:
            break
        time.sleep(0.2)
    error = st["program_error"]
    assert f"past its memory budget of {budget:,} MB (node.eval_memory_mb)" in error
    assert "the recursion deriving d" in error and "counter over a cycle" in error
    # queries keep the last good epoch, and the node answers promptly
    assert _rows(node, "r(X)") == [[1], [2]] and _rows(node, "d(X, D)") == []
    # what the failed evaluation took is let go
    assert _rss_mb(node.proc.pid) < base + 32, (_rss_mb(node.proc.pid), base, budget)
    # retracting the seed brings the epochs back
    status, body = node.request("POST", "/v1/facts", {"retract": "start(1)."})
    assert status == 200, body
    _, st = node.request("GET", "/v1/status")
    assert st["program_error"] is None
    assert _rows(node, "d(X, D)") == []
    node.stop()
    failures = [line for line in node.stderr_lines if "memory budget" in line]
    assert len(failures) == 1 and "Traceback" not in node.stderr_text, node.stderr_text


def test_a_normal_program_is_unaffected_by_a_small_budget(
    run: Cli, home: Path, tmp_path: Path, node_factory
) -> None:
    run("init")
    run("put", *[f"edge({i}, {i + 1})." for i in range(100)])
    program = tmp_path / "p.dl"
    program.write_text("p(X, Y) :- edge(X, Y).\np(X, Z) :- p(X, Y), edge(Y, Z).\n")
    run("load", str(program))
    probe = node_factory(home).start()
    budget = int(_rss_mb(probe.proc.pid)) + 64
    probe.stop()
    node = node_factory(home, env={"MERKLOG_NODE_EVAL_MEMORY_MB": str(budget)}).start()
    status, body = node.request("POST", "/v1/facts", {"assert": "edge(100, 101)."})
    assert status == 200, body
    _, st = node.request("GET", "/v1/status")
    assert st["program_error"] is None and st["derived"] == 101 * 102 // 2
