"""``merklog sync`` and the per-peer sync status, with real nodes and real ``merklog``
processes: the command's ``--set sync.timeout`` through a running node, the INFO record
of a sync with ``-v``, Ctrl-C during a sync, and forgetting an ad hoc URL's history."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from merklog.node.failures import ExitCode

from .conftest import Cli, QuietHandler, SilentServer


def merklog(
    home: Path, *args: str, timeout: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess:
    """A real ``merklog --home HOME ARGS…`` process (no MERKLOG_SYNC_TIMEOUT inherited)."""
    environ = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    if not env or "MERKLOG_SYNC_TIMEOUT" not in env:
        environ.pop("MERKLOG_SYNC_TIMEOUT", None)
    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
        stdin=subprocess.DEVNULL,
    )


class SilentPeer(SilentServer):
    """A "peer" on 127.0.0.1 that accepts connections and reads requests but never
    answers; ``asked`` is set once a request's first bytes arrived."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        super().__init__()

    def _read(self, conn: socket.socket) -> None:
        try:
            while conn.recv(1 << 16):
                self.asked.set()
        except OSError:
            pass


@pytest.fixture
def silent_peer() -> Iterator[SilentPeer]:
    peer = SilentPeer()
    yield peer
    peer.close()


def test_set_sync_timeout_reaches_a_running_node(
    tmp_path: Path, node_factory, silent_peer: SilentPeer
) -> None:
    """``merklog --set sync.timeout=1 sync URL`` through a running node whose own
    sync.timeout is 100 s gave up only after 100 s: the node never saw the override. It
    now sends it (``"timeout"`` in ``POST /v1/sync``) and the sync times out after 1 s:
    the command ends well within its 60 s subprocess limit, exit 4, "did not answer
    within 1.0 s". A bad ``"timeout"`` is 400 bad input naming the field."""
    home = Cli(tmp_path / "a")
    home("init")
    node = node_factory(home.home, env={"MERKLOG_SYNC_TIMEOUT": "100"}).start()
    done = merklog(home.home, "--set", "sync.timeout=1", "sync", silent_peer.url, timeout=60)
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    assert done.returncode == ExitCode.PEER_UNREACHABLE, out
    (line,) = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert line.startswith("Error:") and "did not answer within 1.0 s" in line, line
    for bad in (-1, 0, "5", True, 1e9, None):
        body: dict = {"url": silent_peer.url, "timeout": bad}
        if bad is None:
            body["timeout"] = [1]
        status, answer = node.request("POST", "/v1/sync", body)
        assert status == 400 and answer["error"] == "bad input", (bad, answer)
        assert '"timeout"' in answer["detail"], answer


def test_the_client_waits_for_the_nodes_own_sync_timeout(
    tmp_path: Path, node_factory, silent_peer: SilentPeer
) -> None:
    """Without a timeout of its own, the CLI's client gave up on the running node after
    its fixed wait (60 s) although the node waits its sync.timeout per peer request:
    it now waits that (as the home's config gives it) plus a margin, and hears the
    node's own answer. Scaled down: a client wait of 1 s, a node timeout of 3 s."""
    from merklog.node.client import NodeAPIError, NodeClient

    home = Cli(tmp_path / "a")
    home("init")
    node = node_factory(home.home, env={"MERKLOG_SYNC_TIMEOUT": "3"}).start()
    client = NodeClient(node.url, node.token, timeout=1)
    with pytest.raises(NodeAPIError) as failed:
        client.sync(silent_peer.url, node_timeout=3)
    assert failed.value.status in (502, 504) and "within 3.0 s" in str(failed.value)


