"""Backup (``merklog export``) and restore into a fresh home (``merklog restore``)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import Cli


def _facts(run: Cli) -> list[str]:
    return sorted(line.split("\t")[1] for line in run("ls").output.splitlines())


def test_export_then_restore_into_a_fresh_home(tmp_path: Path, node_factory) -> None:
    a = Cli(tmp_path / "a")
    a("init")
    a("put", "edge(1, 2).", "edge(2, 3).", 'name("x", 1.0, true, x"00").')
    a("retract", "edge(1, 2).")
    node = node_factory(a.home).start()  # the backup is taken from a running node
    a("put", "edge(3, 4).")
    backup = tmp_path / "backup.car"
    assert "exported" in a("export", str(backup)).output
    node.stop()
    before = _facts(a)
    # Restored with the saved key: same dataset, same facts, and it can write as before.
    b = Cli(tmp_path / "b")
    out = b("restore", str(backup), "--identity", str(a.home / "identity.pem")).output
    assert "restored" in out
    assert _facts(b) == before
    import json

    status_a, status_b = (json.loads(x("status", "--json").output) for x in (a, b))
    assert status_a["dataset"] == status_b["dataset"] and status_a["heads"] == status_b["heads"]
    assert status_a["key"] == status_b["key"]
    b("put", "edge(9, 9).")
    # Without the key: the data comes back, writes need a grant (exit 7 says so).
    c = Cli(tmp_path / "c")
    c("restore", str(backup))
    assert _facts(c) == before
    refused = c("put", "edge(5, 5).", ok=False)
    assert refused.exit_code == 7 and "cannot write yet" in refused.output
    # An initialised home is never overwritten; a broken backup creates nothing.
    again = b("restore", str(backup), ok=False)
    assert again.exit_code == 1 and "already a merklog home" in again.output
    broken = tmp_path / "broken.car"
    broken.write_bytes(backup.read_bytes()[: backup.stat().st_size // 2])
    d = Cli(tmp_path / "d")
    failed = d("restore", str(broken), ok=False)
    assert failed.exit_code != 0 and "Traceback" not in failed.output
    assert not (tmp_path / "d").exists()


def test_export_and_import_through_a_running_node_count_blocks_and_pass_max_body(
    tmp_path: Path, node_factory
) -> None:
    """Through a running node, ``export`` and ``import`` report real progress (blocks, as
    the CAR streams) and a CAR larger than ``node.max_body`` imports: the body is streamed,
    not one request body read into memory. A damaged CAR changes nothing."""
    from merklog.node.target import open_target

    a = Cli(tmp_path / "a")
    a("--set", "node.max_body=65536", "init")  # a small body limit, kept in config.toml
    rows = "".join(f'row({i}, {i}.0, "{i}", true, x"{i % 256:02x}").\n' for i in range(3000))
    (tmp_path / "rows.dl").write_text(rows)
    a("put", "-f", str(tmp_path / "rows.dl"))
    backup = tmp_path / "backup.car"
    a("export", str(backup))
    assert backup.stat().st_size > 2 * 65536
    b = Cli(tmp_path / "b")
    b("--set", "node.max_body=65536", "restore", str(backup))  # same dataset, fewer deltas
    a("put", 'v(1). v(1.0). v(true). v("1"). v(x"01").')
    node_a = node_factory(a.home).start()
    seen: list[int] = []
    with open_target(a.home) as target:
        exported = target.export_car(tmp_path / "later.car", seen.append)
    assert exported == 3000 + 5 + 3  # facts, genesis and the two deltas
    assert seen and seen[-1] == exported and seen == sorted(seen)
    node_a.stop()

    assert "max_body = 65536" in (b.home / "config.toml").read_text()
    node_b = node_factory(b.home).start()
    damaged = tmp_path / "damaged.car"
    raw = (tmp_path / "later.car").read_bytes()
    damaged.write_bytes(raw[:-40] + bytes(40))
    refused = b("import", str(damaged), ok=False)
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert len(_facts(b)) == 3000
    sent: list[int] = []
    with open_target(b.home) as target:
        result = target.import_car(tmp_path / "later.car", sent.append)
    assert result["accepted"] == 1 and result["facts"] == 5
    assert sent[-1] == exported
    assert _facts(b) == _facts(a)
    node_b.stop()


def _merklog(home: Path, *args: str, stdin=None) -> subprocess.CompletedProcess:
    """``merklog --home HOME ARGS…`` as a real process (bytes out)."""
    return subprocess.run(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args],
        capture_output=True,
        timeout=120,
    )


@pytest.mark.parametrize("running", [False, True], ids=["stopped-home", "running-node"])
def test_export_writes_through_links_fifos_and_standard_output(
    tmp_path: Path, node_factory, running: bool
) -> None:
    """``export`` replaced whatever its path named with a new file: a symbolic link
    became a file of its own (the file it pointed at kept its old bytes), a FIFO's
    reader waited forever, and ``-`` made a file named ``-``. Now a link is written
    through, a FIFO as the CAR is made, ``-`` is standard output (the summary on
    standard error), and every form carries the same CAR."""
    home = tmp_path / "home"
    Cli(home)("init")
    Cli(home)("put", 'v(1). v(1.0). v(true). v("1"). v(x"01").')
    node = node_factory(home).start() if running else None
    try:
        plain = tmp_path / "plain.car"
        assert _merklog(home, "export", str(plain)).returncode == 0
        car = plain.read_bytes()
        assert len(car) > 200

        target, link = tmp_path / "target.car", tmp_path / "link.car"
        target.write_text("keep")
        link.symlink_to(target)
        assert _merklog(home, "export", str(link)).returncode == 0
        assert link.is_symlink() and target.read_bytes() == car

        done = _merklog(home, "export", "-")
        assert done.returncode == 0 and done.stdout == car
        assert b"exported 7 blocks to standard output" in done.stderr
        assert not (Path.cwd() / "-").exists()

        fifo = tmp_path / "pipe.car"
        os.mkfifo(fifo)
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
        reader.start()
        assert _merklog(home, "export", str(fifo)).returncode == 0
        reader.join(60)
        assert received == [car] and stat.S_ISFIFO(fifo.lstat().st_mode)
    finally:
        if node is not None:
            node.stop()


def _small_files() -> None:
    """In the child: files of at most 64 KiB, and a write past that fails (EFBIG)
    instead of killing the process (SIGXFSZ)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))


