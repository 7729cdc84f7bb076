"""Operations on real node processes: per-peer sync state (peers added at run time too) in
``status`` and ``GET /v1/status``, sync failures logged and counted, HTTP request metrics,
JSON log lines, paged ``GET /v1/facts``, and live-query streams closed on shutdown."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

from merklog.replication.identity import Identity

from .conftest import Cli

DEAD = "http://127.0.0.1:9"


def _until(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_status_shows_per_peer_sync_state_and_failures_are_logged(home: Path, node_factory) -> None:
    run = Cli(home)
    run("init")
    node = node_factory(home, env={"MERKLOG_SYNC_INTERVAL": "0.2"}).start()
    # Added while the node runs: its sync loop and its status pick it up.
    run("peers", "add", "gone", DEAD, "--key", Identity.generate().public_key.hex())

    def failing() -> dict | None:
        _, st = node.request("GET", "/v1/status")
        peer = next((p for p in st["peers"] if p["name"] == "gone"), None)
        return peer if peer and peer["failures"] >= 2 else None

    peer = _until(failing)
    assert peer, node.request("GET", "/v1/status")[1]
    assert peer["url"] == DEAD and peer["last_attempt"] and peer["last_success"] is None
    assert "connect" in peer["last_error"].lower()
    _, metrics = node.request("GET", "/metrics")
    text = metrics.decode()
    assert f'merklog_sync_failures_total{{peer="{DEAD}"}}' in text
    assert 'merklog_http_requests_total{method="GET",route="/v1/status",status="200"}' in text
    out = run("status").output
    assert "last error" in out and "gone" in out and DEAD in out and "{'" not in out
    assert node.request("POST", "/v1/sync", {"url": DEAD})[0] == 502
    node.stop()
    log = node.stderr_text
    # Logged at the default level, once while the error stays the same (the rest is counted).
    assert log.count(f"WARNING merklog.node.node: sync with {DEAD} failed") == 1, log
    # A sync asked over HTTP is not logged a second time by the error middleware.
    assert "POST /v1/sync" not in log, log


def test_log_lines_are_json_when_asked(home: Path, node_factory) -> None:
    Cli(home)("init")
    node = node_factory(
        home, env={"MERKLOG_SYNC_INTERVAL": "0.2"}, options=("-vv", "--log-format", "json")
    ).start()
    Cli(home)("peers", "add", "gone", DEAD, "--key", Identity.generate().public_key.hex())
    assert _until(lambda: any("sync with" in line for line in node.stderr_lines))
    node.request("POST", "/v1/program", {"program": "self(C) :- C := edge(C, _)."})
    node.stop()
    records = [json.loads(line) for line in node.stderr_lines if line.strip()]
    assert {"ts", "level", "logger", "msg"} <= set(records[0])
    assert any("listening on" in r["msg"] for r in records)
    assert any(r["level"] == "WARNING" and "sync with" in r["msg"] for r in records)
    assert any(r["level"] == "DEBUG" for r in records)
    assert any("falling back" in r["msg"] for r in records)  # a multi-part warning
    assert records[-1]["msg"] == "stopped"


def test_facts_are_paged(home: Path, node_factory, tmp_path: Path) -> None:
    run = Cli(home)
    run("init")
    facts = tmp_path / "f.dl"
    facts.write_text("".join(f"n({i}).\n" for i in range(2500)) + "other(1).\n")
    run("put", "-f", str(facts))
    node = node_factory(home).start()
    seen: list[str] = []
    after = ""
    pages = 0
    while True:
        _, page = node.request("GET", f"/v1/facts?rel=n&limit=1000&after={after}")
        seen += [f["cid"] for f in page["facts"]]
        pages += 1
        if not page["next"]:
            break
        after = page["next"]
    assert pages == 3 and len(seen) == len(set(seen)) == 2500
    assert node.request("GET", "/v1/facts?limit=0")[0] == 400
    # -1 is a decimal integer, out of range (it said "must be a decimal integer", QA)
    status, body = node.request("GET", "/v1/facts?limit=-1")
    assert status == 400 and body["detail"] == "limit= must be between 1 and 10000, got -1"
    # int() reads these as 10 and 3; a page size is written in ASCII digits
    for odd in ("1_0", "%D9%A3", "+5", "%205"):
        assert node.request("GET", f"/v1/facts?limit={odd}")[0] == 400, odd
    assert node.request("GET", "/v1/facts?after=zzz")[0] == 400
    assert len(run("ls").output.splitlines()) == 2501  # the CLI follows the pages


def test_shutdown_closes_live_query_streams(home: Path, node_factory) -> None:
    Cli(home)("init")
    node = node_factory(home).start()
    req = urllib.request.Request(
        node.url + "/v1/subscribe?q=edge(X,%20Y)",
        headers={"Authorization": f"Bearer {node.read_token}"},
    )
    streams = [urllib.request.urlopen(req, timeout=60) for _ in range(3)]
    for stream in streams:
        assert stream.readline().startswith(b"event: result")
        stream.readline()
    node.proc.send_signal(signal.SIGTERM)
    for stream in streams:
        rest = stream.read()  # returns only when the server ends the stream
        assert b"event:" not in rest
    assert node.proc.wait(timeout=60) == 0
    node.stop()
    assert "Traceback" not in node.stderr_text