def test_a_sync_that_works_is_one_info_record_with_fields(tmp_path: Path, node_factory) -> None:
    """``merklog -v --log-format json sync`` logged nothing about a sync that worked. It
    is one INFO record whose JSON line carries the peer, the deltas pulled (and new) and
    pushed, the bytes each way and the seconds as fields; without ``-v`` stderr stays
    empty."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)
    key_b = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", key_b)  # A lets B sync
    a("put", "edge(1, 2).", "edge(2, 3).")
    shown = merklog(b.home, "-v", "--log-format", "json", "sync", na.url)
    assert shown.returncode == 0, shown.stderr
    records = [json.loads(line) for line in shown.stderr.splitlines() if line.strip()]
    synced = [r for r in records if r["msg"].startswith("synced with")]
    assert len(synced) == 1, records
    (rec,) = synced
    assert rec["level"] == "INFO" and rec["peer"] == na.url, rec
    assert rec["accepted"] >= 1 and rec["deltas_received"] >= rec["accepted"], rec
    assert rec["deltas_pushed"] == 0 and rec["bytes_in"] > 0 and rec["bytes_out"] > 0, rec
    assert isinstance(rec["seconds"], float) and rec["seconds"] >= 0, rec
    quiet = merklog(b.home, "sync", na.url)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def _interrupt_sync(home: Path, peer: SilentPeer) -> subprocess.CompletedProcess:
    """``merklog sync PEER`` as a real process, sent SIGINT once the peer got its request
    (the sync is under way, waiting for the answer); its exit status and output."""
    environ = {**os.environ, "PYTHONWARNINGS": "ignore"}
    environ.pop("MERKLOG_SYNC_TIMEOUT", None)
    cmd = [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "sync", peer.url]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=environ,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert peer.asked.wait(60), "the sync never reached the peer"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


#: The line of a sync that Ctrl-C interrupted: what stays, and how to finish it.
SYNC_INTERRUPTED = (
    "Error: interrupted (Ctrl-C): the deltas already applied stay (a running node stops"
    " this sync too); the same sync run again finishes it and applies nothing twice"
)


def _entry(peers: list[dict], url: str) -> dict:
    (entry,) = [p for p in peers if p["url"] == url]
    return entry


def _when_recorded(node, url: str, seconds: float) -> dict:
    """The running node's ``GET /v1/status`` entry for ``url`` once it shows a
    ``last_error`` (or as it is after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        _, status = node.request("GET", "/v1/status")
        entry = _entry(status["peers"], url)
        if entry["last_error"] or time.monotonic() > deadline:
            return entry
        time.sleep(0.1)


def test_ctrl_c_of_a_sync_on_a_stopped_home_says_what_stays(
    tmp_path: Path, silent_peer: SilentPeer
) -> None:
    """Ctrl-C during ``merklog sync`` on a stopped home said only "interrupted (Ctrl-C)"
    though a pull keeps what it applied; and the history kept the attempt with neither
    a success nor an error. Now: exit 1, one line saying what stays and to run it again,
    no traceback; ``status`` shows the attempt as interrupted, not as a failure."""
    home = Cli(tmp_path / "a")
    home("init")
    done = _interrupt_sync(home.home, silent_peer)
    assert "Traceback" not in done.stdout + done.stderr
    assert (done.returncode, done.stderr.strip()) == (1, SYNC_INTERRUPTED), done.stderr
    status = merklog(home.home, "status", "--json")
    assert status.returncode == 0, status.stderr
    entry = _entry(json.loads(status.stdout)["peers"], silent_peer.url)
    assert entry["last_attempt"] is not None and entry["last_success"] is None, entry
    assert entry["last_error"].startswith("interrupted") and entry["failures"] == 0, entry


def test_ctrl_c_of_a_sync_through_a_running_node_is_recorded_by_the_node(
    tmp_path: Path, node_factory, silent_peer: SilentPeer
) -> None:
    """The node stopped a sync whose ``merklog sync`` went away only when a progress line
    failed to reach it (never, with a peer that does not answer: it waited for its
    sync.timeout), and recorded a cancelled sync with neither success nor error. Now
    the command says what stays (exit 1, one line), and the node stops the sync and
    shows it in ``GET /v1/status`` as interrupted, long before its 100 s sync.timeout,
    without counting it in ``merklog_sync_failures_total``."""
    home = Cli(tmp_path / "a")
    home("init")
    node = node_factory(home.home, env={"MERKLOG_SYNC_TIMEOUT": "100"}).start()
    done = _interrupt_sync(home.home, silent_peer)
    assert "Traceback" not in done.stdout + done.stderr
    assert (done.returncode, done.stderr.strip()) == (1, SYNC_INTERRUPTED), done.stderr
    entry = _when_recorded(node, silent_peer.url, 60)
    assert entry["last_error"].startswith("interrupted") and entry["failures"] == 0, entry
    assert entry["last_success"] is None, entry
    _, metrics = node.request("GET", "/metrics")
    assert f'merklog_sync_failures_total{{peer="{silent_peer.url}"}}' not in metrics.decode()


def test_a_plain_json_sync_whose_caller_went_away_is_stopped(
    tmp_path: Path, node_factory, silent_peer: SilentPeer
) -> None:
    """``POST /v1/sync`` without the NDJSON ``Accept`` (a script's plain JSON request)
    went on after its caller closed the connection, until the node's sync.timeout: aiohttp
    does not cancel the handler, and nothing is written that could fail. Now the node
    notices within a second, stops the sync and shows it as interrupted, not a failure."""
    import http.client
    from urllib.parse import urlsplit

    home = Cli(tmp_path / "a")
    home("init")
    node = node_factory(home.home, env={"MERKLOG_SYNC_TIMEOUT": "100"}).start()
    where = urlsplit(node.url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    body = json.dumps({"url": silent_peer.url})
    headers = {"Authorization": f"Bearer {node.token}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/sync", body=body, headers=headers)
    assert silent_peer.asked.wait(60), "the sync never reached the peer"
    conn.close()
    entry = _when_recorded(node, silent_peer.url, 30)
    assert (entry["last_error"] or "").startswith("interrupted"), entry
    assert entry["failures"] == 0 and entry["last_success"] is None, entry


def _peer_urls(home: Path) -> list[str]:
    shown = merklog(home, "status", "--json")
    assert shown.returncode == 0, shown.stderr
    return [p["url"] for p in json.loads(shown.stdout)["peers"]]


def test_peers_remove_forgets_an_ad_hoc_url_and_a_removed_peers_history(
    tmp_path: Path, node_factory
) -> None:
    """A URL synced ad hoc stayed in ``status`` forever: ``peers remove`` took only
    names. ``peers remove URL`` now forgets its history, on a stopped home and through
    a running node (which keeps the history in memory and would write it back);
    ``peers remove NAME`` also forgets the history of NAME's URL, but not while another
    peer has that URL; a URL that is a peer is removed by name (exit 2), and an unknown
    URL is exit 3."""
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    a("init")
    na = node_factory(a.home).start()
    b("init", "--join", na.url, "--token", na.read_token)  # lists A as peer `origin`
    key_b = json.loads(b("status", "--json").output)["key"]
    a("peers", "add", "b", "http://127.0.0.1:9", "--key", key_b)  # A lets B sync
    a_url = na.url.rstrip("/")
    down = "http://127.0.0.1:9"  # discard port: refused at once
    b("sync", na.url)  # an ad hoc sync of a URL that is also peer `origin`
    assert merklog(b.home, "sync", down).returncode == ExitCode.PEER_UNREACHABLE
    assert set(_peer_urls(b.home)) == {a_url, down}
    # stopped home
    refused = merklog(b.home, "peers", "remove", na.url)
    assert refused.returncode == ExitCode.BAD_INPUT and "peers remove origin" in refused.stderr
    removed = merklog(b.home, "peers", "remove", down + "/")
    assert removed.returncode == 0 and f"forgot the sync history of {down}" in removed.stdout
    assert _peer_urls(b.home) == [a_url]
    again = merklog(b.home, "peers", "remove", down)
    assert again.returncode == ExitCode.NOT_FOUND and "no peer and no sync history" in again.stderr
    b("peers", "add", "again", na.url, "--token", na.read_token)  # two names, one URL
    assert merklog(b.home, "peers", "remove", "again").returncode == 0
    assert _peer_urls(b.home) == [a_url]  # `origin` still has it: its history stays
    assert merklog(b.home, "peers", "remove", "origin").returncode == 0
    assert _peer_urls(b.home) == []
    # running node
    nb = node_factory(b.home).start()
    status, body = nb.request("POST", "/v1/sync", {"url": na.url})
    assert status == 200, body
    status, body = nb.request("POST", "/v1/sync", {"url": down})
    assert status == 502, body
    assert set(_peer_urls(b.home)) == {a_url, down}
    removed = merklog(b.home, "peers", "remove", down)
    assert removed.returncode == 0, removed.stderr
    assert _peer_urls(b.home) == [a_url]
    status, body = nb.request("DELETE", "/v1/sync/history")
    assert status == 400 and body["error"] == "bad input" and '"url"' in body["detail"], body
    # QA: the CLI refused a peer's URL, HTTP forgot it (its history came back at the
    # next sync); both refuse it now
    b("peers", "add", "origin", na.url, "--token", na.read_token)
    status, body = nb.request("DELETE", f"/v1/sync/history?url={na.url}")
    assert status == 400 and "is peer origin: remove it by name" in body["detail"], body
    assert set(_peer_urls(b.home)) == {a_url}
    assert merklog(b.home, "peers", "remove", "origin").returncode == 0  # by name: forgotten
    assert _peer_urls(b.home) == []
    nb.request("POST", "/v1/sync", {"url": na.url})  # the node saves its history again
    nb.stop()
    assert _peer_urls(b.home) == [a_url]  # and the forgotten URL stays forgotten


def test_a_peer_that_pulled_everything_is_not_shown_behind(tmp_path: Path, node_factory) -> None:
    """``deltas_behind`` counted from the peer's heads as seen in syncs this node
    started: after the peer pulled everything from us it still showed the deltas it
    had just taken. An incoming pull that took everything (or a push) now records the
    peer's heads too."""
    from .conftest import peered_pair

    a, b, na, nb = peered_pair(tmp_path, node_factory)

    def behind() -> int | None:
        _, status = na.request("GET", "/v1/status")
        (entry,) = [p for p in status["peers"] if p["name"] == "b"]
        return entry["deltas_behind"]

    status, body = na.request("POST", "/v1/sync", {"url": nb.url})  # A sees B's heads
    assert status == 200, body
    a("put", "edge(1, 2).")
    a("put", "edge(2, 3).")
    assert behind() == 2
    b("sync", "a")  # B (a running node) pulls both from A
    assert "edge(2, 3)" in b("ls", "edge").output
    deadline = time.monotonic() + 30  # the heads are recorded by a worker thread
    while behind() != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert behind() == 0


def test_a_node_that_stops_mid_sync_is_named_with_what_to_do() -> None:
    """QA: ``kill -9`` of the local node during ``merklog sync`` said only "the node ended
    the sync stream without a result". The stream's end without a result names the node
    and says what stays and what to do. (A real HTTP server on 127.0.0.1 plays the node:
    one progress line, then the connection ends, as a killed node's does.)"""
    import http.server

    from merklog.node.client import NodeAPIError, NodeClient

    class Dying(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()
            line = {"progress": {"direction": "pull", "bytes": 10, "deltas": 1}}
            self.wfile.write(json.dumps(line).encode() + b"\n")
            self.close_connection = True

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dying)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen: list[tuple] = []
    try:
        with pytest.raises(NodeAPIError) as err:
            NodeClient(url, "token").sync("http://127.0.0.1:9", lambda *p: seen.append(p))
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("pull", 10, 1)]
    text = str(err.value)
    assert f"the node at {url} stopped before its sync ended" in text
    assert "merklog status" in text and "run the sync again" in text


def test_a_sync_cut_short_by_the_nodes_stop_says_so_and_can_be_retried(
    tmp_path: Path, node_factory, silent_peer: SilentPeer
) -> None:
    """QA: stopping the node while ``merklog sync`` ran through it answered "this node is
    closed: open it again (merklog.open)" with exit 2 (bad input: scripts do not retry,
    and merklog.open means nothing on the command line). Now it says the node stopped
    before the sync ended, that what it applied is kept and to run the sync again, with
    exit 4 (try again later)."""
    home = Cli(tmp_path / "a")
    home("init")
    node = node_factory(home.home, env={"MERKLOG_SYNC_TIMEOUT": "100"}).start()
    environ = {**os.environ, "PYTHONWARNINGS": "ignore"}
    environ.pop("MERKLOG_SYNC_TIMEOUT", None)
    sync = subprocess.Popen(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home.home)]
        + ["sync", silent_peer.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=environ,
    )
    try:
        assert silent_peer.asked.wait(60), "the sync never reached the peer"
        node.stop(signal.SIGTERM)
        out, err = sync.communicate(timeout=60)
    finally:
        sync.kill()
    assert "Traceback" not in out + err
    assert sync.returncode == ExitCode.PEER_UNREACHABLE, (sync.returncode, err)
    assert "stopped before" in err and "run the sync again" in err, err
    assert "merklog.open" not in err, err


