"""A real ``merklog node run`` subprocess: health, API writes, CLI through the node, SSE,
metrics, OpenAPI and clean shutdown."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import Cli


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
    # Nested thousands deep: a 400 naming the problem, where the decoders' recursion
    # overflowed (a 500, or a 400 without a position).
    deep_json = b'{"assert": [{"rel": "x", "args": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}]}"
    req = urllib.request.Request(node.url + "/v1/facts", data=deep_json, method="POST")
    req.add_header("Authorization", f"Bearer {node.token}")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 400
    assert "nests its JSON arrays or objects too deeply" in json.loads(err.value.read())["detail"]
    status, body = node.request("POST", "/v1/facts", {"assert": "x(" + "(" * 5000 + "1).\n"})
    assert status == 400 and body["detail"].startswith("1:103: this term nests"), body
    status, body = node.request("GET", "/v1/facts")
    assert [f["fact"] for f in body["facts"]] == ["keep(1)"]
    assert "Traceback" not in node.stderr_text


def test_openapi_document_is_valid(home: Path, node_factory) -> None:
    from openapi_spec_validator import validate

    Cli(home)("init")
    node = node_factory(home).start()
    status, doc = node.request("GET", "/openapi.json")
    assert status == 200
    validate(doc)
    for path in ("/v1/facts", "/v1/query", "/v1/subscribe", "/healthz", "/metrics"):
        assert path in doc["paths"]


def _sse(url: str, events: list, stop_after: int, done: threading.Event, token: str) -> None:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        event = None
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[6:])))
                if len(events) >= stop_after:
                    done.set()
                    return


def _wait_for(events: list, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(events) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(events) >= n, events


def test_subscribe_streams_initial_result_then_deltas(home: Path, node_factory) -> None:
    Cli(home)("init")
    node = node_factory(home, "--epoch-interval", "5").start()
    node.request("POST", "/v1/facts", {"assert": "edge(1, 2)."})
    events: list[tuple[str, dict]] = []
    done = threading.Event()
    url = node.url + "/v1/subscribe?q=edge(1,%20X)"
    threading.Thread(target=_sse, args=(url, events, 4, done, node.read_token), daemon=True).start()
    _wait_for(events, 1)
    node.request("POST", "/v1/facts", {"assert": "edge(1, 3). edge(2, 9)."})
    _wait_for(events, 2)
    node.request("POST", "/v1/facts", {"assert": "edge(1, 4)."})
    _wait_for(events, 3)
    node.request("POST", "/v1/facts", {"retract": "edge(1, 3)."})
    assert done.wait(15), events
    assert events[0] == ("result", {**events[0][1], "added": [[2]], "removed": []})
    assert events[0][1]["columns"] == ["X"]
    assert events[1][0] == "delta" and events[1][1]["added"] == [[3]]
    # Each write took effect promptly although idle epochs are 5 s apart.
    assert events[2][0] == "delta" and events[2][1]["added"] == [[4]]
    assert events[3][0] == "delta" and events[3][1] == {
        **events[3][1],
        "added": [],
        "removed": [[3]],
    }
    epochs = [e[1]["epoch"] for e in events]
    assert epochs == sorted(set(epochs))


PATH = "path(X, Y) :- edge(X, Y).\npath(X, Z) :- path(X, Y), edge(Y, Z).\n"


def test_sse_deltas_are_the_incremental_engine_deltas(home: Path, node_factory) -> None:
    """A live query on a derived relation streams exactly what the incremental engine
    outputs for the same inputs, retractions through recursion included."""
    from merklog.engine.checks import check_program
    from merklog.engine.incremental import IncrementalEngine
    from merklog.engine.parser import parse_program

    Cli(home)("init")
    node = node_factory(home, "--epoch-interval", "5").start()
    status, _ = node.request("POST", "/v1/program", {"program": PATH})
    assert status == 200
    steps = [
        ({"edge": [(1, 2)]}, {}),
        ({"edge": [(2, 3), (3, 4)]}, {}),
        ({}, {"edge": [(2, 3)]}),
        ({"edge": [(2, 3), (4, 5)]}, {"edge": [(1, 2)]}),
        ({"edge": [(1, 2)]}, {}),
    ]
    engine = IncrementalEngine(check_program(parse_program(PATH)))
    expected = []
    for ins, dels in steps:
        delta = engine.step(inserts=ins, deletes=dels).get("path", {})
        added = sorted([y] for (x, y), w in delta.items() if x == 1 and w > 0)
        removed = sorted([y] for (x, y), w in delta.items() if x == 1 and w < 0)
        expected.append((added, removed))
    events: list[tuple[str, dict]] = []
    done = threading.Event()
    url = node.url + "/v1/subscribe?q=path(1,%20X)"
    threading.Thread(
        target=_sse, args=(url, events, 1 + len(steps), done, node.read_token), daemon=True
    ).start()
    _wait_for(events, 1)
    assert events[0][0] == "result" and events[0][1]["added"] == []

    def facts(rows: dict) -> str:
        return " ".join(f"edge({a}, {b})." for a, b in rows.get("edge", []))

    for i, (ins, dels) in enumerate(steps):
        node.request("POST", "/v1/facts", {"assert": facts(ins), "retract": facts(dels)})
        _wait_for(events, i + 2)
    assert done.wait(15)
    got = [(e[1]["added"], e[1]["removed"]) for e in events[1:]]
    assert got == expected
    assert expected[2] == ([], [[3], [4]])  # one retraction, two rows gone


def test_sigterm_and_sigint_stop_cleanly(home: Path, node_factory) -> None:
    Cli(home)("init")
    for sig in (signal.SIGTERM, signal.SIGINT):
        node = node_factory(home).start()
        assert node.stop(sig) == 0
        assert not (home / "node.json").exists()
    # The home is free again: a one-shot command opens it directly.
    assert "not running" in Cli(home)("status").output


def test_cli_right_after_node_start_neither_races_nor_fails(home: Path, node_factory) -> None:
    """``merklog node run &`` then a command at once: whichever takes the home lock first,
    the command succeeds and the node comes up (it waits for a one-shot command's lock,
    a command waits for a starting node to listen)."""
    import subprocess

    from .conftest import PYTHON

    run = Cli(home)
    run("init")
    for i in range(2):
        node = node_factory(home)
        starter = threading.Thread(target=node.start)
        starter.start()
        # (a few ms apart: sometimes the command wins the lock, sometimes the node)
        time.sleep(0.05 * i)
        out = subprocess.run(
            [PYTHON, "-m", "merklog.node.cli", "--home", str(home), "put", f"n({i})."],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        starter.join(60)
        assert node.url, "the node never came up"
        _, q = node.request("GET", "/v1/query?q=n(X)")
        assert q["rows"] == [[k] for k in range(i + 1)]
        node.stop()


def test_write_answer_cids_lists_the_full_answers_cids(home: Path, node_factory) -> None:
    """``POST /v1/facts?answer=cids`` answers the CIDs alone, in input order, equal to the
    full answer's; 1, 1.0, true, "1" and x"01" stay five facts with five CIDs; a retract
    of a fact that is not visible is still named in full; a bad ``answer`` is a 400 that
    writes nothing; ``put`` through the node prints the same lines as the full answer."""
    run = Cli(home)
    run("init")
    node = node_factory(home).start()
    text = 'v(1). v(1.0). v(true). v("1"). v(x"01").'
    _, full = node.request("POST", "/v1/facts", {"assert": text})
    status, cids = node.request("POST", "/v1/facts?answer=cids", {"assert": text})
    assert status == 200
    assert cids["asserted"] == [item["cid"] for item in full["asserted"]]
    assert len(set(cids["asserted"])) == 5
    status, body = node.request("POST", "/v1/facts?answer=cids", {"retract": 'v(1). v("nope").'})
    assert status == 200 and body["retracted"][0] == full["asserted"][0]["cid"]
    assert [item["fact"] for item in body["not_visible"]] == ['v("nope")']
    status, body = node.request("POST", "/v1/facts?answer=short", {"assert": "w(1)."})
    assert status == 400 and "answer" in body["detail"]
    _, page = node.request("GET", "/v1/facts?rel=w")
    assert page["facts"] == []
    out = run("put", "u(2).", 'u("2").', "u(2.0).").output.splitlines()
    _, again = node.request("POST", "/v1/facts", {"assert": 'u(2). u("2"). u(2.0).'})
    assert out == [f"{item['cid']}\t{item['fact']}" for item in again["asserted"]]


def test_a_write_sent_without_an_answer_says_it_may_have_been_applied() -> None:
    """A write to a node that took it and then stopped answering (SIGSTOP, a timeout)
    said only "cannot reach node", although the write was applied when the node went
    on. A request that was sent says it may have been applied; one that could not
    connect, or a read, still says the node could not be reached."""
    import socket

    from merklog.node.client import NodeAPIError, NodeClient

    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        client = NodeClient(url, "token", timeout=0.5)
        with pytest.raises(NodeAPIError, match="may have been applied") as sent:
            client.write("v(1).")
        assert sent.value.status == 0
        assert f"no answer from node at {url} (timed out)" in str(sent.value)
        with pytest.raises(NodeAPIError, match="cannot reach node"):
            client.status()
    with socket.create_server(("127.0.0.1", 0)) as resetting:  # reads, then resets (RST)
        import struct
        import threading

        def reset_once() -> None:
            conn, _ = resetting.accept()
            conn.recv(65536)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

        threading.Thread(target=reset_once, daemon=True).start()
        url = f"http://127.0.0.1:{resetting.getsockname()[1]}"
        with pytest.raises(NodeAPIError, match="may have been applied") as sent:
            NodeClient(url, "token", timeout=5).write("v(1).")
        # the reason in plain words, as everywhere else: not "[Errno 104] Connection …"
        assert f"no answer from node at {url} (connection reset by peer)" in str(sent.value)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(NodeAPIError, match="cannot reach node") as refused:
        NodeClient(f"http://127.0.0.1:{port}", "token", timeout=0.5).write("v(1).")
    assert "may have been" not in str(refused.value)


def test_an_answer_cut_off_mid_body_is_the_same_one_line_as_no_answer() -> None:
    """A node stopped while it was sending a large write's answer left the client with
    an ``IncompleteRead``, which ``put`` reported as an internal error (exit 70) although
    the write had been applied. It is the "may have been applied" line (exit 4) now, and
    for a read a line saying the answer was cut off."""
    import socket
    import threading

    from merklog.node.client import NodeAPIError, NodeClient
    from merklog.node.failures import ExitCode, exit_code_for_status

    server = socket.create_server(("127.0.0.1", 0))

    def answer_half() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:  # the whole request, so no reset
                    request += conn.recv(65536)
                head, _, body = request.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n" + b'{"asserted": [' + b'"x", ' * 20
                )

    threading.Thread(target=answer_half, daemon=True).start()
    client = NodeClient(f"http://127.0.0.1:{server.getsockname()[1]}", "token", timeout=5)
    try:
        with pytest.raises(NodeAPIError, match="may have been applied") as sent:
            client.write("v(1).")
        assert "its answer was cut off after 114 bytes" in str(sent.value)
        assert exit_code_for_status(sent.value.status) == ExitCode.PEER_UNREACHABLE
        with pytest.raises(NodeAPIError, match="its answer was cut off"):
            client.status()
    finally:
        server.close()


def test_a_write_in_flight_when_the_node_stops_is_answered(tmp_path, node_factory) -> None:
    """SIGTERM while a large write was being decoded and stored: aiohttp cancelled its
    handler two seconds into the shutdown, the write committed in its worker thread all
    the same, and the client got no answer ("may have been applied") for facts that were
    stored. The node now lets writes in flight finish and answers them, then stops."""
    import json
    import signal
    import socket

    Cli(tmp_path / "h")("init")
    node = node_factory(tmp_path / "h").start()
    n = 300_000  # seconds of decoding and storing: well past the 2 s aiohttp gives
    body = json.dumps({"assert": "".join(f"w({i}).\n" for i in range(n))}).encode()
    host, port = node.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/facts?answer=cids HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {node.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=600) as conn:
        # A small send buffer: sendall returns only once the node has read most of the
        # body, so the write is in flight (not merely queued in the kernel) at SIGTERM.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        conn.sendall(head + body)
        node.proc.send_signal(signal.SIGTERM)  # the body is in: decoding, storing ahead
        answer = b""
        while chunk := conn.recv(1 << 20):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"200", answer[:300]
    assert len(json.loads(rest.partition(b"\r\n\r\n")[2])["asserted"]) == n
    assert node.proc.wait(timeout=120) == 0
    assert f"facts {n} stored" in " ".join(Cli(tmp_path / "h")("status").output.split())


def test_a_request_aiohttp_cannot_parse_is_no_logged_error(tmp_path, node_factory) -> None:
    """A raw non-ASCII character in a request's URL was logged at ERROR with a
    traceback from aiohttp.server, by any client, before any token check. It is a
    400 and, at the default level, nothing in the log."""
    import socket

    from .conftest import Cli

    home = tmp_path / "home"
    Cli(home)("init")
    node = node_factory(home).start()
    try:
        host, port = node.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall("GET /v1/facts?limit=٣ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0]
    finally:
        node.stop()
    log = "".join(node.stderr_lines)
    assert "Traceback" not in log and "ERROR" not in log, log


def test_the_app_url_in_a_log_holds_no_token(home: Path, tmp_path: Path, node_factory) -> None:
    """With a static app, ``node run`` printed ``app: URL/#token=<write token>`` to any
    stderr: under a service manager, the journal kept the write token. A log (stderr not
    a terminal, as here) gets the URL and where to find the token instead."""
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<p>app</p>")
    Cli(home)("init")
    token = Cli(home)("token", "--write").output.strip()
    node = node_factory(home, "--static-dir", str(static)).start()
    deadline = time.monotonic() + 10
    while "app: " not in node.stderr_text and time.monotonic() < deadline:
        time.sleep(0.05)
    log = node.stderr_text
    assert f"app: {node.url}/ (open it as {node.url}/#token=WRITE_TOKEN" in log, log
    assert token not in log


def test_sigterm_with_a_write_in_flight_answers_it_and_exits_at_once(
    home: Path, node_factory
) -> None:
    """SIGTERM while a write request was being handled: the node stopped its epoch loop,
    the request then waited for an epoch that never came, and the client got a
    disconnect ~4 s later (two shutdown timeouts) although its write was stored. Now the
    request is answered (the write is durable) and the node exits at once."""
    Cli(home)("init")
    node = node_factory(home).start()
    body = {"assert": "".join(f"inflight({i}, {i * 7}).\n" for i in range(40_000))}
    answer: list = []
    writer = threading.Thread(target=lambda: answer.append(node.request("POST", "/v1/facts", body)))
    writer.start()
    time.sleep(0.15)  # the request is being decoded and written
    started = time.monotonic()
    assert node.stop(signal.SIGTERM) == 0
    took = time.monotonic() - started
    writer.join(30)
    assert answer and answer[0][0] == 200, str(answer)[:200]
    assert len(answer[0][1]["asserted"]) == 40_000
    assert took < 3.0, took  # it took 4.0-4.3 s
    restarted = node_factory(home).start()
    _, rows = restarted.request("GET", "/v1/query?q=inflight(39999,%20X)")
    assert rows["rows"] == [[39999 * 7]]


def test_a_live_query_whose_client_went_away_ends_soon(home: Path, node_factory) -> None:
    """A subscriber's stream noticed a gone client only when a keep-alive write failed,
    15 s later: its live query stayed registered and evaluated every epoch meanwhile."""
    import socket

    Cli(home)("init")
    Cli(home)("put", "a(1).")
    node = node_factory(home).start()

    def subscribers() -> float:
        req = urllib.request.Request(
            node.url + "/metrics", headers={"Authorization": f"Bearer {node.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("merklog_subscribers "):
                    return float(line.split()[1])
        raise AssertionError("no merklog_subscribers gauge")

    host, port = node.url.split("//")[1].split(":")
    clients = []
    for _ in range(3):
        s = socket.create_connection((host, int(port)))
        s.sendall(
            b"GET /v1/subscribe?q=a(X) HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {node.token}\r\n\r\n".encode()
        )
        assert b"200" in s.recv(4096)
        clients.append(s)
    assert subscribers() == 3
    for s in clients:
        s.close()
    deadline = time.monotonic() + 6  # the old code kept them for 15 s
    while subscribers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert subscribers() == 0


def _raw_answer(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one raw request (the node closes the connection)."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_an_unparsable_request_answers_json_and_no_token_is_logged(
    home: Path, node_factory
) -> None:
    """A request line over 8190 bytes answered a text/plain 400 echoing the Python repr
    of the line, ``?access_token=`` included, and aiohttp logged that line at INFO with
    the token; malformed requests answered in plain text too, and none was counted."""
    Cli(home)("init")
    node = node_factory(home, options=("-v",)).start()
    token = node.read_token
    query = "e(X)" + ",e(X)" * 2100
    cases = [
        (f"GET /v1/subscribe?access_token={token}&q={query} HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Token: {token}{'a' * 17000}\r\n\r\n", 431),
        ("GET /healthz HTTP/1.1\r\n" + "X-A: 1\r\n" * 130 + "\r\n", 431),
        (f"GARBAGE{token}\r\n\r\n", 400),
        ("POST /v1/facts HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
        (
            "POST /v1/facts HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
    ]
    for request, status in cases:
        got, headers, body = _raw_answer(node.url, request.encode())
        assert got == status, (request[:60], got, body[:200])
        assert headers["content-type"].startswith("application/json"), request[:60]
        answer = json.loads(body)
        assert set(answer) == {"error", "detail"} and token not in body.decode(), answer
    # A header of 9,000 bytes is no error.
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-A: " + b"a" * 9000
    assert _raw_answer(node.url, big + b"\r\n\r\n")[0] == 200
    _, metrics = node.request("GET", "/metrics")
    text = metrics.decode()
    for status, n in (("414", 1), ("431", 2), ("400", 3)):
        assert f'route="unmatched",status="{status}"}} {n}.0' in text, text
    node.stop()
    log = node.stderr_text
    assert "bad HTTP request: 414" in log
    assert token not in log and "Traceback" not in log and "ERROR" not in log, log


def test_subscribe_refuses_an_unknown_arity_as_query_does(home: Path, node_factory) -> None:
    """``/v1/query`` of a relation known at another arity answered 404 ``unknown
    relation``; ``/v1/subscribe`` of the same query 400 ``bad query``."""
    Cli(home)("init")
    node = node_factory(home).start()
    node.request("POST", "/v1/facts", {"assert": "e(1)."})
    q_status, q_body = node.request("GET", "/v1/query?q=e(X,%20Y)")
    s_status, s_body = node.request("GET", "/v1/subscribe?q=e(X,%20Y)")
    assert q_status == s_status == 404 and q_body == s_body, (q_body, s_body)
    assert s_body["error"] == "unknown relation" and "e/1" in s_body["detail"]
    doc = node.request("GET", "/openapi.json")[1]
    assert "404" in doc["paths"]["/v1/subscribe"]["get"]["responses"]


def _post_raw(node, path: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(node.url + path, data=body, method="POST")
    req.add_header("Authorization", f"Bearer {node.token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_json_integer_too_long_to_read_is_named_by_its_field(home: Path, node_factory) -> None:
    """A JSON integer of 5,001 digits answered Python's "Exceeds the limit (4300
    digits) for integer string conversion … use sys.set_int_max_str_digits()", naming
    no field; an integer just over 64 bits names its field and argument."""
    Cli(home)("init")
    node = node_factory(home).start()
    huge = b"1" + b"0" * 5000
    status, body = _post_raw(
        node, "/v1/facts", b'{"assert": [{"rel": "e", "args": [1, ' + huge + b"]}]}"
    )
    assert status == 400 and body["error"] == "bad input"
    assert body["detail"] == (
        "assert[0]: e(…) argument 1: integer 100000000000…0000 (5001 digits)"
        " does not fit in 64 signed bits"
    ), body
    status, body = _post_raw(
        node,
        "/v1/facts",
        b'{"assert": "ok(1).", "retract": [{"rel": "e", "args": [-' + huge + b"]}]}",
    )
    assert status == 400 and body["detail"].startswith("retract[0]: e(…) argument 0: integer -1")
    assert "sys.set_int_max_str_digits" not in body["detail"]
    assert node.request("GET", "/v1/facts")[1]["facts"] == []


def test_unknown_fields_of_program_sync_and_grant_bodies_are_refused(
    home: Path, node_factory
) -> None:
    """``POST /v1/program``, ``/v1/sync`` and ``/v1/writers`` ignored a key they do not
    know, as the write and query bodies no longer do: a misspelt ``"timout"`` synced
    with the node's own timeout, a misspelt ``"sourc"`` named errors ``<program>``."""
    Cli(home)("init")
    node = node_factory(home).start()
    cases = [
        ("/v1/program", {"program": "p(X) :- e(X).", "sourc": "a.dl"}, "'sourc'"),
        ("/v1/sync", {"url": "http://127.0.0.1:9", "timout": 5}, "'timout'"),
        ("/v1/writers", {"key": "00" * 32, "keys": ["11" * 32]}, "'keys'"),
    ]
    for path, body, named in cases:
        status, err = node.request("POST", path, body)
        assert status == 400 and err["error"] == "bad input", (path, status, err)
        assert err["detail"].startswith(f"unknown field {named}: "), (path, err)
    assert node.request("GET", "/v1/status")[1]["program"] is False  # nothing installed
    assert node.request("GET", "/v1/status")[1]["peers"] == []  # nothing synced
    status, _ = node.request("POST", "/v1/program", {"program": "p(X) :- e(X).", "source": "a"})
    assert status == 200
    # /openapi.json says so (it let any key through, and "args" be left out of a fact).
    schemas = node.request("GET", "/openapi.json")[1]["components"]["schemas"]
    for name in ("Write", "JsonFact", "Query", "ProgramText", "SyncRequest", "WriterKey"):
        assert schemas[name]["additionalProperties"] is False, name
    assert schemas["JsonFact"]["required"] == ["rel", "args"]
    status, err = node.request("POST", "/v1/facts", {"assert": [{"rel": "e"}]})
    assert status == 400 and '"args"' in err["detail"], err


