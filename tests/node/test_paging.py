"""``Node.page_facts`` (behind ``GET /v1/facts`` and ``merklog ls`` through a running
node): pages follow CID order from the cursor, skip retracted facts, filter by relation
and together list exactly the visible facts, across the internal read batches."""

from __future__ import annotations

from pathlib import Path

import merklog
from merklog.store import fact_cid, make_fact

from .conftest import all_pages

MIXED = [1, 1.0, True, "1", b"\x01"]


def test_pages_list_exactly_the_visible_facts_in_cid_order(tmp_path: Path) -> None:
    with merklog.open(tmp_path / "home") as node:
        node.write(asserts=[("n", (i, float(i), str(i))) for i in range(2600)])
        node.write(asserts=[("v", (x,)) for x in MIXED] + [("nn", (1,)), ("vv", ("v",))])
        node.retract("n", 7, 7.0, "7")
        node.retract("v", True)
        visible = sorted(node.list_facts(), key=lambda cf: cf[0])
        assert len(visible) == 2599 + 4 + 2
        for limit in (700, 1000, 5000):
            listed, _pages = all_pages(node, None, limit)
            assert listed == visible
        v_pages, pages = all_pages(node, "v", 3)
        assert [f for _c, f in v_pages] == [f for _c, f in visible if f.rel == "v"]
        assert pages == 2 and fact_cid(make_fact("v", [True])) not in dict(v_pages)
        n_pages, pages = all_pages(node, "n", 700)  # pages cross the 1,000-CID read batches
        assert len(n_pages) == 2599 and pages == 4
        assert [c for c, _f in n_pages] == sorted(c for c, _f in n_pages)
        # a page ends exactly at the last fact: no cursor to an empty page
        last, cursor = node.page_facts(None, visible[-2][0], 1)
        assert last == [visible[-1]] and cursor is None
        assert node.page_facts("missing", None, 10) == ([], None)
