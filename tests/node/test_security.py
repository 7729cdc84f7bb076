"""Secure defaults and the HTTP error contract, on real node processes: owner-only files,
a token on every /v1 route (read vs write, anonymous reads only when configured), JSON
errors with the right status, /openapi.json equal to the router, writer revocation, and
a client dying mid-sync not logged as a server error."""

from __future__ import annotations

import gzip
import json
import os
import socket
import stat
import time
import urllib.request
from pathlib import Path

import pytest

from merklog.node.server import ROUTES

from .conftest import Cli, peered_pair
from .test_server import _raw_answer


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask():
    old = os.umask(0o022)  # the usual default: files would come out world-readable
    yield
    os.umask(old)


def test_home_files_are_owner_only(home: Path, node_factory, loose_umask) -> None:
    run = Cli(home)
    run("init")
    node = node_factory(home).start()
    run("put", "edge(1, 2).")  # through the node: the WAL exists now
    files = ["config.toml", "identity.pem", "store.sqlite", "store.sqlite-wal", "node.json"]
    for name in files:
        assert _mode(home / name) == 0o600, name
    assert _mode(home / "store.sqlite-shm") == 0o600
    assert _mode(home) == 0o700
    node.stop()
    run("export", str(home / "backup.car"))
    assert _mode(home / "backup.car") == 0o600


def test_token_command_prints_the_tokens(home: Path) -> None:
    import tomllib

    run = Cli(home)
    run("init")
    api = tomllib.loads((home / "config.toml").read_text())["api"]
    assert api["token"] != api["read_token"] and len(api["read_token"]) >= 20
    assert run("token").output.strip() == api["read_token"]
    assert run("token", "--write").output.strip() == api["token"]
    assert api["anonymous_reads"] is False