@pytest.mark.parametrize("running", [False, True], ids=["stopped-home", "running-node"])
def test_a_failed_export_leaves_the_old_file_as_it_was(
    tmp_path: Path, node_factory, running: bool
) -> None:
    """Written to a temporary file renamed into place once whole: an export that cannot
    finish (the file would pass the process's size limit, as on a full disk) fails with
    one line and leaves the earlier backup as it was, and no temporary file."""
    home = tmp_path / "home"
    Cli(home)("init")
    rows = tmp_path / "rows.dl"
    rows.write_text("".join(f'row({i}, "{i}").\n' for i in range(5000)))
    Cli(home)("put", "-f", str(rows))
    node = node_factory(home).start() if running else None
    try:
        old = tmp_path / "backups" / "b.car"
        old.parent.mkdir()
        old.write_bytes(b"an earlier backup")
        done = subprocess.run(
            [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "export", str(old)],
            capture_output=True,
            timeout=120,
            preexec_fn=_small_files,
        )
        assert done.returncode != 0 and b"Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.decode().strip().splitlines()) == 1, done.stderr
        assert old.read_bytes() == b"an earlier backup"
        assert sorted(p.name for p in old.parent.iterdir()) == ["b.car"]
    finally:
        if node is not None:
            node.stop()


def test_an_export_stopped_by_sigterm_leaves_no_temporary_file(tmp_path: Path) -> None:
    """``kill`` (SIGTERM) of an export left its ``.tmp`` file behind (432 MB seen): the
    command now ends as on an error, its temporary file removed, with status 143."""
    import time

    home = tmp_path / "home"
    Cli(home)("init")
    rows = tmp_path / "rows.dl"
    rows.write_text("".join(f'row({i}, "{i:0>40}").\n' for i in range(300_000)))
    Cli(home)("put", "-f", str(rows))
    out = tmp_path / "b.car"
    tmp = tmp_path / "b.car.tmp"
    proc = subprocess.Popen(
        [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "export", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not tmp.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert tmp.exists(), "the export ended before it could be stopped"
    proc.terminate()
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and b"Traceback" not in err, err
    assert not tmp.exists() and not out.exists()


def test_a_restore_killed_mid_import_is_refused_by_others_and_redone_by_itself(
    tmp_path: Path,
) -> None:
    """``kill -9`` during a restore's import (no cleanup can run) left a home that looked
    initialised with no facts: commands served an empty dataset and the same restore
    refused it as "already a merklog home". The home now says it is an unfinished
    restore until the import commits; other commands refuse it and the restore starts
    over."""
    src = Cli(tmp_path / "src")
    src("init")
    src("put", "a(1).", "a(1.0).", 'a("1").')
    car = tmp_path / "backup.car"
    src("export", str(car))
    home = tmp_path / "restored"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys\n"
            "from merklog.node import node\n"
            "node.Node.import_car = lambda self, *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
            "from merklog.node.cli import main\n"
            f"sys.argv = ['merklog', '--home', {str(home)!r}, 'restore', {str(car)!r}]\n"
            "os.umask(0o022)\n"
            "main()\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == -9, killed.stderr
    assert (home / "config.toml").exists()  # what a killed restore leaves
    # owner-only like every file of a home, whatever the umask (it was 0644)
    assert (home / "restore.unfinished").stat().st_mode & 0o777 == 0o600
    status = Cli(home)("status", ok=False)
    assert status.exit_code == 1 and "restore that was stopped before it ended" in status.output
    # init too (it said "already initialised" and rewrote config.toml, QA)
    config = (home / "config.toml").read_bytes()
    init = Cli(home)("init", "--port", "23999", ok=False)
    assert init.exit_code == 1 and "restore that was stopped before it ended" in init.output
    assert (home / "config.toml").read_bytes() == config
    Cli(home)("restore", str(car))
    assert sorted(Cli(home)("query", "--json", "a(X)").output.split("rows")[1]) == sorted(
        src("query", "--json", "a(X)").output.split("rows")[1]
    )
    assert not (home / "restore.unfinished").exists()


def test_an_export_writes_each_block_once(tmp_path: Path, node_factory) -> None:
    """A fact asserted again (tutorial section 6: retracted, then put again) is asserted
    by two deltas; the export wrote its block with each and said `exported 6 blocks`
    for a CAR of 5 distinct blocks, while fsck of the restored home counted 5. Each
    block is now written once, on both paths (stopped home, running node), and counted
    once; the restore holds the same facts."""
    from merklog.store.car import read_car

    a = Cli(tmp_path / "a")
    a("init")
    a("put", "done(1).", "done(2).")
    a("retract", "done(1).")
    a("put", "done(1).")  # a fresh assertion of the same fact block
    stopped = tmp_path / "stopped.car"
    node = node_factory(a.home).start()
    running = tmp_path / "running.car"
    said_running = a("export", str(running)).output
    node.stop()
    said_stopped = a("export", str(stopped)).output
    for car, said in ((stopped, said_stopped), (running, said_running)):
        with car.open("rb") as src:
            _roots, blocks = read_car(src)
            cids = [cid.raw for cid, _data in blocks]
        assert len(cids) == len(set(cids)), "a block written twice"
        # genesis, 3 deltas, 2 fact blocks
        assert len(cids) == 6
        assert f"exported {len(cids)} blocks" in said, said
        b = Cli(tmp_path / f"restored-{car.stem}")
        b("restore", str(car))
        assert _facts(b) == ["done(1)", "done(2)"]
        assert b("fsck").output.startswith(f"ok: {len(cids)} blocks"), b("fsck").output


def test_the_backup_example_of_operations_md_runs_as_written(tmp_path: Path) -> None:
    """The example exported `backup-$(date +%F).car` and restored a fixed
    `backup-2026-11-23.car`: run literally, the restore found no such file. It runs in
    sh with only the homes moved into a temporary directory."""
    import re
    import shlex

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = doc[doc.index("## Backup and restore") :]
    script = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    assert "~/.merklog" in script and "/new/home" in script
    script = script.replace("~/.merklog", str(tmp_path / "old")).replace(
        "/new/home", str(tmp_path / "new")
    )
    Cli(tmp_path / "old")("init")
    Cli(tmp_path / "old")("put", "edge(1, 2).")
    shim = tmp_path / "bin" / "merklog"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m merklog.node.cli "$@"\n')
    shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        ["sh", "-ec", script],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}"},
    )
    assert done.returncode == 0, done.stderr
    assert _facts(Cli(tmp_path / "new")) == ["edge(1, 2)"]
    import json

    old, new = (json.loads(Cli(tmp_path / x)("status", "--json").output) for x in ("old", "new"))
    assert (new["dataset"], new["heads"], new["key"]) == (old["dataset"], old["heads"], old["key"])


