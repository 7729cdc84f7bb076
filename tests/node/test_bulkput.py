"""``put -f`` on a stopped home checks, encodes and renders chunk k+1 while chunk k is
in SQLite (ADR 0143): what is stored and printed is what writing the chunks one after
the other gives, and a chunk that fails stops the put with nothing after it written."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from merklog.node.commands import put
from merklog.store import Link, sqlrun
from merklog.store.sqlite import SQLiteBlockStore

from .conftest import Cli, as_printed, put_script

# Values Python's == merges (1, 1.0, true) beside look-alikes ("1", x"01").
VALUES = ["1", "1.0", "true", '"1"', 'x"01"', "-0.0", '"x"', "9223372036854775807"]


def _lines(n: int, start: int = 0) -> list[str]:
    return [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(start, start + n)]


def _printed(output: str) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in output.splitlines() if "\t" in line]


def _store(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "store.sqlite")


def _in_thread(run: Cli, *args: str, ok: bool = True):
    """``run(*args)`` that fails the test instead of hanging it."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(run(*args, ok=ok)), daemon=True)
    worker.start()
    worker.join(120)
    assert box, f"merklog {' '.join(args)} did not finish"
    return box[0]


def test_chunks_stored_in_sqlite_runs_give_the_facts_and_output_of_one_by_one_writes(
    run: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 1,200 mixed-type facts (each stored in one statement), facts repeated
    across chunks and facts visible before the put: every line printed in input order
    with the CID a one-fact write gives, one assert per distinct fact, every block
    readable, and a second put of the same file adds nothing and ends."""
    run("init")
    lines = _lines(3000)
    lines += lines[1100:1300] + _lines(500, 5000)  # repeats of chunk 1 in chunk 3
    run("put", *[line for line in lines[::50]])  # visible before the put
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 1200)
    assert 1200 >= sqlrun.RUN_MIN
    printed = _printed(_in_thread(run, "put", "-f", str(data)).output)
    assert [fact + "." for _cid, fact in printed] == as_printed(lines)
    for i in (0, 1, 2, 3, 4, 5, 6, 7, 1150, 3001, 3699):
        (cid, _fact) = _printed(run("put", lines[i]).output)[0]
        assert cid == printed[i][0]
    distinct = {cid for cid, _f in printed}
    assert len(distinct) == 3500
    with _store(home) as conn:
        assert conn.execute("SELECT count(*) FROM repl_assert").fetchone() == (3500,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    store = SQLiteBlockStore(home / "store.sqlite")
    try:
        assert all(store.get(Link.parse(cid)) for cid in sorted(distinct)[::7])
    finally:
        store.close()
    again = _printed(_in_thread(run, "put", "-f", str(data)).output)
    assert again == printed  # every fact already visible: no write reaches SQLite
    with _store(home) as conn:
        assert conn.execute("SELECT count(*) FROM repl_assert").fetchone() == (3500,)
    assert len(run("ls", "v").output.splitlines()) == 3500


def test_a_full_disk_mid_put_keeps_the_chunks_before_and_writes_nothing_after(
    run: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite runs out of pages (``max_page_count``, SQLite's own full-disk error) in
    the third chunk's write, while the fourth is being prepared: the first two chunks
    are printed and queryable, nothing of the third or fourth is stored, the CLI says
    so in one line with a non-zero exit, and the store is intact."""
    run("init")
    lines = _lines(4 * 1500)
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 1500)
    monkeypatch.setattr(put, "BULK_CACHE_FACTS", 1)  # set_cache_mb runs: limit the file there
    real = SQLiteBlockStore.set_cache_mb

    def limited(self: SQLiteBlockStore, mb: int) -> None:
        real(self, mb)
        (pages,) = self.conn.execute("PRAGMA page_count").fetchone()
        # Room for two chunks (~32 pages of 16 KiB each), not three.
        self.conn.execute(f"PRAGMA max_page_count = {pages + 80}")

    monkeypatch.setattr(SQLiteBlockStore, "set_cache_mb", limited)
    result = _in_thread(run, "put", "-f", str(data), ok=False)
    assert result.exit_code == 6  # no space left (docs/operations.md, exit status)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "\t" not in line and line.strip()]
    assert len(errors) == 1 and "full" in errors[0], result.output
    printed = [fact + "." for _cid, fact in _printed(result.output)]
    assert printed == as_printed(lines[:3000])
    monkeypatch.undo()
    rows = json.loads(run("query", "--json", "v(X, Y)").output)["rows"]
    assert len(rows) == len(printed)
    with _store(home) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_mid_put_prints_exactly_the_chunks_it_stored(
    run: Cli, home: Path, tmp_path: Path, sig: str
):
    """Ctrl-C (a real SIGINT to a real ``merklog put -f`` of four 60k-fact chunks) once
    the first chunk is printed, while the second is being written: that write finishes
    and is printed before the put stops, and the later ones are never sent. So the facts
    printed are exactly the facts stored; one line on stderr, exit 1, the store intact.
    SIGTERM (``kill``, a service manager) the same, exit 143: it kept a chunk it never
    printed, and said nothing."""
    import signal
    import subprocess
    import sys
    import time

    run("init")
    # Chunks of 60k facts, not the 200k of LOCAL_CHUNK_FACTS: each still takes over a
    # second to write (the window the signal must hit). Four of them: an input of this
    # size is cut in quarters (ADR 0194), so each is LOCAL_CHUNK_FACTS.
    chunk = 60_000
    lines = _lines(4 * chunk)
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    script = put_script("LOCAL_CHUNK_FACTS")
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(chunk), "--home", str(home), "put", "-f", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a shell: a test run started in the background (``cmd &`` in a script)
        # ignores SIGINT, and a child inherits that; Ctrl-C must reach this put.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    printed = [proc.stdout.readline() for _ in range(chunk)]  # chunk 1 committed and printed
    time.sleep(0.05)  # its printing is over; chunk 2's write is in flight
    proc.send_signal(getattr(signal, sig))
    rest, err = proc.communicate(timeout=120)
    printed += rest.splitlines(keepends=True)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    if sig == "SIGINT":
        assert proc.returncode == 1
        assert "interrupted (Ctrl-C): what was written before it stays written" in err, err
    else:
        assert proc.returncode == 143
        assert "stopped (SIGTERM): what was written before it stays written" in err, err
    # The write in flight when the signal came is finished and printed: chunk 2 as a
    # rule, chunk 3 on a machine that wrote chunk 2 before the signal arrived.
    done = len(printed) // chunk
    assert len(printed) % chunk == 0 and done in (2, 3), len(printed)
    assert [line.rstrip("\n").split("\t")[1] + "." for line in printed] == as_printed(
        lines[: done * chunk]
    )
    with _store(home) as conn:
        assert conn.execute("SELECT count(*) FROM repl_assert").fetchone() == (done * chunk,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# Values in the spellings the one-fact-per-line reader takes (JSON's), mixed types.
JSON_VALUES = ["1", "1.0", "true", '"1"', "-0.5", '"x"', "9223372036854775807", "false"]


def _json_lines(n: int, start: int = 0) -> list[str]:
    return [f"v({i}, {JSON_VALUES[i % len(JSON_VALUES)]})." for i in range(start, start + n)]


def _gate_spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], threading.Event]:
    """Records each held first write that reached its commit (and whether it was let
    through); the event is set when one is waiting there."""
    from merklog.node import bulkput

    outcomes: list[bool] = []
    waiting = threading.Event()
    real = bulkput.CommitGate.__call__

    def spy(self: bulkput.CommitGate) -> None:
        waiting.set()
        try:
            real(self)
        except bulkput.InputAborted:
            outcomes.append(False)
            raise
        outcomes.append(True)

    monkeypatch.setattr(bulkput.CommitGate, "__call__", spy)
    return outcomes, waiting


