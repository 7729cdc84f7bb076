"""Error lines and exit statuses that must not depend on which path a command takes
(a stopped home or a running node), and that stay one line whatever a peer, a codec or
SQLite says (docs/operations.md, "Exit status"). Real homes, real ``merklog``
subprocesses, real nodes and HTTP servers on 127.0.0.1."""

from __future__ import annotations

import re
from pathlib import Path

from merklog.node.failures import ExitCode

from .conftest import Cli, answering
from .test_cli_errors import assert_fails, merklog


def fails_on_one_line(result, code: int, *words: str) -> str:
    """:func:`assert_fails`, and nothing else on stderr: the error is one line."""
    line = assert_fails(result, code, *words)
    assert result.stderr.strip().splitlines() == [line], result.stderr
    return line


def _forged_car(home: Path, out: Path) -> None:
    """A CAR of one delta on top of ``home``'s heads, signed by a key that is no writer."""
    import merklog as api
    import merklog.store.car as car
    from merklog.replication.blocks import build_delta
    from merklog.replication.identity import Identity
    from merklog.store import encode_fact, make_fact

    with api.open(home) as node:
        replica = node.replica
        heads = replica.heads()
        clock = 1 + max(replica._clock_of(h) or 0 for h in heads)
        cid, data = encode_fact(make_fact("forged", [1]))
        delta = build_delta(
            Identity.generate(), replica.dataset, 1, clock, heads, [{"op": "assert", "fact": cid}]
        )
    with open(out, "wb") as f:
        car.write_car(f, [delta.cid], [(cid, data), (delta.cid, delta.data)])


def test_importing_a_delta_by_a_non_writer_is_bad_input_stopped_or_running(
    tmp_path: Path, node_factory
) -> None:
    """A CAR holding a delta whose author is not a writer was exit 7 ("this node's key is
    not a writer": ask for a grant) on a stopped home, and exit 2 with another line
    through a running node. The fault is in the file: exit 2, one line naming it, the
    same on both paths, and nothing is written."""
    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", "a(1).")
    forged = tmp_path / "forged.car"
    _forged_car(home, forged)
    stopped = assert_fails(
        merklog(home, "import", str(forged)), ExitCode.BAD_INPUT, str(forged), "is not a writer"
    )
    node = node_factory(home).start()
    running = assert_fails(merklog(home, "import", str(forged)), ExitCode.BAD_INPUT)
    assert running == stopped
    status, body = node.request("POST", "/v1/query", {"q": "forged(X)"})
    assert status in (200, 404) and "forged" not in str(body.get("rows", "")), body


