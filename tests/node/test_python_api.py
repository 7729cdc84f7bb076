"""The Python API as an app builder uses it: arguments of ``Node`` calls refused as bad
input (``NodeInputError``, a ``merklog.Error``) before anything happens, rather than
taken for something else (a peer that is down, a setting that is ignored)."""

from __future__ import annotations

import asyncio
import math
import socket

import pytest

import merklog
from merklog.node.errors import NodeInputError
from merklog.node.runtime import running_node_url
from merklog.store import Fact


def _refused_url() -> str:
    """The URL of a port on 127.0.0.1 nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_sync_refuses_a_bad_timeout_or_progress_before_contacting_the_peer() -> None:
    """``timeout="5"`` reached aiohttp and came back as ``PeerUnreachable`` ("'>' not
    supported between instances of 'str' and 'int'"), recorded as a failure of the peer;
    0, a negative number or NaN asked for a sync without any timeout; a progress that is
    no callable failed the same way once the peer answered. Each is bad input now, as
    ``POST /v1/sync`` says for its ``"timeout"``, and the peer's history stays empty."""
    url = _refused_url()

    async def main() -> list[str]:
        said = []
        async with merklog.open(memory=True) as node:
            for kw in (
                {"timeout": "5"},
                {"timeout": 0},
                {"timeout": -1.0},
                {"timeout": math.nan},
                {"timeout": True},
                {"timeout": 86400.5},
                {"progress": 5},
            ):
                with pytest.raises(NodeInputError) as info:
                    await node.sync(url, **kw)
                said.append(str(info.value))
            assert node.status()["peers"] == []  # nothing tried, nothing recorded
            with pytest.raises(merklog.Error, match="connection refused"):
                await node.sync(url, timeout=2)  # a good timeout: the peer is down
        return said

    said = asyncio.run(main())
    assert said[0] == ("timeout must be a number of seconds above 0 and at most 86400, got '5'")
    assert said[-1] == "progress: expected a callable, got int"


def test_page_facts_takes_a_limit_of_any_size(tmp_path) -> None:
    """A limit past 2**63 (``10**30``: "all of them") raised a raw OverflowError from
    SQLite; it reads every fact, in one page without a cursor, on a home and in memory."""
    for where in ({"home": tmp_path / "h"}, {"memory": True}):
        with merklog.open(**where) as node:
            for value in (1, 1.0, True, "1", b"\x01"):
                node.assert_("v", value)
            for rel in ("v", None):
                page, cursor = node.page_facts(rel, limit=10**30)
                assert cursor is None
                assert sorted(map(repr, (f.args[0] for _, f in page if f.rel == "v"))) == sorted(
                    map(repr, (1, 1.0, True, "1", b"\x01"))
                )


def test_open_refuses_store_settings_that_would_be_ignored(tmp_path, monkeypatch) -> None:
    """A memory node took ``dataset.id``, ``store.path`` and ``store.backend="sqlite"``
    and ignored them: it made a fresh dataset in memory (its first sync with the dataset's
    nodes was refused, its writes were gone at close). A home opened with
    ``store.backend="memory"`` was made on disk, then kept nothing of its writes: each
    open started a new, empty dataset (the CLI refuses that setting for a home). All are
    refused before anything is created."""
    with merklog.open(tmp_path / "h") as node:
        dataset = str(node.dataset)
    for settings in (
        {"dataset.id": dataset},
        {"store.path": str(tmp_path / "x.sqlite")},
        {"store.backend": "sqlite"},
    ):
        key = next(iter(settings))
        with pytest.raises(merklog.Error, match=f"settings: {key}=.* is not for a memory node"):
            merklog.open(memory=True, settings=settings)
    home = tmp_path / "new"
    with pytest.raises(merklog.Error, match="settings: store.backend is memory"):
        merklog.open(home, settings={"store.backend": "memory"})
    monkeypatch.setenv("MERKLOG_STORE_BACKEND", "memory")
    with pytest.raises(merklog.Error, match="MERKLOG_STORE_BACKEND=memory"):
        merklog.open(home)
    assert not home.exists() and not (tmp_path / "x.sqlite").exists()
    with merklog.open(memory=True, settings={"store.backend": "memory"}) as node:
        node.assert_("v", 1)  # what a memory node is


def test_open_of_a_new_home_over_an_unusable_store_raises_store_damaged(tmp_path) -> None:
    """A first ``merklog.open`` of a directory whose ``store.sqlite`` is a damaged SQLite
    file raised ``sqlite3.DatabaseError``, which is no ``merklog.Error``, and left
    ``node.lock`` there; one whose store is a directory left ``node.lock`` too. Each
    raises ``StoreDamaged`` (the CLI's exit 5) and leaves the directory as it was."""
    from merklog.node.failures import StoreDamaged

    for damage in ("a directory", "damaged SQLite"):
        home = tmp_path / damage.replace(" ", "-")
        home.mkdir()
        store = home / "store.sqlite"
        if damage == "a directory":
            store.mkdir()
        else:
            store.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
        with pytest.raises(StoreDamaged, match="store"):
            merklog.open(home)
        assert [p.name for p in home.iterdir()] == ["store.sqlite"], damage


def test_live_query_rows_come_in_the_order_query_answers() -> None:
    """A live query's rows came sorted by type name, then text (``true, 1.0, b"\\x01", 1,
    "1"``, and ``10`` before ``9``), not in the value order ``query`` answers, and Python
    cannot sort them itself (``sorted([(1,), ("1",)])`` raises TypeError). The initial
    result and each delta now come in that order, so an app compares them with ``query``
    rows as they are."""
    values = [10, 9, 1.0, 1, True, False, "1", "10", b"\x01", -2.5]
    with merklog.open(memory=True) as node:
        node.load_program("p(X) :- v(X).")
        events = []
        node.subscribe("v(X)", lambda *event: events.append(event))  # follows deltas
        node.subscribe("p(X), v(X)", lambda *event: events.append(event))  # re-evaluated
        node.write(asserts=[("v", (v,)) for v in values])
        want = node.query("v(X)").rows
        assert want == [(False,), (True,), (-2.5,), (1,), (1.0,), (9,), (10,), ("1",)] + [
            ("10",),
            (b"\x01",),
        ]
        assert events[-2:] == [("delta", want, [])] * 2
        node.write(retracts=[("v", (v,)) for v in values])
        assert events[-2:] == [("delta", [], want)] * 2
        node.write(asserts=[("v", (v,)) for v in values[:5]])
        with merklog.open(memory=True) as other:  # the initial result of a new live query
            other.write(asserts=[("v", (v,)) for v in values])
            other.subscribe("v(X)", lambda *event: events.append(event))
            assert events[-1] == ("result", want, [])


def test_ctrl_c_in_a_live_query_callback_leaves_the_epoch_whole(tmp_path) -> None:
    """A KeyboardInterrupt raised in one live query's callback (Ctrl-C while a plain
    ``with`` app's callback runs) left the epoch half done: the live queries after it
    and the sinks never got its delta (their answer differed from ``query`` for good), and
    the epoch's state was not saved (the home reopened at the epoch before). Every
    listener is told and the epoch saved; then the interrupt reaches the caller."""
    home = tmp_path / "h"
    with merklog.open(home) as node:
        node.assert_("v", 1)
        interrupt = [True]

        def ctrl_c(event, added, removed):
            if event == "delta" and interrupt and interrupt.pop():
                raise KeyboardInterrupt

        later, sunk = [], []
        node.subscribe("v(X)", ctrl_c)
        node.subscribe("v(X)", lambda *event: later.append(event))
        node.add_sink(lambda epoch, changes: sunk.append(changes))
        with pytest.raises(KeyboardInterrupt):
            node.assert_("v", 1.0)
        assert later[-1] == ("delta", [(1.0,)], [])
        assert sunk == [[(merklog.Fact("v", (1.0,)), 1)]]
        node.assert_("v", True)  # the next epoch goes on from there
        assert later[-1] == ("delta", [(True,)], [])
        assert node.query("v(X)").rows == [(True,), (1,), (1.0,)]
        epoch = node.epoch
        with pytest.raises(KeyboardInterrupt):
            interrupt.append(True)
            node.assert_("v", "1")
        epoch += 1
        assert node.epoch == epoch
    with merklog.open(home) as node:
        assert node.epoch == epoch  # the interrupted epoch was saved


async def _merklog(*args: str) -> tuple[int, str, str]:
    """A real ``merklog ARGS…`` process, awaited without blocking this event loop (the
    node it talks to runs in it)."""
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "merklog.node.cli",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def test_serve_lets_peers_and_commands_reach_an_app_s_node(tmp_path) -> None:
    """An app's node served no HTTP: a second device could not join or sync with it,
    and a ``merklog`` command on its home waited 15 s for the lock, then failed.
    ``merklog.serve`` serves it for a block: a home joins it and pulls an app write,
    a command on the app's home goes through it, and after the block the port is closed
    and commands open the home themselves again."""
    import json
    import tomllib

    origin, device = tmp_path / "origin", tmp_path / "device"

    async def main() -> None:
        async with merklog.open(origin) as node:
            async with merklog.serve(node) as url:
                assert url.startswith("http://127.0.0.1:") and node.url == url
                node.assert_("edge", 1, "1")
                read = tomllib.loads((origin / "config.toml").read_text())["api"]["read_token"]
                code, _out, err = await _merklog(
                    "--home", str(device), "init", "--join", url, "--token", read
                )
                assert code == 0, err
                code, out, err = await _merklog("--home", str(device), "status", "--json")
                assert code == 0, err
                key = json.loads(out)["key"]
                # a command on the app's own home, which the app holds: through its server
                code, _out, err = await _merklog(
                    "--home", str(origin), "peers", "add", "device", "http://127.0.0.1:9",
                    "--key", key,
                )  # fmt: skip
                assert code == 0, err
                code, _out, err = await _merklog("--home", str(device), "sync", "origin")
                assert code == 0, err
                code, out, err = await _merklog(
                    "--home", str(origin), "query", "edge(X, Y)", "--json"
                )
                assert code == 0, err
                assert json.loads(out)["rows"] == [[1, "1"]]
            assert node.url is None and running_node_url(origin) is None
            with pytest.raises(OSError):  # nothing listens any more
                socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), 2).close()
            node.assert_("edge", 2, "2")  # the node runs on after the block
            await node.settled()
        code, out, err = await _merklog("--home", str(device), "query", "edge(X, Y)", "--json")
        assert code == 0, err
        assert json.loads(out)["rows"] == [[1, "1"]]  # 1 and "1" as written

    asyncio.run(main())