def test_a_syntax_error_after_the_first_chunk_writes_nothing(
    run: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first chunk is written while the rest of the file is read (ADR 0144); a syntax
    error in the rest still writes nothing: the held write rolls back, the error names
    its line and column in the whole file in one line, exit 2, the store intact."""
    run("init")
    run("put", "seen(1).")
    lines = _json_lines(3000)
    lines[2500] = "v(2500, )."
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 1200)
    outcomes, _waiting = _gate_spy(monkeypatch)
    result = _in_thread(run, "put", "-f", str(data), ok=False)
    assert outcomes == [False]  # the first chunk was written, then rolled back
    assert result.exit_code == 2
    assert "Traceback" not in result.output and not _printed(result.output)
    assert "2501:9: expected a term" in result.output.splitlines()[0], result.output
    monkeypatch.undo()
    with _store(home) as conn:
        assert conn.execute("SELECT count(*) FROM repl_assert").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM repl_delta").fetchone() == (2,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert run("ls", "v", ok=False).exit_code == 3  # no visible facts of v


def test_a_rest_of_other_shapes_gives_what_reading_the_whole_file_first_gives(
    run: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first chunk's lines are one fact each; the rest holds values the line reader
    leaves to the parser (``x"01"``, ``-0.0``), a comment and two facts on one line, so
    the parser reads the whole file: the facts stored and the lines printed (CIDs in
    input order) are those of a put that reads the whole file before writing."""
    lines = _json_lines(1500)
    rest = _lines(900, 1500) + ["% a comment", 'w(1). w("1").', "w(1.0)."]
    text = "\n".join(lines + rest) + "\n"
    data = tmp_path / "facts.dl"
    data.write_text(text)
    whole_home = tmp_path / "whole"
    whole = Cli(whole_home)
    whole("init")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 10_000)  # one chunk: read first
    want = _printed(_in_thread(whole, "put", "-f", str(data)).output)
    run("init")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 1000)
    outcomes, _waiting = _gate_spy(monkeypatch)
    got = _printed(_in_thread(run, "put", "-f", str(data)).output)
    assert outcomes == [True]
    assert got == want and len(got) == 1500 + 900 + 3
    assert [fact for _cid, fact in got[-3:]] == ["w(1)", 'w("1")', "w(1.0)"]
    assert len({cid for cid, _f in got[-3:]}) == 3
    monkeypatch.undo()
    for name in ("v", "w"):
        assert sorted(run("ls", name).output.splitlines()) == sorted(
            whole("ls", name).output.splitlines()
        )


