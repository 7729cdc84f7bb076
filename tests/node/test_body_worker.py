"""A running node decodes, checks and encodes large ``POST /v1/facts`` bodies in a forked
worker process (ADR 0148): real ``merklog node run`` processes, real SQLite homes, real
HTTP on 127.0.0.1. What a write answers and stores is what the node gives without the
worker, errors keep their exact status and message, a worker that dies costs nothing
but its speed, and the worker never outlives its node."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from merklog.node import handlers, helperproc
from merklog.node.errors import NodeInputError
from merklog.node.helperproc import HelperError, Worker

from .conftest import NodeProc, init_home, reaped

# Values Python's == merges (1, 1.0, true) beside look-alikes; -0.0 is normalised.
DATALOG_VALUES = ["1", "1.0", "true", '"1"', 'x"01"', "-0.0", "9223372036854775807", '"é"']
JSON_VALUES = [1, 1.0, True, "1", {"/": {"bytes": "AQ"}}, -0.0, -9223372036854775808, "é"]


def _children(pid: int) -> list[int]:
    """The live (not reaped) child processes of ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == str(pid):
                out.append(int(entry))
    return out


def _answer(node: NodeProc, body: dict) -> tuple[int, dict]:
    """A write's status and answer without its delta's CID (each node signs its own)."""
    status, answer = node.request("POST", "/v1/facts", body)
    if isinstance(answer, dict):
        answer.pop("delta", None)
    return status, answer


def _rows(node: NodeProc, query: str) -> list:
    status, answer = node.request("POST", "/v1/query", {"q": query})
    assert status == 200, answer
    return sorted(map(repr, answer["rows"]))


def _datalog_body(n: int, bad_line: int | None = None, first: int = 0, rel: str = "val") -> str:
    """``n`` lines over the mixed values (more than WORKER_MIN_BYTES from ~4,000 on),
    line ``bad_line`` (1-based) broken at its 8th column."""
    lines = []
    for i in range(first, first + n):
        v = DATALOG_VALUES[i % len(DATALOG_VALUES)]
        lines.append(f"{rel}({i}, {v}).")
    if bad_line is not None:
        lines[bad_line - 1] = "val(1, , 2)."
    return "\n".join(lines) + "\n"


def _json_body(n: int) -> list[dict]:
    return [{"rel": "jv", "args": [i, JSON_VALUES[i % len(JSON_VALUES)]]} for i in range(n)]


#: A write that keeps the node busy for a while (decoding, writing, its epoch), so that
#: the requests sent just after it find another write in progress.
BUSY = {"assert": _datalog_body(30_000, first=10**6, rel="busy")}


def _together(node: NodeProc, bodies: list[dict]) -> list[tuple[int, dict]]:
    """``BUSY``, then each body 50 ms after the one before, each from its own thread:
    the bodies arrive while an earlier write is in progress. Their (status, answer)."""
    out: list = [None] * (len(bodies) + 1)

    def post(k: int, body: dict) -> None:
        out[k] = _answer(node, body)

    threads = []
    for k, body in enumerate([BUSY, *bodies]):
        threads.append(threading.Thread(target=post, args=(k, body)))
        threads[-1].start()
        time.sleep(0.05)
    for t in threads:
        t.join(120)
    assert out[0][0] == 200, out[0]
    return out[1:]


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _node(tmp_path: Path, name: str, node_factory, worker: bool) -> NodeProc:
    home = tmp_path / name
    init_home(home)
    env = {"MERKLOG_NODE_HELPER": "1" if worker else "0"}
    return node_factory(home, env=env).start()


@pytest.fixture
def pair(tmp_path: Path, node_factory) -> tuple[NodeProc, NodeProc]:
    """The same node twice: with its body worker, and with ``MERKLOG_NODE_HELPER=0``."""
    with_worker = _node(tmp_path, "with", node_factory, True)
    return with_worker, _node(tmp_path, "without", node_factory, False)


def test_the_worker_runs_beside_the_node_and_ends_with_it(tmp_path: Path, node_factory) -> None:
    on = _node(tmp_path, "on", node_factory, True)
    off = _node(tmp_path, "off", node_factory, False)
    assert off.proc is not None and _children(off.proc.pid) == []
    assert on.proc is not None
    (worker,) = _children(on.proc.pid)
    assert on.stop() == 0
    assert reaped(worker)


def test_large_bodies_give_the_same_answers_and_facts(pair) -> None:
    """Datalog and JSON bodies over the worker's threshold, sent while another write is in
    progress, with values that Python's == merges: the worker decodes them, the answers
    (CIDs, facts) are those of the node without a worker, and the look-alike values stay
    distinct in the store."""
    text = _datalog_body(4000)
    assert len(text.encode()) >= handlers.WORKER_MIN_BYTES
    with_worker, _without = pair
    assert with_worker.proc is not None
    (worker,) = _children(with_worker.proc.pid)
    before = _cpu_ticks(worker)
    answers = []
    for node in pair:
        got = _together(node, [{"assert": text}, {"assert": _json_body(4000)}])
        status, both = _answer(node, {"assert": "extra(1).", "retract": text[: text.index("\n")]})
        answers.append((got, (status, both), _rows(node, "val(I, X), I < 8")))
    assert _cpu_ticks(worker) > before  # the worker did decode
    assert answers[0] == answers[1]
    [(status, datalog), (status2, typed)], (status3, both), rows = answers[0]
    assert status == status2 == status3 == 200
    assert len(datalog["asserted"]) == 4000 and len(typed["asserted"]) == 4000
    assert len({item["cid"] for item in datalog["asserted"][: len(DATALOG_VALUES)]}) == len(
        DATALOG_VALUES
    )
    assert len({item["cid"] for item in typed["asserted"][: len(JSON_VALUES)]}) == len(JSON_VALUES)
    assert both["retracted"] == datalog["asserted"][:1]
    assert len(rows) == 7  # val(0, 1) was retracted; the other seven values all differ


