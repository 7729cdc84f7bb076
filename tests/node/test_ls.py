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
