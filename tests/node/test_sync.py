"""Two real nodes: join, grant, sync both ways through the CLI; bad peers fail cleanly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from merklog.replication.client import SyncStats

from .conftest import Cli, peered_pair


def _facts(run: Cli) -> list[str]:
    return sorted(line.split("\t")[1] for line in run("ls").output.splitlines())


def test_two_nodes_join_grant_and_sync(tmp_path: Path, node_factory) -> None:
    a, b, na, nb = peered_pair(tmp_path, node_factory)
    a("put", "edge(1, 2).")
    # B's first write: it syncs once with the node it joined from, receives the grant
    # made there, then writes (no "not a writer in the causal past" surprise).
    b("put", "edge(7, 8).")
    line = b("sync", "a").output.strip()
    assert line.startswith("synced with http://127.0.0.1:"), line
    # each figure once, by the names of the sync's stats (no aliases beside them)
    names = [part.split()[0] for part in line.split(": ", 1)[1].split(", ")]
    assert names == [field.name for field in dataclasses.fields(SyncStats)], names
    # C joined too but was never granted: it says so plainly, exit status 7.
    c = Cli(tmp_path / "c")
    c("init", "--join", na.url, "--token", na.read_token)
    refused = c("put", "edge(9, 9).", ok=False)
    assert refused.exit_code == 7 and "cannot write yet" in refused.output
    # Why its sync found no grant, said on the error line itself (it was a WARNING only):
    # A does not list C's key, so A refuses C's syncs.
    assert "its last sync with it failed:" in refused.output
    assert "is not allowed to sync" in refused.output
    # the whole key and the command that allows it (a 16-digit prefix could not be pasted)
    c_key = json.loads(c("status", "--json").output)["key"]
    assert f"run `merklog peers add NAME URL --key {c_key}` on the node that refused" in (
        refused.output.replace("\n", " ")
    )
    assert "WARNING" not in refused.output  # one line, the Error line
    assert "Traceback" not in refused.output
    assert _facts(a) == _facts(b) == ["edge(1, 2)", "edge(7, 8)"]
    # The running node's program state sees replicated facts too.
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, q = na.request("GET", "/v1/query?q=edge(7,%20X)")
        if q["rows"]:
            break
        time.sleep(0.05)
    assert q["rows"] == [[8]]
    before = _facts(b)
    for bad in ("http://127.0.0.1:9", "nobody"):
        result = b("sync", bad, ok=False)
        assert result.exit_code != 0 and "Error" in result.output
    assert _facts(b) == before
    _, metrics = nb.request("GET", "/metrics")
    counted = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.decode().splitlines()
        if line.startswith("merklog_sync_bytes_total{")
    }
    # B's syncs moved bodies both ways and the counter has them
    assert counted['merklog_sync_bytes_total{direction="in"}'] > 0, counted
    assert counted['merklog_sync_bytes_total{direction="out"}'] > 0, counted


def _counters(node) -> dict[str, float]:
    _, metrics = node.request("GET", "/metrics")
    return {
        line.split()[0]: float(line.split()[1])
        for line in metrics.decode().splitlines()
        if line.startswith(("merklog_deltas_total", "merklog_sync_bytes_total{"))
    }


def test_a_node_that_answers_syncs_counts_what_it_accepts_and_serves(
    tmp_path: Path, node_factory
) -> None:
    """QA: a hub node that only answers syncs showed 15 in ``merklog_deltas_total`` with
    29 deltas stored: deltas pushed to it, and grants and revokes, were not counted; and
    ``merklog_sync_bytes_total{direction="out"}`` showed 1,969 bytes after serving 8.8 MB,
    since only syncs it started were counted."""
    a, b, na, nb = peered_pair(tmp_path, node_factory)  # a granted b: one delta at a
    hub = _counters(na)
    assert hub["merklog_deltas_total"] == 1.0, hub  # the grant
    b("put", "edge(7, 8).")  # b's first write: it pulls the grant from a first
    b("put", "big(1, \"" + "x" * 20_000 + "\").")
    b("sync", "a")  # b's node pushes its two deltas to a
    after = _counters(na)
    assert after["merklog_deltas_total"] == hub["merklog_deltas_total"] + 2, (hub, after)
    got = after['merklog_sync_bytes_total{direction="in"}']
    sent = after['merklog_sync_bytes_total{direction="out"}']
    assert got > 20_000 and sent > 0, after  # a answered b's pull and took its push
    a("writers", "revoke", json.loads(b("status", "--json").output)["key"])
    assert _counters(na)["merklog_deltas_total"] == after["merklog_deltas_total"] + 1


def test_sync_interval_syncs_with_every_peer_automatically(tmp_path: Path, node_factory) -> None:
    import time

    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    wrong = Cli(tmp_path / "wrong")
    refused = wrong("init", "--join", na.url, "--token", "not-the-token", ok=False)
    assert refused.exit_code == 1 and "refused the token given" in refused.output
    missing = Cli(tmp_path / "missing")("init", "--join", na.url, ok=False)
    assert missing.exit_code == 1 and "it wants a token" in missing.output
    b("init", "--join", na.url, "--token", na.read_token)
    nb = node_factory(b.home, env={"MERKLOG_SYNC_INTERVAL": "0.2"}).start()
    a("peers", "add", "b", nb.url, "--writer", "--token", nb.read_token)
    b(
        "peers", "add", "a", na.url, "--token", na.read_token
    )  # picked up by the running node's next round
    a("put", "edge(1, 2).")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "edge(1, 2)" not in _facts(b):
        time.sleep(0.1)
    assert "edge(1, 2)" in _facts(b)
    b("put", "edge(7, 8).")
    while time.monotonic() < deadline and "edge(7, 8)" not in _facts(a):
        time.sleep(0.1)
    assert "edge(7, 8)" in _facts(a)  # pushed by B's loop, A never ran sync


def test_join_on_an_initialised_home_refuses_without_force(tmp_path: Path, node_factory) -> None:
    import tomllib

    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    b("init")
    b("put", "mine(1).")

    def dataset(home: Path) -> str:
        return tomllib.loads((home / "config.toml").read_text())["dataset"]["id"]

    own = dataset(b.home)
    refused = b("init", "--join", na.url, "--token", na.read_token, ok=False)
    assert refused.exit_code == 1 and "--force" in refused.output and own in refused.output
    assert dataset(b.home) == own and _facts(b) == ["mine(1)"]  # nothing changed
    switched = b("init", "--join", na.url, "--token", na.read_token, "--force")
    assert "switching" in switched.output and dataset(b.home) == dataset(a.home)
    assert _facts(b) == []  # the other dataset's facts are no longer visible
    assert (
        b("init", "--join", na.url, "--token", na.read_token).exit_code == 0
    )  # same dataset again: nothing to do


def test_a_joined_node_writes_over_http_before_any_sync(tmp_path: Path, node_factory) -> None:
    """``init --join`` then ``node run``: the first ``POST /v1/facts`` syncs once with
    the origin (receiving the grant made there) and succeeds; with the origin down the
    write answers 503 naming it, and ``put`` exits 4 saying why."""
    a, b, c = Cli(tmp_path / "a"), Cli(tmp_path / "b"), Cli(tmp_path / "c")
    a("init")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    c("init", "--join", na.url, "--token", na.read_token)
    nb = node_factory(b.home).start()
    a("peers", "add", "b", nb.url, "--writer", "--token", nb.read_token)  # grant, on A only
    status, body = nb.request("POST", "/v1/facts", {"assert": "edge(7, 8)."})
    assert status == 200, body
    assert [r["fact"] for r in body["asserted"]] == ["edge(7, 8)"]
    _, q = nb.request("GET", "/v1/query?q=edge(X,%20Y)")
    assert q["rows"] == [[7, 8]]

    origin = na.url
    na.stop()
    nc = node_factory(c.home).start()
    status, body = nc.request("POST", "/v1/facts", {"assert": "edge(9, 9)."})
    assert status == 503, body
    assert origin in body["detail"] and "cannot write yet" in body["detail"]
    through = c("put", "edge(9, 9).", ok=False)  # through the running node
    nc.stop()
    refused = c("put", "edge(9, 9).", ok=False)
    assert refused.exit_code == 4, refused.output
    assert origin in refused.output and "Traceback" not in refused.output
    # One wording both ways: it said "peer unreachable: this node cannot write yet: …".
    assert through.exit_code == 4 and through.output.startswith("Error: this node cannot write yet")
    assert refused.output.startswith("Error: this node cannot write yet"), refused.output
    assert "edge(9, 9)" not in c("ls").output


def test_peer_sync_history_survives_a_restart(tmp_path: Path, node_factory) -> None:
    """``status`` on a stopped home and ``GET /v1/status`` after a restart still show
    the peer's last success (kept in the home, not only in the process)."""
    import json

    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    b("peers", "add", "a", na.url, "--token", na.read_token)
    key_b = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", key_b)  # A lets B sync
    b("sync", "a")

    def peer_a(peers: list[dict]) -> dict:
        (entry,) = [p for p in peers if p["url"] == na.url.rstrip("/")]
        return entry

    said = json.loads(b("status", "--json").output)
    stopped = peer_a(said["peers"])
    assert stopped["last_success"] is not None and stopped["last_error"] is None
    assert oct((b.home / "peersync.json").stat().st_mode & 0o777) == "0o600"
    # QA: the node's own last good sync was null on a stopped home and after a restart.
    last = said["last_sync"]
    assert last is not None and last["url"] == na.url.rstrip("/"), said
    assert last["at"] == stopped["last_success"] and "deltas_received" in last, last
    assert "last_stats" not in stopped
    nb = node_factory(b.home).start()
    _, st = nb.request("GET", "/v1/status")
    assert peer_a(st["peers"])["last_success"] == stopped["last_success"]
    assert st["last_sync"] == last