def test_a_json_fact_argument_that_is_no_value_is_named_as_json_names_it(
    home: Path, node_factory
) -> None:
    """``{"rel": "p", "args": [null]}`` answered "NoneType is not a merklog value" and
    ``[[1]]`` "list is not …": Python's type names, which a JSON client does not use."""
    Cli(home)("init")
    node = node_factory(home).start()
    for arg, named in ((None, "null"), ([1, 2], "an array")):
        body = {"assert": [{"rel": "p", "args": [1, arg]}]}
        status, err = node.request("POST", "/v1/facts", body)
        assert status == 400, err
        assert err["detail"].startswith(f"assert[0] argument 1: {named} is not a merklog"), err
    assert node.request("GET", "/v1/facts")[1]["facts"] == []


def test_a_url_parameter_given_twice_is_refused(home: Path, node_factory) -> None:
    """``?rel=a&rel=b``, ``?q=a(X)&q=b(Y)``, … used the first value and dropped the
    other without a word (as a JSON body's repeated key once was): a page of ``a`` for
    a client that asked for two relations, the answer to one query of two."""
    Cli(home)("init")
    node = node_factory(home).start()
    node.request("POST", "/v1/facts", {"assert": "a(1). b(2)."})
    cases = [
        ("GET", "/v1/facts?rel=a&rel=b", "rel"),
        ("GET", "/v1/facts?limit=1&limit=2", "limit"),
        ("GET", "/v1/query?q=a(X)&q=b(Y)", "q"),
        ("GET", "/v1/subscribe?q=a(X)&q=b(Y)", "q"),
        ("DELETE", "/v1/sync/history?url=http://x&url=http://y", "url"),
    ]
    for method, path, name in cases:
        status, err = node.request(method, path)
        assert status == 400, (path, status, err)
        assert err["detail"] == f"{name}= is given 2 times: give it once", (path, err)
    status, err = node.request("POST", "/v1/facts?answer=cids&answer=full", {"assert": "c(3)."})
    assert status == 400 and err["detail"].startswith("answer= is given 2 times"), err
    assert node.request("GET", "/v1/query?q=c(X)")[0] == 404  # nothing written
    assert node.request("GET", "/v1/facts?rel=a&limit=1")[1]["facts"][0]["fact"] == "a(1)"
    # An empty value is no value given, for every parameter: ?rel= and ?after= were
    # taken as absent while ?limit= and ?answer= were refused (QA)
    status, page = node.request("GET", "/v1/facts?rel=&after=&limit=&form=")
    assert status == 200 and len(page["facts"]) == 2, page
    status, written = node.request("POST", "/v1/facts?answer=", {"assert": "d(4)."})
    assert status == 200 and written["asserted"][0]["fact"] == "d(4)", written
    status, err = node.request("GET", "/v1/query?q=")
    assert status == 400 and err["detail"].startswith('missing query "q"'), err