def test_sync_urls_are_classified_before_anything_is_tried(tmp_path: Path, node_factory) -> None:
    """QA: ``http://256.1.1.1:80`` was tried, answered 502 "peer unreachable" and recorded
    in status and metrics; ``HTTP://127.0.0.1:…`` was "unknown peer" (404), although a
    URL's scheme is case-insensitive. The first is bad input with nothing recorded, the
    second the same peer as its lower-case spelling."""
    home = Cli(tmp_path / "a")
    home("init")
    node = node_factory(home.home).start()
    status, body = node.request("POST", "/v1/sync", {"url": "http://256.1.1.1:80"})
    assert (status, body["error"]) == (400, "bad input"), body
    assert "256.1.1.1 is not a valid IPv4 address" in body["detail"], body
    status, body = node.request("POST", "/v1/sync", {"url": "HTTP://127.0.0.1:9", "timeout": 5})
    assert status == 502, body  # tried (nothing listens there), not an unknown peer
    _, st = node.request("GET", "/v1/status")
    assert [p["url"] for p in st["peers"]] == ["http://127.0.0.1:9"], st["peers"]


def test_a_sync_whose_process_is_killed_shows_in_status(
    tmp_path: Path, silent_peer: SilentPeer
) -> None:
    """QA: ``kill -9`` of ``merklog sync`` (or of the node running it) left no trace:
    ``status`` showed the peer's last attempt as never made and no error. The start is
    saved when the sync starts, so status shows when it started and that its process
    ended without recording an outcome."""
    home = tmp_path / "h"
    Cli(home)("init")
    proc = subprocess.Popen(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "sync", silent_peer.url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert silent_peer.asked.wait(60)  # the sync is under way
    finally:
        proc.kill()
        proc.wait()
    status = json.loads(merklog(home, "status", "--json").stdout)
    [row] = [p for p in status["peers"] if p["url"] == silent_peer.url]
    assert row["last_attempt"] is not None and row["last_success"] is None
    assert row["last_error"].startswith("its process ended during the sync"), row
    # the next sync that works records its outcome as usual (here: the peer is silent)
    done = merklog(home, "--set", "sync.timeout=1", "sync", silent_peer.url)
    assert done.returncode == ExitCode.PEER_UNREACHABLE, done.stderr
    status = json.loads(merklog(home, "status", "--json").stdout)
    [row] = [p for p in status["peers"] if p["url"] == silent_peer.url]
    assert not row["last_error"].startswith("its process ended"), row