def test_a_sync_started_by_the_peer_shows_in_this_nodes_status(
    tmp_path: Path, node_factory
) -> None:
    """B syncs with A (pull and push): A's status shows it for peer b as
    ``last_incoming`` (it was null: only syncs A started counted), kept in A's home; A's
    own ``last_success`` stays null (A never synced), and a peer that never synced with
    A has no ``last_incoming``."""
    import json

    a, b, na, nb = peered_pair(tmp_path, node_factory)
    a("peers", "add", "c", "http://127.0.0.1:9", "--key", "cd" * 32)

    def peer(node, name: str) -> dict:
        _, st = node.request("GET", "/v1/status")
        (entry,) = [p for p in st["peers"] if p["name"] == name]
        return entry

    assert peer(na, "b")["last_incoming"] is None
    b("put", "edge(7, 8).")  # B writes: its sync pushes to A as well as pulling
    before = peer(na, "b")
    b("sync", "a")
    after = peer(na, "b")
    assert after["last_incoming"] is not None
    assert before["last_incoming"] is None or after["last_incoming"] > before["last_incoming"]
    assert after["last_success"] is None and after["last_attempt"] is None
    assert peer(na, "c")["last_incoming"] is None
    _, st = na.request("GET", "/v1/status")
    assert st["last_sync"] is None  # A's own syncs: none
    na.stop()
    stopped = json.loads(a("status", "--json").output)["peers"]
    (entry,) = [p for p in stopped if p["name"] == "b"]
    assert entry["last_incoming"] == after["last_incoming"]
    table = a("status").output
    assert "last incoming" in table
    # The tutorial (step 9) names the columns as the table heads them: it said "last
    # attempt" for the column headed "last started".
    import re

    tutorial = (Path(__file__).resolve().parents[2] / "docs" / "tutorial.md").read_text()
    para = tutorial[tutorial.index("a table with one row per") :]
    para = para[: para.index("Stop the laptop")]
    named = set(re.findall(r"last [a-z]+", para))
    (header,) = [line for line in table.splitlines() if " url " in line]
    assert named and all(name in header for name in named), (named, header)