def test_fields_of_the_wrong_type_are_refused_and_named(home: Path, node_factory) -> None:
    """``"source": 5`` was taken (errors then read ``5:1:5:``), ``{"q": 5}`` said the
    query was missing, ``{"assert": null}`` answered 200 writing nothing, and a syntax
    error in ``retract`` text gave a LINE:COL that reads as one in ``assert``."""
    Cli(home)("init")
    node = node_factory(home).start()
    status, body = node.request("POST", "/v1/program", {"program": "p(X) :- e(X).", "source": 5})
    assert status == 400 and body["detail"].startswith('"source" must be a string'), body
    assert node.request("GET", "/v1/status")[1]["program"] is False  # nothing installed
    status, body = node.request(
        "POST", "/v1/program", {"program": "p(X :- e(X).", "source": "a.dl"}
    )
    assert status == 400 and body["detail"].startswith("a.dl:1:"), body
    status, body = node.request("POST", "/v1/query", {"q": 5})
    assert (status, body["error"]) == (400, "bad query")
    assert body["detail"] == '"q" must be a string, got a number', body
    for empty in ({"assert": None}, {"retract": None}, {"assert": "ok(1).", "retract": None}):
        status, body = node.request("POST", "/v1/facts", empty)
        assert status == 400 and "got null" in body["detail"], (empty, body)
    status, body = node.request("POST", "/v1/facts", {"assert": "ok(1).", "retract": "ok(2"})
    assert status == 400 and body["detail"].startswith("retract: 1:5: "), body
    status, body = node.request("POST", "/v1/facts", {"assert": "ok(1", "retract": "ok(2)."})
    assert status == 400 and body["detail"].startswith("1:5: "), body
    assert node.request("GET", "/v1/facts")[1]["facts"] == []


