"""Programs on a node: static checks on load (CLI and HTTP), the incremental engine per
epoch (results equal the batch evaluator's; live-query deltas are its output deltas), and
the batch fallback for constructs the incremental compiler rejects."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from merklog.engine.program import Program
from merklog.node.errors import NodeInputError
from merklog.node.node import Node

from .conftest import Cli

PATH = "path(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n"

#: (program text, expected "LINE:COL" and a word of the message) per static check.
BAD_PROGRAMS = [
    ("ok(X) :- edge(X, _).\np(X, Y) :- edge(X, _).\n", "2:6", "not bound"),
    ("ok(X) :- edge(X, _).\nlonely(X) :- edge(X, _), !path(Y, X).\n", "2:32", "negated"),
    ("ok(X) :- edge(X, _).\nwin(X) :- edge(X, Y), !win(Y).\n", "2:23", "recursion"),
]


def _rows(run: Cli, q: str) -> list:
    return json.loads(run("query", "--json", q).output)["rows"]


@pytest.mark.parametrize("text,where,word", BAD_PROGRAMS)
def test_cli_load_rejects_unchecked_program_and_changes_nothing(
    run: Cli, home: Path, tmp_path: Path, text: str, where: str, word: str
) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).")
    good = tmp_path / "path.dl"
    good.write_text(PATH)
    run("load", str(good))
    config = (home / "config.toml").read_text()
    bad = tmp_path / "bad.dl"
    bad.write_text(text)
    result = run("load", str(bad), ok=False)
    assert result.exit_code == 2  # bad input
    assert f"bad.dl:{where}:" in result.output and word in result.output
    assert (home / "config.toml").read_text() == config
    assert _rows(run, "path(1, X)") == [[2], [3]]  # the old program still runs
    unknown = run("query", "ok(X)", ok=False)  # the refused program's relation: unknown
    assert unknown.exit_code == 3 and "unknown relation ok/1" in unknown.output


def test_a_query_of_an_unknown_relation_names_its_place_and_the_closest_one(
    run: Cli, tmp_path: Path
) -> None:
    """QA: ``query 'gtt(X, Y)'`` said only "unknown relation gtt/2", where the engine's
    own check (docs/language.md) gives the place and ``did you mean gt?``. The node's
    check says both, whether the close name is the program's or a stored relation's."""
    run("init")
    run("put", "edge(1, 2).")
    prog = tmp_path / "gt.dl"
    prog.write_text("gt(X, Y) :- edge(X, Y), X > Y.\n")
    run("load", str(prog))
    typo = run("query", "gtt(X, Y)", ok=False)
    assert typo.exit_code == 3, typo.output
    assert "1:1: unknown relation gtt/2" in typo.output and "(did you mean gt?)" in typo.output
    second = run("query", "edge(X, Y), edgee(Y, Z)", ok=False)
    assert "1:13: unknown relation edgee/2" in second.output
    assert "(did you mean edge?)" in second.output
    far = run("query", "zzz(X)", ok=False)
    assert far.exit_code == 3 and "did you mean" not in far.output


def test_a_relation_whose_facts_were_all_retracted_answers_no_rows(
    run: Cli, home: Path, node_factory
) -> None:
    """QA: once the last fact of a relation was retracted, ``query 'y(X)'`` and
    ``v(X), !y(X)`` said "unknown relation y/1" (exit 3, HTTP 404): a to-do app broke
    when its user deleted the last item. A relation the dataset has had facts of is
    known, with no rows, on a stopped home, through a running node and after a
    restart; one it never had stays unknown."""
    run("init")
    run("put", "v(1).", "v(2).", "y(1).", "z().")
    run("retract", "y(1).", "z().")
    assert _rows(run, "y(X)") == []
    assert _rows(run, "z()") == []
    assert _rows(run, "v(X), !y(X)") == [[1], [2]]
    assert _rows(run, "y(X, Y)") == []  # its arities went with its facts
    never = run("query", "w(X)", ok=False)
    assert never.exit_code == 3 and "unknown relation w/1" in never.output
    node = node_factory(home).start()
    for q in ("y(X)", "v(X),%20!y(X)", "z()"):
        status, body = node.request("GET", f"/v1/query?q={q}")
        assert status == 200, body
    assert body["rows"] == []
    status, body = node.request("GET", "/v1/query?q=w(X)")
    assert status == 404 and body["error"] == "unknown relation"
    node.request("POST", "/v1/facts", {"assert": "u(1).", "retract": "v(1)."})
    node.request("POST", "/v1/facts", {"retract": "u(1).", "assert": "v(1)."})
    status, body = node.request("GET", "/v1/query?q=u(X)")  # emptied while it runs
    assert status == 200 and body["rows"] == [], body


def test_a_program_reading_a_stored_relation_at_another_arity_is_refused(
    run: Cli, home: Path, tmp_path: Path, node_factory
) -> None:
    """QA: ``q(X) :- v(X, Y).`` over stored ``v/1`` facts loaded and derived nothing,
    where a query of ``v(X, Y)`` says "v exists here as v/1 only" and ``merklog eval``
    refuses the same program over the same facts. Loading refuses it at LINE:COL (CLI
    exit 2, HTTP 400), and the running program stays; a relation with no stored fact
    yet, or one the program defines, is not checked."""
    run("init")
    run("put", "v(1).", "v(2).")
    prog = tmp_path / "q.dl"
    prog.write_text("ok(X) :- u(X).\nq(X) :- v(X, Y).\n")
    refused = run("load", str(prog), ok=False)
    assert refused.exit_code == 2, refused.output
    assert "q.dl:2:9:" in refused.output and "v has arity 1 in the facts and 2 here" in (
        refused.output
    )
    run("put", "u(1).", "u(2).")
    # w has no fact yet; v/2 is the program's own (beside the stored v/1)
    prog.write_text("v(X, X) :- u(X).\nok(X) :- v(X, X), !w(X, X).\n")
    run("load", str(prog))
    assert _rows(run, "ok(X)") == [[1], [2]]
    node = node_factory(home).start()
    status, body = node.request(
        "POST", "/v1/program", {"program": "q(X) :- v(X, Y, Z).", "source": "h.dl"}
    )
    assert status == 400 and body["error"] == "bad program", body
    assert body["detail"].startswith("h.dl:1:9:"), body
    _, q = node.request("GET", "/v1/query?q=ok(X)")
    assert q["rows"] == [[1], [2]]  # the program loaded before still runs


def test_http_program_rejects_unchecked_program_with_400(home: Path, node_factory) -> None:
    run = Cli(home)
    run("init")
    node = node_factory(home).start()
    node.request("POST", "/v1/facts", {"assert": "edge(1, 2). edge(2, 3)."})
    status, body = node.request("POST", "/v1/program", {"program": PATH, "source": "p.dl"})
    assert status == 200 and body["program"] and body["engine"] == "incremental"
    for text, where, word in BAD_PROGRAMS:
        status, body = node.request("POST", "/v1/program", {"program": text, "source": "bad.dl"})
        assert status == 400, body
        assert body["error"] == "bad program"
        assert body["detail"].startswith(f"bad.dl:{where}:") and word in body["detail"]
        _, q = node.request("GET", "/v1/query?q=path(1,%20X)")
        assert q["rows"] == [[2], [3]]
        status, q = node.request("GET", "/v1/query?q=ok(X)")  # never defined: unknown
        assert status == 404 and "unknown relation ok/1" in q["detail"]
        assert q["error"] == "unknown relation"  # not found, as the CLI's exit 3
    # Through the running node the CLI reports the same message and exits 2.
    bad = home.parent / "bad.dl"
    bad.write_text(BAD_PROGRAMS[0][0])
    result = run("load", str(bad), ok=False)
    assert result.exit_code == 2 and "2:6" in result.output
    _, metrics = node.request("GET", "/metrics")
    # 4 refused programs (the 3 queries of an unknown relation were not found, not rejected)
    assert "merklog_rejected_inputs_total 4.0" in metrics.decode()


def test_load_program_raises_node_input_error(tmp_path: Path) -> None:
    with Node.open(tmp_path / "h") as node:
        for text, where, _word in BAD_PROGRAMS:
            with pytest.raises(NodeInputError, match=f"^x.dl:{where}:"):
                node.load_program(text, "x.dl")
        assert node.status()["program"] is False


MIXED = (
    PATH
    + "node(X) :- edge(X, _).\nnode(Y) :- edge(_, Y).\n"
    + "unreached(X, Y) :- node(X), node(Y), !path(X, Y).\n"
    + "fanout(X, N) :- node(X), N := count : edge(X, _).\n"
)


def test_epochs_run_incrementally_and_match_the_batch_evaluator(tmp_path: Path) -> None:
    rng = random.Random(7)
    batch = Program.parse(MIXED)
    with Node.open(tmp_path / "h") as node:
        node.load_program(MIXED, "mixed.dl")
        node.run_epoch()
        assert node.engine.mode == "incremental"
        stored: set[tuple[int, int]] = set()
        for _ in range(25):
            adds = {(rng.randrange(6), rng.randrange(6)) for _ in range(rng.randrange(4))}
            dels = set(rng.sample(sorted(stored), min(len(stored), rng.randrange(3))))
            node.write([("edge", e) for e in adds], [("edge", e) for e in dels - adds])
            stored = (stored - dels) | adds
            node.run_epoch()
            expected = batch.evaluate({"edge": stored})
            for rel in ("path", "node", "unreached", "fanout"):
                assert node.relation(rel) == set(expected.get(rel, set())), rel


def test_live_query_deltas_are_the_engine_output_deltas(tmp_path: Path) -> None:
    with Node.open(tmp_path / "h") as node:
        node.load_program(PATH, "path.dl")
        node.run_epoch()
        engine_deltas: list[tuple[int, set, set]] = []
        live: list[tuple[int, set, set]] = []

        def sink(epoch: int, changes: list) -> None:
            plus = {f.args for f, w in changes if f.rel == "path" and w > 0}
            minus = {f.args for f, w in changes if f.rel == "path" and w < 0}
            if plus or minus:
                engine_deltas.append((epoch, plus, minus))

        node.add_sink(sink)
        node.subscribe("path(X, Y)", lambda ev, a, r: live.append((node.epoch, set(a), set(r))))
        steps = [
            (["edge(1, 2).", "edge(2, 3)."], []),
            (["edge(3, 4)."], []),
            ([], ["edge(2, 3)."]),  # one retraction removes four paths at once
            (["edge(2, 3)."], ["edge(1, 2)."]),
        ]
        for adds, dels in steps:
            node.write(adds, dels)
            node.run_epoch()
        assert live[0][1:] == (set(), set())  # the initial (empty) answer
        assert live[1:] == engine_deltas
        assert engine_deltas[2][2] == {(1, 3), (1, 4), (2, 3), (2, 4)}
        assert node.relation("path") == {(2, 3), (2, 4), (3, 4)}


def test_batch_fallback_when_the_incremental_compiler_rejects(tmp_path: Path, caplog) -> None:
    text = "self(C) :- C := edge(C, _).\nsrc(X) :- edge(X, _).\n"
    with Node.open(tmp_path / "h") as node:
        node.assert_("edge(1, 2).", "edge(5, 6).")
        with caplog.at_level(logging.WARNING, logger="merklog.node.programs"):
            node.load_program(text, "fallback.dl")
        assert "falling back" in caplog.text and "fallback.dl" in caplog.text
        node.run_epoch()
        assert node.status()["engine"] == "batch"
        assert node.relation("src") == {(1,), (5,)}
        node.retract("edge(1, 2).")
        node.run_epoch()
        assert node.relation("src") == {(5,)}


def test_memory_backend_node_is_ephemeral_and_works(tmp_path: Path) -> None:
    with Node.open(tmp_path / "m", store__backend="memory") as node:
        node.load_program(PATH, "path.dl")
        node.assert_("edge(1, 2).", "edge(2, 3).")
        node.run_epoch()
        assert node.query("path(1, X)").rows == [(2,), (3,)]
        first = node.dataset
    with Node.open(tmp_path / "m", store__backend="memory") as node:
        assert node.dataset != first and node.list_facts() == []


def test_loaded_program_is_stored_in_the_home_not_read_from_its_file(
    run: Cli, home: Path, tmp_path: Path, node_factory
) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).")
    source = tmp_path / "path.dl"
    source.write_text(PATH)
    run("load", str(source))
    import tomllib

    assert tomllib.loads((home / "config.toml").read_text())["node"]["program"] == ""
    source.write_text("this is not Datalog")  # editing the file afterwards changes nothing
    assert _rows(run, "path(1, X)") == [[2], [3]]
    source.unlink()  # nor does deleting it, across restarts of a real node
    node = node_factory(home).start()
    _, q = node.request("GET", "/v1/query?q=path(1,%20X)")
    assert q["rows"] == [[2], [3]]
    node.stop()
    # node run --program with a program failing a check: refused, the stored one stays.
    bad = tmp_path / "bad.dl"
    bad.write_text(BAD_PROGRAMS[0][0])
    with pytest.raises(RuntimeError, match="exited early with 2"):
        node_factory(home, "--program", str(bad)).start()
    assert _rows(run, "path(1, X)") == [[2], [3]]
    # ... and a good one replaces it, stored too.
    source.write_text("reach(X) :- edge(1, X).\n")
    node = node_factory(home, "--program", str(source)).start()
    node.stop()
    source.unlink()
    assert _rows(run, "reach(X)") == [[2]]


def test_a_program_without_fixpoint_is_refused_and_the_running_one_stays(low_limit) -> None:
    """Loading ``n(X + 1) :- n(X).`` hung the load, every query and the node's shutdown
    (memory grew by GBs a minute). Its first epoch now stops at the round limit, the
    load is refused with the reason, and the program before keeps answering."""
    import merklog

    with merklog.open(memory=True) as node:
        node.assert_("e", 1)
        node.load_program("r(X) :- e(X).")
        with pytest.raises(merklog.Error, match="runaway.dl:2:1: the recursion deriving n"):
            node.load_program("n(0).\nn(X + 1) :- n(X).\n", "runaway.dl")
        assert node.program_text == "r(X) :- e(X)."
        assert node.query("r(X)").rows == [(1,)]
        # A write can make a loaded program run away: it is durable and said so, the
        # queries keep the last good epoch, and the next change re-derives.
        node.load_program("n(0).\nn(X + 1) :- n(X), go(1).\nm(X) :- n(X).")
        with pytest.raises(merklog.Error, match="did not reach a fixpoint"):
            node.assert_("go", 1)
        assert [f.rel for _cid, f in node.list_facts("go")] == ["go"]
        node.retract("go", 1)
        assert node.query("m(X)").rows == [(0,)]


def test_program_loads_are_atomic_to_queries_and_to_each_other(tmp_path: Path) -> None:
    """``load_program`` swapped the engine, then ran its first epoch outside the epoch
    mutex: a query in between answered 0 rows of a derived relation (neither program's
    answer), and two loads at once could leave one program running and the other stored.
    Now every query sees the old program's answer or the new one's, and the running
    program is the stored one."""
    import threading

    import merklog

    edges = [("edge", (i, i + 1)) for i in range(300)]
    programs = [
        "rr(X, Y) :- edge(X, Y).\nrr(X, Z) :- rr(X, Y), edge(Y, Z).\nwhich(1).\n",
        "rr(X, Z) :- edge(X, Z).\nrr(X, Z) :- edge(X, Y), rr(Y, Z).\nwhich(2).\n",
    ]
    home = tmp_path / "h"
    with merklog.open(home) as node:
        node.write(edges)
        node.load_program(programs[0])
        full = len(node.query("rr(X, Y)").rows)
        counts: list[int] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                counts.append(len(node.query("rr(X, Y)").rows))

        def load(k: int) -> None:
            for i in range(6):
                node.load_program(programs[(i + k) % 2], f"p{k}.dl")

        reader = threading.Thread(target=read)
        loaders = [threading.Thread(target=load, args=(k,)) for k in (0, 1)]
        reader.start()
        for t in loaders:
            t.start()
        for t in loaders:
            t.join()
        stop.set()
        reader.join()
        assert counts and set(counts) == {full}, sorted(set(counts))
        running = node.query("which(N)").rows
    with merklog.open(home) as node:
        assert node.query("which(N)").rows == running  # the stored program is the running one


def test_a_program_of_blanks_or_comments_is_no_program(tmp_path) -> None:
    """QA: loading "" left ``"program": false`` but " ", "\\n" or "% c" left it true with
    no rules. A program counts as loaded when it says something: a rule, a fact or a
    declaration."""
    import merklog

    with merklog.open(tmp_path / "h") as node:
        for text in ("", " ", "\n", "% c", "// c\n/* c */"):
            node.load_program(text)
            assert node.status()["program"] is False, text
        for text in (".decl e(a: int).", "p(1).", "q(X) :- p(X)."):
            node.load_program(text)
            assert node.status()["program"] is True, text