def _sync_failures(node) -> dict[str, float]:
    """``merklog_sync_failures_total`` of a running node, by peer URL."""
    _, metrics = node.request("GET", "/metrics")
    out = {}
    for line in metrics.decode().splitlines():
        if line.startswith("merklog_sync_failures_total{"):
            out[line.split('peer="')[1].split('"')[0]] = float(line.split()[-1])
    return out


def _free_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_automatic_sync_contacts_a_url_listed_twice_once_per_round(
    tmp_path: Path, node_factory
) -> None:
    """``init --join URL`` then ``peers add NAME URL`` (the tutorial's steps) list one
    node under two names: each round syncs it once, so its failures count once per
    round, like those of a peer listed once."""
    import time

    home = Cli(tmp_path / "home")
    home("init")
    twice, once = _free_url(), _free_url()  # both down: every attempt fails at once
    key = "11" * 32
    home("peers", "add", "origin", twice, "--key", key)
    added = home("peers", "add", "laptop", twice, "--key", key)
    assert f"note: {twice} is also peer origin" in added.output  # said, and allowed
    home("peers", "add", "other", once, "--key", key)
    node = node_factory(home.home, env={"MERKLOG_SYNC_INTERVAL": "0.2"}).start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _sync_failures(node).get(once, 0) < 8:
        time.sleep(0.2)
    counted = _sync_failures(node)
    assert counted.get(once, 0) >= 8, counted
    assert counted[twice] <= counted[once] + 1, counted  # not twice as many
    rows = [p for p in node.request("GET", "/v1/status")[1]["peers"] if p["url"] == twice]
    assert len(rows) == 1 and rows[0]["failures"] <= counted[once] + 1, rows