class _Junk:
    """An HTTP server on 127.0.0.1 (port 0) that answers every request as ``mode`` says:
    ``text`` 200 "hello", ``html`` a 501 HTML page, ``car`` 200 with a truncated CAR
    header, ``huge`` 200 with 300 MiB (streamed), ``json`` 200 with ``self.body``
    (settable) as ``application/json``."""

    def __init__(self, mode: str) -> None:
        import http.server
        import threading

        junk = self
        self.body = b"{}"

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body, size = 200, b"hello", None
                if mode == "json":
                    body = junk.body
                elif mode == "html":
                    status = 501
                    body = b"<!DOCTYPE HTML>\n<html>\n<head><title>Error</title></head>\n"
                    body += b"<body>\n<h1>Unsupported method</h1>\n" + b"<p>x</p>\n" * 20
                    body += b"</body>\n</html>\n"
                elif mode == "car":
                    body = b"\x0a\xa2eroots\x80gversion\x01"
                elif mode == "huge":
                    body, size = b"x" * (1 << 20), 300 << 20
                self.send_response(status)
                if mode == "json":
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(size or len(body)))
                self.end_headers()
                try:
                    for _ in range((size or len(body)) // len(body)):
                        self.wfile.write(body)
                except OSError:
                    pass  # the client stopped reading: what is tested

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_peer_answering_junk_gives_one_line_and_status_stopped_or_running(
    tmp_path: Path, node_factory
) -> None:
    """A peer that answered 200 with junk said "malformed CAR: …" (exit 1) on a stopped
    home but "peer error: malformed CAR: …" through a running node; one answering a
    body over the limit exit 2 (bad input: the user's fault) against exit 1; an HTML
    error page printed its 11 lines, a truncated CBOR answer a 7-line decoder report.
    Now: the peer misbehaved, exit 1, one ``peer error:`` line naming the peer, the same
    on both paths."""
    home = tmp_path / "home"
    Cli(home)("init")
    servers = {mode: _Junk(mode) for mode in ("text", "html", "car", "huge")}
    try:
        stopped = {
            mode: fails_on_one_line(
                merklog(home, "sync", s.url), ExitCode.FAILED, "peer error: ", s.url
            )
            for mode, s in servers.items()
        }
        assert "malformed CAR" in stopped["text"] and "exceeds" in stopped["huge"]
        assert "Unsupported method" in stopped["html"], stopped["html"]
        # a piece of text the page repeats (its twenty "x" paragraphs) is quoted once
        assert stopped["html"].endswith("HTTP 501 http_error: Error Unsupported method x")
        node_factory(home).start()
        for mode, s in servers.items():
            running = fails_on_one_line(merklog(home, "sync", s.url), ExitCode.FAILED)
            assert running == stopped[mode]
        for line in stopped.values():
            assert len(line) < 400, line
    finally:
        for s in servers.values():
            s.close()


def _filled(home: Path, tmp_path: Path, n: int = 3000) -> None:
    Cli(home)("init")
    facts = tmp_path / "facts.dl"
    facts.write_text("".join(f'e({i}, "{"x" * 40}").\n' for i in range(n)))
    Cli(home)("put", "-f", str(facts))


def test_fsck_of_page_level_damage_is_one_line_and_a_json_report(tmp_path: Path) -> None:
    """SQLite's report of page-level damage went into the ``Error:`` line whole (5 to
    101 lines), and ``fsck --json`` printed nothing on stdout. Now the report is summed
    up in one problem (its first line and how many more), the error is one line, and
    ``--json`` prints the report before exit 5."""
    import json
    import shutil

    base = tmp_path / "base"
    _filled(base, tmp_path)
    # the schema page (nothing reads), a tree page, and a file cut short (SQLite cannot
    # open it: --json printed nothing for it, found by QA)
    for damage in (2, 70, "cut"):
        home = tmp_path / f"page{damage}"
        shutil.copytree(base, home)
        with open(home / "store.sqlite", "r+b") as f:
            if damage == "cut":
                f.truncate(f.seek(0, 2) // 2)
            else:
                f.seek(16384 * damage)
                f.write(b"\x37" * 16384)
        line = fails_on_one_line(
            merklog(home, "fsck"), ExitCode.STORE_DAMAGED, "page-level damage", "restore a backup"
        )
        result = merklog(home, "fsck", "--json")
        fails_on_one_line(result, ExitCode.STORE_DAMAGED)
        report = json.loads(result.stdout)
        assert report["ok"] is False and len(report["problems"]) == 1, report
        assert report["problems"][0].startswith("SQLite reports page-level damage: ")
        assert report["problems"][0] in line


def test_fsck_lists_every_problem_beside_a_damaged_genesis_block(tmp_path: Path) -> None:
    """A damaged genesis block stopped fsck: the other missing block went unlisted and
    ``blocks`` was 0. Now both are listed (docs: each problem is listed)."""
    import json
    import sqlite3

    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", "a(1).", "a(2).", "a(3).")
    with sqlite3.connect(home / "store.sqlite") as db:
        ids = [r[0] for r in db.execute("SELECT id FROM blocks ORDER BY id")]
        db.execute("UPDATE blocks SET data = substr(data, 1, 10) WHERE id = ?", (ids[0],))
        db.execute("DELETE FROM blocks WHERE id = ?", (ids[1],))
    result = merklog(home, "fsck", "--json")
    fails_on_one_line(result, ExitCode.STORE_DAMAGED, "2 problems")
    report = json.loads(result.stdout)
    assert report["problems"][0].startswith("genesis block "), report
    assert len(report["problems"]) == 2 and report["problems"][1].endswith(" is missing")
    assert report["blocks"] > 0


def test_a_replica_table_without_heads_is_a_damaged_store(tmp_path: Path) -> None:
    """With the rows of ``repl_head`` gone, fsck said ok and ``put`` failed with
    "Error: max() arg is an empty sequence", exit 2 (bad input). Now fsck lists it and
    ``put`` says the store is damaged, exit 5, naming fsck and a backup."""
    import sqlite3

    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", "a(1).")
    with sqlite3.connect(home / "store.sqlite") as db:
        db.execute("DELETE FROM repl_head")
    fails_on_one_line(merklog(home, "fsck"), ExitCode.STORE_DAMAGED)
    assert "no heads" in merklog(home, "fsck").stdout
    fails_on_one_line(
        merklog(home, "put", "a(2)."), ExitCode.STORE_DAMAGED, "no heads", "merklog fsck"
    )


def test_a_damaged_node_key_is_named_with_the_missing_key_status(tmp_path: Path) -> None:
    """An empty or junk ``identity.pem`` made ``status`` and ``put`` print the
    cryptography library's "Unable to load PEM file. See https://cryptography.io/…
    MalformedFraming", exit 2, naming no file; ``restore --identity junk.pem`` too. Now
    the home's key is damaged as a missing one is (exit 5, the file named, the way out
    said), and a junk ``--identity`` is bad input that creates nothing."""
    home = tmp_path / "home"
    Cli(home)("init")
    car = tmp_path / "home.car"
    Cli(home)("export", str(car))
    key = home / "identity.pem"
    for content in (b"", b"junk\n"):
        key.write_bytes(content)
        for args in (("status",), ("put", "a(1)."), ("fsck",)):
            line = fails_on_one_line(
                merklog(home, *args),
                ExitCode.STORE_DAMAGED,
                str(key),
                "damaged",
                "put the key back",
            )
            assert "cryptography" not in line and "PEM file" not in line, line
    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"junk\n")
    fresh = tmp_path / "fresh"
    fails_on_one_line(
        merklog(fresh, "restore", str(car), "--identity", str(junk)),
        ExitCode.BAD_INPUT,
        str(junk),
        "not a valid node key",
    )
    assert not fresh.exists()


def test_init_join_force_on_a_running_home_refuses_without_announcing_a_switch(
    tmp_path: Path, node_factory
) -> None:
    """``init --join URL --force`` on a home whose node runs printed "switching … from
    dataset X to Y" and then refused ("a merklog node is already running"), having
    switched nothing. Now it only refuses."""
    import tomllib

    a, b = tmp_path / "a", tmp_path / "b"
    Cli(a)("init")
    Cli(b)("init")
    na = node_factory(a).start()
    node_factory(b).start()
    before = (b / "config.toml").read_text()
    result = merklog(b, "init", "--join", na.url, "--token", na.read_token, "--force")
    fails_on_one_line(result, ExitCode.FAILED, "already running")
    assert "switching" not in result.stdout + result.stderr
    assert (b / "config.toml").read_text() == before
    assert (
        tomllib.loads(before)["dataset"]["id"]
        != tomllib.loads((a / "config.toml").read_text())["dataset"]["id"]
    )


def test_facts_that_are_not_utf8_are_named_by_place_stopped_or_running(
    tmp_path: Path, node_factory
) -> None:
    """``put -f`` of a file with a byte that is not UTF-8 said "'utf-8' codec can't
    decode byte 0xff in position 3" (no file, no line); an argument holding one gave a
    lone-surrogate message on a stopped home and a codec's through a running node. Now
    ``FILE:LINE:COL`` (or ``LINE:COL`` of the arguments), the same on both paths, and
    nothing is written."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    Cli(home)("init")
    bad = tmp_path / "bad.dl"
    bad.write_bytes(b'ok(1).\ns("\xff").\n')

    def put_bytes() -> subprocess.CompletedProcess:  # argv as bytes, as a shell gives it
        return subprocess.run(
            [os.fsencode(sys.executable), b"-m", b"merklog.node.cli", b"--home",
             os.fsencode(home), b"put", b's("\xff").'],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def lines() -> tuple[str, str]:
        from_file = fails_on_one_line(
            merklog(home, "put", "-f", str(bad)), ExitCode.BAD_INPUT, f"{bad}:2:4:", "UTF-8"
        )
        from_arg = fails_on_one_line(put_bytes(), ExitCode.BAD_INPUT, "1:4:", "byte 0xff")
        return from_file, from_arg

    stopped = lines()
    node_factory(home).start()
    assert lines() == stopped
    assert "ok(1)" not in Cli(home)("ls").output


def test_a_bad_byte_after_wide_characters_is_at_the_lexers_column(tmp_path: Path) -> None:
    """The column of a byte that is not UTF-8 was counted in bytes, every other column
    (the lexer's) in characters: after an ``é`` (two bytes) the bad byte was said one
    column further right than a syntax error at the same place."""
    home = tmp_path / "home"
    Cli(home)("init")
    bad_byte = tmp_path / "byte.dl"
    bad_byte.write_bytes('s("é", '.encode() + b"\xff).\n")
    bad_syntax = tmp_path / "syntax.dl"
    bad_syntax.write_text('s("é", @).\n', encoding="utf-8")
    assert_fails(
        merklog(home, "put", "-f", str(bad_syntax)), ExitCode.BAD_INPUT, f"{bad_syntax}:1:8:"
    )
    fails_on_one_line(
        merklog(home, "put", "-f", str(bad_byte)), ExitCode.BAD_INPUT, f"{bad_byte}:1:8:", "0xff"
    )


def test_a_bad_cid_is_said_once_and_eval_help_names_bools(tmp_path: Path, node_factory) -> None:
    """``get notacid`` said "not a CID: 'notacid' (not a CID: 'notacid')", and the HTTP
    answer for ``{"/": "notacid"}`` repeated itself too; ``eval --help`` left bools out of
    the ``--sorted`` order, which puts them first."""
    home = tmp_path / "home"
    Cli(home)("init")
    line = fails_on_one_line(merklog(home, "get", "notacid"), ExitCode.BAD_INPUT)
    assert line.count("not a CID") == 1 and "'notacid'" in line, line
    node = node_factory(home).start()
    status, body = node.request(
        "POST", "/v1/facts", {"assert": [{"rel": "p", "args": [{"/": "notacid"}]}]}
    )
    assert status == 400 and body["detail"].count("not a CID") == 1, body
    assert "bools, then ints" in " ".join(merklog(home, "eval", "--help").stdout.split())


def test_a_running_node_says_each_error_once_as_a_stopped_home_does(
    tmp_path: Path, node_factory
) -> None:
    """Through a running node the CLI printed the answer's error name before its detail,
    which named it again: ``unknown relation: unknown relation nosuch/1 …``, ``not found:
    block not found …``, ``bad program: p.dl:1:9: …``. Each line is now the stopped
    home's, word for word, with the same exit status."""
    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", "edge(1, 2).")
    program = tmp_path / "p.dl"
    program.write_text("p(X) :- q(X, .\n")
    absent = "bafyreihlx7sqczozsnchtyjxsg76vbxhzduqyye3sahwvoymqaqlh6jndi"
    cases = [
        (("query", "nosuch(X)"), ExitCode.NOT_FOUND, "unknown relation nosuch/1"),
        (("get", absent), ExitCode.NOT_FOUND, absent),
        (("load", str(program)), ExitCode.BAD_INPUT, "p.dl:1:"),
    ]

    def said() -> list[str]:
        out = []
        for args, code, word in cases:
            done = merklog(home, *args)
            assert_fails(done, code, word)
            out.append(done.stderr)  # the Error line, and a program's hint below it
        return out

    stopped = said()
    node_factory(home).start()
    running = said()
    assert running == stopped
    for text in running:
        body = re.sub(r"^\d+:\d+: ", "", text.splitlines()[0].removeprefix("Error: "))
        name = body.split(":", 1)[0]  # after the query's LINE:COL, if any
        assert body.count(name) == 1, text  # no name said twice


def test_usage_mistakes_in_merklogs_own_options_are_one_line(tmp_path: Path) -> None:
    """A mistake in ``merklog``'s own options (parsed before any command) printed click's
    usage block, its hint and a blank line before the error; a command's own usage
    mistakes were already one line. ``retract`` with no facts suggested ``merklog put``."""
    import subprocess
    import sys

    afile = tmp_path / "afile"
    afile.write_text("")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    fails_on_one_line(cli("--home", str(afile), "status"), 2, "--home", "is a file", "--help")
    fails_on_one_line(cli("--bogus"), 2, "--bogus", "merklog --help")
    home = tmp_path / "home"
    Cli(home)("init")
    fails_on_one_line(
        cli("--home", str(home), "retract"), 2, "no facts given", "merklog retract 'edge(1, 2).'"
    )


def test_export_into_a_missing_directory_names_the_users_path(tmp_path: Path, node_factory) -> None:
    """``export DIR/x.car`` into a directory that does not exist said ``[Errno 2] No such
    file or directory: 'DIR/x.car.tmp'``: the temporary file, not the path the user
    gave. Now the path and the missing directory are named, stopped or running."""
    home = tmp_path / "home"
    Cli(home)("init")
    target = tmp_path / "nodir" / "x.car"
    stopped = fails_on_one_line(
        merklog(home, "export", str(target)), ExitCode.FAILED, str(target), "no directory"
    )
    node_factory(home).start()
    running = fails_on_one_line(merklog(home, "export", str(target)), ExitCode.FAILED)
    assert running == stopped and ".tmp" not in stopped
    assert not (tmp_path / "nodir").exists()


def test_an_argument_that_is_not_utf8_is_named_by_every_command(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in an argument of ``ls``, ``query``, ``get`` or ``sync``
    gave a codec's message (``'utf-8' codec can't encode character '\\udcff'…``) or the
    argument shown as ``'\\udcff'``. Now one line naming the argument as the bytes were
    given, the bad byte and its column; exit 2 (``put`` names LINE:COL of its facts)."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    Cli(home)("init")

    def run(*args: bytes) -> subprocess.CompletedProcess:  # argv as bytes, as a shell gives it
        return subprocess.run(
            [os.fsencode(sys.executable), b"-m", b"merklog.node.cli", b"--home",
             os.fsencode(home), *args],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    for args, shown, column in (
        ((b"ls", b"\xff"), r"'\xff'", 1),
        ((b"query", b"a(\xff)"), r"'a(\xff)'", 3),
        ((b"get", b"\xffx"), r"'\xffx'", 1),
        ((b"sync", b"http://\xff"), r"'http://\xff'", 8),
    ):
        fails_on_one_line(
            run(*args), ExitCode.BAD_INPUT, shown, "not UTF-8", f"byte 0xff at column {column}"
        )


def test_a_home_named_put_does_not_hide_a_bad_argument(tmp_path: Path) -> None:
    """``merklog --home put ls $'\\xff'`` (a home directory named ``put``, given relative)
    took the value of ``--home`` for the command ``put``, whose facts name their bad bytes
    themselves, and checked no further: ``relation name '\\udcff' must start with a
    letter…``. The command is the first argument that is neither an option of merklog nor
    an option's value; ``put`` itself still names LINE:COL of its facts."""
    import os
    import subprocess
    import sys

    Cli(tmp_path / "put")("init")

    def run(*args: bytes) -> subprocess.CompletedProcess:  # argv as bytes, as a shell gives it
        return subprocess.run(
            [os.fsencode(sys.executable), b"-m", b"merklog.node.cli", *args],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path,
        )  # fmt: skip

    for home in ([b"--home", b"put"], [b"--home=put"], [b"-v", b"--home", b"put"]):
        line = fails_on_one_line(run(*home, b"ls", b"\xff"), ExitCode.BAD_INPUT)
        assert line == (
            r"Error: argument '\xff': not UTF-8 text (byte 0xff at column 1);"
            " give arguments as UTF-8"
        )
    line = fails_on_one_line(run(b"--home", b"put", b"put", b"a(\xff)."), ExitCode.BAD_INPUT)
    assert line == "Error: 1:3: not UTF-8 text (byte 0xff); give facts as UTF-8"


def test_peer_mistakes_have_the_documented_statuses(tmp_path: Path) -> None:
    """QA: ``sync ftp://x`` said "unknown peer" (exit 3) where a malformed peer URL is
    exit 2; ``fsck --repair-from NAME`` of an unknown name was exit 2 where ``sync NAME``
    is 3; ``peers add`` against a server answering 404 (not a merklog node) exited 3,
    "not found", as if the command's own object were missing: a peer's refusing answer
    is exit 1, as ``sync`` reports it."""
    import functools
    import http.server
    import threading

    home = tmp_path / "home"
    Cli(home)("init")
    fails_on_one_line(merklog(home, "sync", "nosuch"), ExitCode.NOT_FOUND, "unknown peer")
    fails_on_one_line(merklog(home, "sync", "ftp://x"), ExitCode.BAD_INPUT, "http://")
    fails_on_one_line(
        merklog(home, "fsck", "--repair-from", "nosuch"), ExitCode.NOT_FOUND, "unknown peer"
    )
    fails_on_one_line(merklog(home, "fsck", "--repair-from", "ftp://x"), ExitCode.BAD_INPUT)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        fails_on_one_line(
            merklog(home, "peers", "add", "web", url, "--token", "x"), ExitCode.FAILED, "404"
        )
    finally:
        server.shutdown()
    fails_on_one_line(
        merklog(home, "peers", "add", "gone", "http://127.0.0.1:9"), ExitCode.PEER_UNREACHABLE
    )


def test_sync_over_https_with_a_plain_http_peer_is_a_setup_mistake(
    tmp_path: Path, node_factory
) -> None:
    """``sync https://…`` of a peer serving plain HTTP said "peer unreachable …
    WRONG_VERSION_NUMBER", exit 4 (worth retrying): retrying cannot help. It is a peer
    error (exit 1) saying that a plain-HTTP peer needs an http:// URL, stopped or
    running, and so do ``peers add`` and ``init --join`` (which said exit 4 too)."""
    peer, home = tmp_path / "peer", tmp_path / "home"
    Cli(peer)("init")
    node = node_factory(peer).start()
    Cli(home)("init")
    wrong = node.url.replace("http://", "https://")
    said = "TLS handshake failed (wrong version number); a peer that serves plain HTTP needs"
    stopped = fails_on_one_line(
        merklog(home, "sync", wrong), ExitCode.FAILED, f"cannot reach peer {wrong}: {said}"
    )
    added = merklog(home, "peers", "add", "p", wrong)
    fails_on_one_line(added, ExitCode.FAILED, f"{wrong} to ask its key: {said}")
    joined = merklog(tmp_path / "joiner", "init", "--join", wrong)
    fails_on_one_line(joined, ExitCode.FAILED, f"{wrong} to join it: {said}")
    assert not (tmp_path / "joiner").exists()
    node_factory(home).start()
    running = fails_on_one_line(merklog(home, "sync", wrong), ExitCode.FAILED)
    assert running == stopped


def test_a_peer_that_cannot_be_reached_is_said_one_way_by_every_command(
    tmp_path: Path, node_factory
) -> None:
    """A closed port was worded three ways, each quoting a Python repr: ``sync`` said
    ``peer unreachable: cannot reach peer URL: Connect call failed ('127.0.0.1', N)``
    (unreachable twice), ``peers add`` ``cannot ask URL for its key (cannot reach node
    at URL: <urlopen error [Errno 111] Connection refused>)``, ``init --join`` ``cannot
    join URL: Cannot connect to host 127.0.0.1:N ssl:default [Connect call failed …]``.
    Now one wording with a plain reason, exit 4, stopped or running."""
    from .test_cli_errors import free_port

    home = tmp_path / "home"
    Cli(home)("init")
    url = f"http://127.0.0.1:{free_port()}"  # bound, then closed: nothing listens there
    said = f"Error: cannot reach peer {url}"
    unreachable = ExitCode.PEER_UNREACHABLE
    stopped = fails_on_one_line(merklog(home, "sync", url), unreachable)
    assert stopped == f"{said}: connection refused"
    line = fails_on_one_line(merklog(home, "peers", "add", "x", url), unreachable)
    assert line == f"{said} to ask its key: connection refused; pass --key HEX to add it offline"
    line = fails_on_one_line(merklog(tmp_path / "new", "init", "--join", url), unreachable)
    assert line == f"{said} to join it: connection refused"
    assert not (tmp_path / "new" / "store.sqlite").exists()
    node = node_factory(home).start()
    assert fails_on_one_line(merklog(home, "sync", url), unreachable) == stopped
    status, body = node.request("POST", "/v1/sync", {"url": url})
    assert (status, body) == (
        502,
        {"error": "peer unreachable", "detail": f"cannot reach peer {url}: connection refused"},
    )


def test_peers_add_of_a_peer_answering_a_strange_status_is_a_peer_error(tmp_path: Path) -> None:
    """QA: ``peers add NAME URL --token T`` read ``info["key"]`` unchecked: a peer
    answering 200 with ``{}`` was an internal error (KeyError, exit 70), ``[]``/``null``
    or a number for the key a TypeError (exit 70), an HTML page or cut JSON a bare
    ``Expecting value: …`` (exit 2, no peer named), a key "zz" blamed a ``--key`` the
    user never passed. Each is the peer's fault: one ``peer error: URL: …`` line, exit
    1, and no peer is added."""
    import json

    home = tmp_path / "home"
    Cli(home)("init")
    dataset = json.loads(Cli(home)("status", "--json").output)["dataset"]
    peer = _Junk("json")
    cases = {
        b"{}": "names no valid key (64 hex digits; it sent none)",
        b"[]": "is not a JSON object ([])",
        b"null": "is not a JSON object (null)",
        json.dumps({"dataset": dataset, "key": 5}).encode(): "names no valid key",
        b"<html><body>hello</body></html>": "is not JSON",
        b'{"dataset": "': "is not JSON",
        json.dumps({"dataset": dataset, "key": "zz"}).encode(): 'it sent "zz"',
        json.dumps({"dataset": dataset, "key": "ab" * 31}).encode(): "names no valid key",
    }
    try:
        for body, says in cases.items():
            peer.body = body
            line = fails_on_one_line(
                merklog(home, "peers", "add", "x", peer.url, "--token", "T"),
                ExitCode.FAILED,
                f"peer error: {peer.url}: its answer to GET /v1/status ",
                says,
                "pass --key HEX",
            )
            assert "--key must be" not in line and "internal error" not in line, line
    finally:
        peer.close()
    assert Cli(home)("peers", "list").output.strip() == ""


def test_peers_add_of_a_peer_answering_a_page_quotes_an_excerpt_of_it(tmp_path: Path) -> None:
    """QA: ``peers add`` of a peer answering 200 with a page that is not JSON said only
    the decoder's report (``is not JSON (Expecting value: line 1 column 1 (char 0))``),
    not what the peer sent, which docs/operations.md promises as ``sync`` does it: a
    short excerpt on the one line, an HTML page without its tags."""
    home = tmp_path / "home"
    Cli(home)("init")
    peer = _Junk("json")
    page = b"<html><head><title>Welcome to nginx!</title></head>\n<body><h1>Welcome to"
    page += b" nginx!</h1>\n" + b"<p>If you see this page, the web server works.</p>\n" * 40
    cases = {
        page + b"</body></html>": "(it sent: Welcome to nginx! If you see this page, the web",
        b'{"dataset": "': '(it sent: {"dataset": ")',
        b"<p>caf\xe9</p>": "(it sent: caf\ufffd)",  # not UTF-8 either
    }
    try:
        for body, says in cases.items():
            peer.body = body
            line = fails_on_one_line(
                merklog(home, "peers", "add", "x", peer.url),
                ExitCode.FAILED,
                f"peer error: {peer.url}: its answer to GET /v1/status is not JSON {says}",
                "; pass --key HEX to add it offline",
            )
            assert "Expecting" not in line and "<" not in line and len(line) < 300, line
    finally:
        peer.close()
    assert Cli(home)("peers", "list").output.strip() == ""


def test_peers_add_and_join_quote_what_a_peer_that_is_no_merklog_sent(tmp_path: Path) -> None:
    """``peers add`` of a peer answering an HTML error page said only ``HTTP Error 501:
    Not Implemented``, and ``init --join`` said ``HTTP 501`` or "it named no valid
    dataset id"; sync already quoted the page. Now each quotes an excerpt of it."""
    home = tmp_path / "home"
    Cli(home)("init")
    for mode, says in (("html", "it sent: Error Unsupported method x"), ("text", "it sent: hello")):
        peer = _Junk(mode)
        try:
            added = fails_on_one_line(merklog(home, "peers", "add", "x", peer.url), ExitCode.FAILED)
            joined = fails_on_one_line(
                merklog(tmp_path / f"join-{mode}", "init", "--join", peer.url, "--token", "t"),
                ExitCode.FAILED,
            )
        finally:
            peer.close()
        for line in (added, joined):
            assert says in line and "<" not in line, line
        assert not (tmp_path / f"join-{mode}").exists()


def test_status_shows_a_peers_words_as_written_not_as_markup(tmp_path: Path) -> None:
    """QA: a peer answering 500 with ``[bold red]INJECT[/bold red] ESC[5mBLINK ESC[0m
    [link=http://evil.example]click[/link]`` made ``status`` print real bold red text,
    a blinking word and a clickable link to another site in its "last error" cell. A
    peer's words are now shown as written: markup as text, control characters escaped."""
    body = b"[bold red]INJECT[/bold red] \x1b[5mBLINK\x1b[0m [link=http://evil.example]click[/link]"
    home = tmp_path / "home"
    Cli(home)("init")
    with answering(500, "text/plain", body) as url:
        assert merklog(home, "sync", url).returncode != 0
    shown = merklog(home, "status")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.replace("\n", "")
    assert "\x1b" not in shown.stdout and "\\x1b[5mBLINK" in out
    assert "[bold red]INJECT[/bold red]" in out and "[link=http://evil.example]" in out
