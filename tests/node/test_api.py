"""The Python API for apps: ``merklog.open``, ``merklog.Error``, typed writes, the JSON fact
form over HTTP, and the complete app in docs/python-api.md (run as documented)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import merklog
from merklog.store import Link, fact_cid, make_fact

from .conftest import Cli, answering

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "python-api.md"

#: Five values that Python's == conflates in part (1 == 1.0 == True) but merklog keeps apart.
MIXED = [1, 1.0, True, "1", b"\x01"]


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*"))


def test_memory_node_touches_no_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("MERKLOG_HOME", str(tmp_path / "merklog-home"))
    with merklog.open(memory=True) as node:
        results = [node.assert_("v", value) for value in MIXED]
        node.load_program("w(X) :- v(X).")
        node.retract("v", "1")
        assert len(node.list_facts("v")) == 4
        assert node.status()["facts"] >= 1
    assert _files(tmp_path) == []
    cids = {r.asserted[0][0] for r in results}
    assert cids == {fact_cid(make_fact("v", [v])) for v in MIXED} and len(cids) == 5


def test_open_home_is_the_cli_home_and_errors_share_one_root(tmp_path: Path) -> None:
    home = tmp_path / "h"
    with merklog.open(home) as node:
        node.assert_("edge", 1, 2)
        assert node.query("edge(1, X)").rows == [(2,)]
        # the home lock is held, by this app and not by a running node: said as such
        with pytest.raises(merklog.Error, match=r"is open already in this process .*merklog.open"):
            merklog.open(home)
        with pytest.raises(merklog.Error):
            node.assert_("edge", float("inf"))
        with pytest.raises(merklog.Error, match="1:"):
            node.load_program("p(X) :- q(Y).")
    assert (home / "config.toml").stat().st_mode & 0o777 == 0o600
    assert "edge(1, 2)" in Cli(home)("ls").output
    with pytest.raises(merklog.Error, match="unknown option"):
        merklog.open(home, settings={"node.nope": 1})
    with pytest.raises(merklog.Error):
        merklog.open(memory=True, settings={"sync.interval": "soon"})


def test_typed_values_keep_their_identity_in_the_store(tmp_path: Path) -> None:
    cid = fact_cid(make_fact("x", [0]))
    with merklog.open(tmp_path / "h") as node:
        for value in [*MIXED, cid]:
            node.assert_("v", "k", value)
        stored = {c: f for c, f in node.list_facts("v")}
    assert len(stored) == 6
    assert {type(f.args[1]) for f in stored.values()} == {int, float, bool, str, bytes, Link}


SCRIPT = """
import asyncio, sys
import merklog

async def main():
    async with merklog.open(sys.argv[1]) as node:
        await node.sync(sys.argv[2])  # first: a joined home cannot write before it
        node.assert_("from_b", 1)
        await node.sync(sys.argv[2])
        print("synced", flush=True)

asyncio.run(main())
print("exited", flush=True)
"""


def test_async_with_exits_after_sync(tmp_path: Path, node_factory) -> None:
    """``async with merklog.open(home)`` ending in ``await node.sync(url)`` leaves the block
    and the process ends (it used to hang in the epoch loop's cancellation)."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    with merklog.open(b.home) as node_b:
        key_b = node_b.identity.public_key.hex()
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", key_b, "--writer")
    (tmp_path / "app.py").write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(tmp_path / "app.py"), str(b.home), na.url],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard, not a timing assertion
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["synced", "exited"]
    _, q = na.request("GET", "/v1/query?q=from_b(X)")
    assert q["rows"] == [[1]]


QUIET_APP = """
import asyncio, logging, socket, sys
import merklog
from merklog.engine import batch, columnar, errors, incremental

for module in (batch, columnar, errors, incremental):  # a runaway recursion fails fast
    module.MAX_FIXPOINT_ITERATIONS = 1_000
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
with socket.socket() as s:  # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]

def boom(event, added, removed):
    if event == "delta":
        raise RuntimeError("callback failed")

async def main():
    async with merklog.open(memory=True) as node:
        node.load_program("n(X + 1) :- n(X).")
        sub = node.subscribe("p(X)", boom)
        node.assert_("p", 1)
        await node.settled()
        print("subscriber closed:", sub.closed, flush=True)
        try:
            await node.sync(f"http://127.0.0.1:{port}")
        except merklog.Error as exc:
            print("sync:", type(exc).__name__, flush=True)
        for rel in ("n", "m"):  # the loop logs the first failure before it runs the next
            node.assert_(rel, 0)
            try:
                await node.settled()
            except merklog.Error as exc:
                print("settled:", type(exc).__name__, flush=True)

async def leave_during_a_failing_epoch():
    for module in (batch, columnar, errors, incremental):  # an epoch that lasts a while
        module.MAX_FIXPOINT_ITERATIONS = 20_000
    async with merklog.open(memory=True) as node:
        node.load_program("n(X + 1) :- n(X).")
        node.assert_("n", 0)
        await asyncio.sleep(0.05)  # the epoch has started: leaving the block stops it

asyncio.run(main())
asyncio.run(leave_during_a_failing_epoch())
"""