def test_a_hung_peer_does_not_stall_automatic_sync_with_the_others(
    tmp_path: Path, node_factory
) -> None:
    """A peer that accepts the connection but never answers holds only its own sync
    (for ``sync.timeout``): a healthy peer's write still arrives within a few rounds."""
    import socket
    import time

    hung = socket.socket()  # listens (the kernel accepts connections), never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    try:
        a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
        a("init")
        na = node_factory(a.home).start()
        b("init", "--join", na.url, "--token", na.read_token)
        hung_url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        # sorted first and last around "origin": whichever order a round took
        b("peers", "add", "aaa-hung", hung_url, "--key", "11" * 32)
        b("peers", "add", "zzz-hung", hung_url + "/", "--key", "11" * 32)
        env = {"MERKLOG_SYNC_INTERVAL": "0.2", "MERKLOG_SYNC_TIMEOUT": "20"}
        nb = node_factory(b.home, env=env).start()
        a("peers", "add", "b", nb.url, "--token", nb.read_token)  # A lets B sync
        time.sleep(1.0)  # a round is under way: the hung peer holds its sync
        a("put", "edge(1, 2).")
        started = time.monotonic()
        while time.monotonic() - started < 20 and "edge(1, 2)" not in _facts(b):
            time.sleep(0.1)
        took = time.monotonic() - started
        assert "edge(1, 2)" in _facts(b) and took < 8, took
    finally:
        hung.close()


def test_a_peer_history_entry_with_wrong_types_is_ignored_not_a_crash(tmp_path: Path) -> None:
    """``peersync.json`` is a record: an entry whose values have the wrong types is
    logged and left out (``status`` exits 0, not 70); the other entries still show."""
    import json
    import os
    import subprocess
    import sys

    home = Cli(tmp_path / "home")
    home("init")
    good = {"url": "http://good", "last_attempt": 5.0, "last_success": 5.0, "failures": 0}
    bad = {"url": "http://x", "last_attempt": "abc", "last_success": [1], "failures": "z"}
    (home.home / "peersync.json").write_text(json.dumps({"http://x": bad, "http://good": good}))

    def status(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(home.home), "status", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            timeout=60,
        )

    shown = status()
    assert shown.returncode == 0 and "http://good" in shown.stdout, shown.stderr
    done = status("--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    urls = [p["url"] for p in json.loads(done.stdout)["peers"]]
    assert urls == ["http://good"], urls
    assert "http://x" in done.stderr and "wrong type" in done.stderr  # logged


def test_a_node_asked_to_sync_with_itself_says_so(tmp_path: Path, node_factory) -> None:
    """A sync with a node's own URL said "peer <own key> is not allowed to sync", which
    sent its user to [peers]; and `peers add self <own URL>` was accepted."""
    a = Cli(tmp_path / "a")
    a("init")
    node = node_factory(a.home).start()
    status, body = node.request("POST", "/v1/sync", {"url": node.url})
    assert status == 424 and "this node itself" in body["detail"], body
    added = a("peers", "add", "self", node.url, "--token", node.read_token, ok=False)
    assert added.exit_code == 2 and "this node itself" in added.output
    assert "self" not in a("peers", "list").output


def test_syncs_with_one_peer_at_once_take_turns_and_download_once(
    tmp_path: Path, node_factory
) -> None:
    """Three ``POST /v1/sync`` with the same peer at once each sent the same summary, so
    each downloaded (and applied) the peer's whole answer. They take turns now: one
    brings the new deltas, the others find nothing left to fetch; all three succeed."""
    from concurrent.futures import ThreadPoolExecutor

    a, b, na, nb = peered_pair(tmp_path, node_factory)
    (tmp_path / "f.dl").write_text("".join(f'p({i}, "{i:060d}", {i}.5, true).\n' for i in range(4000)))
    a("put", "-q", "-f", str(tmp_path / "f.dl"))
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: nb.request("POST", "/v1/sync", {"url": na.url}), range(3)))
    assert [status for status, _ in answers] == [200, 200, 200], answers
    received = sorted(stats["bytes_received"] for _, stats in answers)
    accepted = sorted(stats["accepted"] for _, stats in answers)
    assert received[-1] > 100_000 and sum(received[:2]) < received[-1] // 10, received
    assert accepted[-1] >= 1 and accepted[:2] == [0, 0], accepted
    assert len(b("ls", "p").output.splitlines()) == 4000


