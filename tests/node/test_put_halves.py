"""``put -f`` and ``retract -f`` through a running node read a large input in two halves
at once, the second by a forked helper process (ADR 0157): real ``merklog`` processes, a
real node, real SQLite homes. What is sent, stored and printed is what one process
gives, a syntax error in either half still writes nothing and names its place in the
whole file, and a helper that dies is replaced."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Cli, answered_posts, as_printed, put_script, reaped

# The helper kills itself (a real SIGKILL) before it says anything.
KILL_IN_HELPER = (
    "import os, signal\n"
    "def dying(*args):\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "    yield None\n"
    "put._half_in_helper = dying\n"
)
# The helper reads its half and says how many facts it holds, then is killed (SIGKILL)
# before it sends their rendering, which the put takes only when a request needs it.
KILL_AFTER_COUNT = (
    "import os, signal\n"
    "_real_half = put._half_in_helper\n"
    "def dying(text, mid):\n"
    "    items = _real_half(text, mid)\n"
    "    yield next(items)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "put._half_in_helper = dying\n"
)
# Values Python's == merges (1, 1.0, true) beside look-alikes, in the spellings the line
# reader takes; -0.0 is normalised by the checks (printed as 0.0).
VALUES = ["1", "1.0", "true", '"1"', "-0.5", '"x"', "9223372036854775807", "false", "-0.0"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork on Linux")


def _merklog(
    home: Path, *args: str, helper: bool = True, extra: str = ""
) -> subprocess.CompletedProcess:
    env = {**os.environ, "MERKLOG_PUT_HELPER": "1" if helper else "0"}
    script = put_script("SPLIT_FROM_CHARS", extra)
    return subprocess.run(
        [sys.executable, "-c", script, "1000", "-v", "--home", str(home), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _helper_pid(stderr: str) -> int | None:
    found = re.search(r"helper process (\d+) reads the second half", stderr)
    return int(found.group(1)) if found else None


def _printed(stdout: str) -> list[tuple[str, ...]]:
    return [tuple(line.split("\t")) for line in stdout.splitlines() if "\t" in line]


def _rows(home: Path, query: str) -> list[str]:
    result = _merklog(home, "query", "--json", query)
    assert result.returncode == 0, result.stderr
    return sorted(map(json.dumps, json.loads(result.stdout)["rows"]))


def _node_home(tmp_path: Path, name: str, node_factory) -> Path:
    """A home whose running node takes bodies of at most 4 KiB (a quarter of its body
    limit), so a few thousand facts go in many requests, one of them across the middle."""
    home = tmp_path / name
    Cli(home)("--set", "node.max_body=16384", "init")
    node_factory(home).start()
    return home


def test_halves_send_store_and_print_what_one_process_does(tmp_path: Path, node_factory) -> None:
    """Mixed-type facts with repeats, put and then partly retracted (one retract of a
    fact never put): with the helper and without it, the same output (CIDs in input
    order, facts as given but -0.0 as 0.0), the same exit status and the same facts on the node."""
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(3000)]
    lines += lines[100:400]  # repeats, in the second half
    lines += ["w(1, 1).", "w(1, 1.0).", "w(1, true).", 'w(1, "1").']
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    gone = tmp_path / "gone.dl"
    gone.write_text("\n".join([*lines[:3000:3], "v(-1, 2)."]) + "\n")
    homes = [_node_home(tmp_path, name, node_factory) for name in ("a", "b")]
    puts = [_merklog(h, "put", "-f", str(data), helper=h.name == "a") for h in homes]
    assert puts[0].returncode == 0 == puts[1].returncode, puts[0].stderr + puts[1].stderr
    pid = _helper_pid(puts[0].stderr)
    assert pid is not None and reaped(pid), puts[0].stderr
    assert _helper_pid(puts[1].stderr) is None
    assert puts[0].stdout == puts[1].stdout
    printed = _printed(puts[0].stdout)
    assert [fact + "." for _cid, fact in printed] == as_printed(lines)
    assert len({cid for cid, fact in printed if fact.startswith("w(")}) == 4
    assert _rows(homes[0], "v(X, Y)") == _rows(homes[1], "v(X, Y)")
    assert len(_rows(homes[0], "v(X, Y)")) == 3000

    retracts = [_merklog(h, "retract", "-f", str(gone), helper=h.name == "a") for h in homes]
    assert retracts[0].returncode == retracts[1].returncode != 0
    assert _helper_pid(retracts[0].stderr) is not None
    assert retracts[0].stdout == retracts[1].stdout
    assert "not visible, nothing to retract: v(-1, 2)" in retracts[0].stderr
    assert "Traceback" not in retracts[0].stderr
    assert _rows(homes[0], "v(X, Y)") == _rows(homes[1], "v(X, Y)")
    assert len(_rows(homes[0], "v(X, Y)")) == 2000


@pytest.mark.parametrize("where", [700, 2600], ids=["first-half", "second-half"])
def test_a_syntax_error_in_either_half_writes_nothing(
    tmp_path: Path, node_factory, where: int
) -> None:
    """One bad line in either half: exit 2, one line naming its place in the whole file,
    nothing printed, no fact of the input on the node, the helper gone."""
    home = _node_home(tmp_path, "h", node_factory)
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(3000)]
    lines[where] = f"v({where}, )."
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    result = _merklog(home, "put", "-f", str(data))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and not _printed(result.stdout)
    col = len(f"v({where}, ") + 1
    assert f"{where + 1}:{col}: expected a term" in result.stderr, result.stderr
    pid = _helper_pid(result.stderr)
    assert pid is not None and reaped(pid)
    query = _merklog(home, "query", "v(X, Y)")
    assert query.returncode == 3 and "unknown relation v/2" in query.stderr  # no v fact


def test_a_second_half_in_other_spellings_is_read_by_the_parser(
    tmp_path: Path, node_factory
) -> None:
    """``x"01"`` and a fact over two lines in the second half (outside the line reader's
    shape): the whole input is read by the parser here, with the output of one process."""
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(3000)]
    lines[2500] = 'v(2500, x"01").'
    lines[2700] = "v(2700,\n 5)."
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    homes = [_node_home(tmp_path, name, node_factory) for name in ("a", "b")]
    puts = [_merklog(h, "put", "-f", str(data), helper=h.name == "a") for h in homes]
    assert puts[0].returncode == 0 == puts[1].returncode, puts[0].stderr
    assert _helper_pid(puts[0].stderr) is not None
    assert puts[0].stdout == puts[1].stdout
    assert len(_printed(puts[0].stdout)) == 3000
    assert _rows(homes[0], "v(X, Y)") == _rows(homes[1], "v(X, Y)")


@pytest.mark.parametrize("kill", [KILL_IN_HELPER, KILL_AFTER_COUNT], ids=["at-once", "after-count"])
def test_a_helper_that_dies_is_replaced_by_reading_here(
    tmp_path: Path, node_factory, kill: str
) -> None:
    """The helper is killed (SIGKILL) before it says anything, or once it has sent its
    count but not its facts' rendering: this process reads the second half itself, and
    the put gives the output of one process."""
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(3000)]
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    homes = [_node_home(tmp_path, name, node_factory) for name in ("a", "b")]
    got = _merklog(homes[0], "put", "-f", str(data), extra=kill)
    want = _merklog(homes[1], "put", "-f", str(data), helper=False)
    assert got.returncode == 0 == want.returncode, got.stderr
    pid = _helper_pid(got.stderr)
    assert pid is not None and reaped(pid)
    assert got.stdout == want.stdout
    assert [fact + "." for _cid, fact in _printed(got.stdout)] == as_printed(lines)


def test_put_through_a_node_sizes_its_requests_by_their_json_bytes(tmp_path, node_factory):
    """Requests were cut at a quarter of ``node.max_body`` characters of text, assuming
    JSON escaping at most doubles it; a raw control character takes six bytes and an
    astral character took twelve (``\\ud83d\\ude00``), so facts a stopped home takes
    were refused with 413 through a running node (exit 2, the chunks before kept)."""
    run = Cli(tmp_path / "h")
    run("--set", "node.max_body=65536", "init")
    node = node_factory(run.home).start()
    lines = [f'ctl({i}, "{chr(1) * 5000}").' for i in range(6)]
    lines += [f'emoji({i}, "{chr(0x1F600) * 4000}").' for i in range(6)]
    path = tmp_path / "wide.dl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run("put", "-f", str(path))
    assert len(result.output.splitlines()) == 12
    status, page = node.request("GET", "/v1/facts?limit=100")
    assert status == 200 and len(page["facts"]) == 12


def test_quiet_puts_and_retracts_through_a_node_store_what_printing_ones_do(
    tmp_path: Path, node_factory
) -> None:
    """``put -q`` and ``retract -q`` through a running node, the input read in two
    halves: nothing on stdout, the same exit status and the same facts on the node as
    the printing commands (mixed-type values, repeats), and a retract of a fact that is
    not visible still says so (exit 3 either way)."""
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(3000)]
    lines += lines[100:400] + ["w(1, 1).", "w(1, 1.0).", "w(1, true).", 'w(1, "1").']
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    gone = tmp_path / "gone.dl"
    gone.write_text("\n".join([*lines[:3000:3], "v(-1, 2)."]) + "\n")
    loud, quiet = (_node_home(tmp_path, name, node_factory) for name in ("loud", "quiet"))
    printed = _merklog(loud, "put", "-f", str(data))
    silent = _merklog(quiet, "put", "-q", "-f", str(data))
    assert printed.returncode == 0 == silent.returncode, printed.stderr + silent.stderr
    assert len(_printed(printed.stdout)) == len(lines) and silent.stdout == ""
    assert _helper_pid(silent.stderr) is not None  # the halves path, not a shortcut
    assert "Traceback" not in silent.stderr
    for query in ("v(X, Y)", "w(X, Y)"):
        assert _rows(loud, query) == _rows(quiet, query)
    assert len(_rows(quiet, "w(X, Y)")) == 4
    retracts = [
        _merklog(h, "retract", *q, "-f", str(gone)) for h, q in ((loud, []), (quiet, ["-q"]))
    ]
    assert retracts[0].returncode == retracts[1].returncode == 3  # not visible
    assert retracts[1].stdout == "" and len(_printed(retracts[0].stdout)) == 1000
    assert "not visible, nothing to retract: v(-1, 2)" in retracts[1].stderr
    assert _rows(loud, "v(X, Y)") == _rows(quiet, "v(X, Y)")
    assert len(_rows(quiet, "v(X, Y)")) == 2000


def test_a_put_through_a_node_is_sent_in_quarters(tmp_path: Path, node_factory) -> None:
    """ADR 0194: a put through a running node of at least ``SPLIT_FROM_LINES`` lines (1,000
    here) into a node that holds fewer facts is sent as four requests of a quarter of its
    facts, so the node decodes one while it writes another from the first request on.
    Mixed-type facts: the output and the facts on the node are those of the same input
    sent as one request. Into a node that holds more facts than the input, one request."""
    lines = [f"v({i}, {VALUES[i % len(VALUES)]})." for i in range(2000)]
    data = tmp_path / "facts.dl"
    data.write_text("\n".join(lines) + "\n")
    homes, nodes = [], []
    for name in ("quarters", "one"):
        home = tmp_path / name
        Cli(home)("init")
        homes.append(home)
        nodes.append(node_factory(home).start())
    before = [answered_posts(node, "/v1/facts") for node in nodes]
    split = {"quarters": "put.SPLIT_FROM_LINES = 1000\n", "one": "put.SPLIT_FROM_LINES = 10**9\n"}
    puts = [_merklog(h, "put", "-f", str(data), extra=split[h.name]) for h in homes]
    assert puts[0].returncode == 0 == puts[1].returncode, puts[0].stderr + puts[1].stderr
    assert [
        answered_posts(node, "/v1/facts") - n for node, n in zip(nodes, before, strict=True)
    ] == [4, 1]
    assert puts[0].stdout == puts[1].stdout
    assert [fact + "." for _cid, fact in _printed(puts[0].stdout)] == as_printed(lines)
    assert _rows(homes[0], "v(X, Y)") == _rows(homes[1], "v(X, Y)")
    assert len(_rows(homes[0], "v(X, Y)")) == 2000
    # 1,500 more lines into a node that holds 2,000 facts: one request (its commits
    # would cost more than the earlier start saves).
    more = tmp_path / "more.dl"
    more.write_text("".join(f"w({i}).\n" for i in range(1500)))
    before = answered_posts(nodes[0], "/v1/facts")
    put = _merklog(homes[0], "put", "-f", str(more), extra=split["quarters"])
    assert put.returncode == 0, put.stderr
    assert answered_posts(nodes[0], "/v1/facts") - before == 1