def test_serve_refuses_a_memory_node_and_a_node_not_running(tmp_path) -> None:
    """A memory node has no tokens to serve with; a node outside ``async with`` runs no
    epoch loop to answer the writes it would receive. Both are bad input, named."""

    async def main() -> None:
        async with merklog.open(memory=True) as node:
            with pytest.raises(NodeInputError, match="a memory node cannot serve"):
                async with merklog.serve(node):
                    raise AssertionError("a memory node was served")
        with merklog.open(tmp_path / "h") as node:
            with pytest.raises(NodeInputError, match="serve a running node"):
                async with merklog.serve(node):
                    raise AssertionError("a node outside async with was served")

    asyncio.run(main())


def test_a_command_on_a_home_an_app_holds_names_the_app_and_serve(tmp_path, monkeypatch) -> None:
    """A command on a home that an app holds (``merklog.open``, no server) asked "another
    merklog command?", though the holder was the app; it now names both and the way
    through (``merklog.serve``). The 15 s wait is shortened here."""
    from merklog.node import target

    monkeypatch.setattr(target, "LOCK_WAIT", 0.2)
    home = tmp_path / "h"
    with merklog.open(home):
        with pytest.raises(target.TargetError) as info:
            with target.open_target(home):
                raise AssertionError("a home an app holds was opened")
    assert str(info.value) == (
        f"{home} is in use by another process that serves no HTTP API (another merklog"
        " command, or an app that opened it with merklog.open; an app that serves it with"
        " merklog.serve lets commands through); try again when it has ended"
    )
    with target.open_target(home) as opened:  # free again once the app closed it
        assert isinstance(opened, target.LocalTarget)