def test_a_grant_made_after_the_last_sync_is_said_to_come_with_the_next(
    tmp_path: Path, node_factory
) -> None:
    """A home that synced before the owner granted it was told the grant "has not been
    made there yet", which sent its user back to an owner who had made it. Now it says
    no grant had arrived by its last sync, and that a sync brings one made since."""
    a, b, na, nb = peered_pair(tmp_path, node_factory, writer=False)
    b("sync", "a")
    refused = b("put", "edge(1, 2).", ok=False)
    assert refused.exit_code == 7, refused.output
    said = refused.output.replace("\n", " ")
    assert f"no grant to it had arrived by its last sync with {na.url}" in said, said
    assert "has not been made" not in said
    a("writers", "grant", "b")
    b("sync", "a")
    b("put", "edge(1, 2).")
    assert _facts(b) == ["edge(1, 2)"]


def _home_with_an_offline_peer(tmp_path: Path) -> Path:
    """A home whose one peer is never reached: each automatic round is one attempt."""
    home = tmp_path / "home"
    run = Cli(home)
    run("init")
    run("peers", "add", "down", "http://127.0.0.1:9", "--key", "cd" * 32)
    return home


def _rounds_across(home: Path, fault, repair, seconds: float) -> tuple[float, float]:
    """Open ``home`` syncing every 0.1 s; once it has tried its peer, ``fault()``, wait
    ``seconds``, ``repair()``; the peer's last attempt then, and that of a later round
    (whose wait ends only if the loop still runs)."""
    import asyncio

    import merklog

    def attempt(node) -> float:
        [peer] = node.status()["peers"]
        return peer["last_attempt"] or 0.0

    async def main() -> tuple[float, float]:
        async with merklog.open(home, settings={"sync.interval": 0.1}) as node:
            async with asyncio.timeout(30):
                while not attempt(node):
                    await asyncio.sleep(0.05)
                fault()
                await asyncio.sleep(seconds)
                repair()
                during = attempt(node)
                while attempt(node) <= during:
                    await asyncio.sleep(0.05)
            return during, attempt(node)

    return asyncio.run(main())