def test_the_library_prints_nothing_unless_the_app_configures_logging(tmp_path: Path) -> None:
    """An app that configured no logging got merklog's warnings on stderr through Python's
    last-resort handler: ``sync with URL failed`` (the call raises anyway), ``epoch
    failed`` and, for a live-query callback that raised, a whole traceback. The records
    still reach an app that configures logging. Leaving ``async with`` while an epoch
    failed printed asyncio's "Future exception was never retrieved" and a traceback."""
    (tmp_path / "app.py").write_text(QUIET_APP)
    said = {}
    for mode in ("quiet", "configured"):
        out = subprocess.run(
            [sys.executable, str(tmp_path / "app.py"), mode],
            capture_output=True,
            text=True,
            timeout=120,  # a hang guard, not a timing assertion
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [
            "subscriber closed: True",
            "sync: PeerUnreachable",
            "settled: NotSettled",
            "settled: NotSettled",
        ]
        said[mode] = out.stderr
    assert said["quiet"] == ""
    assert "never retrieved" not in said["configured"]
    for line in (
        "live-query subscriber",
        "RuntimeError: callback failed",
        "sync with",
        "epoch failed",
    ):
        assert line in said["configured"], said["configured"]


def test_json_fact_form_over_http_keeps_types(home: Path, node_factory) -> None:
    Cli(home)("init")
    node = node_factory(home).start()
    cid = fact_cid(make_fact("x", [0]))
    body = {
        "assert": [
            {"rel": "v", "args": [1]},
            {"rel": "v", "args": [1.0]},
            {"rel": "v", "args": [True]},
            {"rel": "v", "args": ["1"]},
            {"rel": "v", "args": [{"/": {"bytes": "AQ"}}]},
            {"rel": "v", "args": [{"/": str(cid)}]},
        ]
    }
    status, result = node.request("POST", "/v1/facts", body)
    assert status == 200, result
    expected = [make_fact("v", [v]) for v in [*MIXED, cid]]
    assert [a["cid"] for a in result["asserted"]] == [str(fact_cid(f)) for f in expected]
    # The Datalog text form of the same fact gives the same CID.
    _, text = node.request("POST", "/v1/facts", {"assert": "v(1.0)."})
    assert text["asserted"][0]["cid"] == result["asserted"][1]["cid"]
    _, q = node.request("GET", "/v1/query?q=v(X)")
    assert {"/": {"bytes": "AQ"}} in [r[0] for r in q["rows"]]
    assert {"/": str(cid)} in [r[0] for r in q["rows"]]
    _, retracted = node.request("POST", "/v1/facts", {"retract": [{"rel": "v", "args": [True]}]})
    assert retracted["retracted"][0]["cid"] == result["asserted"][2]["cid"]
    for bad in (
        [{"rel": "v", "args": [None]}],
        [{"rel": "v", "args": [{"bytes": "AQ"}]}],
        [{"rel": "v", "args": [{"/": "not-a-cid"}]}],
        [{"rel": "v", "args": [2**63]}],
        [{"rel": "v"}, 5],
        {"rel": "v", "args": [1]},
        [{"rel": "v"}],  # no "args": not v()
        [{"rel": "v", "args": [7], "arg": [8]}],  # a misspelt key
        [{"rel": "V", "args": [7]}],  # names no query or retract could write
        [{"rel": "é", "args": [7]}],
    ):
        status, err = node.request("POST", "/v1/facts", {"assert": bad})
        assert status == 400 and err["error"] == "bad input", (bad, err)
    # A key given twice wrote only its last value.
    import urllib.error
    import urllib.request

    twice = urllib.request.Request(
        node.url + "/v1/facts", data=b'{"assert": "v(8).", "assert": "v(9)."}', method="POST"
    )
    twice.add_header("Authorization", f"Bearer {node.token}")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(twice, timeout=30)
    assert refused.value.code == 400 and b"gives the key 'assert' twice" in refused.value.read()
    # Inside a fact object too: the last "rel" or "bytes" was written, with a 200.
    for body, key in (
        (b'{"assert": [{"rel": "a1", "rel": "b1", "args": [1]}]}', b"'rel'"),
        (
            b'{"assert": [{"rel": "a1", "args": [{"/": {"bytes": "AQ", "bytes": "Ag"}}]}]}',
            b"'bytes'",
        ),
        (b'{"assert": [{"rel": "a1", "args": [1], "args": [2]}]}', b"'args'"),
    ):
        nested = urllib.request.Request(node.url + "/v1/facts", data=body, method="POST")
        nested.add_header("Authorization", f"Bearer {node.token}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(nested, timeout=30)
        answer = refused.value.read()
        assert refused.value.code == 400 and b"gives the key " + key + b" twice" in answer, answer
    for name in ("a1", "b1"):
        status, err = node.request("GET", f"/v1/query?q={name}(X)")
        assert status == 404, err  # nothing of them was written
    # A JSON number no double holds as written: 1e-400 was stored as 0.0 (beside a real
    # 0.0 in the same body), 1e+999 named as "float inf", 1e999 (no sign) "float inf is
    # not finite". All are refused by name now; NaN and Infinity, which Python's decoder
    # takes, are not JSON.
    beyond = "assert[1]: v(…) argument 0: a float beyond ±1.8e308 is out of range"
    for number, shown in (
        (b"1e-400", "assert[1]: v(…) argument 0: float 1e-400 is out of range"),
        (b"1e+999", "assert[1]: v(…) argument 0: float 1e+999 is out of range"),
        (b"1e999", beyond),
        (b"-1E400", beyond),
        (b"NaN", "request body is not JSON: NaN is not a JSON number"),
        (b"-Infinity", "request body is not JSON: -Infinity is not a JSON number"),
    ):
        body = b'{"assert": [{"rel": "v", "args": [0.0]}, {"rel": "v", "args": [%s]}]}' % number
        request = urllib.request.Request(node.url + "/v1/facts", data=body, method="POST")
        request.add_header("Authorization", f"Bearer {node.token}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        detail = json.loads(refused.value.read())["detail"]
        assert refused.value.code == 400 and detail.startswith(shown), (number, detail)
    # A misspelt field wrote nothing and said 200.
    status, err = node.request("POST", "/v1/facts", {"asert": "v(7)."})
    assert status == 400 and "unknown field 'asert'" in err["detail"], err
    _, facts = node.request("GET", "/v1/facts?rel=v")
    assert len(facts["facts"]) == 5


def test_python_api_writes_only_relation_names_datalog_can_write(tmp_path: Path) -> None:
    with merklog.open(memory=True) as node:
        for rel in ("Up", "P", "é"):
            with pytest.raises(merklog.Error, match="cannot be written in Datalog"):
                node.assert_(rel, 1)
            with pytest.raises(merklog.Error, match="cannot be written in Datalog"):
                node.write(asserts=[(rel, (1,))])
        with pytest.raises(merklog.Error, match="is not a fact"):
            node.write(asserts=[("p",)])
        node.assert_("up_Down2", 1)
        assert node.query("up_Down2(X)").rows == [(1,)]


def test_the_documented_app_runs_and_prints_what_the_doc_says(tmp_path: Path) -> None:
    text = DOC.read_text()
    app = re.findall(r"```python\n(.*?)```", text, re.S)[-1]
    expected = re.search(r"Output:\n\n```text\n(.*?)```", text, re.S)
    assert expected and "asyncio.run(main())" in app
    (tmp_path / "app.py").write_text(textwrap.dedent(app))
    out = subprocess.run(
        [sys.executable, "app.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MERKLOG_HOME": str(tmp_path / "unused")},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected.group(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.py"]  # a memory node


def _joined(tmp_path: Path, name: str, origin, grant: bool = True) -> Path:
    """A home made by ``init --join`` (never synced since); the origin grants its key."""
    import json

    cli = Cli(tmp_path / name)
    cli("init", "--join", origin.url, "--token", origin.read_token)
    key = json.loads(cli("status", "--json").output)["key"]
    if grant:
        Cli(origin.home)("peers", "add", name, "http://127.0.0.1:9", "--writer", "--key", key)
    return cli.home


def test_python_api_on_a_joined_home_syncs_with_its_origin_before_the_first_write(
    tmp_path: Path, node_factory
) -> None:
    """``merklog.open(home)`` on a freshly joined home writes at once, like ``put`` and
    ``POST /v1/facts`` (ADR 0037, 0076): plain ``with`` syncs before the first write,
    ``async with`` when it opens. With the origin down the write raises merklog.Error
    naming the origin and nothing is written."""
    import asyncio

    from merklog.node.failures import NotWritableYet

    a = Cli(tmp_path / "a")
    a("init")
    origin = node_factory(a.home).start()
    b_home = _joined(tmp_path, "b", origin)
    c_home = _joined(tmp_path, "c", origin)
    with merklog.open(b_home) as node:
        results = [node.assert_("v", value) for value in MIXED]
        assert len({r.asserted[0][0] for r in results}) == 5
        rows = node.query("v(X)").rows
        assert sorted((type(x).__name__, repr(x)) for (x,) in rows) == sorted(
            (type(x).__name__, repr(x)) for x in MIXED
        )
        asyncio.run(node.sync(origin.url))  # the writes reach the origin: they were valid
    assert len([line for line in a("ls", "v").output.splitlines() if line]) == 5

    async def in_a_loop() -> list:
        async with merklog.open(c_home) as node:
            node.assert_("edge", 1, 2.0)
            await node.settled()
            return node.query("edge(X, Y)").rows

    assert asyncio.run(in_a_loop()) == [(1, 2.0)]

    d_home, e_home = _joined(tmp_path, "d", origin), _joined(tmp_path, "e", origin)
    url = origin.url
    origin.stop()
    with merklog.open(d_home) as node, pytest.raises(merklog.Error) as refused:
        node.assert_("edge", 3, 4)
    assert isinstance(refused.value, NotWritableYet)
    assert url in str(refused.value) and "cannot be reached" in str(refused.value)

    async def origin_down() -> str:
        async with merklog.open(e_home) as node:  # opens although the origin is down
            try:
                node.assert_("edge", 5, 6)
            except merklog.Error as exc:
                assert isinstance(exc, NotWritableYet)
                return str(exc)
            finally:
                assert node.list_facts() == []
        raise AssertionError("the write should have been refused")

    message = asyncio.run(origin_down())
    assert url in message and f"await node.sync({url!r})" in message
    with merklog.open(d_home) as node:
        assert node.list_facts() == []


def test_open_refuses_a_damaged_home_without_touching_it(tmp_path: Path) -> None:
    """``merklog.open`` on a home whose store was emptied wrote a fresh schema into it
    and raised ``genesis block … is not known``, after which the CLI could no longer
    say what was wrong; a truncated store raised a raw ``sqlite3.DatabaseError``, a
    directory in the store's place a raw ``IsADirectoryError``, a path that is a file a
    raw ``FileExistsError``, and a bad option left a whole home
    behind. Each is now a ``merklog.Error`` and changes nothing on disk."""
    good = tmp_path / "good"
    with merklog.open(good) as node:
        node.assert_("v", 1)
    store = (good / "store.sqlite").read_bytes()

    empty = tmp_path / "empty"
    Cli(empty)("init")
    (empty / "store.sqlite").write_bytes(b"")
    with pytest.raises(merklog.Error, match="is empty"):
        merklog.open(empty)
    assert (empty / "store.sqlite").stat().st_size == 0
    assert Cli(empty)("status", ok=False).exit_code == 5

    truncated = tmp_path / "truncated"
    Cli(truncated)("init")
    Cli(truncated)("put", "v(1).")
    (truncated / "store.sqlite").write_bytes(store[:5000])
    with pytest.raises(merklog.Error, match="damaged or not a merklog store"):
        merklog.open(truncated)
    assert (truncated / "store.sqlite").read_bytes() == store[:5000]

    # A directory in the store's place raised a raw IsADirectoryError (the CLI: exit 1).
    a_dir = tmp_path / "a-dir"
    Cli(a_dir)("init")
    (a_dir / "store.sqlite").unlink()
    (a_dir / "store.sqlite").mkdir()
    with pytest.raises(merklog.Error, match="store.sqlite is a directory, not a SQLite"):
        merklog.open(a_dir)
    assert Cli(a_dir)("status", ok=False).exit_code == 5

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(merklog.Error, match="not a directory"):
        merklog.open(a_file)

    with pytest.raises(merklog.Error, match="node.port"):
        merklog.open(tmp_path / "new", settings={"node.port": "x"})
    assert not (tmp_path / "new").exists()


def test_sync_with_something_that_is_not_a_peer_says_so() -> None:
    """``await node.sync("notaurl")`` said ``peer :// failed mid-request``; it is an
    unknown peer now (the CLI's exit 3, HTTP 404)."""
    import asyncio

    from merklog.node.failures import ExitCode

    with merklog.open(memory=True) as node:
        with pytest.raises(merklog.Error, match="unknown peer 'notaurl'") as failed:
            asyncio.run(node.sync("notaurl"))
    assert failed.value.exit_code == ExitCode.NOT_FOUND


def test_leaving_async_with_waits_for_an_epoch_still_running(tmp_path: Path, caplog) -> None:
    """A live-query callback still running when the block ended: the node released the
    home's lock at once while its epoch thread went on, so another process could write
    the home meanwhile, and the epoch then failed on the closed store ('Cannot operate
    on a closed database'). Closing now lets that epoch finish first."""
    import asyncio
    import logging
    import time

    home = tmp_path / "h"
    events: list[str] = []

    def slow(event: str, added: list, removed: list) -> None:
        if event == "delta":
            events.append("callback start")
            time.sleep(3)  # longer than stop()'s 2 s wait for the epoch
            events.append("callback end")

    async def main() -> None:
        async with merklog.open(home) as node:
            node.load_program("r(X) :- e(X).")
            node.subscribe("r(X)", slow)
            node.assert_("e", 1)
            while not events:
                await asyncio.sleep(0.05)
        events.append("closed")

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert events == ["callback start", "callback end", "closed"]
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "e(1)" in Cli(home)("ls").output


def test_a_home_that_cannot_be_made_and_a_closed_node_say_so(tmp_path: Path) -> None:
    """A home under a file raised a raw NotADirectoryError; a closed home node raised
    sqlite3.ProgrammingError on a write, and a closed memory node went on taking them."""
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(merklog.Error, match="cannot make .* a merklog home: Not a directory"):
        merklog.open(tmp_path / "a-file" / "home")
    for node in (merklog.open(memory=True), merklog.open(tmp_path / "h")):
        node.assert_("p", 1)
        node.close()
        for call in (
            lambda n=node: n.assert_("p", 2),
            lambda n=node: n.query("p(X)"),
            lambda n=node: n.load_program("q(X) :- p(X)."),
        ):
            with pytest.raises(merklog.Error, match="this node is closed"):
                call()


def test_every_call_on_a_closed_node_says_so(tmp_path: Path) -> None:
    """Reads, grants, exports, live queries and sync on a closed node: a home node raised
    sqlite3.ProgrammingError (sync blamed the peer, write_async too), a memory node went on
    signing grants and calling live queries back, and forgetting a peer's sync history
    wrote to a home the node no longer held."""
    import asyncio

    key = "cd" * 32
    for node in (merklog.open(memory=True), merklog.open(tmp_path / "h")):
        node.assert_("p", 1)
        sub = node.subscribe("p(X)", lambda *_: None)
        node.close()
        calls = {
            "list_facts": lambda n=node: n.list_facts(),
            "page_facts": lambda n=node: n.page_facts(),
            "status": lambda n=node: n.status(),
            "heads": lambda n=node: n.heads(),
            "grant": lambda n=node: n.grant(key),
            "revoke": lambda n=node: n.revoke(key),
            "export_car": lambda n=node: n.export_car(tmp_path / "x.car"),
            "run_epoch": lambda n=node: n.run_epoch(),
            "relation": lambda n=node: n.relation("p"),
            "subscribe": lambda n=node: n.subscribe("p(X)", print),
            "unsubscribe": lambda n=node, s=sub: n.unsubscribe(s),
            "add_sink": lambda n=node: n.add_sink(print),
            "write": lambda n=node: n.write(["p(3)."]),
            "sync": lambda n=node: asyncio.run(n.sync("http://127.0.0.1:9")),
            "settled": lambda n=node: asyncio.run(n.settled()),
            # raised sqlite3.ProgrammingError; saved the home's sync history without its lock
            "write_async": lambda n=node: asyncio.run(n.write_async([make_fact("p", (4,))], [])),
            "forget_peer_history": lambda n=node: n.forget_peer_history("http://127.0.0.1:9"),
        }
        for name, call in calls.items():
            with pytest.raises(merklog.Error, match="this node is closed"):
                call()
                pytest.fail(f"{name} on a closed node did not raise")
        assert not (tmp_path / "x.car").exists()


def test_with_on_a_closed_node_says_so(tmp_path: Path) -> None:
    """``with node:`` on a closed node raised nothing (the doc: every call raises)."""
    for node in (merklog.open(memory=True), merklog.open(tmp_path / "h")):
        node.close()
        with pytest.raises(merklog.Error, match="this node is closed"), node:
            pytest.fail("entered a closed node")


def test_closing_a_node_waits_for_a_write_in_flight(tmp_path: Path) -> None:
    """``close()`` while another thread's write was on its way closed the store under
    it: the write died with a raw ``sqlite3.ProgrammingError`` and was lost. A write
    that has begun now completes first (durable); one begun after close is refused
    with ``merklog.Error``, nothing stored."""
    import threading
    import time

    home = tmp_path / "h"
    facts = [("e", (i,)) for i in range(150_000)]
    node = merklog.open(home)
    outcome: dict[str, object] = {}

    def write() -> None:
        try:
            outcome["result"] = node.write(asserts=facts)
        except BaseException as exc:  # noqa: BLE001 - the test reports what it was
            outcome["error"] = exc

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 60
    while not node._writes._count and writer.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)  # until the write is on its way
    node.close()
    writer.join(120)
    assert "error" not in outcome, repr(outcome.get("error"))
    assert len(outcome["result"].asserted) == 150_000
    with pytest.raises(merklog.Error, match="this node is closed"):
        node.write(asserts=[("late", (1,))])
    with merklog.open(home) as again:
        assert len(again.query("e(X)").rows) == 150_000
        with pytest.raises(merklog.Error, match="unknown relation late"):
            again.query("late(X)")


def test_leaving_async_with_keeps_a_write_task_in_flight(tmp_path: Path) -> None:
    """A ``write_async`` task still running when its ``async with`` block ended raised
    ``sqlite3.ProgrammingError`` (not a ``merklog.Error``) and was lost. Now it either
    completes, and its facts are stored, or is refused with ``merklog.Error``."""
    import asyncio

    home = tmp_path / "h"

    async def main() -> object:
        async with merklog.open(home) as node:
            facts = [merklog.Fact("e", (i,)) for i in range(150_000)]
            task = asyncio.create_task(node.write_async(facts, []))
            await asyncio.sleep(0.2)
        try:
            return await task
        except merklog.Error as exc:
            return exc

    got = asyncio.run(main())
    with merklog.open(home) as again:
        stored = len(again.query("e(X)").rows)
    if isinstance(got, merklog.Error):
        assert "closed" in str(got) and stored == 0
    else:
        assert len(got.asserted) == 150_000 and stored == 150_000


def test_leaving_async_with_stops_a_long_epoch_at_its_next_round(tmp_path: Path) -> None:
    """Leaving ``async with`` waited for the epoch running then: 13 s for a transitive
    closure over a 1,500-link chain, 17 s for a recursion running to the 1,000,000-round
    limit (the doc promises about two seconds). A closing node now stops the evaluation
    at its next round; the writes are durable and the next open evaluates them."""
    import asyncio
    import time

    closure = "r(X, Y) :- e(X, Y).\nr(X, Z) :- r(X, Y), e(Y, Z).\n"
    runaway = "n(X + 1) :- n(X).\n"

    async def leave_while_evaluating(home: Path | None, program: str, facts: list) -> float:
        opened = merklog.open(home) if home is not None else merklog.open(memory=True)
        async with opened as node:
            node.load_program(program)
            node.write(asserts=facts)  # durable on return; its epoch starts
            await asyncio.sleep(0.3)
            started = time.monotonic()
        return time.monotonic() - started

    chain = [("e", (i, i + 1)) for i in range(1500)]
    took = asyncio.run(leave_while_evaluating(tmp_path / "h", closure, chain))
    assert took < 5, took  # 13 s before, whatever the machine's load
    took = asyncio.run(leave_while_evaluating(None, runaway, [("n", (1,))]))
    assert took < 5, took  # 17 s before
    with merklog.open(tmp_path / "h") as node:  # the next open evaluates the stored write
        assert len(node.query("r(0, X)").rows) == 1500


def test_assert_takes_its_first_argument_as_a_relation_name() -> None:
    """``assert_()`` and ``assert_("")`` wrote nothing without a word, ``assert_("", 1)``
    said "1 is not a fact", and ``assert_("a b", 1)`` was parsed as Datalog text (an error
    at 1:3). The older forms (Datalog text, Fact, pairs) still work."""
    with merklog.open(memory=True) as node:
        for args, says in (
            ((), 'assert_: give a relation name, then its values: assert_("edge", 1, 2)'),
            # a write states the rule of names a new fact may have (QA: it stated the
            # looser one of names read from a store)
            (("",), "relation name '' cannot be written in Datalog: it must start with a"),
            (("", 1), "relation name '' cannot be written in Datalog"),
            (("a b", 1), "relation name 'a b' cannot be written in Datalog: it must start"),
            (("v(80)", 1), "relation name 'v(80)' cannot be written in Datalog"),
            (("v(80)", "x"), "relation name 'v(80)' cannot be written in Datalog"),
            ((1, 2), "relation name must be a non-empty string, got 1"),
        ):
            for call in (node.assert_, node.retract):
                with pytest.raises(
                    merklog.Error, match=re.escape(says.replace("assert_", call.__name__))
                ):
                    call(*args)
        assert node.list_facts() == []
        node.assert_("p(1). p(2).")
        node.assert_("p(3).", ("p", (4,)), make_fact("p", (5,)))
        node.assert_("ok.")
        node.assert_("q", "s")
        assert node.query("p(X)").rows == [(1,), (2,), (3,), (4,), (5,)]
        assert node.query("ok").rows == [()] and node.query("q(X)").rows == [("s",)]


def test_write_in_a_plain_with_is_evaluated_like_assert(tmp_path: Path) -> None:
    """``write`` ran no epoch without an epoch loop: the next query answered the state
    before it (or UnknownRelation for a new relation) and live queries missed it."""
    for node in (merklog.open(memory=True), merklog.open(tmp_path / "h")):
        with node:
            seen = []
            node.subscribe("edge(X, Y)", lambda *event, seen=seen: seen.append(event))
            node.assert_("edge", 1, 2)
            node.write(asserts=[("edge", (2, 3))], retracts=[("edge", (1, 2))])
            assert node.query("edge(X, Y)").rows == [(2, 3)]
            assert seen[-1] == ("delta", [(2, 3)], [(1, 2)])
            node.write(asserts=[("fresh", (1, 1.0, True))])
            assert node.query("fresh(X, Y, Z)").rows == [(1, 1.0, True)]
            epoch = node.epoch
            node.write(asserts=["bulk(1)."], evaluate=False)  # durable, evaluated later
            assert node.epoch == epoch
            assert node.query("bulk(X)").rows == []  # known, not evaluated yet
            node.run_epoch()
            assert node.query("bulk(X)").rows == [(1,)]


def test_a_write_whose_epoch_fails_says_it_is_stored(low_limit) -> None:
    """A write that makes the program run away is durable; ``assert_`` raised the bare
    engine error, as if nothing had been written, and ``settled()`` returned as if the
    epoch had evaluated it."""
    import asyncio

    from merklog.node.errors import NotSettled

    with merklog.open(memory=True) as node:
        node.load_program("n(X) :- seed(X).\nn(X + 1) :- n(X).\n")
        with pytest.raises(
            NotSettled, match="the write is stored .*epoch that evaluates it failed"
        ):
            node.assert_("seed", 0)
        assert [f.args for _cid, f in node.list_facts("seed")] == [(0,)]
        try:
            node.assert_("other", 1)
        except NotSettled as exc:  # the program still fails: said, and the write is kept
            assert exc.result.asserted and exc.result.delta is not None
        assert len(node.list_facts("other")) == 1
        node.retract("seed", 0)  # the program's input gone: epochs run again
        assert node.query("other(X)").rows == [(1,)]

    async def in_a_loop() -> None:
        async with merklog.open(memory=True) as node:
            node.load_program("n(X) :- seed(X).\nn(X + 1) :- n(X).\n")
            node.assert_("seed", 0)
            with pytest.raises(NotSettled, match="the writes are stored, but the epoch"):
                await node.settled()
            node.retract("seed", 0)
            await node.settled()
            assert node.query("n(X)").rows == []

    asyncio.run(in_a_loop())


@pytest.mark.parametrize("where", ["memory", "home", "async with"])
def test_retracting_the_seed_of_a_runaway_recursion_lets_writes_settle_again(
    tmp_path: Path, low_limit, where: str
) -> None:
    """After an epoch failed, the engine kept its half-updated state: the reload that
    followed the seed's retraction answered from a snapshot, but the next write fed the
    stored facts to that engine, which still held the seed and ran away again. The write
    after the retraction raised NotSettled (a plain ``with``; ``settled()`` in ``async
    with``) and its fact stayed invisible to queries."""
    import asyncio

    from merklog.node.errors import NotSettled

    program = "n(X + 1) :- n(X).\n"
    if where != "async with":
        with merklog.open(memory=True) if where == "memory" else merklog.open(tmp_path) as node:
            node.load_program(program)
            with pytest.raises(NotSettled):
                node.assert_("n", 0)
            node.retract("n", 0)
            node.assert_("m", 1)  # raised NotSettled
            assert node.query("m(X)").rows == [(1,)]
            node.run_epoch()
            node.assert_("m", 2)
            assert node.query("m(X)").rows == [(1,), (2,)]
            assert node.query("n(X)").rows == []
        return

    async def in_a_loop() -> None:
        async with merklog.open(memory=True) as node:
            node.load_program(program)
            node.assert_("n", 0)
            with pytest.raises(NotSettled):
                await node.settled()
            node.retract("n", 0)
            await node.settled()
            node.assert_("m", 1)
            await node.settled()  # raised NotSettled
            assert node.query("m(X)").rows == [(1,)]

    asyncio.run(in_a_loop())


def test_a_home_whose_program_fails_on_its_facts_starts_and_can_be_fixed(
    tmp_path: Path, low_limit
) -> None:
    """A write that makes the loaded program run away is stored; the node restarted from
    that home refused to start (``node run`` exit 2, every time; ``async with`` raised),
    so no retraction could reach it. It starts now: status says why nothing is
    evaluated, reads raise ``ProgramFailing`` (a ``merklog.Error``, HTTP 409) instead of
    evaluating again, and the retraction of the seed brings the epochs back."""
    import asyncio

    from merklog.node.errors import NotSettled
    from merklog.node.failures import ProgramFailing

    with merklog.open(tmp_path) as node:
        node.load_program("n(X) :- seed(X).\nn(X + 1) :- n(X).\n")
        with pytest.raises(NotSettled):
            node.assert_("seed", 0)

    async def restarted() -> None:
        async with merklog.open(tmp_path) as node:  # raised the engine's error
            status = node.status()
            assert "fails on the stored facts" in status["program_error"]
            assert "retract the fact that sets it off" in status["program_error"]
            assert status["derived"] == 0 and status["facts"] == 1
            with pytest.raises(ProgramFailing, match="fails on the stored facts") as caught:
                node.query("seed(X)")
            assert isinstance(caught.value, merklog.Error)
            node.retract("seed", 0)
            await node.settled()
            assert node.query("n(X)").rows == [] and node.status()["program_error"] is None
            node.assert_("other", 1)
            await node.settled()
            assert node.query("other(X)").rows == [(1,)]

    asyncio.run(restarted())


def test_a_stopped_home_whose_program_fails_answers_reads_with_program_failing(
    tmp_path: Path, low_limit
) -> None:
    """On a stopped home (plain ``with``, the CLI) reads raised the program's own
    ``IterationLimitError`` and the CLI exited 2 (bad input) for a valid query,
    running the failing evaluation again for every read. They raise ``ProgramFailing``
    now (exit 1), as a running node's do, and a retraction of the seed fixes them."""
    from merklog.node.errors import NotSettled
    from merklog.node.failures import ExitCode, ProgramFailing

    with merklog.open(tmp_path) as node:
        node.load_program("n(X) :- seed(X).\nn(X + 1) :- n(X).\nm(X) :- k(X).\n")
        node.assert_("k", 1)
        with pytest.raises(NotSettled):
            node.assert_("seed", 0)
    with merklog.open(tmp_path) as node:
        status = node.status()  # raised ProgramFailing: status is how an operator finds out
        assert "fails on the stored facts" in status["program_error"]
        assert status["derived"] == 0 and status["facts"] == 2
        for _ in range(2):
            with pytest.raises(ProgramFailing, match="fails on the stored facts"):
                node.query("m(X)")
    done = subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(tmp_path), "query", "m(X)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert done.stderr.splitlines() == [done.stderr.splitlines()[0]]
    assert done.stderr.startswith("Error: the loaded program fails on the stored facts")
    with merklog.open(tmp_path) as node:
        node.retract("seed", 0)  # its epoch runs without the seed
        assert node.query("m(X)").rows == [(1,)]
    with merklog.open(tmp_path) as node:
        assert node.query("m(X)").rows == [(1,)] and node.query("n(X)").rows == []


def test_a_failed_program_load_leaves_the_running_program_correct(low_limit) -> None:
    """A program load whose first epoch fails puts the running program back; that epoch
    had taken a retraction the running program's engine never saw, and the write after
    the next one brought the retracted fact back into what it derives."""
    with merklog.open(memory=True) as node:
        node.load_program("q(X) :- p(X).")
        node.write(asserts=[("p", (1,)), ("p", (2,)), ("seed", (0,))])
        node.write(retracts=[("p", (1,))], evaluate=False)
        with pytest.raises(merklog.Error, match="did not reach a fixpoint"):
            node.load_program("q(X) :- p(X).\nn(X) :- seed(X).\nn(X + 1) :- n(X).\n")
        node.assert_("p", 3)
        node.assert_("p", 4)
        assert node.query("q(X)").rows == [(2,), (3,), (4,)]


def test_a_datalog_text_write_answers_the_stored_zero_not_minus_zero() -> None:
    """``write(asserts=["p(-0.0)."])`` answered a Fact holding ``-0.0`` under the CID of
    ``0.0``, the value the store keeps (and ``assert_("p", -0.0)`` answers)."""
    with merklog.open(memory=True) as node:
        typed = node.assert_("p", -0.0).asserted
        text = node.write(asserts=["p(-0.0). q(-1, -0.0, -0e5, 0.0, -2.5)."]).asserted
        assert text[0] == typed[0] and repr(text[0][1].args) == "(0.0,)"
        assert repr(text[1][1].args) == "(-1, 0.0, 0.0, 0.0, -2.5)"
        # A negative literal too small for a double is out of range, not a zero.
        with pytest.raises(merklog.Error, match="float literal 1e-400 is out of range"):
            node.write(asserts=["q(-1e-400)."])
        retracted = node.write(retracts=["p(-0.0)."]).retracted
        assert repr(retracted[0][1].args) == "(0.0,)"


def test_a_relation_written_but_not_yet_evaluated_is_known(tmp_path: Path) -> None:
    """In ``async with``, a query of a relation whose first fact was just written raised
    UnknownRelation ("no visible fact has it") until the epoch came; live queries took
    any arity and never answered a wrong one."""
    import asyncio

    async def main() -> None:
        async with merklog.open(memory=True) as node:
            node.assert_("w", 1)
            assert node.query("w(X)").rows in ([], [(1,)])  # before or after its epoch
            await node.settled()
            assert node.query("w(X)").rows == [(1,)]
            with pytest.raises(merklog.Error, match="w exists here as w/1 only"):
                node.subscribe("w(X, Y)", print)
            with pytest.raises(merklog.Error, match="unknown relation nope/1"):
                node.query("nope(X)")
            seen = []  # a live query may wait for a relation's first facts
            node.subscribe("later(X)", lambda *event: seen.append(event))
            node.assert_("later", 2)
            await node.settled()
            assert seen == [("result", [], []), ("delta", [(2,)], [])]

    asyncio.run(main())


def test_wrong_arguments_name_what_is_expected() -> None:
    """Each of these raised a raw AttributeError or ValueError with an internal message,
    or (a bare string) was read character by character."""
    import asyncio

    with merklog.open(memory=True) as node:
        cases = [
            (lambda: node.load_program(None), "a program is Datalog text, got NoneType"),
            (lambda: node.load_program("p(1).", engine="bogus"), "engine must be auto or batch"),
            (lambda: asyncio.run(node.sync(None)), "a peer is a name or an URL, got NoneType"),
            (lambda: node.unsubscribe(None), "expected a Subscription, got NoneType"),
            (lambda: node.subscribe("p(X)", None), "callback: expected a callable"),
            (lambda: node.write(asserts="edge(1, 2)."), "asserts: expected a list of facts"),
            (lambda: node.write(retracts=("edge", (1, 2))), "one \\(rel, args\\) pair"),
            (lambda: node.assert_("_x", 1), "must start with a lowercase ASCII letter"),
            # These raised a raw TypeError (or, import_car(5), read file descriptor 5).
            (lambda: node.write(asserts=5), "asserts: expected a list of facts .* got int"),
            (lambda: node.write(retracts=None), "retracts: expected a list .* got NoneType"),
            (lambda: node.coerce_facts(None), "facts: expected a list of facts"),
            # A dict's keys were read as Datalog texts: "1:5: expected ',' or '.'".
            (lambda: node.write(asserts={"edge": (1, 2)}), "asserts: expected a list .* got dict"),
            (lambda: node.export_car(5), "path: expected a path .* got int"),
            (lambda: node.import_car(5), "path: expected a path .* got int"),
            (lambda: node.import_blocks(None), "blocks: expected \\(CID, bytes\\) pairs"),
            (lambda: node.import_blocks(["x"]), "blocks\\[0\\]: expected a \\(Link, bytes\\)"),
            (lambda: merklog.open(5), "home: expected a path .* got int"),
            (lambda: merklog.open(b"/tmp/x"), "home: expected a path .* got bytes"),
            (lambda: merklog.Link(5), "a Link is a CID string .* got int"),
            (lambda: merklog.Link("bafy"), "not a base32 CID: 'bafy'"),
            # Reads check the relation name as writes do (an empty answer said nothing).
            (lambda: node.relation("a b"), "relation name 'a b' must start with a letter"),
            (lambda: node.relation(5), "relation name must be a non-empty string, got 5"),
            (lambda: node.list_facts(5), "relation name must be a non-empty string"),
            (lambda: node.page_facts(rel="a b"), "relation name 'a b'"),
        ]
        for call, message in cases:
            with pytest.raises(merklog.Error, match=message):
                call()
        np = pytest.importorskip("numpy")
        with pytest.raises(merklog.Error, match="numpy.bool is not a merklog value"):
            node.assert_("v", np.True_)
        assert node.list_facts() == []
        node.write(asserts=("a(1).", "b(2)."))  # a tuple of texts is a list of facts
        assert len(node.list_facts()) == 2
        # A name no fact has yet, or one an older version let through, reads as empty.
        assert node.relation("nosuch") == set() and node.list_facts("Up") == []
        cid = node.list_facts("a")[0][0]
        assert merklog.Link(str(cid)) == cid == merklog.Link(cid.raw)


def test_a_refusing_peer_raises_peer_refused_and_a_down_one_peer_unreachable(
    tmp_path: Path, node_factory
) -> None:
    """``except PeerUnreachable`` catches a peer that is down, not one that answered
    and refused; ``PeerError`` (a ``merklog.Error``) is the parent of both."""
    import asyncio
    import socket

    from merklog.replication.errors import PeerError, PeerRefused, PeerUnreachable

    a = Cli(tmp_path / "a")
    a("init")
    origin = node_factory(a.home).start()
    other = Cli(tmp_path / "other")
    other("init")  # another dataset: the origin answers 404
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"

    async def sync(url: str) -> BaseException:
        async with merklog.open(other.home) as node:
            try:
                await node.sync(url)
            except merklog.Error as exc:
                return exc
        raise AssertionError("the sync should have failed")

    refused = asyncio.run(sync(origin.url))
    assert isinstance(refused, PeerRefused) and isinstance(refused, PeerError)
    assert not isinstance(refused, PeerUnreachable)
    assert refused.status == 404 and "not served here" in str(refused)
    unreachable = asyncio.run(sync(down))
    assert isinstance(unreachable, PeerUnreachable) and isinstance(unreachable, PeerError)
    assert not isinstance(unreachable, PeerRefused)

    # A peer that answers 503 (its IPFS daemon is down: "store unavailable") cannot serve
    # now: worth retrying, as good as unreachable. It was a plain PeerError (exit 1).
    body = b'{"error": "store unavailable", "detail": "IPFS daemon not reachable"}'
    with answering(503, "application/json", body) as url:
        busy = asyncio.run(sync(url))
    assert isinstance(busy, PeerUnreachable) and busy.status == 503, repr(busy)


def test_async_open_on_a_joined_home_whose_origin_refuses_says_not_a_writer(
    tmp_path: Path, node_factory
) -> None:
    """The origin answers but refuses the home's key (not in its ``[peers]``): inside
    ``async with`` a write raises ``NotAWriter`` naming the refusal, as with plain
    ``with``, not ``NotWritableYet`` saying the origin was unreachable."""
    import asyncio

    from merklog.node.failures import NotAWriter

    a = Cli(tmp_path / "a")
    a("init")
    origin = node_factory(a.home).start()
    home = _joined(tmp_path, "b", origin, grant=False)

    async def write() -> merklog.Error:
        async with merklog.open(home) as node:
            try:
                node.assert_("edge", 1, 2)
            except merklog.Error as exc:
                assert node.list_facts() == []
                return exc
        raise AssertionError("the write should have been refused")

    with merklog.open(home) as node, pytest.raises(NotAWriter) as plain:
        node.assert_("edge", 1, 2)
    refused = asyncio.run(write())
    assert isinstance(refused, NotAWriter), refused
    assert "is not allowed to sync" in str(refused), refused
    assert "unreachable" not in str(refused)
    assert type(refused) is type(plain.value)


def test_open_refuses_bad_settings_before_making_a_home(tmp_path: Path) -> None:
    """A store.backend that is no backend, a dataset.id that is no CID and an epoch
    interval of NaN (which passed every range check and stopped idle epochs) were taken:
    the first two left a whole home behind, the last a node that never ticked."""
    home = tmp_path / "new"
    for settings, says in (
        ({"store.backend": "bogus"}, "store.backend"),
        ({"dataset.id": "bogus"}, "dataset.id"),
        ({"node.epoch_interval": float("nan")}, "node.epoch_interval"),
        ({"sync.timeout": float("inf")}, "sync.timeout"),
    ):
        with pytest.raises(merklog.Error, match=says):
            merklog.open(home, settings=settings)
        assert not home.exists()
    with merklog.open(memory=True, settings={"store.backend": "memory"}) as node:
        node.assert_("p", 1)  # the memory store stays the Python API's


def test_open_refuses_settings_that_are_no_mapping_of_option_names(tmp_path: Path) -> None:
    """A non-string key raised a raw AttributeError, a list of pairs was taken as no
    settings at all, and every settings error said "command line:" though none was used."""
    home = tmp_path / "new"
    for settings, says in (
        ({1: 2}, "settings: an option name is a dotted string such as 'sync.interval', got 1"),
        ([("sync.interval", 1.0)], "settings: expected a mapping of option names to values"),
        ({"nope.key": 1}, "settings: unknown option 'nope.key'"),
        ({"sync.interval": "x"}, "settings: sync.interval must be a number"),
    ):
        for open_ in (
            lambda s=settings: merklog.open(home, settings=s),
            lambda s=settings: merklog.open(memory=True, settings=s),
        ):
            with pytest.raises(merklog.Error, match=re.escape(says)) as info:
                open_()
            assert type(info.value).__name__ == "ConfigError"
            assert "command line" not in str(info.value)
        assert not home.exists()
    with merklog.open(memory=True, settings={"sync.interval": 2}) as node:
        assert node.config.get("sync.interval") == 2.0


def test_open_refuses_a_home_with_memory_true(tmp_path: Path) -> None:
    """``merklog.open(home, memory=True)`` ignored the home: the app believed it kept its
    data there, and nothing was ever written to it."""
    with pytest.raises(merklog.Error, match="a memory node has no home"):
        merklog.open(tmp_path / "h", memory=True)
    assert list(tmp_path.iterdir()) == []


def test_open_refuses_an_empty_home_path(tmp_path: Path, monkeypatch) -> None:
    """``merklog.open("")`` made the current directory a home: keys and store written
    there and the directory chmod 0700."""
    monkeypatch.chdir(tmp_path)
    tmp_path.chmod(0o755)
    with pytest.raises(merklog.Error, match="home path is empty") as info:
        merklog.open("")
    assert isinstance(info.value, ValueError)
    assert list(tmp_path.iterdir()) == [] and tmp_path.stat().st_mode & 0o777 == 0o755


def test_open_refuses_a_home_whose_key_is_missing(tmp_path: Path) -> None:
    """A home whose identity.pem was gone got a new key on open, which may not write to
    the dataset; ``merklog.open`` now raises the CLI's exit-5 error and makes no key."""
    home = tmp_path / "h"
    with merklog.open(home) as node:
        node.assert_("v", 1)
    (home / "identity.pem").unlink()
    with pytest.raises(merklog.Error, match="identity.pem is missing") as info:
        merklog.open(home)
    assert info.value.exit_code == 5
    assert not (home / "identity.pem").exists()


def test_an_open_node_keeps_its_peers_while_config_toml_has_a_bad_peer(
    tmp_path: Path, caplog
) -> None:
    """Peer entries are checked when config.toml is read; a node already open re-reads
    it for peers added meanwhile, and a bad hand edit must not stop its status (or its
    automatic sync loop): it keeps the peers it had and logs why."""
    import logging

    home = tmp_path / "h"
    Cli(home)("init")
    Cli(home)("peers", "add", "good", "http://127.0.0.1:7401", "--key", "cd" * 32)
    with merklog.open(home) as node:
        config = home / "config.toml"
        config.write_text(config.read_text() + "\n[peers.x]\nurl = 5\n")
        with caplog.at_level(logging.WARNING):
            assert node.peer_urls() == {"good": "http://127.0.0.1:7401"}
            assert [p["name"] for p in node.status()["peers"]] == ["good"]
    assert "[peers.x] url must be" in caplog.text


def test_fact_pages_in_typed_json_are_what_a_write_takes(tmp_path: Path, node_factory) -> None:
    """``GET /v1/facts?form=json`` lists ``{"cid", "rel", "args"}`` with typed values: ``1``,
    ``1.0``, ``true``, ``"1"``, bytes, a link and int64's ends stay five-plus values, and
    the entries without their CIDs, written to another node, are the same facts (same
    CIDs). The default stays Datalog text; another form is a 400."""
    link = Link.for_dag_cbor(b"\xa0")
    facts = [make_fact("v", (x,)) for x in (1, 1.0, True, "1", b"\x01", link)]
    facts.append(make_fact("w", (-(2**63), 2**63 - 1, -0.5, "")))
    a, b = tmp_path / "a", tmp_path / "b"
    for home in (a, b):
        Cli(home)("init")
    na, nb = node_factory(a).start(), node_factory(b).start()
    status, _ = na.request(
        "POST",
        "/v1/facts",
        {"assert": [{"rel": f.rel, "args": [_json(x) for x in f.args]} for f in facts]},
    )
    assert status == 200
    status, page = na.request("GET", "/v1/facts?form=json")
    assert status == 200 and page["next"] is None
    assert sorted(e["cid"] for e in page["facts"]) == sorted(str(fact_cid(f)) for f in facts)
    by_cid = {e["cid"]: e for e in page["facts"]}
    assert by_cid[str(fact_cid(facts[1]))] == {
        "cid": str(fact_cid(facts[1])), "rel": "v", "args": [1.0],
    }  # fmt: skip
    assert by_cid[str(fact_cid(facts[4]))]["args"] == [{"/": {"bytes": "AQ"}}]
    assert by_cid[str(fact_cid(facts[5]))]["args"] == [{"/": str(link)}]
    copy = [{"rel": e["rel"], "args": e["args"]} for e in page["facts"]]
    status, written = nb.request("POST", "/v1/facts?answer=cids", {"assert": copy})
    assert status == 200 and sorted(written["asserted"]) == sorted(by_cid)
    _, text = na.request("GET", "/v1/facts?rel=v&limit=1")
    assert set(text["facts"][0]) == {"cid", "fact"}
    status, err = na.request("GET", "/v1/facts?form=xml")
    assert status == 400 and err["detail"] == "form='xml': expected one of text, json"


def _json(value: object) -> object:
    from merklog.node.jsonvalues import value_to_json

    return value_to_json(value)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("a b", "(' ' at position 2 is none of them)"),
        ("ab-c", "('-' at position 3 is none of them)"),
        ("1x", "(it starts with '1')"),
        (
            "Up",
            "cannot be written in Datalog: it must start with a lowercase ASCII letter, then"
            " ASCII letters, digits or _ (it starts with 'U')",
        ),
        (
            "aé",
            "cannot be written in Datalog: it must start with a lowercase ASCII letter, then"
            " ASCII letters, digits or _ ('é' at position 2 is none of them)",
        ),
    ],
)
def test_a_bad_relation_name_is_refused_naming_the_character(name: str, says: str) -> None:
    """``"a b"`` was refused as a name that "must start with a letter, then letters,
    digits or _": true of the rule, but "a b" does start with a letter. The message names
    the character that breaks it."""
    with merklog.open(memory=True) as node, pytest.raises(merklog.Error) as refused:
        node.assert_(name, 1)
    assert str(refused.value).startswith(f"relation name {name!r} ")
    assert str(refused.value).endswith(says), str(refused.value)


def test_a_write_while_the_program_fails_is_answered_at_once_saying_so(
    tmp_path: Path, low_limit
) -> None:
    """QA: while the loaded program failed (a recursion without fixpoint), every write
    waited for an epoch that ran the failing recursion again (6-10 s) and its 200 did
    not say the write was not evaluated. The answer now says why (``not_evaluated``)
    and does not wait for an epoch while the program fails; once a retraction fixes it,
    writes are evaluated (and answered after their epoch) again."""
    import asyncio
    import tomllib

    import aiohttp

    async def main() -> None:
        async with merklog.open(tmp_path / "h") as node, merklog.serve(node) as url:
            token = tomllib.loads((tmp_path / "h" / "config.toml").read_text())["api"]["token"]
            auth = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(headers=auth) as http:

                async def write(body: dict) -> dict:
                    async with http.post(f"{url}/v1/facts", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        return await resp.json()

                assert "not_evaluated" not in await write({"assert": "o(1)."})
                node.load_program("n(X + 1) :- n(X).\n")
                first = await write({"assert": "n(0)."})  # its epoch fails
                assert "the epoch that evaluates them failed" in first["not_evaluated"]
                assert node.status()["program_error"]
                second = await write({"assert": "o(2)."})  # answered without an epoch
                assert second["not_evaluated"].startswith("the writes are stored, but")
                await write({"retract": "n(0)."})
                async with asyncio.timeout(30):
                    while node.status()["program_error"]:
                        await asyncio.sleep(0.05)
                assert "not_evaluated" not in await write({"assert": "o(3)."})
                assert node.query("o(X)").rows == [(1,), (2,), (3,)]

    asyncio.run(main())


def test_reads_of_a_home_whose_program_fails_answer_409_as_the_document_says(
    tmp_path: Path, low_limit
) -> None:
    """A home restarted with a program that fails on its stored facts answers reads
    409 ``failed`` (ADR 0198); ``/openapi.json`` listed no 409 for ``/v1/query`` and
    ``/v1/subscribe`` (QA)."""
    import asyncio
    import tomllib

    import aiohttp

    from merklog.node.errors import NotSettled

    home = tmp_path / "h"
    with merklog.open(home) as node:
        node.load_program("n(X) :- seed(X).\nn(X + 1) :- n(X).\n")
        with pytest.raises(NotSettled):
            node.assert_("seed", 0)
    token = tomllib.loads((home / "config.toml").read_text())["api"]["token"]

    async def main() -> None:
        async with merklog.open(home) as node, merklog.serve(node) as url:
            auth = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(headers=auth) as http:
                async with http.get(f"{url}/openapi.json") as resp:
                    doc = await resp.json()
                for method, path in (("get", "/v1/query?q=seed(X)"), ("post", "/v1/query")):
                    kw = {"json": {"q": "seed(X)"}} if method == "post" else {}
                    async with http.request(method, url + path, **kw) as resp:
                        body = await resp.json()
                        assert resp.status == 409 and body["error"] == "failed", body
                    route = doc["paths"][path.split("?")[0]][method]["responses"]
                    assert "409" in route
                for method in ("get", "post"):
                    assert "409" in doc["paths"]["/v1/subscribe"][method]["responses"]

    asyncio.run(main())