def test_ctrl_c_while_the_rest_is_read_writes_nothing(
    run: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the rest of the file is read, the first chunk's write held at its
    commit: that write rolls back, nothing is printed or stored, the put stops (click's
    one-line abort, exit 1). The interrupt is raised where the reader runs (a real
    SIGINT cannot be aimed at that moment)."""
    from merklog.engine import factreader

    run("init")
    lines = _json_lines(3000)
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 1200)
    outcomes, waiting = _gate_spy(monkeypatch)
    real = factreader.read_fact_lines
    calls: list[int] = []

    def interrupted(text: str):
        calls.append(len(text))
        if len(calls) == 2:  # the first piece of the rest
            assert waiting.wait(60), "the first chunk's write never reached its commit"
            raise KeyboardInterrupt
        return real(text)

    monkeypatch.setattr(factreader, "read_fact_lines", interrupted)
    result = _in_thread(run, "put", "-f", str(data), ok=False)
    assert result.exit_code == 1 and outcomes == [False]
    assert "Traceback" not in result.output and not _printed(result.output)
    monkeypatch.undo()
    with _store(home) as conn:
        assert conn.execute("SELECT count(*) FROM repl_assert").fetchone() == (0,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_quiet_put_stores_what_a_printing_put_stores_and_prints_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``put -q -f`` on a stopped home, in chunks of 1,200 (the later ones prepared by the
    helper process, the first written while the rest is read): stdout is empty, and the
    store holds the asserts and blocks of the same put without ``-q`` (mixed-type values,
    repeats across chunks)."""
    lines = _lines(3000)
    lines += lines[1100:1300] + _lines(500, 5000)
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(put, "LOCAL_CHUNK_FACTS", 1200)
    printed: set[str] = set()
    for name, flags in (("loud", []), ("quiet", ["-q"])):
        home = tmp_path / name
        run = Cli(home)
        run("init")
        result = _in_thread(run, "put", *flags, "-f", str(data))
        if flags:
            assert result.output == ""
        else:
            printed = {cid for cid, _fact in _printed(result.output)}
        assert len(printed) == 3500
        with _store(home) as conn:
            assert conn.execute("SELECT count(*) FROM repl_assert").fetchone() == (3500,)
        store = SQLiteBlockStore(home / "store.sqlite")
        try:  # the fact blocks of the CIDs the printing put gave
            assert all(store.get(Link.parse(cid)) for cid in printed)
        finally:
            store.close()
        assert len(run("ls", "v").output.splitlines()) == 3500


def _chunk_spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the size of each chunk a put on a stopped home writes after reading its
    first chunk's lines (:func:`put._chunks_while_reading`)."""
    sizes: list[int] = []
    real = put._chunks_while_reading

    def spy(*args: object) -> Iterator[list]:
        for chunk in real(*args):
            sizes.append(len(chunk))
            yield chunk

    monkeypatch.setattr(put, "_chunks_while_reading", spy)
    return sizes


def test_an_input_of_one_chunk_is_written_in_quarters_with_the_output_of_one_write(
    run: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0194: a put of 24,002 lines of mixed-type facts (fewer than LOCAL_CHUNK_FACTS,
    at least SPLIT_FROM_LINES) into a fresh home, with the real chunk sizes, is written in
    four chunks of a quarter of the lines, the first held until the rest has read: the
    lines printed and the facts stored are those of the same input written as one chunk.
    A put of fewer lines than the home holds facts is not cut."""
    lines = _json_lines(24_002)
    assert put.SPLIT_FROM_LINES <= len(lines) < put.LOCAL_CHUNK_FACTS
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    whole_home = tmp_path / "whole"
    whole = Cli(whole_home)
    whole("init")
    monkeypatch.setattr(put, "SPLIT_FROM_LINES", 10**9)  # one chunk, read first
    want = _in_thread(whole, "put", "-f", str(data)).output
    monkeypatch.undo()
    run("init")
    outcomes, _waiting = _gate_spy(monkeypatch)
    sizes = _chunk_spy(monkeypatch)
    got = _in_thread(run, "put", "-f", str(data)).output
    assert outcomes == [True]  # the first quarter was held, then let through
    assert sizes == [6_001, 6_001, 6_001, 5_999]
    assert got == want
    assert [fact + "." for _cid, fact in _printed(got)] == as_printed(lines)
    monkeypatch.undo()
    assert sorted(run("ls", "v").output.splitlines()) == sorted(
        whole("ls", "v").output.splitlines()
    )
    # Into a home that holds more facts than the input, its commits cost more than the
    # earlier start saves: 20,000 more lines are one chunk, read whole first.
    more = tmp_path / "more.dl"
    more.write_text("\n".join(_json_lines(20_000, 30_000)) + "\n")
    outcomes, _waiting = _gate_spy(monkeypatch)
    sizes = _chunk_spy(monkeypatch)
    printed = _printed(_in_thread(run, "put", "-f", str(more)).output)
    assert outcomes == [] and sizes == [] and len(printed) == 20_000


def test_a_syntax_error_on_the_last_line_of_a_quartered_input_writes_nothing(
    run: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0194 with the real chunk sizes: the first quarter of a 24,000-line input is
    written while the rest is read; a syntax error on its last line rolls that write
    back. One line naming it, exit 2, nothing of the input stored."""
    run("init")
    run("put", "seen(1).")
    lines = _json_lines(24_000)
    lines[-1] = "v(23999, )."
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    outcomes, _waiting = _gate_spy(monkeypatch)
    result = _in_thread(run, "put", "-f", str(data), ok=False)
    assert outcomes == [False]
    assert result.exit_code == 2
    assert "Traceback" not in result.output and not _printed(result.output)
    assert "24000:10: expected a term" in result.output.splitlines()[0], result.output
    monkeypatch.undo()
    with _store(home) as conn:
        assert conn.execute("SELECT count(*) FROM repl_assert").fetchone() == (1,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