def test_automatic_sync_outlives_a_config_file_it_cannot_read(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """Each round re-reads ``[peers]`` from config.toml. A node out of file descriptors
    (QA: ``ulimit -n 64`` and 50 clients) failed that read with an OSError nothing
    caught: the sync loop died, silently, for good. Now the round uses the peers read at
    start, says so once, and the loop goes on (the fault is injected: EMFILE cannot be
    produced for one file read alone)."""
    import errno
    import logging

    from merklog.node import peersync

    home = _home_with_an_offline_peer(tmp_path)
    real = peersync.Config.load
    failing = {"on": False}

    def load(*args, **kwargs):
        if failing["on"]:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(*args, **kwargs)

    monkeypatch.setattr(peersync.Config, "load", load)
    with caplog.at_level(logging.INFO, logger="merklog"):
        during, after = _rounds_across(
            home, lambda: failing.update(on=True), lambda: failing.update(on=False), 1.0
        )
    assert after > during
    said = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 1 and "Too many open files" in said[0].getMessage(), said
    assert said[0].levelno == logging.WARNING and said[0].exc_info is None
    assert any("is read again" in r.getMessage() for r in caplog.records)


def test_automatic_sync_keeps_its_peers_when_config_toml_is_deleted(tmp_path: Path, caplog) -> None:
    """A config.toml deleted while the node runs read as the defaults: no peers, so the
    automatic sync stopped with nothing said. The peers read at start are kept, and
    the node says once why."""
    import logging

    home = _home_with_an_offline_peer(tmp_path)
    config = home / "config.toml"
    saved = config.read_bytes()
    with caplog.at_level(logging.INFO, logger="merklog"):
        # the file is put back only after the loop has shown it goes on without it
        during, after = _rounds_across(home, config.unlink, lambda: None, 0.5)
    config.write_bytes(saved)
    assert after > during
    said = [r for r in caplog.records if "config.toml cannot be read" in r.getMessage()]
    assert len(said) == 1 and "it is gone" in said[0].getMessage(), said


def test_an_import_through_a_running_node_reports_the_facts_it_made_visible(
    tmp_path: Path, node_factory
) -> None:
    """QA: ``import big.car`` through a running node said ``facts 3010 visible`` where
    ``status`` then counted 23,010: the import was answered before the epoch that shows
    its facts, and the count asked of that epoch. The answer now comes after it."""
    a, b, na, nb = peered_pair(tmp_path, node_factory)
    facts = tmp_path / "facts.dl"
    facts.write_text("".join(f"n({i}, \"v{i}\").\n" for i in range(20_000)))
    a("put", "-q", "-f", str(facts))
    car = tmp_path / "a.car"
    a("export", str(car))
    line = b("import", str(car)).output.strip()
    visible = json.loads(b("status", "--json").output)["facts"]
    assert visible == 20_000 and line.endswith("; facts 20000 visible"), line


def test_a_refused_write_through_a_running_node_pulls_nothing_more(
    tmp_path: Path, node_factory
) -> None:
    """QA: a joined home that was not granted, its node running, synced with its origin
    again after every refused ``put`` (the command retried through a sync), so a refused
    write pulled everything new there. As on a stopped home, only the first write syncs
    once; later refused writes change nothing."""
    a, c = Cli(tmp_path / "a"), Cli(tmp_path / "c")
    a("init")
    na = node_factory(a.home).start()
    c("init", "--join", na.url, "--token", na.read_token)
    c_key = json.loads(c("status", "--json").output)["key"]
    a("peers", "add", "c", "http://127.0.0.1:9", "--key", c_key)  # may sync, not write
    nc = node_factory(c.home).start()
    a("put", "seen(1).")
    first = c("put", "x(1).", ok=False)  # the one sync before the first write
    assert first.exit_code == 7, first.output
    assert "seen(1)" in c("ls").output
    a("put", "later(1).")
    again = c("put", "x(2).", ok=False)
    assert again.exit_code == 7 and "Traceback" not in again.output, again.output
    assert "later(1)" not in c("ls").output
    assert nc.request("GET", "/v1/status")[0] == 200


def test_a_peer_is_never_behind_on_its_own_deltas_and_a_moved_peer_leaves_no_row(
    tmp_path: Path, node_factory
) -> None:
    """QA: with identical heads everywhere, the desktop showed the laptop "behind 2": the
    laptop's own deltas had reached the desktop through the phone, and the laptop's heads
    recorded at the last sync predated them. A peer cannot lack what it wrote: its own
    deltas are not counted. And ``peers add NAME NEWURL`` left NAME's old URL in status
    as an unnamed row; its history is forgotten as ``peers remove`` forgets it."""
    a, b, na, nb = peered_pair(tmp_path, node_factory)
    c = Cli(tmp_path / "c")
    c("init", "--join", na.url, "--token", na.read_token)
    nc = node_factory(c.home).start()
    a("peers", "add", "c", nc.url, "--writer", "--token", nc.read_token)
    c("peers", "add", "b", nb.url, "--token", nb.read_token)
    b("peers", "add", "c", nc.url, "--token", nc.read_token)
    b("sync", "a")  # B records A's heads
    a("put", "only(1).")  # A's own delta
    c("sync", "origin")  # C gets it from A
    b("sync", "c")  # and B from C: A's heads as B saw them predate it

    def row(node, name: str) -> dict:
        _, st = node.request("GET", "/v1/status")
        (entry,) = [p for p in st["peers"] if p["name"] == name]
        return entry

    assert "only(1)" in b("ls").output
    assert row(nb, "a")["deltas_behind"] == 0, row(nb, "a")
    # C moves: the old URL's history goes with it (A's URL stays: it is also `origin`).
    old = nc.url.rstrip("/")
    key = json.loads(c("status", "--json").output)["key"]
    b("peers", "add", "c", old.replace("127.0.0.1", "localhost"), "--key", key)
    _, st = nb.request("GET", "/v1/status")
    assert old not in [p["url"] for p in st["peers"]], st["peers"]
    assert na.url.rstrip("/") in [p["url"] for p in st["peers"]], st["peers"]