def test_an_empty_token_in_the_environment_is_refused_before_a_home_is_made(
    tmp_path: Path,
) -> None:
    """``MERKLOG_API_TOKEN=`` (set and empty): a first ``merklog.open`` and ``node run
    --init`` made the whole home (tokens, key, store), then refused to open it; ``init``
    made it and every later command refused it. Each now refuses before anything is
    made, naming the variable."""
    import subprocess
    import sys

    for var, command in (
        ("MERKLOG_API_TOKEN", ["init"]),
        ("MERKLOG_API_READ_TOKEN", ["node", "run", "--init", "--port", "0"]),
        ("MERKLOG_API_TOKEN", None),  # merklog.open
    ):
        home = tmp_path / f"h-{var}-{command is None}"
        env = {**os.environ, var: ""}
        if command is None:
            script = f"import merklog\nmerklog.open({str(home)!r})\n"
            done = subprocess.run(
                [sys.executable, "-c", script], env=env, capture_output=True, text=True
            )
            assert "ConfigError" in done.stderr and f"{var} is set and empty" in done.stderr
        else:
            done = subprocess.run(
                [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *command],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 2, done.stderr
            assert done.stderr.startswith(f"Error: {var} is set and empty"), done.stderr
        assert not home.exists(), (var, command)


def test_an_empty_or_shared_token_is_refused_naming_the_option(home: Path, tmp_path: Path) -> None:
    """``token = ""`` and ``read_token = ""`` in config.toml: ``merklog token`` printed an
    empty line (exit 0) and the node started though nobody could authenticate; ``--set
    api.token=x --set api.read_token=x`` was taken, the read token then granting writes.
    Both are refused (exit 2, one line naming the option), by the Python API too; a short
    token of the user's choosing is taken, and ``init`` fills in an empty one."""
    import tomllib

    import merklog

    run = Cli(home)
    run("init")
    config = home / "config.toml"
    text = config.read_text()
    api = tomllib.loads(text)["api"]
    empty = text.replace(f'token = "{api["token"]}"', 'token = ""')
    empty = empty.replace(f'read_token = "{api["read_token"]}"', 'read_token = ""')
    config.write_text(empty)
    for args in (("token",), ("token", "--write"), ("node", "run", "--port", "0"), ("status",)):
        result = run(*args, ok=False)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.strip() == (
            "Error: api.token is empty, so no client could authenticate: set one, or run"
            " `merklog init`, which generates one in place of an empty one"
        ), args
    with pytest.raises(merklog.Error, match="^api.token is empty"):
        merklog.open(home)
    run("init")  # generates both again
    fresh = tomllib.loads(config.read_text())["api"]
    assert fresh["token"] and fresh["read_token"] and fresh["token"] != fresh["read_token"]
    same = ("--set", "api.token=x", "--set", "api.read_token=x")
    shared = (
        "Error: api.read_token is the same as api.token, so the read token would grant"
        " writes: give them different values"
    )
    for args in (("token",), ("node", "run", "--port", "0"), ("put", "a(1).")):
        result = run(*same, *args, ok=False)
        assert (result.exit_code, result.output.strip()) == (2, shared), args
    result = Cli(tmp_path / "new")(*same, "init", ok=False)
    assert (result.exit_code, result.output.strip()) == (2, shared)
    assert not (tmp_path / "new").exists()
    with pytest.raises(merklog.Error, match="^api.read_token is the same as api.token"):
        merklog.open(tmp_path / "new2", settings={"api.token": "x", "api.read_token": "x"})
    assert not (tmp_path / "new2").exists()
    result = run("--set", "api.read_token=", "token", ok=False)
    assert result.exit_code == 2 and "api.read_token is empty" in result.output
    # A short token is the user's choice.
    assert run("--set", "api.token=w", "--set", "api.read_token=r", "token").output == "r\n"
    with merklog.open(memory=True) as node:  # a memory node has no tokens: it cannot serve
        assert node.config.get("api.token") == ""


def test_a_token_given_by_set_is_taken_as_written_and_said_as_given(
    home: Path, monkeypatch
) -> None:
    """``--set 'api.token= x'`` lost its spaces (a ``--set`` value was stripped), where
    the same token from ``MERKLOG_API_TOKEN`` or config.toml is refused; and ``init
    --set api.token=T`` on an initialised home said it "generated a new one". A token
    from ``--set`` is refused as from the environment (exit 2, the same line, nothing
    made), one given is said as given, and ``1e3`` stays ``1e3`` (not ``1000.0``)."""
    import tomllib

    run = Cli(home)
    spaced = (
        "Error: {key} begins or ends with a space, which no Authorization header carries: remove it"
    )
    for key, value in (("api.token", " x"), ("api.read_token", "x "), ("api.token", "\tx")):
        result = run("--set", f"{key}={value}", "init", ok=False)
        assert (result.exit_code, result.output.strip()) == (2, spaced.format(key=key)), value
        assert not home.exists()
        monkeypatch.setenv(env_var := f"MERKLOG_{key.upper().replace('.', '_')}", value)
        from_env = run("init", ok=False)
        monkeypatch.delenv(env_var)
        assert (from_env.exit_code, from_env.output) == (result.exit_code, result.output)
    run("init")
    result = run("--set", "api.token= x", "put", "a(1).", ok=False)  # every command
    assert (result.exit_code, result.output.strip()) == (2, spaced.format(key="api.token"))
    out = run("--set", "api.token=1e3", "init").output
    assert "  changed  api.token: set to the one given (`merklog token --write` prints it)\n" in out
    assert "generated" not in out and "1e3" not in out
    monkeypatch.setenv("MERKLOG_API_READ_TOKEN", "true")
    out = run("init").output
    assert "  changed  api.read_token: set to the one given (`merklog token` prints it)\n" in out
    monkeypatch.delenv("MERKLOG_API_READ_TOKEN")
    api = tomllib.loads((home / "config.toml").read_text())["api"]
    assert (api["token"], api["read_token"]) == ("1e3", "true")
    config = (home / "config.toml").read_text()
    (home / "config.toml").write_text(config.replace('token = "1e3"', 'token = ""'))
    out = run("init").output  # an empty one is still generated, and said so
    assert "  changed  api.token: generated a new one (`merklog token --write` prints it)\n" in out


def test_an_older_world_readable_home_is_tightened(home: Path, loose_umask) -> None:
    run = Cli(home)
    run("init")
    for path in (home, home / "config.toml", home / "store.sqlite"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    run("put", "edge(1, 2).")
    assert _mode(home / "store.sqlite") == 0o600 and _mode(home) == 0o700


def test_tightening_never_adds_a_permission(home: Path) -> None:
    """Opening a home took a 0500 home to 0700 and a 0400 store to 0600: an operator's
    read-only protection undone (and a put then went through). Tightening only takes
    the group's and others' bits away."""
    run = Cli(home)
    run("init")
    run("put", "edge(1, 2).")
    (home / "store.sqlite").chmod(0o440)
    (home / "config.toml").chmod(0o444)
    home.chmod(0o550)
    try:
        run("ls")
        assert _mode(home) == 0o500
        assert _mode(home / "store.sqlite") == 0o400
        assert _mode(home / "config.toml") == 0o400
    finally:
        home.chmod(0o700)


def _call(url: str, method: str, token: str | None, body: bytes | None = None):
    req = urllib.request.Request(url, data=body, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read(0)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), json.loads(exc.read())


def _concrete(path: str) -> str:
    return (
        path.replace("{cid}", "bafyreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku")
        .replace("{key}", "cd" * 32)
        .replace("/v1/subscribe", "/v1/subscribe?q=nothing(X)")
        .replace("{path:.+}", "app.js")
    )


def test_every_route_needs_the_token_its_table_entry_names(
    home: Path, tmp_path: Path, node_factory
) -> None:
    Cli(home)("init")
    app = tmp_path / "app"
    app.mkdir()
    (app / "app.js").write_text("// the app")
    node = node_factory(home, "--static-dir", str(app)).start()
    assert {r.access for r in ROUTES} == {"public", "read", "write"}
    for route in ROUTES:
        if route.path == "/v1/subscribe":
            continue  # a stream: checked below
        url = node.url + _concrete(route.path)
        body = b"{}" if route.method == "POST" else None
        anonymous, _, err = _call(url, route.method, None, body)
        read_only = _call(url, route.method, node.read_token, body)[0]
        if route.access == "public":
            assert anonymous == 200, route
        elif route.access == "read":
            assert anonymous == 401 and err["error"] == "unauthorized", route
            assert read_only != 401, route
        else:
            assert anonymous == 401 and read_only == 403, route
            assert _call(url, route.method, node.token, body)[0] != 401, route
    stream = node.url + "/v1/subscribe?q=edge(X,%20Y)"
    assert _call(stream, "GET", None)[0] == 401
    # EventSource cannot send headers: a read may carry ?access_token= instead.
    with urllib.request.urlopen(f"{stream}&access_token={node.read_token}", timeout=30) as resp:
        assert resp.status == 200 and resp.readline().startswith(b"event: result")
    assert _call(node.url + "/v1/facts", "POST", None, b'{"assert": "x(1)."}')[0] == 401
    # Peer sync routes are not token routes: they want a peer signature.
    status, _, err = _call(node.url + "/v1/inbox", "POST", node.token, b"")
    assert status == 401 and err["error"] != "unauthorized"


def test_url_parameters_that_are_not_utf8_are_refused(home: Path, node_factory) -> None:
    """``GET /v1/query?q=u(%22%ff%22)`` was read with the bad byte as U+FFFD, so it
    matched the stored string "\ufffd" and answered true; ``rel=%ff`` was refused quoting
    a character the client never sent. Bad input now, naming the parameter and the byte;
    a query of "\ufffd" written in UTF-8 still finds it."""
    Cli(home)("init")
    node = node_factory(home).start()
    assert node.request("POST", "/v1/facts", {"assert": [{"rel": "u", "args": ["\ufffd"]}]})[0] == 200
    for path, name in (
        ("/v1/query?q=u(%22%ff%22)", "q"),
        ("/v1/facts?rel=%ff", "rel"),
        ("/v1/facts?rel=u&after=%c3", "after"),
        ("/v1/subscribe?q=u(%22%80%22)", "q"),
    ):
        status, err = node.request("GET", path)
        assert (status, err["error"]) == (400, "bad input"), (path, err)
        assert f"URL parameter {name}=" in err["detail"] and "not UTF-8 (byte 0x" in err["detail"], err
    status, answer = node.request("GET", "/v1/query?q=u(%22%ef%bf%bd%22)")  # U+FFFD, in UTF-8
    assert status == 200 and answer["rows"] == [[]], answer


def test_a_url_parameter_a_route_does_not_take_is_refused(home: Path, node_factory) -> None:
    """``GET /v1/facts?limt=5`` answered a first page of 1,000 rows, the misspelt
    parameter ignored, where a JSON body's unknown field is refused. Every /v1 route now
    refuses a name that /openapi.json does not list for it (``access_token`` on the GETs
    that take a token), naming it and the ones it takes; the listed ones still work."""
    from merklog.node.openapi import query_parameters

    Cli(home)("init")
    node = node_factory(home).start()
    node.request("POST", "/v1/facts", {"assert": "a(1). a(2)."})
    takes = query_parameters()
    assert takes[("GET", "/v1/facts")] == {"rel", "after", "limit", "form", "access_token"}
    routes = [route for route in takes if route[1].startswith("/v1/")]
    assert len(routes) > 15
    for method, template in routes:
        path = _concrete(template).replace("{id}", "bafy")
        if method != "GET":  # POST /v1/subscribe reads its query from the body alone
            path = path.partition("?")[0]
        url = node.url + path + ("&" if "?" in path else "?") + "limt=5"
        body = b"{}" if method == "POST" else None
        status, _, err = _call(url, method, node.token, body)
        known = ", ".join(f"{name}=" for name in sorted(takes[(method, template)]))
        assert (status, err["error"]) == (400, "bad input"), (method, template, err)
        assert err["detail"] == (
            f"unknown URL parameter limt=: {method} {template} takes {known or 'no URL parameter'}"
        )
    assert node.request("GET", "/v1/facts?limt=5&limit=1")[0] == 400
    status, err = node.request("POST", "/v1/query?q=b(X)", {"q": "a(X)"})  # q= was ignored
    assert status == 400 and err["detail"].startswith("unknown URL parameter q=: POST"), err
    assert _call(node.url + "/v1/status?access_token=x", "GET", None)[0] == 401  # checked
    assert node.request("POST", "/v1/facts?access_token=" + node.token, {"assert": "b(1)."})[0] == 400
    # The ones each route takes still work, the token in the URL too.
    with urllib.request.urlopen(f"{node.url}/v1/facts?rel=a&limit=1&access_token={node.token}") as r:
        page = json.loads(r.read())
    assert len(page["facts"]) == 1 and page["next"]
    rest = node.request("GET", "/v1/facts?rel=a&form=json&after=" + page["next"])[1]["facts"]
    assert {page["facts"][0]["fact"], f"a({rest[0]['args'][0]})"} == {"a(1)", "a(2)"}
    assert node.request("GET", "/v1/query?q=a(X)")[0] == 200
    assert node.request("POST", "/v1/facts?answer=cids", {"assert": "c(1)."})[0] == 200
    assert node.request("GET", "/v1/query?q=b(X)")[0] == 404  # nothing refused was written
    assert Cli(home)("ls").output.count("a(") == 2  # the CLI's own URLs through the node


def test_the_url_parameters_a_handler_reads_are_the_documented_ones() -> None:
    """The node refuses what /openapi.json does not list: a parameter a handler reads
    that the document left out would be refused before the handler saw it."""
    import re

    from merklog.node import handlers
    from merklog.node.openapi import query_parameters

    source = Path(handlers.__file__).read_text()
    read = set(re.findall(r'query_param\(request, "([a-z_]+)"\)', source))
    documented = set().union(*query_parameters().values()) - {"access_token"}
    assert read == documented == {"rel", "after", "limit", "form", "q", "answer", "url"}


def test_anonymous_reads_when_configured(home: Path, node_factory) -> None:
    Cli(home)("--set", "api.anonymous_reads=true", "init")
    node = node_factory(home).start()
    assert node.request("GET", "/v1/facts", token=None)[0] == 200
    assert node.request("GET", "/v1/status", token=None)[0] == 200
    assert node.request("POST", "/v1/facts", {"assert": "y(1)."})[0] == 200  # x stays unknown
    assert node.request("GET", "/v1/query?q=y(X)", token=None)[0] == 200
    assert node.request("POST", "/v1/facts", {"assert": "x(1)."}, token=None)[0] == 401
    assert node.request("POST", "/v1/facts", {"assert": "x(1)."}, token=node.read_token)[0] == 403


def test_anonymous_reads_still_refuse_a_wrong_token(home: Path, node_factory) -> None:
    """With ``api.anonymous_reads``, a read with a wrong token answered 200 as if it had
    none: an app holding a stale or mistyped token saw its reads work and learnt of the
    token only from a write's 401 (the checklist page then said "read-only token")."""
    Cli(home)("--set", "api.anonymous_reads=true", "init")
    node = node_factory(home).start()
    for path in ("/v1/status", "/v1/facts", "/v1/query?q=y(X)", "/metrics"):
        status, err = node.request("GET", path, token="wrong")
        assert status == 401 and err["error"] == "unauthorized", (path, status, err)
        assert "api.anonymous_reads" in err["detail"]
    status, _, err = _call(node.url + "/v1/status?access_token=wrong", "GET", None)
    assert status == 401 and err["error"] == "unauthorized"
    # No token, an empty one, or another scheme (a proxy's Basic auth): anonymous.
    assert _call(node.url + "/v1/status?access_token=", "GET", None)[0] == 200
    assert node.request("GET", "/v1/status", token="")[0] == 200
    req = urllib.request.Request(node.url + "/v1/status")
    req.add_header("Authorization", "Basic dXNlcjpwYXNz")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    for token in (node.token, node.read_token):
        assert node.request("GET", "/v1/status", token=token)[0] == 200


def test_errors_are_json_with_the_right_status(home: Path, node_factory) -> None:
    Cli(home)("init")
    node = node_factory(home, env={"MERKLOG_NODE_MAX_BODY": "4096"}).start()
    status, ctype, err = _call(node.url + "/v1/nope", "GET", node.token)
    assert status == 404 and ctype.startswith("application/json") and err["error"] == "not found"
    status, ctype, err = _call(node.url + "/v1/status", "POST", node.token, b"{}")
    assert status == 405 and ctype.startswith("application/json") and "GET" in err["detail"]
    big = json.dumps({"assert": "x(%s)." % ("1" * 10)} | {"pad": "y" * 10000}).encode()
    status, ctype, err = _call(node.url + "/v1/facts", "POST", node.token, big)
    assert status == 413 and ctype.startswith("application/json") and "4096" in err["detail"]
    # gzip of that body is under the limit as sent and over it decompressed: said so,
    # not "of 99 bytes exceeds 4096 bytes" (QA)
    req = urllib.request.Request(
        node.url + "/v1/facts", data=gzip.compress(big), method="POST"
    )
    req.add_header("Content-Encoding", "gzip")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {node.token}")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("a body decompressing past node.max_body was taken")
    except urllib.error.HTTPError as exc:
        assert exc.code == 413
        detail = json.loads(exc.read())["detail"]
        assert "decompresses to more than 4096 bytes" in detail, detail
    status, _, err = _call(node.url + "/v1/facts", "POST", node.token, b"{not json")
    assert status == 400 and err["error"] == "bad input"
    status, _, err = _call(
        node.url + "/v1/sync", "POST", node.token, b'{"url": "http://127.0.0.1:9"}'
    )
    assert status == 502 and err["error"] == "peer unreachable"
    status, _, err = _call(node.url + "/v1/blocks/notacid", "GET", node.token)
    assert status == 400 and err["error"] == "bad CID"
    # A relation name no fact can have, and a query field that would be ignored, say so.
    status, _, err = _call(node.url + "/v1/facts?rel=a%20b", "GET", node.token)
    assert status == 400 and "relation name 'a b' must start with a letter" in err["detail"]
    body = json.dumps({"q": "edge(X, Y)", "limit": 5}).encode()
    status, _, err = _call(node.url + "/v1/query", "POST", node.token, body)
    assert status == 400 and err["detail"].startswith("unknown field 'limit'"), err
    assert node.request("GET", "/v1/facts")[1]["facts"] == []


def _raw_request(url: str, head: str, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``) on a new connection; the first answer's bytes (up
    to its JSON body), or b"" when none comes in 20 s."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head.encode() + body)
        received = b""
        try:
            while not received.startswith(b"HTTP/1.1 100") and not received.endswith(b"}"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
        except TimeoutError:
            pass
        return received


def _post_head(path: str, token: str, length: int, expect: str = "") -> str:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Bearer {token}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
    ]
    if expect:
        lines.append(f"Expect: {expect}")
    return "\r\n".join(lines) + "\r\n\r\n"


def test_a_body_declared_over_max_body_is_refused_from_its_headers(
    home: Path, node_factory
) -> None:
    """A client that waits for "100 Continue" got it, then uploaded a body only to hear
    413; a Content-Length over the limit with the body still to come got no answer at
    all. Now the headers decide: 413 (or 401/403 for the token) at once, as JSON."""
    Cli(home)("init")
    node = node_factory(home, env={"MERKLOG_NODE_MAX_BODY": "4096"}).start()
    big = 10**9
    answer = _raw_request(node.url, _post_head("/v1/facts", node.token, big, "100-continue"))
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b'"detail": "request body of 1000000000 bytes exceeds 4096 bytes' in answer
    answer = _raw_request(node.url, _post_head("/v1/facts", node.token, big), b'{"assert": ')
    assert answer.startswith(b"HTTP/1.1 413") and b"application/json" in answer, answer
    # The token is checked first: no "100 Continue" for a request that will be refused.
    answer = _raw_request(node.url, _post_head("/v1/facts", "wrong", 10, "100-continue"))
    assert answer.startswith(b"HTTP/1.1 401") and b"WWW-Authenticate: Bearer" in answer
    answer = _raw_request(node.url, _post_head("/v1/facts", node.read_token, 10, "100-continue"))
    assert answer.startswith(b"HTTP/1.1 403") and b'"error": "forbidden"' in answer, answer
    # A request the headers do not refuse is told to go on, a streamed import whatever its size.
    for path, length in (("/v1/facts", 2), ("/v1/import", big)):
        answer = _raw_request(node.url, _post_head(path, node.token, length, "100-continue"))
        assert answer.startswith(b"HTTP/1.1 100 Continue"), (path, answer)
    answer = _raw_request(node.url, _post_head("/v1/facts", node.token, 2, "teapot"))
    assert answer.startswith(b"HTTP/1.1 417") and b"application/json" in answer, answer
    assert node.request("POST", "/v1/facts", {"assert": "x(1)."})[0] == 200
    # QA: a header aiohttp takes once, given twice, said only "not valid HTTP/1.1"
    twice = _post_head("/v1/facts", node.token, 2).replace(
        "Content-Type: application/json\r\n",
        "Content-Type: application/json\r\nContent-Type: text/plain\r\n",
    )
    answer = _raw_request(node.url, twice, b"{}")
    assert answer.split(b" ", 2)[1] == b"400", answer  # HTTP/1.0: aiohttp's, not parsed
    assert b"gives the header Content-Type more than once" in answer, answer


def test_openapi_lists_every_route_of_the_router(tmp_path: Path) -> None:
    from openapi_spec_validator import validate

    import merklog
    from merklog.node.openapi import openapi_document
    from merklog.node.server import build_app, router_routes

    doc = openapi_document()
    validate(doc)
    with merklog.open(memory=True) as node:
        routes = router_routes(build_app(node))
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == routes
    for path, ops in doc["paths"].items():
        for op in ops.values():
            for code, answer in op["responses"].items():
                if code == "502":
                    assert "peer" in answer["description"].lower(), path
                if code.startswith(("4", "5")):
                    assert "application/json" in answer["content"], (path, code)
    for path in ("/v1/writers", "/v1/export", "/v1/import", "/v1/genesis", "/v1/inbox"):
        assert path in doc["paths"]
    assert any(p.startswith("/v1/datasets/") for p in doc["paths"])


def test_static_files_are_the_app_folders_and_never_the_homes(tmp_path: Path, node_factory) -> None:
    """``node.static_dir`` was served whole at an undocumented public ``/static/``; set
    to the home, anyone read config.toml (both tokens) and identity.pem. Now the route is
    documented and listed, serves the folder's plain files only, and a folder that would
    publish the home is refused before the node starts."""
    import subprocess
    import sys

    home = tmp_path / "home"
    Cli(home)("init")
    app = tmp_path / "app"
    (app / "js").mkdir(parents=True)
    (app / "index.html").write_text("<p>app</p>")
    (app / "js" / "app.js").write_text("// the app")
    (app / ".env").write_text("SECRET=1")
    (app / "key.pem").symlink_to(home / "identity.pem")
    (app / "home").symlink_to(home)
    node = node_factory(home, "--static-dir", str(app)).start()
    with urllib.request.urlopen(node.url + "/static/js/app.js", timeout=30) as resp:
        assert resp.status == 200 and resp.read() == b"// the app"
    for path in (
        "/static/.env",
        "/static/key.pem",
        "/static/home/config.toml",
        "/static/js",
        "/static/index.html%00",  # QA: 400 with Python's "embedded null byte"
    ):
        status, ctype, err = _call(node.url + path, "GET", None)
        assert status == 404 and ctype.startswith("application/json"), path
        assert err["error"] == "not found", path
    with socket.create_connection(node.url.removeprefix("http://").split(":"), timeout=10) as c:
        c.sendall(b"GET /static/%2e%2e/home/config.toml HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 404 " in c.recv(4096).split(b"\r\n")[0]
    status, doc = node.request("GET", "/openapi.json")
    assert doc["paths"]["/static/{path}"]["get"]["security"] == []
    node.stop()

    for folder in (home, tmp_path, home / "www"):
        folder.mkdir(exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "node", "run"]
            + ["--port", "0", "--static-dir", str(folder)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (folder, done.stderr)
        assert done.stderr.startswith("Error: node.static_dir ") and "would publish" in done.stderr
        assert "Traceback" not in done.stderr and not (home / "node.json").exists()
    # A folder that is not there (a typo) was taken: / answered the API's JSON.
    for args in (["--static-dir", str(tmp_path / "nosuch")], []):
        env = {**os.environ, "MERKLOG_NODE_STATIC_DIR": str(tmp_path / "nosuch")}
        done = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "node", "run"]
            + ["--port", "0", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env if not args else None,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr == (
            f"Error: node.static_dir {tmp_path / 'nosuch'} is not there: give the folder that"
            " holds the app's index.html\n"
        )
        assert not (home / "node.json").exists()


def test_init_refuses_what_node_run_would_refuse(tmp_path: Path) -> None:
    """``init --set node.static_dir=HOME`` and ``init --host 'bad host'`` exited 0 and
    saved the setting; every ``node run`` then refused it (exit 2, "would publish the
    home") or failed on it ("cannot serve on bad host:PORT: Name or service not known").
    ``init`` refuses both (exit 2, nothing created) without a DNS lookup; ``node run``
    gives a bad host the same line. A static folder that does not exist yet is taken."""
    home = tmp_path / "h"
    run = Cli(home)
    publish = "would publish the home ({home}): everything in it is served without a token"
    for folder in (home, tmp_path, home / "app"):
        result = run("--set", f"node.static_dir={folder}", "init", ok=False)
        assert result.exit_code == 2, result.output
        assert result.output.strip().startswith(f"Error: node.static_dir {folder} ")
        assert publish.format(home=home) in result.output
        assert not home.exists()
    bad_host = (
        "Error: command line: node.host 'bad host' is not a host name or IP address (letters,"
        " digits, '-', '_' and '.' between labels; e.g. 127.0.0.1, ::1 or node.example)"
    )
    for args in (("init", "--host", "bad host"), ("--set", "node.host=bad host", "init")):
        result = run(*args, ok=False)
        assert (result.exit_code, result.output.strip()) == (2, bad_host), args
        assert not home.exists()
    for host in ("256.1.1.1", "1.2.3.4.5"):  # no address, and no name ends in a number
        result = run("init", "--host", host, ok=False)
        assert result.exit_code == 2 and "is not a host name or IP address" in result.output
        assert not home.exists()
    for host in ("0.0.0.0", "::1", "localhost", "node.example", "no-such-host.invalid"):
        result = Cli(tmp_path / host.replace(":", "_"))("init", "--host", host)
        assert result.exit_code == 0  # syntax only: no name is looked up
    run("--set", f"node.static_dir={tmp_path / 'app'}", "init")  # made later: taken
    for args in (("--set", "node.host=bad host", "node", "run"), ("node", "run", "--host", "bad host")):
        result = run(*args, ok=False)
        assert (result.exit_code, result.output.strip()) == (2, bad_host), args
    result = run("node", "run", "--port", "0", ok=False)  # its folder is still missing
    assert result.exit_code == 2 and "node.static_dir" in result.output and "not there" in result.output


def test_a_relative_static_dir_from_set_or_the_environment_is_the_working_directorys(
    tmp_path: Path, node_factory, monkeypatch
) -> None:
    """``--set node.static_dir=app`` and ``MERKLOG_NODE_STATIC_DIR=app`` were resolved
    against the home, so a relative folder always named HOME/app and was refused as
    publishing the home (init, exit 2) or as not there (node run), while ``node run
    --static-dir app`` took ./app. Now a relative one from ``--set`` or the environment
    is the working directory's too: init saves it absolute, and node run serves it."""
    import tomllib

    work = tmp_path / "work"
    (work / "app").mkdir(parents=True)
    (work / "app" / "index.html").write_text("<p>app</p>")
    monkeypatch.chdir(work)
    by_set, by_env, served = (tmp_path / name for name in ("set", "env", "served"))
    Cli(by_set)("--set", "node.static_dir=app", "init")
    monkeypatch.setenv("MERKLOG_NODE_STATIC_DIR", "app")
    Cli(by_env)("init")
    for home in (by_set, by_env):
        node = tomllib.loads((home / "config.toml").read_text())["node"]
        assert node["static_dir"] == str(work / "app"), home
    monkeypatch.delenv("MERKLOG_NODE_STATIC_DIR")
    Cli(served)("init")
    node = node_factory(served, env={"MERKLOG_NODE_STATIC_DIR": "app"}).start()
    with urllib.request.urlopen(node.url + "/", timeout=30) as resp:
        assert resp.status == 200 and resp.read() == b"<p>app</p>"
    node.stop()
    # relative to the working directory, a folder in the home is still refused
    monkeypatch.chdir(tmp_path)
    result = Cli(served)("--set", "node.static_dir=served/www", "init", ok=False)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: node.static_dir {served / 'www'} would publish")


def test_writer_revocation_from_cli_and_http(tmp_path: Path, node_factory) -> None:
    a, b, na, nb = peered_pair(tmp_path, node_factory, writer=False)
    assert "granted" in a("writers", "grant", "b").output
    b("sync", "a")
    b("put", "edge(1, 2).")
    b("sync", "a")
    assert "revoked" in a("writers", "revoke", "b").output
    b("sync", "a")
    refused = b("put", "edge(3, 4).", ok=False)
    assert (
        refused.exit_code != 0 and "writer" in refused.output and "Traceback" not in refused.output
    )
    assert [line.split("\t")[1] for line in a("ls").output.splitlines()] == ["edge(1, 2)"]
    # Over HTTP: the owner grants again, a bad key is bad input, the read token is not enough.
    key_b = json.loads(b("status", "--json").output)["key"]
    assert na.request("DELETE", f"/v1/writers/{key_b}", token=na.read_token)[0] == 403
    assert na.request("DELETE", "/v1/writers/xyz")[0] == 400
    status, body = na.request("POST", "/v1/writers", {"key": key_b})
    assert status == 200 and body["delta"]
    status, body = na.request("DELETE", f"/v1/writers/{key_b}")
    assert status == 200 and body["delta"]
    bad = a("writers", "revoke", "nobody", ok=False)
    assert bad.exit_code == 3 and "neither a peer" in bad.output  # an unknown name, as sync's
    # Short hex is a name (`C`, `cafe`: it said exit 2, "malformed"); 16 digits or more
    # is a key cut short (the CLI shows 16 digits of a key).
    for name in ("C", "cafe", "deadbeef"):
        bad = a("writers", "grant", name, ok=False)
        assert bad.exit_code == 3 and "neither a peer" in bad.output, (name, bad.output)
    bad = a("writers", "revoke", key_b[:16], ok=False)
    assert bad.exit_code == 2 and "16 hex digits where a key has 64" in bad.output


def test_client_dying_mid_sync_is_not_a_server_error(tmp_path: Path, node_factory) -> None:
    from merklog.replication.auth import sign_headers
    from merklog.replication.identity import Identity

    a = Cli(tmp_path / "a")
    a("init")
    facts = tmp_path / "many.dl"
    pad = "p" * 200
    facts.write_text("".join(f'row({i}, "{pad}").\n' for i in range(40000)))
    a("put", "-f", str(facts))
    peer = Identity.generate()
    a("peers", "add", "gone", "http://127.0.0.1:9", "--key", peer.public_key.hex())
    na = node_factory(a.home).start()
    dataset = json.loads(a("status", "--json").output)["dataset"]
    path = f"/v1/datasets/{dataset}/sync"
    body = json.dumps({"heads": [dataset], "summary": None}).encode()
    import hashlib

    host, port = na.url.removeprefix("http://").split(":")
    for _ in range(3):
        headers = sign_headers(peer, "POST", path, hashlib.sha256(body).hexdigest())
        with socket.socket() as sock:
            # A small receive window: the server's writes back up while the client lags.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((host, int(port)))
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            sock.sendall(
                (
                    f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n{head}\r\n"
                ).encode()
                + body
            )
            first = sock.recv(4096)
            assert first.startswith(b"HTTP/1.1 200"), first[:200]
            # Die: reset the connection with most of the CAR unread.
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
    # Die mid-push: the server is still reading the body when the connection resets.
    push = f"/v1/datasets/{dataset}/push"
    car = b"x" * 2_000_000
    headers = sign_headers(peer, "POST", push, hashlib.sha256(car).hexdigest())
    with socket.create_connection((host, int(port))) as sock:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(
            (
                f"POST {push} HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/vnd.ipld.car\r\n"
                f"Content-Length: {len(car)}\r\n{head}\r\n"
            ).encode()
            + car[:100_000]
        )
        time.sleep(0.5)  # let the server start reading the body (not a timing assertion)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    assert na.request("GET", "/healthz")[0] == 200
    na.stop()
    assert na.proc is None
    log = na.stderr_text
    assert "Traceback" not in log and "ERROR" not in log and "Error handling" not in log, log


def test_the_bearer_scheme_name_is_case_insensitive(home: Path, node_factory) -> None:
    """``Authorization: bearer TOKEN`` got 401: the scheme name is case-insensitive
    (RFC 7235 §2.1). A wrong token still gets 401, whatever the case."""
    import tomllib

    Cli(home)("init")
    token = tomllib.loads((home / "config.toml").read_text())["api"]["token"]
    node = node_factory(home).start()
    try:
        for scheme, secret, status in (
            ("bearer", token, 200),
            ("BEARER", token, 200),
            ("Bearer", token, 200),
            ("bearer", "wrong", 401),
            ("Basic", token, 401),
        ):
            req = urllib.request.Request(node.url + "/v1/status")
            req.add_header("Authorization", f"{scheme} {secret}")
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    got = resp.status
            except urllib.error.HTTPError as exc:
                got = exc.code
            assert got == status, (scheme, secret, got)
    finally:
        node.stop()


def test_a_token_of_bytes_that_are_not_utf8_is_a_wrong_token(home: Path, node_factory) -> None:
    """``Authorization: Bearer \\xff\\xfe`` answered 400 "'utf-8' codec can't encode
    characters …": it is a wrong token, 401 as any other, with no codec text."""
    Cli(home)("init")
    node = node_factory(home).start()
    for path in ("/v1/status", "/v1/facts"):
        head = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
        status, headers, raw = _raw_answer(
            node.url, head + b"Authorization: Bearer \xff\xfe\r\n\r\n"
        )
        assert status == 401, raw
        body = json.loads(raw)
        assert body["error"] == "unauthorized" and "codec" not in body["detail"], body
        assert headers["www-authenticate"] == 'Bearer realm="merklog"', headers


def test_openapi_lists_the_query_token_on_every_get_that_takes_a_token() -> None:
    """The middleware reads ``?access_token=`` on any GET; the document listed it for
    ``/v1/subscribe`` only."""
    from merklog.node.openapi import openapi_document

    doc = openapi_document()
    gets = [ops["get"] for ops in doc["paths"].values() if ops.get("get", {}).get("security")]
    tokens = [op for op in gets if {"readToken": []} in op["security"]]
    assert tokens and all({"queryToken": []} in op["security"] for op in tokens)
    # Peer GET routes want a signature: ?access_token= is refused there (401).
    peer = [op for op in gets if {"peerSignature": []} in op["security"]]
    assert len(peer) == 2 and all(op["security"] == [{"peerSignature": []}] for op in peer)
    posts = [ops["post"] for ops in doc["paths"].values() if "post" in ops]
    assert all({"queryToken": []} not in op.get("security", []) for op in posts)
    assert doc["components"]["securitySchemes"]["queryToken"]["name"] == "access_token"


@pytest.mark.parametrize(
    "args", [("status",), ("token",), ("put", "edge(1, 2)."), ("peers", "list")]
)
def test_every_command_tightens_the_homes_secrets(home: Path, args: tuple[str, ...]) -> None:
    """Opening a home tightened its directory and store but left a world-readable
    config.toml (API tokens) and identity.pem (private key) as they were; then ``token``
    and ``peers list``, which read the config alone, left the home and the store (every
    fact) readable by all (QA)."""
    run = Cli(home)
    run("init")
    files = (home / "config.toml", home / "identity.pem", home / "store.sqlite")
    for path in files:
        path.chmod(0o644)
    home.chmod(0o755)
    run(*args)
    assert [_mode(path) for path in files] == [0o600, 0o600, 0o600]
    assert _mode(home) == 0o700


def test_a_parquet_export_is_owner_only_whatever_the_umask(
    home: Path, tmp_path: Path, loose_umask
) -> None:
    """QA: ``parquet export`` followed the umask (755 folders and 644 files at 022, 777
    and 666 at 000) while the CAR export of the same facts is 0600."""
    run = Cli(home)
    run("init")
    run("put", "edge(1, 2).", "name(1, \"a\").")
    for umask in (0o022, 0o000):
        os.umask(umask)
        out = tmp_path / f"pq-{umask:o}"
        run("parquet", "export", str(out))
        made = [out, *out.rglob("*")]
        assert any(p.suffix == ".parquet" for p in made)
        assert {_mode(p) for p in made if p.is_dir()} == {0o700}
        assert {_mode(p) for p in made if p.is_file()} == {0o600}


BAD_PEER_URLS = (
    "http://127.0.0.1:99999",
    "http://[::1",
    "http://127.0.0.1:abc",
    "http://user:s3cret@127.0.0.1:9",
    "http:///v1",
)


def test_a_malformed_or_credentialed_peer_url_is_bad_input_and_not_recorded(
    home: Path, node_factory
) -> None:
    """``POST /v1/sync`` of ``http://127.0.0.1:99999`` or ``http://[::1`` answered 502
    ``peer unreachable`` (CLI exit 4: "worth retrying"), and each such URL became a
    permanent peer row in ``/v1/status`` and ``peersync.json``; a URL with
    ``user:password@`` synced and was shown to every read-token holder."""
    run = Cli(home)
    run("init")
    node = node_factory(home).start()
    for url in BAD_PEER_URLS:
        status, body = node.request("POST", "/v1/sync", {"url": url})
        assert status == 400 and body["error"] == "bad input", (url, body)
        assert "s3cret" not in body["detail"]
        result = run("sync", url, ok=False)
        assert result.exit_code == 2 and "s3cret" not in result.output, (url, result.output)
    assert node.request("GET", "/v1/status")[1]["peers"] == []
    assert "merklog_sync_failures_total{" not in node.request("GET", "/metrics")[1].decode()
    node.stop()
    for url in BAD_PEER_URLS:
        assert run("sync", url, ok=False).exit_code == 2, url
    result = run(
        "peers", "add", "p", "http://user:s3cret@127.0.0.1:9", "--key", "00" * 32, ok=False
    )
    assert result.exit_code == 2 and "s3cret" not in result.output
    assert (
        not (home / "peersync.json").exists() and "s3cret" not in (home / "config.toml").read_text()
    )


def _status(url: str, method: str, token: str | None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read() if method == "HEAD" else b""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() if method == "HEAD" else b""


def test_every_get_route_answers_head_and_a_405_counts_under_its_route(
    home: Path, tmp_path: Path, node_factory
) -> None:
    """HEAD answered 405 on every GET route, ``/healthz`` included (uptime checkers
    send HEAD), and every 405 was counted under ``route="unmatched"``."""
    Cli(home)("init")
    app = tmp_path / "app"
    app.mkdir()
    (app / "index.html").write_text("<p>app</p>")
    (app / "app.js").write_text("// the app")
    node = node_factory(home, "--static-dir", str(app)).start()
    gets = [route for route in ROUTES if route.method == "GET"]
    assert {route.path for route in gets} >= {"/healthz", "/", "/v1/status", "/v1/subscribe"}
    for route in gets:
        url = node.url + _concrete(route.path)
        for token in (node.token, None):
            expected = _status(url, "GET", token)[0] if route.path != "/v1/subscribe" else None
            status, body = _status(url, "HEAD", token)
            assert body == b"", route
            if expected is not None:
                assert status == expected, (route, token, status, expected)
            else:  # a stream: HEAD gets its status and headers, and ends
                assert status == (200 if token else 401), route
    assert _status(node.url + "/healthz", "HEAD", None)[0] == 200
    assert _call(node.url + "/healthz", "PUT", None, b"")[0] == 405
    assert _call(node.url + "/v1/status", "DELETE", node.token)[0] == 405
    metrics = node.request("GET", "/metrics")[1].decode()
    assert 'method="PUT",route="/healthz",status="405"' in metrics
    assert 'method="DELETE",route="/v1/status",status="405"' in metrics
    assert 'route="unmatched",status="405"' not in metrics


def test_a_cli_token_the_running_node_refuses_says_so(tmp_path, node_factory, monkeypatch) -> None:
    """A command whose token is not the one its home's running node runs with (set in the
    environment, or config.toml edited under the node) said ``unauthorized: send
    Authorization: Bearer …``, HTTP advice; it says the node refused this command's token
    and where that token comes from."""
    from .conftest import Cli

    home = Cli(tmp_path / "h")
    home("init")
    node_factory(home.home).start()
    monkeypatch.setenv("MERKLOG_API_TOKEN", "not-the-token")
    result = home("status", ok=False)
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    assert "refused this command's token" in line and "MERKLOG_API_TOKEN" in line, line


def test_a_token_given_twice_is_bad_input(home: Path, node_factory) -> None:
    """``?access_token=GOOD&access_token=wrong`` was let through (the first was taken) and
    ``?access_token=wrong&access_token=GOOD`` refused 401; a wrong ``?access_token=``
    beside a good ``Authorization`` header was ignored. A token given twice is now bad
    input, 400, as any other URL parameter given twice."""
    Cli(home)("init")
    good = Cli(home)("token").output.strip()
    node = node_factory(home).start()
    try:
        for query, header in (
            (f"access_token={good}&access_token=wrong", None),
            (f"access_token=wrong&access_token={good}", None),
            ("access_token=wrong", good),
            (f"access_token={good}", good),
        ):
            req = urllib.request.Request(f"{node.url}/v1/facts?{query}")
            if header is not None:
                req.add_header("Authorization", f"Bearer {header}")
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    status, body = resp.status, json.load(resp)
            except urllib.error.HTTPError as exc:
                status, body = exc.code, json.load(exc)
            assert status == 400, (query, header, status, body)
            assert body["error"] == "bad input" and "give it once" in body["detail"], body
        with urllib.request.urlopen(f"{node.url}/v1/facts?access_token={good}") as resp:
            assert resp.status == 200  # given once, as the checklist's EventSource gives it
        # Two Authorization headers: the first was taken (read then write token: 403,
        # write then read: 200). Bad input now, in either order.
        import http.client
        from urllib.parse import urlsplit

        write = Cli(home)("token", "--write").output.strip()
        parts = urlsplit(node.url)
        for first, second in ((good, write), (write, good)):
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
            conn.putrequest("POST", "/v1/facts")
            conn.putheader("Authorization", f"Bearer {first}")
            conn.putheader("Authorization", f"Bearer {second}")
            conn.putheader("Content-Type", "application/json")
            data = json.dumps({"assert": "twice(1)."}).encode()
            conn.putheader("Content-Length", str(len(data)))
            conn.endheaders(data)
            resp = conn.getresponse()
            body = json.loads(resp.read())
            conn.close()
            assert resp.status == 400, (resp.status, body)
            assert "Authorization header is given 2 times" in body["detail"], body
    finally:
        node.stop()


def test_out_of_descriptors_at_accept_is_one_warning_a_minute(caplog) -> None:
    """Out of file descriptors (``ulimit -n``), asyncio's listener logs
    ``socket.accept() out of system resource`` with a traceback at every attempt: QA saw
    31,844 in 30 s (13 MB of log). A serving node's loop says it once a minute, without
    a traceback; every other loop error still reaches asyncio's handler. (EMFILE at
    accept is given as asyncio gives it: a real one starves the test process too.)"""
    import asyncio
    import errno
    import logging

    from merklog.node.server import AcceptFailures

    passed: list = []
    loop = asyncio.new_event_loop()
    try:
        handler = AcceptFailures(lambda _loop, context: passed.append(context["message"]))
        emfile = OSError(errno.EMFILE, "Too many open files")
        context = {"message": "socket.accept() out of system resource", "exception": emfile}
        with caplog.at_level(logging.WARNING, logger="merklog"):
            for _ in range(1000):
                handler(loop, dict(context))
            handler(loop, {"message": "Task exception was never retrieved"})
    finally:
        loop.close()
    said = [r for r in caplog.records if "cannot accept connections" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None
    assert "Too many open files" in said[0].getMessage() and "ulimit -n" in said[0].getMessage()
    assert passed == ["Task exception was never retrieved"]
