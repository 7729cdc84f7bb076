"""Every CLI command on a real home directory (SQLite store), including bad input."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from merklog.store import Link, fact_cid, make_fact

from .conftest import Cli


def _ls(run) -> list[str]:
    return run("ls").output.splitlines()


def test_init_creates_key_config_store_and_dataset(run, home: Path) -> None:
    out = run("init").output
    assert "initialised" in out
    cfg = tomllib.loads((home / "config.toml").read_text())
    assert cfg["node"]["port"] == 7420 and cfg["store"]["backend"] == "sqlite"
    assert len(cfg["api"]["token"]) >= 20
    Link.parse(cfg["dataset"]["id"])
    assert (home / "identity.pem").stat().st_mode & 0o777 == 0o600
    assert (home / "store.sqlite").exists()
    again = run("init").output
    assert "already initialised" in again
    assert "changed" not in again


def test_init_of_an_initialised_home_says_what_it_changes(run, home: Path) -> None:
    """``init --port N`` on an initialised home printed "already initialised" and saved
    the new port without a word. It still saves what it was given (init is how a setting
    is changed from the command line), and lists each change; a repeat changes nothing."""
    run("init")
    out = run("--set", "node.tick=true", "init", "--port", "7433").output
    assert "already initialised" in out
    assert "  changed  node.port: 7420 -> 7433\n" in out
    assert "  changed  node.tick: false -> true\n" in out
    cfg = tomllib.loads((home / "config.toml").read_text())
    assert cfg["node"]["port"] == 7433 and cfg["node"]["tick"] is True
    assert "changed" not in run("init", "--port", "7433").output
    assert tomllib.loads((home / "config.toml").read_text())["dataset"] == cfg["dataset"]


def test_put_prints_each_cid_then_get_and_ls(run) -> None:
    run("init")
    out = run("put", "edge(1, 2).", "edge(2, 3)", 'name("a", x"00ff", 1.5, true).').output
    lines = [line.split("\t") for line in out.splitlines()]
    assert [f for _, f in lines] == ["edge(1, 2)", "edge(2, 3)", 'name("a", x"00ff", 1.5, true)']
    assert lines[0][0] == str(fact_cid(make_fact("edge", (1, 2))))
    assert run("get", lines[0][0]).output.strip() == "edge(1, 2)"
    assert json.loads(run("get", "--json", lines[1][0]).output)["kind"] == "fact"
    assert len(_ls(run)) == 3
    assert [line.split("\t")[1] for line in run("ls", "edge").output.splitlines()] == [
        "edge(1, 2)",
        "edge(2, 3)",
    ]


def test_ls_of_a_relation_without_visible_facts_exits_3(run) -> None:
    run("init")
    run("put", "edge(1, 2).", "p(1).", "p(1.0).", "p(true).")
    assert len(run("ls", "p").output.splitlines()) == 3
    typo = run("ls", "edgee", ok=False)
    assert typo.exit_code == 3
    assert "no visible facts of relation 'edgee'" in typo.output
    run("retract", "edge(1, 2).")
    assert run("ls", "edge", ok=False).exit_code == 3
    assert len(run("ls").output.splitlines()) == 3  # no REL: an empty list is an answer


def test_put_reads_a_file(run, tmp_path: Path) -> None:
    run("init")
    f = tmp_path / "facts.dl"
    f.write_text("edge(5, 6).\nedge(6, 7).\n")
    assert len(run("put", "-f", str(f)).output.splitlines()) == 2


@pytest.mark.parametrize("running", [False, True], ids=["stopped-home", "running-node"])
def test_a_file_ending_in_a_comment_is_read_as_it_is(
    run, tmp_path: Path, node_factory, running: bool
) -> None:
    """``put``/``retract`` gave every input not ending in ``.`` a ``.`` of its own, so a
    file whose last line is a comment failed (``3:1: expected a rule head``, a line that
    does not exist). Only an argument may leave its ``.`` out; a file is read as it is."""
    run("init")
    node = node_factory(run.home).start() if running else None
    try:
        for n, ending in enumerate(("% the end", "// the end", "/* the end */")):
            data = tmp_path / f"c{n}.dl"
            data.write_text(f'a({n}). a({n}.0). a("{n}").\n{ending}\n')
            assert len(run("put", "-f", str(data)).output.splitlines()) == 3
        assert len(run("ls", "a").output.splitlines()) == 9
        run("retract", "-f", str(tmp_path / "c0.dl"))
        assert len(run("ls", "a").output.splitlines()) == 6
        run("put", "b(1)", "b(2).")  # arguments may leave the final '.' out
        assert len(run("ls", "b").output.splitlines()) == 2
        bad = tmp_path / "bad.dl"
        bad.write_text("a(7).\na(8\n")
        failed = run("put", "-f", str(bad), ok=False)
        assert failed.exit_code == 2 and "found end of input" in failed.output
        assert "found '.'" not in failed.output
    finally:
        if node is not None:
            node.stop()


def test_bulk_put_on_a_stopped_home_raises_its_page_cache(run, tmp_path: Path, monkeypatch) -> None:
    """A large ``put -f`` on a stopped home asks its store for a larger page cache (ADR
    0110) and a larger WAL (ADR 0152; the threshold is lowered here) and still writes
    every mixed-type fact."""
    from merklog.node.commands import put
    from merklog.store.sqlite import SQLiteBlockStore

    asked: dict[str, list[int]] = {"set_cache_mb": [], "set_wal_checkpoint_mb": []}
    for name, seen in asked.items():
        real = getattr(SQLiteBlockStore, name)

        def spy(store: SQLiteBlockStore, mb: int, real=real, seen=seen) -> None:
            seen.append(mb)
            real(store, mb)

        monkeypatch.setattr(SQLiteBlockStore, name, spy)
    sizes, wal = asked["set_cache_mb"], asked["set_wal_checkpoint_mb"]
    monkeypatch.setattr(put, "BULK_CACHE_FACTS", 5)
    run("init")
    f = tmp_path / "facts.dl"
    f.write_text('p(1).\np(1.0).\np(true).\np("1").\np(x"01").\n')
    out = run("put", "-f", str(f)).output.splitlines()
    assert sizes == [put.BULK_CACHE_MB]
    assert wal == [put.BULK_WAL_MB]
    assert len({line.split("\t")[0] for line in out}) == 5
    f.write_text("p(2).\n")
    run("put", "-f", str(f))
    assert sizes == [put.BULK_CACHE_MB] and wal == [put.BULK_WAL_MB]  # a small write: defaults


def test_retract_removes_from_ls(run) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).")
    out = run("retract", "edge(1, 2).").output
    assert "edge(1, 2)" in out
    assert [line.split("\t")[1] for line in _ls(run)] == ["edge(2, 3)"]


def test_query_table_json_csv(run) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).", "edge(1, 4).")
    table = run("query", "edge(1, X)").output
    assert "X" in table and "(2 rows)" in table
    data = json.loads(run("query", "--json", "edge(1, X)").output)
    assert data == {"columns": ["X"], "rows": [[2], [4]]}
    csv = run("query", "--csv", "edge(X, Y)").output.splitlines()
    assert csv == ["X,Y", "1,2", "1,4", "2,3"]
    # A ground query wrote an empty line per row: one empty column, not true or false.
    assert run("query", "--csv", "edge(1, 2)").output == "holds\ntrue\n"
    assert run("query", "--csv", "edge(2, 1)").output == "holds\nfalse\n"
    both = run("query", "--json", "--csv", "edge(X, Y)", ok=False)  # the last one won
    assert both.exit_code == 2 and "give one" in both.output


def test_bad_datalog_is_rejected_with_position_and_nothing_changes(run, home: Path) -> None:
    run("init")
    run("put", "edge(1, 2).")
    before = _ls(run)
    size = (home / "store.sqlite").stat().st_size
    for bad in ("edge(1, X).", "edge(1, 2", "edge(1, 99999999999999999999)."):
        result = run("put", bad, ok=False)
        assert result.exit_code != 0
        assert "Error:" in result.output
    assert "1:" in run("put", "edge(1, 2", ok=False).output
    assert _ls(run) == before
    assert (home / "store.sqlite").stat().st_size == size or _ls(run) == before
    assert run("query", "edge(1,", ok=False).exit_code != 0


def test_get_bad_and_unknown_cid(run) -> None:
    run("init")
    assert "not a CID" in run("get", "nope", ok=False).output
    missing = str(fact_cid(make_fact("never", (1,))))
    result = run("get", missing, ok=False)
    assert result.exit_code != 0 and missing in result.output


def test_commands_on_missing_home_say_run_init(run) -> None:
    result = run("ls", ok=False)
    assert result.exit_code != 0 and "merklog" in result.output and "init" in result.output


def test_peers_add_list_remove_and_unknown(run) -> None:
    run("init")
    key = "cd" * 32
    run("peers", "add", "bob", "http://127.0.0.1:9", "--key", key)
    assert run("peers", "list").output.split() == ["bob", "http://127.0.0.1:9", key]
    assert run("peers", "remove", "nobody", ok=False).exit_code != 0
    assert "unknown peer" in run("peers", "remove", "nobody", ok=False).output
    run("peers", "remove", "bob")
    assert run("peers", "list").output == ""


def test_peers_add_refuses_a_key_that_is_no_point_of_the_curve(run) -> None:
    """``peers add --key`` took any 64 hex digits, ``ff`` * 32 too, which no node can
    hold (it decodes to no Ed25519 point): the peer was listed and every sync with it
    would fail. It is bad input (exit 2), as ``writers grant`` of it is, and nothing
    is added."""
    run("init")
    for bad in ("ff" * 32, "ab" * 32, "01" + "00" * 31, "00" * 32):  # no point, small order
        refused = run("peers", "add", "p", "http://127.0.0.1:9", "--key", bad, ok=False)
        assert refused.exit_code == 2, refused.output
        assert "is not an Ed25519 public key" in refused.output
        assert "Traceback" not in refused.output
    assert run("peers", "list").output == ""


def test_peers_add_of_a_name_with_another_key_is_refused_unless_replace(run) -> None:
    """A typo'd name in ``peers add`` silently replaced that peer's key: the device it
    named was refused every later sync (403) and nothing said why. Now the command
    refuses (exit 1) and changes nothing; --replace takes the new key and says so; a new
    URL for the same key is an update."""
    run("init")
    bob, carol = "ee" * 32, "cd" * 32
    run("peers", "add", "bob", "http://127.0.0.1:9", "--key", bob)
    refused = run("peers", "add", "bob", "http://127.0.0.1:10", "--key", carol, ok=False)
    assert refused.exit_code == 1 and "peer bob already exists with another key" in refused.output
    assert "Traceback" not in refused.output
    assert run("peers", "list").output.split() == ["bob", "http://127.0.0.1:9", bob]
    moved = run("peers", "add", "bob", "http://127.0.0.1:11", "--key", bob).output
    assert moved.startswith("updated peer bob: url http://127.0.0.1:9 -> http://127.0.0.1:11")
    replaced = run("peers", "add", "bob", "http://127.0.0.1:10", "--key", carol, "--replace")
    assert replaced.output.startswith(f"replaced peer bob: key {bob[:16]}… -> {carol[:16]}…")
    assert run("peers", "list").output.split() == ["bob", "http://127.0.0.1:10", carol]
    # A new key at the same URL: one line (a second said "is already", i.e. no change, QA)
    dave = "ea4a6c63e29c520abef5507b132ec5f9954776aebebe7b92421eea691446d22c"
    rekeyed = run("peers", "add", "bob", "http://127.0.0.1:10", "--key", dave, "--replace")
    assert rekeyed.output.startswith(f"replaced peer bob: key {carol[:16]}… -> {dave[:16]}…")
    assert "is already" not in rekeyed.output
    run("peers", "add", "bob", "http://127.0.0.1:10", "--key", carol, "--replace")
    # The same peer again said "added peer bob …" although nothing changed; with --writer
    # it says whether it granted anything (a second grant needs no delta).
    again = run("peers", "add", "bob", "http://127.0.0.1:10", "--key", carol).output
    assert again.startswith(f"peer bob is already http://127.0.0.1:10 key {carol[:16]}…\n")
    granted = run("peers", "add", "bob", "http://127.0.0.1:10", "--key", carol, "--writer")
    assert granted.output.startswith("peer bob is already") and "granted it write" in granted.output
    second = run("peers", "add", "bob", "http://127.0.0.1:10", "--key", carol, "--writer")
    assert "it can already write" in second.output


def test_peers_add_unreachable_without_key_fails_cleanly(run, home: Path) -> None:
    run("init")
    before = (home / "config.toml").read_text()
    result = run("peers", "add", "bob", "http://127.0.0.1:9", ok=False)
    said = "cannot reach peer http://127.0.0.1:9 to ask its key"
    assert result.exit_code != 0 and said in result.output
    assert run("peers", "add", "bob", "ftp://x", "--key", "00" * 32, ok=False).exit_code != 0
    assert run("peers", "add", "bob", "http://x", "--key", "zz", ok=False).exit_code != 0
    assert (home / "config.toml").read_text() == before


def test_export_import_round_trip_and_corrupt_car(run, tmp_path: Path) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).")
    car = tmp_path / "out.car"
    out = run("export", str(car)).output
    assert "exported 4 blocks" in out  # genesis, delta, 2 facts
    assert "duplicates 1" in run("import", str(car)).output
    bad = tmp_path / "bad.car"
    data = bytearray(car.read_bytes())
    data[-3] ^= 0xFF
    bad.write_bytes(bytes(data))
    before = _ls(run)
    result = run("import", str(bad), ok=False)
    # The CAR's fault (bad input, exit 2), not the store's (exit 5 sent users to fsck).
    assert result.exit_code == 2 and f"{bad} is damaged: CID mismatch" in result.output
    assert _ls(run) == before
    other = Cli(tmp_path / "other")
    other("init")
    other("export", str(tmp_path / "other.car"))
    foreign = run("import", str(tmp_path / "other.car"), ok=False)
    assert foreign.exit_code == 2 and "holds another dataset" in foreign.output  # was 1
    fresh = Cli(tmp_path / "fresh")
    restored = fresh("restore", str(bad), ok=False)
    assert restored.exit_code == 2 and f"{bad} is damaged" in restored.output
    assert not (tmp_path / "fresh").exists()


def test_status_shows_dataset_heads_epoch(run, home: Path) -> None:
    run("init")
    run("put", "edge(1, 2).")
    out = run("status").output
    assert "not running" in out and "dataset" in out and "heads" in out
    info = json.loads(run("status", "--json").output)
    assert info["facts"] == 1 and len(info["heads"]) == 1


def test_config_precedence_env_and_set(run, home: Path, monkeypatch) -> None:
    from merklog.node.config import Config

    run("init", "--port", "8001")
    assert Config.load(home).get("node.port") == 8001
    monkeypatch.setenv("MERKLOG_NODE_PORT", "8002")
    assert Config.load(home).get("node.port") == 8002
    assert Config.load(home, {"node.port": 8003}).get("node.port") == 8003
    result = run("--set", "node.port=x", "status", ok=False)
    assert result.exit_code != 0 and "node.port" in result.output
    assert run("--set", "nonsense", "status", ok=False).exit_code != 0


def test_a_text_option_given_a_number_and_an_over_long_sync_timeout_are_refused(
    run, home: Path, monkeypatch
) -> None:
    """QA: ``token = 5`` in config.toml started the node with the write token "5" (and
    ``1e3`` the token "1000.0"), where every other wrong type is refused; and
    ``sync.timeout = 100000`` was taken, though every sync through a running node then
    refused it. Both are one line naming the option, before anything starts. From the
    environment and ``--set`` a text option still takes a number as its text."""
    from merklog.node.config import Config, ConfigError

    run("init")
    config = home / "config.toml"
    good = config.read_text()
    for line, said in (
        ("[api]\ntoken = 5", "api.token must be a string, got 5"),
        ("[node]\nprogram = 1e3", "node.program must be a string, got 1000.0"),
        ("[sync]\ntimeout = 100000", "sync.timeout must be from 0.001 to 86400.0"),
    ):
        section, _, setting = line.partition("\n")
        name = setting.split(" =")[0]
        text = good.replace(f"[{section[1:-1]}]\n", f"{line}\n", 1)
        text = "\n".join(  # the old line of the same option goes
            ln for ln in text.splitlines() if not ln.startswith(f"{name} = ") or ln == setting
        )
        config.write_text(text + "\n")
        result = run("status", ok=False)
        assert result.exit_code == 2 and said in result.output, result.output
        with pytest.raises(ConfigError, match=said):
            Config.load(home)
    # QA: a syntax error at the end said "(at end of document)", with no line or column
    config.write_text(good + "port = [\n")
    result = run("status", ok=False)
    lines = len(good.splitlines()) + 1
    assert f"(at end of document, line {lines}, column 9)" in result.output, result.output
    config.write_text(good)
    result = run("--set", "sync.timeout=86401", "status", ok=False)
    assert result.exit_code == 2 and "sync.timeout must be from 0.001 to 86400.0" in result.output
    # QA: a SQLite home took and saved any store.ipfs_api, checked only on an IPFS home
    for addr in ("/udp/1", "http://127.0.0.1:99999"):
        result = run("--set", f"store.ipfs_api={addr}", "status", ok=False)
        assert result.exit_code == 2 and "not an IPFS API address" in result.output
        assert "(command line: store.ipfs_api)" in result.output
    result = run("--set", "store.backend=foo", "status", ok=False)
    assert "must be one of sqlite or ipfs (memory: a Python API memory node only)" in (
        result.output
    )
    # QA: init --store sqlite --ipfs-api URL made a SQLite home that saved the API
    other = Cli(home.parent / "other")
    result = other("init", "--store", "sqlite", "--ipfs-api", "http://127.0.0.1:5001", ok=False)
    assert result.exit_code == 2 and "--ipfs-api names the daemon of an IPFS home" in (
        result.output
    )
    assert not other.home.exists()
    monkeypatch.setenv("MERKLOG_NODE_PROGRAM", "2024")
    assert Config.load(home).get("node.program") == "2024"
    assert Config.load(home, {"node.program": 7}).get("node.program") == "7"
    with pytest.raises(ConfigError, match="node.program must be a string"):
        Config.load(home, {"node.program": 7}, overrides_from="settings")


def test_load_program_derives_and_bad_program_changes_nothing(
    run, home: Path, tmp_path: Path
) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).", "edge(3, 4).")
    prog = tmp_path / "path.dl"
    prog.write_text("path(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n")
    assert "loaded" in run("load", str(prog)).output
    rows = json.loads(run("query", "--json", "path(1, X)").output)["rows"]
    assert rows == [[2], [3], [4]]
    conj = json.loads(run("query", "--json", "path(X, Y), !edge(X, Y)").output)["rows"]
    assert conj == [[1, 3], [1, 4], [2, 4]]
    before = (home / "config.toml").read_text()
    bad = tmp_path / "bad.dl"
    bad.write_text("path(X, Y) :- edge(X, Y)\nfoo(.\n")
    result = run("load", str(bad), ok=False)
    assert result.exit_code != 0 and "bad.dl" in result.output and "2:" in result.output
    assert (home / "config.toml").read_text() == before
    # The program stays installed across restarts (recorded in the config).
    assert json.loads(run("query", "--json", "path(2, X)").output)["rows"] == [[3], [4]]


def test_truncated_query_gives_a_positioned_parse_error(run) -> None:
    run("init")
    run("put", "edge(1, 2).")
    for text, where in (("edge(1,", "1:8"), ("edge(", "1:6"), ("edge(1, 2", "1:10")):
        result = run("query", text, ok=False)
        assert result.exit_code == 2  # bad input (docs/operations.md, exit status)
        assert f"Error: {where}:" in result.output, result.output
        assert "index out of range" not in result.output


def test_large_put_file_goes_through_a_running_node_in_chunks(
    home: Path, tmp_path: Path, node_factory
) -> None:
    from .conftest import Cli

    run = Cli(home)
    run("--set", "node.max_body=65536", "init")  # a small body limit, kept in config.toml
    node_factory(home).start()
    f = tmp_path / "many.dl"
    f.write_text("".join(f'row({i}, "{"x" * 40}").\n' for i in range(3000)))  # ~150 KB
    assert f.stat().st_size > 2 * 65536
    out = run("put", "-f", str(f)).output
    assert len(out.splitlines()) == 3000 and "Error" not in out
    assert len(run("ls", "row").output.splitlines()) == 3000


@pytest.mark.parametrize(
    "option", ["node.port=99999", "node.port=-1", "node.max_body=0", "sync.interval=-5"]
)
def test_an_option_out_of_range_is_refused_before_anything_is_created(
    run, home: Path, option: str
) -> None:
    """``init --port 99999`` made a home whose node then died at start-up with an
    internal error (``OverflowError: bind(): port must be 0-65535``)."""
    refused = run("--set", option, "init", ok=False)
    assert refused.exit_code == 2 and "must be" in refused.output, refused.output
    assert not home.exists()
    run("init")
    assert run("--set", option, "status", ok=False).exit_code == 2