def test_restore_counts_the_visible_facts_as_status_does(tmp_path: Path) -> None:
    """QA: ``restore`` printed ``facts M`` where M was every fact ever asserted (a
    backup with 5,806 retracted facts counted them), while ``status`` of the restored
    home said the visible ones. The summary says the visible facts, as ``status``."""
    import json

    a = Cli(tmp_path / "a")
    a("init")
    a("put", "edge(1, 2).", "edge(2, 3).", "edge(3, 4).")
    a("retract", "edge(2, 3).")
    backup = tmp_path / "backup.car"
    a("export", str(backup))
    b = Cli(tmp_path / "b")
    out = b("restore", str(backup)).output
    visible = json.loads(b("status", "--json").output)["facts"]
    assert visible == 2 == len(_facts(b))
    assert out.strip().endswith(f"accepted 2, duplicates 0, facts {visible} visible"), out


def test_a_backup_cut_short_between_two_blocks_restores_nothing(tmp_path: Path) -> None:
    """A CAR cut exactly at a section boundary is a valid, shorter CAR: restore took it
    with exit 0 and an older state of the dataset (1 fact of 5), and fsck said ok. Its
    roots name the heads it was exported at; the restore now refuses it (exit 2) and
    leaves no home."""
    from merklog.store.car import car_header, car_section, read_car

    a = Cli(tmp_path / "a")
    a("init")
    for i in range(5):
        a("put", f"n({i}).")
    backup = tmp_path / "backup.car"
    a("export", str(backup))
    data = backup.read_bytes()
    with open(backup, "rb") as src:
        roots, blocks = read_car(src)
        sections = [car_section(cid, block) for cid, block in blocks]
    assert len(sections) > 3 and roots
    assert data == car_header(roots) + b"".join(sections)
    cut = len(car_header(roots)) + sum(map(len, sections[:3]))  # header + 3 whole sections
    short = tmp_path / "short.car"
    short.write_bytes(data[:cut])
    z = Cli(tmp_path / "z")
    refused = z("restore", str(short), ok=False)
    assert refused.exit_code == 2, refused.output
    assert f"Error: {short} is incomplete:" in refused.output
    assert "nothing was imported" in refused.output and "Traceback" not in refused.output
    assert not (tmp_path / "z").exists()
    whole = Cli(tmp_path / "w")
    assert "facts 5 visible" in whole("restore", str(backup)).output


