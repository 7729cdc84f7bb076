"""A real ``merklog node run`` subprocess: health, API writes, CLI through the node, SSE,
metrics, OpenAPI and clean shutdown."""

from __future__ import annotations

import json
import signal
import threading
import urllib.request
from pathlib import Path

from conftest import Cli


def test_node_serves_api_and_cli_goes_through_it(home: Path, node_factory) -> None:
    run = Cli(home)
    run("init")
    node = node_factory(home).start()
    assert (home / "node.json").exists()
    status, health = node.request("GET", "/healthz")
    assert status == 200 and health["status"] == "ok"

    # CLI writes reach the running node over HTTP (the home lock is held by it).
    out = run("put", "edge(1, 2).", "edge(2, 3).").output
    assert len(out.splitlines()) == 2
    status, body = node.request("POST", "/v1/facts", {"assert": "edge(3, 4)."})
    assert status == 200 and body["asserted"][0]["fact"] == "edge(3, 4)"
    status, body = node.request("GET", "/v1/query?q=edge(X,%20Y)")
    assert status == 200 and body["rows"] == [[1, 2], [2, 3], [3, 4]]
    assert json.loads(run("query", "--json", "edge(2, Y)").output)["rows"] == [[3]]
    assert len(run("ls").output.splitlines()) == 3
    assert "running at" in run("status").output


def test_bad_input_and_missing_token_change_nothing(home: Path, node_factory) -> None:
    Cli(home)("init")
    node = node_factory(home).start()
    node.request("POST", "/v1/facts", {"assert": "keep(1)."})
    status, body = node.request("POST", "/v1/facts", {"assert": "keep(2)."}, token=None)
    assert status == 401 and body["error"] == "unauthorized"
    status, body = node.request("POST", "/v1/facts", {"assert": "keep(2)."}, token="wrong")
    assert status == 401
    status, body = node.request("POST", "/v1/facts", {"assert": "keep(1, X)."})
    assert status == 400 and "1:" in body["detail"]
    status, body = node.request("POST", "/v1/facts", {"assert": 5})
    assert status == 400
    status, body = node.request("GET", "/v1/query?q=keep(")
    assert status == 400 and body["error"] == "bad query"
    status, body = node.request("GET", "/v1/facts")
    assert [f["fact"] for f in body["facts"]] == ["keep(1)"]
    _, metrics = node.request("GET", "/metrics")
    text = metrics.decode()
    assert "merklog_rejected_inputs_total 5.0" in text
    assert "merklog_epochs_total" in text and "merklog_epoch_seconds_bucket" in text


def test_openapi_document_is_valid(home: Path, node_factory) -> None:
    from openapi_spec_validator import validate

    Cli(home)("init")
    node = node_factory(home).start()
    status, doc = node.request("GET", "/openapi.json")
    assert status == 200
    validate(doc)
    for path in ("/v1/facts", "/v1/query", "/v1/subscribe", "/healthz", "/metrics"):
        assert path in doc["paths"]


def test_subscribe_streams_initial_result_then_deltas(home: Path, node_factory) -> None:
    Cli(home)("init")
    node = node_factory(home, "--epoch-interval", "5").start()
    node.request("POST", "/v1/facts", {"assert": "edge(1, 2)."})
    events: list[tuple[str, dict]] = []
    got_three = threading.Event()

    def listen() -> None:
        with urllib.request.urlopen(node.url + "/v1/subscribe?q=edge(1,%20X)", timeout=30) as r:
            event = None
            for raw in r:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    events.append((event, json.loads(line[6:])))
                    if len(events) >= 3:
                        got_three.set()
                        return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    import time

    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.02)
    node.request("POST", "/v1/facts", {"assert": "edge(1, 3). edge(2, 9)."})
    node.request("POST", "/v1/facts", {"assert": "edge(1, 4)."})
    assert got_three.wait(15), events
    assert events[0] == ("result", {**events[0][1], "added": [[2]], "removed": []})
    assert events[0][1]["columns"] == ["X"]
    assert events[1][0] == "delta" and events[1][1]["added"] == [[3]]
    # Each write took effect promptly although idle epochs are 5 s apart.
    assert events[2][0] == "delta" and events[2][1]["added"] == [[4]]


def test_sigterm_and_sigint_stop_cleanly(home: Path, node_factory) -> None:
    Cli(home)("init")
    for sig in (signal.SIGTERM, signal.SIGINT):
        node = node_factory(home).start()
        assert node.stop(sig) == 0
        assert not (home / "node.json").exists()
    # The home is free again: a one-shot command opens it directly.
    assert "not running" in Cli(home)("status").output