def test_a_live_query_too_long_for_a_url_can_be_posted(home: Path, node_factory) -> None:
    """``/v1/subscribe`` was GET only, and a request line over 8190 bytes cannot be
    read: a live query that long could not be opened at all."""
    from urllib.parse import quote

    Cli(home)("init")
    node = node_factory(home).start()
    node.request("POST", "/v1/facts", {"assert": "e(1)."})
    query = 'e(X),X!="' + "a" * 9000 + '"'
    request = f"GET /v1/subscribe?q={quote(query)} HTTP/1.1\r\nHost: x\r\n\r\n"
    status = _raw_answer(node.url, request.encode())[0]
    assert status == 414
    req = urllib.request.Request(
        node.url + "/v1/subscribe", data=json.dumps({"q": query}).encode(), method="POST"
    )
    req.add_header("Authorization", f"Bearer {node.read_token}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.readline() == b"event: result\n"
        assert json.loads(resp.readline().removeprefix(b"data: "))["added"] == [[1]]


def test_a_lone_surrogate_in_datalog_text_is_named_at_its_line_and_column(
    home: Path, tmp_path: Path, node_factory
) -> None:
    """``{"assert": "s(\\"\\ud800\\")."}`` (JSON's escape of a lone surrogate) answered
    400 "Failed to encode DAG-CBOR. UnicodeEncodeError: …", and ``POST /v1/program`` the
    utf-8 codec's own words; the typed JSON form already said "a lone surrogate". Every
    Datalog text now says so at the LINE:COL of the character, nothing is written, and
    ``put -f`` of a file holding its UTF-8-like bytes is still refused as not UTF-8."""
    Cli(home)("init")
    node = node_factory(home).start()
    why = "a lone surrogate (strings must be valid Unicode)"
    cases = [
        ("/v1/facts", {"assert": 's("\ud800").'}, f"1:4: string holds '\\ud800', {why}"),
        ("/v1/facts", {"assert": 'ok(1).\ns("x\udc00").'}, f"2:5: string holds '\\udc00', {why}"),
        ("/v1/facts", {"retract": 's("\ud800").'}, f"retract: 1:4: string holds '\\ud800', {why}"),
        ("/v1/program", {"program": 's("\ud800").'}, f"<program>:1:4: string holds '\\ud800', {why}"),
        ("/v1/program", {"program": "% \ud800\np(X) :- e(X)."}, f"<program>:1:3: text holds '\\ud800', {why}"),
        ("/v1/query", {"q": 's("\ud800")'}, f"1:4: string holds '\\ud800', {why}"),
    ]  # fmt: skip
    for path, body, detail in cases:
        status, err = node.request("POST", path, body)  # json.dumps writes "\ud800"
        assert status == 400, (body, status, err)
        assert err["detail"].split("\n")[0] == detail, (body, err)
        assert "codec" not in err["detail"] and "Unicode" + "EncodeError" not in err["detail"]
    typed = node.request("POST", "/v1/facts", {"assert": [{"rel": "s", "args": ["\ud800"]}]})
    assert typed[0] == 400 and typed[1]["detail"].endswith(why), typed
    assert node.request("GET", "/v1/facts")[1]["facts"] == []
    assert node.request("GET", "/v1/status")[1]["program"] is False
    node.stop()
    facts = tmp_path / "surrogate.dl"
    facts.write_bytes(b's("\xed\xa0\x80").\n')
    result = Cli(home)("put", "-f", str(facts), ok=False)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"Error: {facts}:1:4: not UTF-8 text (byte 0xed); save the file as UTF-8"


def test_live_queries_past_the_limit_are_answered_busy(home: Path, node_factory) -> None:
    """QA: 1,000 live queries that were never read grew a node from 275 MB to 632 MB and
    made one write take 32 s: nothing bounded them. At most ``node.max_live_queries`` are
    served at once; one more is answered 503 ``busy`` (JSON) at once, and a place freed
    by a client leaving is taken again."""
    import socket
    from urllib.parse import urlsplit

    Cli(home)("--set", "node.max_live_queries=2", "init")
    node = node_factory(home).start()
    node.request("POST", "/v1/facts", {"assert": "edge(1, 2)."})
    where = urlsplit(node.url)

    def open_live() -> tuple[socket.socket, bytes]:
        """A live query's connection and the head of its answer."""
        sock = socket.create_connection((where.hostname, where.port), timeout=10)
        sock.sendall(
            f"GET /v1/subscribe?q=edge(1,%20X) HTTP/1.1\r\nHost: {where.netloc}\r\n"
            f"Authorization: Bearer {node.read_token}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        return sock, head

    (first, head1), (second, head2) = open_live(), open_live()
    try:
        assert head1.startswith(b"HTTP/1.1 200") and head2.startswith(b"HTTP/1.1 200")
        status, body = node.request("GET", "/v1/subscribe?q=edge(1,%20X)", token=node.read_token)
        assert status == 503 and body["error"] == "busy", body
        assert "node.max_live_queries" in body["detail"]
        busy, head = open_live()  # and says when to retry (QA: no Retry-After)
        busy.close()
        assert head.startswith(b"HTTP/1.1 503") and b"\r\nRetry-After: 5\r\n" in head, head
        first.close()
        deadline = time.monotonic() + 20
        while True:  # the node notices the client left (within its check interval)
            third, head3 = open_live()
            third.close()
            if head3.startswith(b"HTTP/1.1 200"):
                break
            assert time.monotonic() < deadline, head3
            time.sleep(0.5)
    finally:
        first.close()
        second.close()
    status, _body = node.request("POST", "/v1/facts", {"assert": "edge(1, 3)."})
    assert status == 200


def test_body_codings_are_decoded_refused_or_named(home: Path, node_factory) -> None:
    """QA: a body declared gzip (or deflate) that was not answered 500 "internal error"
    and logged a traceback; an unknown coding ("xyz") was ignored and the body written
    as plain. A gzip body is decoded; one that does not decode is 400 naming the coding;
    an unknown coding is 415; nothing is written by either."""
    import gzip
    import http.client
    from urllib.parse import urlsplit

    Cli(home)("init")
    node = node_factory(home).start()
    where = urlsplit(node.url)

    def post(data: bytes, coding: str) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        headers = {
            "Authorization": f"Bearer {node.token}",
            "Content-Type": "application/json",
            "Content-Encoding": coding,
        }
        try:
            conn.request("POST", "/v1/facts", body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    plain = json.dumps({"assert": "coded(1)."}).encode()
    for coding in ("gzip", "deflate"):
        status, body = post(plain, coding)
        assert (status, body["error"]) == (400, "bad input"), body
        assert f"Content-Encoding: {coding}" in body["detail"], body
    status, body = post(plain, "xyz")
    assert (status, body["error"]) == (415, "unsupported media type"), body
    assert "'xyz'" in body["detail"], body
    assert node.request("GET", "/v1/query?q=coded(X)")[0] == 404  # never written
    status, body = post(gzip.compress(plain), "gzip")
    assert status == 200, body
    assert node.request("GET", "/v1/query?q=coded(X)")[1]["rows"] == [[1]]
    _, metrics = node.request("GET", "/metrics")
    assert 'status="500"' not in metrics.decode()


def test_a_live_query_sending_its_body_slowly_does_not_hold_the_stop(
    home: Path, node_factory
) -> None:
    """QA: a client sending half of a ``POST /v1/subscribe`` body held the node's stop
    for minutes ("waiting for 1 write request(s)"): a live query was held like a write.
    It is a read: the node stops within seconds."""
    import socket
    from urllib.parse import urlsplit

    Cli(home)("init")
    node = node_factory(home).start()
    where = urlsplit(node.url)
    with socket.create_connection((where.hostname, where.port)) as sock:
        sock.sendall(
            b"POST /v1/subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {node.read_token}\r\n".encode()
            + b'Content-Length: 100\r\n\r\n{"q":'
        )
        time.sleep(0.5)
        started = time.monotonic()
        node.stop(signal.SIGTERM)
        took = time.monotonic() - started
    assert took < 10, took


def test_openapi_result_schemas_name_the_fields_the_answers_have(
    tmp_path: Path, node_factory
) -> None:
    """QA: SyncResult, ImportResult, InboxResult, Heads and PushResult were bare objects
    and ``limit`` a string, so generated clients knew nothing of the answers. The
    schemas list the fields real answers carry."""
    import subprocess
    import sys

    from .conftest import peered_pair

    a, b, na, nb = peered_pair(tmp_path, node_factory)
    a("put", "v(1).", "v(1.0).")
    _, doc = na.request("GET", "/openapi.json")
    schemas = doc["components"]["schemas"]
    (limit,) = [p for p in doc["paths"]["/v1/facts"]["get"]["parameters"] if p["name"] == "limit"]
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 10000}
    status, synced = nb.request("POST", "/v1/sync", {"url": na.url})
    assert status == 200, synced
    assert set(synced) == set(schemas["SyncResult"]["required"]), synced
    car = subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(a.home), "export", "-"],
        capture_output=True,
        timeout=120,
    ).stdout
    req = urllib.request.Request(nb.url + "/v1/import", data=car, method="POST")
    req.add_header("Authorization", f"Bearer {nb.token}")
    req.add_header("Content-Type", "application/vnd.ipld.car")
    with urllib.request.urlopen(req, timeout=60) as resp:
        imported = json.loads(resp.read())
    assert set(schemas["ImportResult"]["required"]) <= set(imported), imported
    assert set(imported) <= set(schemas["ImportResult"]["properties"]), imported
    assert schemas["Heads"]["required"] == ["dataset", "heads", "deltas"]  # a signed route


def test_a_chunked_body_that_turns_malformed_is_answered_and_closed(
    home: Path, node_factory
) -> None:
    """QA: a chunked body whose second chunk size was not a number was never answered:
    aiohttp queued the parse error as a next request and left the body unended, so the
    handler waited forever (and a write held the node's stop). Now the read fails: a JSON
    400, the connection closed, nothing written, nothing logged as unhandled."""
    import socket
    from urllib.parse import urlsplit

    Cli(home)("init")
    node = node_factory(home).start()
    where = urlsplit(node.url)
    with socket.create_connection((where.hostname, where.port), timeout=20) as sock:
        sock.sendall(
            b"POST /v1/facts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {node.token}\r\n".encode()
            + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"ass\r\n'
        )
        time.sleep(0.3)  # the handler is reading the body
        sock.sendall(b'zz\r\nert":"q(1)."}\r\n0\r\n\r\n')
        answer = b""
        while chunk := sock.recv(4096):  # ends: the node closes the connection
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    assert json.loads(body)["error"] == "bad input", body
    assert node.request("GET", "/v1/query?q=q(X)")[0] == 404  # nothing written
    time.sleep(0.3)
    assert not [line for line in node.stderr_lines if "Unhandled" in line or "Traceback" in line]