@pytest.mark.parametrize("running", [False, True], ids=["stopped-home", "running-node"])
def test_an_import_cut_short_between_two_blocks_imports_nothing(
    tmp_path: Path, node_factory, running: bool
) -> None:
    """``merklog import`` of a CAR cut exactly at a section boundary (a valid, shorter
    CAR) imported the deltas before the cut, silently dropped the fact blocks after the
    last of them and said ``accepted 0, duplicates 1`` with exit 0. Its roots name the
    heads it was exported at: one that is neither in it nor in the home makes the import
    bad input (exit 2), nothing of it applied, on a stopped home and through a running
    node (HTTP 400) alike. A CAR of a peer that is behind (roots the home has) imports."""
    from merklog.store.car import car_header, car_section, read_car

    a = Cli(tmp_path / "a")
    a("init")
    a("put", "n(1).", "n(1.0).")  # values keep their identity: two facts
    older = tmp_path / "older.car"
    a("export", str(older))
    b = Cli(tmp_path / "b")
    b("restore", str(older))
    a("put", "n(true).", 'n("1").', 'n(x"01").')
    later = tmp_path / "later.car"
    a("export", str(later))
    with open(later, "rb") as src:
        roots, blocks = read_car(src)
        sections = [car_section(cid, block) for cid, block in blocks]
    assert later.read_bytes() == car_header(roots) + b"".join(sections)
    # every block but the last delta: the new facts are there, the head that asserts them not
    short = tmp_path / "short.car"
    short.write_bytes(car_header(roots) + b"".join(sections[:-1]))
    heads = json.loads(b("status", "--json").output)["heads"]
    if running:
        node_factory(b.home).start()
    refused = b("import", str(short), ok=False)
    assert refused.exit_code == 2, refused.output
    assert f"Error: {short} is incomplete: 1 of the 1 head(s)" in refused.output
    assert "nothing was imported" in refused.output and "Traceback" not in refused.output
    assert _facts(b) == ["n(1)", "n(1.0)"]
    assert json.loads(b("status", "--json").output)["heads"] == heads
    assert "duplicates 1" in b("import", str(older)).output  # behind: its root is known
    assert "accepted 1" in b("import", str(later)).output
    assert _facts(b) == _facts(a) == sorted(['n("1")', "n(1)", "n(1.0)", "n(true)", 'n(x"01")'])