def test_settled_takes_seconds_above_zero_or_none_and_a_program_source_is_text() -> None:
    """``settled(-1)`` and ``settled(0)`` gave up at once with "no epoch evaluated the
    changes within -1 s", ``settled(float("nan"))`` waited for ever and ``settled("5")``
    failed inside asyncio; ``load_program(text, source=5)`` named the program ``5`` in
    its errors. Each is now bad input, named; ``settled(None)`` waits without a limit."""

    async def main() -> None:
        async with merklog.open(memory=True) as node:
            node.assert_("a", 1)
            for bad in (-1, 0, float("nan"), float("inf"), "5", True):
                with pytest.raises(NodeInputError, match="^timeout must be a number of seconds"):
                    await node.settled(bad)
            await node.settled(None)
            assert node.query("a(X)").rows == [(1,)]
            with pytest.raises(NodeInputError, match="^a program's source is a name"):
                node.load_program("b(X) :- a(X).", source=5)
            node.load_program("b(X) :- a(X).", source="app.dl")
            assert node.query("b(X)").rows == [(1,)]

    asyncio.run(main())


def test_the_settings_a_home_is_created_with_are_saved_as_init_saves_them(tmp_path) -> None:
    """A first ``merklog.open`` made the home without its settings and laid them over it
    afterwards: ``store.backend=ipfs`` was recorded as a SQLite home (the CLI then read
    another store than the app wrote), and with the daemon down a key, a config and a
    dataset were left behind. The home is now made with them, as ``merklog --set … init``
    makes it, all or nothing."""
    import tomllib

    home = tmp_path / "home"
    with merklog.open(home, settings={"node.port": 9123, "sync.interval": 7.0}) as node:
        node.assert_("k", 1)
    saved = tomllib.loads((home / "config.toml").read_text())
    assert saved["node"]["port"] == 9123 and saved["sync"]["interval"] == 7.0
    with merklog.open(home, settings={"node.port": 9124}) as node:  # this open only
        assert node.config.get("node.port") == 9124
    assert tomllib.loads((home / "config.toml").read_text())["node"]["port"] == 9123
    down = {"store.backend": "ipfs", "store.ipfs_api": _refused_url()}
    for made in (tmp_path / "new", tmp_path / "empty"):
        if made.name == "empty":
            made.mkdir()
        with pytest.raises(merklog.Error, match="not reachable"):
            merklog.open(made, settings=down)
        assert not made.exists() if made.name == "new" else not any(made.iterdir())


