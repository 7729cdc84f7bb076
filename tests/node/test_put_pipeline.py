"""``put -f`` through a running node sends chunk k+1 while it prints chunk k (ADR 0119):
the output keeps the input's order, every chunk is still one durable write, and with
one writer (a stopped home writes inline; ``retract`` keeps one request in flight)
nothing after a failed chunk is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from merklog.node.commands import put

from .conftest import Cli

# Values Python's == merges (1, 1.0, true) beside look-alikes ("1", x"01").
VALUES = ["1", "1.0", "true", '"1"', 'x"01"']


def _lines(n: int) -> list[str]:
    return [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(n)]


def _printed(output: str) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in output.splitlines() if "\t" in line]


def test_stopped_home_put_in_many_chunks_prints_in_input_order(
    run: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("init")
    lines = _lines(103)
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 7)  # 15 chunks, 15 transactions
    printed = _printed(run("put", "-f", str(data)).output)
    assert [fact + "." for _cid, fact in printed] == lines
    # The same CIDs as one-fact writes: chunking changes nothing of what is stored.
    for i in (0, 1, 2, 3, 4, 57, 102):
        (cid, _fact) = _printed(run("put", lines[i]).output)[0]
        assert cid == printed[i][0]
    assert len({cid for cid, _f in printed}) == len(lines)
    assert len(run("ls", "v").output.splitlines()) == len(lines)


def test_stopped_home_put_stops_at_the_failed_chunk(
    run: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("init")
    prog = tmp_path / "p.dl"
    prog.write_text(".decl edge(src: int, dst: int).\npath(X, Y) :- edge(X, Y).\n")
    run("load", str(prog))
    data = tmp_path / "facts.dl"
    data.write_text("edge(1, 2).\nedge(3, 4).\nedge(5, 6).\nedge(7, 1.0).\nedge(9, 10).\n")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 2)  # [1 2] [3 4] [5 (7 1.0)] [9]
    result = run("put", "-f", str(data), ok=False)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "edge(7, 1.0) does not fit" in result.output
    assert [f for _c, f in _printed(result.output)] == ["edge(1, 2)", "edge(3, 4)"]
    rows = json.loads(run("query", "--json", "edge(X, Y)").output)["rows"]
    assert sorted(rows) == [[1, 2], [3, 4]]  # the chunk after the failed one never went in


def test_running_node_put_in_many_requests_prints_in_input_order(
    home: Path, tmp_path: Path, node_factory
) -> None:
    run = Cli(home)
    run("--set", "node.max_body=8192", "init")  # bodies of ≤ 2 KiB: many requests
    node_factory(home).start()
    lines = _lines(1500)
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    printed = _printed(run("put", "-f", str(data)).output)
    assert [fact + "." for _cid, fact in printed] == lines
    assert len({cid for cid, _f in printed}) == len(lines)
    assert len(run("ls", "v").output.splitlines()) == len(lines)


@pytest.mark.parametrize("writers", [0, 1])
def test_serial_writers_send_nothing_after_a_failed_chunk(writers: int) -> None:
    sent: list[int] = []

    def write(chunk: list, lines: object) -> dict:
        sent.append(chunk[0])
        if chunk[0] == 2:
            raise ValueError("refused")
        return {"n": chunk[0]}

    got = []
    with pytest.raises(ValueError, match="refused"):
        for part, result in put.pipelined(write, (([i], None) for i in range(6)), writers):
            got.append((part[0][0], result["n"]))
    assert got == [(0, 0), (1, 1)] and sent == [0, 1, 2]


def test_two_writers_answer_in_input_order() -> None:
    import threading
    import time

    threads = set()

    def write(chunk: list, lines: object) -> dict:
        threads.add(threading.get_ident())
        time.sleep(0.01 * (chunk[0] % 3))  # later chunks may finish first
        return {"n": chunk[0]}

    got = [(p[0][0], r["n"]) for p, r in put.pipelined(write, (([i], None) for i in range(9)), 2)]
    assert got == [(i, i) for i in range(9)]
    assert threading.get_ident() not in threads  # written on worker threads


def test_running_node_put_with_a_refused_request_fails_cleanly(
    home: Path, tmp_path: Path, node_factory
) -> None:
    """Requests in flight and one refused (a ``.decl`` misfit): one clear line, exit
    2, the printed CIDs are a prefix of the input in order and all of them are stored;
    nothing before the refused request is lost."""
    run = Cli(home)
    run("--set", "node.max_body=8192", "init")
    prog = tmp_path / "p.dl"
    prog.write_text(".decl edge(src: int, dst: int).\npath(X, Y) :- edge(X, Y).\n")
    run("load", str(prog))
    node_factory(home).start()
    lines = [f"edge({i}, {i + 1})." for i in range(1200)]
    lines[700] = "edge(700, 1.0)."  # the int column gets a float: refused
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    result = run("put", "-f", str(data), ok=False)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "edge(700, 1.0) does not fit" in result.output
    printed = [fact + "." for _cid, fact in _printed(result.output)]
    assert 0 < len(printed) <= 700 and printed == lines[: len(printed)]
    stored = {json.dumps(row) for row in _rows(run)}
    assert all(json.dumps([i, i + 1]) in stored for i in range(len(printed)))
    assert json.dumps([700, 1.0]) not in stored


def _rows(run: Cli) -> list:
    return json.loads(run("query", "--json", "edge(X, Y)").output)["rows"]