def test_import_says_the_facts_visible_after_it_as_restore_does(tmp_path: Path) -> None:
    """QA: ``import`` ended ``facts 40008`` for a CAR that left 9 facts visible: the count
    was of the accepted deltas' assert ops. It now says ``asserts N`` for that and
    ``facts M visible`` for what ``status`` counts after the import, as ``restore`` does."""
    a = Cli(tmp_path / "a")
    a("init")
    a("put", "n(0).")
    older = tmp_path / "older.car"
    a("export", str(older))
    b = Cli(tmp_path / "b")
    b("restore", str(older))
    a("put", "n(1).", "n(2).", "n(3).")
    a("retract", "n(0).", "n(1).", "n(2).")
    later = tmp_path / "later.car"
    a("export", str(later))
    out = b("import", str(later)).output
    visible = json.loads(b("status", "--json").output)["facts"]
    assert visible == 1 and _facts(b) == ["n(3)"]
    assert out.strip().endswith("accepted 2, duplicates 1, asserts 3; facts 1 visible"), out


def test_restore_and_import_read_a_car_piped_into_them(tmp_path: Path, node_factory) -> None:
    """QA: operations.md pipes ``export -`` through gzip, but ``restore -`` and ``import -``
    were refused ("File '-' does not exist"). Both now read the CAR from standard input,
    on a stopped home and through a running node; an empty pipe is bad input."""
    a = Cli(tmp_path / "a")
    a("init")
    a("put", "v(1).", "v(1.0).", "v(true).", 'v("1").', 'v(x"01").')

    def merklog(home: Path, *args: str, data: bytes) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "merklog.node.cli", "--home", str(home), *args]
        return subprocess.run(cmd, input=data, capture_output=True, timeout=120)

    car = merklog(a.home, "export", "-", data=b"").stdout
    key = str(a.home / "identity.pem")
    restored = merklog(tmp_path / "b", "restore", "-", "--identity", key, data=car)
    assert restored.returncode == 0, restored.stderr
    assert b"from standard input" in restored.stdout
    b = Cli(tmp_path / "b")
    assert _facts(b) == _facts(a) and len(_facts(a)) == 5
    a("put", "w(2).")
    node = node_factory(b.home).start()  # through the running node
    imported = merklog(b.home, "import", "-", data=merklog(a.home, "export", "-", data=b"").stdout)
    assert imported.returncode == 0, imported.stderr
    assert b"imported standard input: accepted 1" in imported.stdout, imported.stdout
    node.stop()
    assert _facts(b) == _facts(a)
    empty = merklog(b.home, "import", "-", data=b"")
    assert empty.returncode == 2 and b"held no CAR" in empty.stderr, empty.stderr
    assert b"Traceback" not in empty.stderr + imported.stderr + restored.stderr
