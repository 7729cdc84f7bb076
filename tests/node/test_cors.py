"""Pages of another origin call the node only when ``api.cors_origins`` lists theirs:
checked in headless Chromium (a page served from one port calling a node on another),
on the wire (preflights, headers on answers, errors and streams) and in the config."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from .conftest import Cli
from .test_browser import _chromium, browser  # noqa: F401 - the module's Chromium

PAGE = b"<!doctype html><title>an app on its own origin</title><p>app</p>"

#: Run in the page: a typed write, a query, a bad body and a live query's first event.
CALLS = """async ([url, token]) => {
  const auth = {"Authorization": "Bearer " + token};
  const out = {};
  try {
    const w = await fetch(url + "/v1/facts", {method: "POST",
      headers: {...auth, "Content-Type": "application/json"},
      body: JSON.stringify({"assert": [{"rel": "v", "args": [1]}, {"rel": "v", "args": ["1"]},
                                       {"rel": "v", "args": [true]}]})});
    out.write = w.status;
    const q = await fetch(url + "/v1/query?q=" + encodeURIComponent("v(X)"), {headers: auth});
    out.rows = (await q.json()).rows;
    const bad = await fetch(url + "/v1/facts", {method: "POST",
      headers: {...auth, "Content-Type": "application/json"}, body: "{"});
    out.bad = [bad.status, (await bad.json()).error];
    out.event = await new Promise((resolve, reject) => {
      const es = new EventSource(url + "/v1/subscribe?q=" + encodeURIComponent("v(X)")
                                 + "&access_token=" + token);
      es.addEventListener("result", (e) => { es.close(); resolve(JSON.parse(e.data).added); });
      es.onerror = () => { es.close(); reject(new Error("stream refused")); };
    });
  } catch (e) {
    out.failed = String(e);
  }
  return out;
}"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads what the page got, not this server's log."""


@pytest.fixture
def page_origin():
    """A web server on 127.0.0.1 serving one page: the app's own origin."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _node(tmp_path: Path, node_factory, origins: str):
    home = tmp_path / "home"
    Cli(home)("--set", f"api.cors_origins={origins}", "init")
    return node_factory(home).start()


@pytest.mark.browser
def test_a_page_of_a_listed_origin_writes_queries_and_streams(
    tmp_path, node_factory, browser, page_origin  # noqa: F811
) -> None:
    node = _node(tmp_path, node_factory, f"http://localhost:1 {page_origin}")
    page = browser.new_page()
    page.goto(page_origin + "/")
    got = page.evaluate(CALLS, [node.url, node.token])
    assert got.get("failed") is None, got
    assert got["write"] == 200
    assert sorted(map(repr, got["rows"])) == ["['1']", "[1]", "[True]"]  # three values
    assert got["bad"] == [400, "bad input"]  # an error the page can read
    assert sorted(map(repr, got["event"])) == ["['1']", "[1]", "[True]"]
    page.close()


@pytest.mark.browser
def test_a_page_of_another_origin_is_refused_and_writes_nothing(
    tmp_path, node_factory, browser, page_origin  # noqa: F811
) -> None:
    """Without its origin listed (none by default, or another one), the browser's preflight
    is refused, so the write is never sent and the page reads nothing."""
    for n, origins in enumerate(("", "http://127.0.0.1:1")):
        node = _node(tmp_path / str(n), node_factory, origins)
        page = browser.new_page()
        page.goto(page_origin + "/")
        got = page.evaluate(CALLS, [node.url, node.token])
        assert got == {"failed": "TypeError: Failed to fetch"}
        status, body = node.request("GET", "/v1/query?q=v(X)")
        assert status == 404 and "v" in body["detail"]  # no fact v(...) arrived
        page.close()
        node.stop()


def _call(url: str, method: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_preflights_and_answers_on_the_wire(tmp_path, node_factory) -> None:
    """A listed origin's preflight is 204 with the methods and headers the API takes; any
    other origin's is a JSON 403; every answer to a listed origin (a 401 too) names it and
    says it varies by Origin; an answer to no origin names none."""
    app = "http://127.0.0.1:5173"
    node = _node(tmp_path, node_factory, f"{app}, https://app.example:443")
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    status, headers = _call(node.url + "/v1/facts", "OPTIONS", {"Origin": app, **ask})
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == app
    assert headers["Access-Control-Allow-Methods"] == "GET, HEAD, POST, DELETE"
    assert headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type"
    assert "Access-Control-Allow-Credentials" not in headers
    # the default port is left out of a browser's Origin: https://app.example is listed
    status, headers = _call(node.url + "/v1/facts", "OPTIONS", {"Origin": "https://app.example", **ask})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    status, headers = _call(node.url + "/v1/facts", "OPTIONS", {"Origin": "http://evil.example", **ask})
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers = _call(node.url + "/v1/facts", "GET", {"Origin": app})
    assert status == 401
    assert headers["Access-Control-Allow-Origin"] == app and headers["Vary"] == "Origin"
    status, headers = _call(node.url + "/v1/facts", "GET", {"Authorization": f"Bearer {node.token}"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("*", 'not "*"'),
        ("http://localhost:5173/", "'http://localhost:5173/' is not an origin"),
        ("localhost:5173", "'localhost:5173' is not an origin"),
        ("http://a:99999", "'http://a:99999' is not an origin"),
    ],
)
def test_a_wrong_origin_is_refused_when_the_config_is_read(tmp_path, value, message) -> None:
    cmd = [sys.executable, "-m", "merklog.node.cli", "--home", str(tmp_path / "h")]
    done = subprocess.run(
        [*cmd, "--set", f"api.cors_origins={value}", "init"], capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("Error: ") and "api.cors_origins" in line and message in line
    assert not (tmp_path / "h").exists()


def test_a_preflight_for_a_method_no_route_takes_is_refused_and_bad_requests_carry_cors(
    tmp_path, node_factory
) -> None:
    """QA: a preflight asking for PUT got 204 although no route takes it, and an answer to
    a request aiohttp could not parse (400 bad request) had no CORS header, so a listed
    page saw only a network error instead of the JSON reason. (aiohttp keeps no header of
    such a request: with one origin listed, that origin may read it.)"""
    import socket
    from urllib.parse import urlsplit

    app = "http://127.0.0.1:5173"
    node = _node(tmp_path, node_factory, app)
    ask = {"Access-Control-Request-Method": "PUT"}
    status, headers = _call(node.url + "/v1/facts", "OPTIONS", {"Origin": app, **ask})
    assert status == 405, (status, headers)
    where = urlsplit(node.url)
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(
            f"GET /v1/status HTTP/1.1\r\nHost: {where.netloc}\r\nOrigin: {app}\r\n"
            "Content-Length: 1\r\nContent-Length: 2\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode()
    assert " 400 " in head.splitlines()[0], head
    assert f"Access-Control-Allow-Origin: {app}" in head, head