def test_write_async_takes_what_write_takes_and_serve_refuses_a_bad_port(tmp_path) -> None:
    """QA: ``write_async([("e", (1,))], [])`` raised a bare AttributeError, and
    ``serve(node, port=-1)`` a bare OverflowError from bind(), where the docs promise
    ``merklog.Error``. Pairs and Datalog text are coerced as ``write`` coerces them;
    what no fact is, and a port out of range, are ``merklog.Error``."""

    async def main() -> None:
        async with merklog.open(tmp_path / "h") as node:
            await node.write_async([("e", (1,)), "e(1.0).", Fact("e", (True,))], [])
            await node.settled()
            assert sorted(map(repr, node.query("e(X)").rows)) == ["(1,)", "(1.0,)", "(True,)"]
            await node.write_async([], ["e(1.0)."])
            await node.settled()
            assert len(node.query("e(X)").rows) == 2
            for bad in ([("e", (None,))], [42], "e(1).", [("e",)]):
                with pytest.raises(merklog.Error):
                    await node.write_async(bad, [])
            for port in (-1, 70000, True, "x"):
                with pytest.raises(merklog.Error, match="port"):
                    async with merklog.serve(node, port=port):
                        raise AssertionError("served")

    asyncio.run(main())


def test_write_async_checks_facts_made_by_hand(tmp_path) -> None:
    """QA: ``write_async([merklog.Fact("z", (None,))], [])`` stored the fact unchecked;
    every later query, ``ls`` and open of the home then failed on its block, and no peer
    could sync with it again. Such facts are checked as ``write`` checks them: refused
    with ``merklog.Error``, nothing stored, the home still readable after a reopen."""
    home = tmp_path / "h"
    bad_facts = [
        Fact("z", (None,)),
        Fact("A B", (1,)),
        Fact("z", (2**64,)),
        Fact("z", (float("nan"),)),
    ]

    async def main() -> None:
        async with merklog.open(home) as node:
            node.assert_("e", 1)
            for bad in bad_facts:
                with pytest.raises(merklog.Error) as refused:
                    await node.write_async([bad])
                if bad.rel == "A B":  # worded as write and assert_ word it
                    assert "lowercase" in str(refused.value), refused.value
            # A hand-made fact that is valid goes in; a bytearray is read as bytes.
            await node.write_async([Fact("e", (bytearray(b"\x01"),)), Fact("e", (1.0,))])
            await node.settled()

    asyncio.run(main())
    with merklog.open(home) as node:
        assert sorted(map(repr, node.query("e(X)").rows)) == ["(1,)", "(1.0,)", "(b'\\x01',)"]
        with pytest.raises(merklog.Error, match="z"):  # no fact of z was stored
            node.query("z(X)")