def test_a_lone_write_is_decoded_by_the_node_itself(pair) -> None:
    """With no other write in progress the round trip would only add to the answer's
    time: the worker stays idle."""
    with_worker, _without = pair
    assert with_worker.proc is not None
    (worker,) = _children(with_worker.proc.pid)
    before = _cpu_ticks(worker)
    for k in range(3):
        status, answer = _answer(with_worker, {"assert": _datalog_body(4000, first=k * 4000)})
        assert status == 200 and len(answer["asserted"]) == 4000
    assert _cpu_ticks(worker) == before


def test_bad_large_bodies_fail_alike(pair) -> None:
    """A syntax error deep in a large body, a bad JSON value, an overflowing float: the
    same 400 and the same message (line:col for Datalog) from the worker as from the node
    without one; nothing of them is stored."""
    text = _datalog_body(4000, bad_line=3001)
    bad_json = _json_body(4000)
    bad_json[2500] = {"rel": "jv", "args": [1, 2**70]}
    overflow = text.replace("val(2010, ", "val(2010, 2e999, ")
    answers = []
    for node in pair:
        answers.append(
            _together(node, [{"assert": text}, {"assert": bad_json}, {"assert": overflow}])
        )
        for rel in ("val", "jv"):  # no fact of either relation is visible
            status, answer = node.request("POST", "/v1/query", {"q": f"{rel}(I, X)"})
            assert status == 404 and f"unknown relation {rel}/2" in answer["detail"], answer
    assert answers[0] == answers[1]
    (status, body), (status2, body2), (status3, body3) = answers[0]
    assert status == 400 and "3001:8" in body["detail"], body
    assert status2 == 400 and "assert[2500]" in body2["detail"], body2
    assert status3 == 400 and "2011:" in body3["detail"], body3


def test_a_dead_worker_costs_only_its_speed(tmp_path: Path, node_factory) -> None:
    """The worker killed with SIGKILL: the next large writes are decoded by the node
    itself, answered as before, and the node says once that its worker is gone."""
    node = _node(tmp_path, "n", node_factory, True)
    assert node.proc is not None
    (worker,) = _children(node.proc.pid)
    text = _datalog_body(5000)
    [(status, before)] = _together(node, [{"assert": text}])
    assert status == 200
    os.kill(worker, signal.SIGKILL)
    for _ in range(2):
        [(status, after)] = _together(node, [{"assert": text}])
        assert status == 200 and after == before
    deadline = time.monotonic() + 5
    while "body worker process is gone" not in node.stderr_text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.stderr_text.count("body worker process is gone") == 1
    # Reaped by the node once it found the worker gone, not left a zombie it holds.
    assert not os.path.exists(f"/proc/{worker}"), open(f"/proc/{worker}/stat").read()
    assert node.stop() == 0


# ------------------------------------------------------------------------ Worker


def _echo_or_fail(payload):
    kind, value = payload
    if kind == "fail":
        raise NodeInputError(f"1:{value}: bad")
    if kind == "local":

        class Local(Exception):
            """Defined in a function: pickle cannot find it by name."""

        raise Local("kept message")
    if kind == "pid":
        return os.getpid()
    if kind == "sleep":
        time.sleep(value)
    return value


def test_worker_answers_each_call_and_keeps_error_types() -> None:
    with Worker(_echo_or_fail) as worker:
        assert worker.call(("echo", [1, 1.0, True])) == [1, 1.0, True]
        with pytest.raises(NodeInputError, match="1:5: bad"):
            worker.call(("fail", 5))
        with pytest.raises(HelperError, match="kept message"):
            worker.call(("local", None))
        assert worker.alive  # an error is an answer: the worker goes on
        assert worker.call(("echo", b"x" * 3_000_000)) == b"x" * 3_000_000


def test_worker_serves_concurrent_callers_in_turn() -> None:
    results: dict[int, object] = {}

    def caller(k: int) -> None:
        results[k] = worker.call(("echo", k))

    with Worker(_echo_or_fail) as worker:
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert results == {k: k for k in range(8)}


def test_worker_gone_fails_fast_and_close_reaps() -> None:
    worker = Worker(_echo_or_fail)
    child = worker.call(("pid", None))
    os.kill(child, signal.SIGKILL)
    with pytest.raises(HelperError, match="ended"):
        worker.call(("echo", 1))
    assert not worker.alive
    with pytest.raises(HelperError, match="not running"):
        worker.call(("echo", 1))
    worker.close()
    worker.close()  # idempotent
    assert reaped(child)


def test_close_during_a_call_ends_it() -> None:
    worker = Worker(_echo_or_fail)
    child = worker.call(("pid", None))
    errors: list[BaseException] = []

    def slow() -> None:
        try:
            worker.call(("sleep", 30))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)
    started = time.monotonic()
    worker.close()
    t.join(5)
    assert time.monotonic() - started < 5
    assert len(errors) == 1 and isinstance(errors[0], HelperError)
    assert reaped(child)


def test_worker_child_ignores_ctrl_c_and_sigterm_and_the_switch_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Worker(_echo_or_fail) as worker:
        child = worker.call(("pid", None))
        os.kill(child, signal.SIGINT)
        os.kill(child, signal.SIGTERM)
        assert worker.call(("echo", "after the signals")) == "after the signals"
    monkeypatch.setattr(helperproc.threading, "active_count", lambda: 1)
    monkeypatch.setenv("MERKLOG_NODE_HELPER", "0")
    assert handlers.body_worker() is None
    assert helperproc.available()  # the put's helper has its own switch
