"""``merklog ls``: every visible fact as ``CID<TAB>fact``, sorted by the fact's text, the
same lines on a stopped home and through a running node (``GET /v1/facts`` pages of
``FACTS_PAGE_MAX``), each rendered exactly as ``str(fact)`` and ``str(cid)`` render it —
also for values the bulk renderer hands back to ``format_value`` (bytes, links, strings
with quotes, backslashes and control characters) and values equal in Python (1, 1.0,
true)."""

from __future__ import annotations

from pathlib import Path

from merklog.node.factpages import FACTS_PAGE_MAX
from merklog.store import fact_cid, make_fact

from .conftest import Cli

VALUES = [1, 1.0, True, "1", b"\x01", -0.0, 2**63 - 1, 'a "q"', "b\\s", "t\tn\n", "]["]


def _expected(facts: list) -> list[str]:
    return sorted((f"{fact_cid(f)}\t{f}" for f in facts), key=lambda line: line.split("\t")[1])


def test_ls_prints_each_fact_as_its_one_rendering(tmp_path: Path, node_factory) -> None:
    home = tmp_path / "h"
    run = Cli(home)
    run("init")
    link = fact_cid(make_fact("p", (1,)))
    facts = [make_fact("p", (v,)) for v in [*VALUES, link]]
    facts += [make_fact("q", (i, VALUES[i % len(VALUES)])) for i in range(FACTS_PAGE_MAX + 5)]
    text = "\n".join(f"{f}." for f in facts) + "\n"
    (tmp_path / "f.dl").write_text(text)
    run("put", "-f", str(tmp_path / "f.dl"))
    stopped_p = run("ls", "p").output.splitlines()
    stopped_all = run("ls").output.splitlines()
    assert stopped_p == _expected(facts[: len(VALUES) + 1])
    assert stopped_all == _expected(facts)
    node_factory(home).start()
    assert run("ls", "p").output.splitlines() == stopped_p
    assert run("ls").output.splitlines() == stopped_all  # two pages of q through the node


def test_ls_whose_reader_goes_away_exits_141_also_unbuffered(tmp_path: Path) -> None:
    """``merklog ls | head -1`` exited 0 under ``PYTHONUNBUFFERED=1`` (many container
    images set it): standard output was a text layer straight on the descriptor, which
    took the kernel's partial write of the first 64 KiB as the whole and dropped the
    rest. It exits 141, as ``query`` did, and a reader that reads on gets every line."""
    import os
    import subprocess
    import sys

    home = tmp_path / "h"
    run = Cli(home)
    run("init")
    (tmp_path / "f.dl").write_text("".join(f'p({i}, "{"x" * 40}").\n' for i in range(6000)))
    run("put", "-q", "-f", str(tmp_path / "f.dl"))
    command = [sys.executable, "-m", "merklog.node.cli", "--home", str(home), "ls"]
    for unbuffered in ("1", ""):
        env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(10)  # then the reader goes away, as `head -c 10`
        proc.stdout.close()
        assert proc.wait(timeout=60) == 141, (unbuffered, proc.stderr.read())
        assert proc.stderr.read() == b""
        whole = subprocess.run(command, capture_output=True, env=env, timeout=60)
        assert whole.returncode == 0 and len(whole.stdout.splitlines()) == 6000