def test_an_apps_sync_in_flight_ends_with_the_node(tmp_path) -> None:
    """QA: an app's ``node.sync(url)`` with a peer that accepts but never answers kept
    its socket and ran on after ``async with`` ended, until ``sync.timeout`` (30 s), then
    raised on a closed node. Leaving the block stops it: it raises that the node stopped
    before the sync ended, and the sync is recorded as interrupted, not as the peer's
    failure."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"

    async def main() -> None:
        settings = {"sync.timeout": 600.0}
        async with merklog.open(tmp_path / "h", settings=settings) as node:
            running = asyncio.create_task(node.sync(url))
            await asyncio.sleep(0.3)  # connected, waiting for an answer
            assert not running.done()
        with pytest.raises(merklog.Error, match="node stopped before this sync"):
            await asyncio.wait_for(running, 30)
        with merklog.open(tmp_path / "h") as node:
            (entry,) = [p for p in node.status()["peers"] if p["url"] == url]
            assert entry["failures"] == 0, entry

    try:
        asyncio.run(main())
    finally:
        silent.close()


def test_a_sync_behind_another_with_the_same_peer_says_it_waits(tmp_path) -> None:
    """QA: ``merklog sync silent`` behind the node's automatic sync with a peer that never
    answers showed nothing for 56 s. A sync that must wait for another with the same
    peer tells its progress ``("waiting", 0, 0)`` first; the CLI's bar shows it."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"

    async def main() -> None:
        async with merklog.open(tmp_path / "h") as node:
            first = asyncio.create_task(node.sync(url, timeout=1.0))
            await asyncio.sleep(0.2)  # the first holds the peer's turn
            told: list[tuple] = []
            with pytest.raises(merklog.Error):
                await node.sync(url, lambda *p: told.append(p), timeout=1.0)
            assert told[:1] == [("waiting", 0, 0)], told
            with pytest.raises(merklog.Error):
                await first
            told.clear()
            with pytest.raises(merklog.Error):  # nobody ahead: no waiting
                await node.sync(url, lambda *p: told.append(p), timeout=0.5)
            assert ("waiting", 0, 0) not in told

    try:
        asyncio.run(main())
    finally:
        silent.close()


def test_serve_refuses_what_it_cannot_serve_and_a_second_serve(tmp_path) -> None:
    """QA: ``merklog.serve(5)`` raised a bare AttributeError; a closed node was told to
    run inside ``async with``; and a second ``serve`` of one node deleted the home's run
    file when it ended while the first still served, so commands on the home waited 15 s
    and failed. Each is now ``merklog.Error`` saying what is wrong, and the first serve's
    URL stays the home's."""

    async def main() -> None:
        with pytest.raises(merklog.Error, match="expected a node"):
            async with merklog.serve(5):  # type: ignore[arg-type]
                raise AssertionError("served")
        async with merklog.open(tmp_path / "h") as node:
            async with merklog.serve(node) as url:
                with pytest.raises(merklog.Error, match="served already"):
                    async with merklog.serve(node):
                        raise AssertionError("served twice")
                assert running_node_url(tmp_path / "h") == url
            assert node.served_url is None
        with pytest.raises(merklog.Error, match="closed"):
            async with merklog.serve(node):
                raise AssertionError("served a closed node")

    asyncio.run(main())


def test_a_second_open_in_one_process_says_so_and_bytes_of_a_link(tmp_path) -> None:
    """QA: a second ``merklog.open`` of a home this process holds said another process
    had it; and ``bytes(link)`` raised TypeError although the docs make a Link from its
    bytes."""
    with merklog.open(tmp_path / "h") as node:
        with pytest.raises(merklog.Error, match="open already in this process"):
            merklog.open(tmp_path / "h")
        link = node.assert_("e", 1).asserted[0][0]
        assert merklog.Link(bytes(link)) == link and bytes(link) == link.raw
    with merklog.open(tmp_path / "h") as again:  # closed: free again
        assert again.query("e(X)").rows == [(1,)]
        with pytest.raises(merklog.Error, match="evaluate: expected True or False"):
            again.write(asserts=["e(2)."], evaluate="no")  # type: ignore[arg-type]
    with pytest.raises(merklog.Error, match="memory: expected True or False"):
        merklog.open(memory="yes")  # type: ignore[arg-type]


def test_open_on_a_read_only_file_system_is_a_merklog_error(tmp_path) -> None:
    """QA: ``merklog.open`` of a home on a file system mounted read-only (and of a new
    home there) raised a bare OSError, where the CLI says what to do. A real read-only
    tmpfs (needs root; skipped otherwise)."""
    import subprocess

    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        merklog.open(mnt / "h").close()  # a home made while the mount is writable
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        for home in (mnt / "h", mnt / "new"):
            with pytest.raises(merklog.Error, match="read-only"):
                merklog.open(home)
        assert not (mnt / "new").exists()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
