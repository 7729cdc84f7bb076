"""The checklist example in headless Chromium: two nodes, two pages, live updates via SSE."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Cli

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "checklist"
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium missing: run tests/setup.d/30-chromium.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def start_checklist_node(home: Path, node_factory):
    run = Cli(home)
    run("init")
    run("put", "-f", str(EXAMPLE / "items.dl"))
    run("load", str(EXAMPLE / "checklist.dl"))
    return node_factory(
        home, "--static-dir", str(EXAMPLE / "static"), "--epoch-interval", "0.5"
    ).start()


def box_state(page, item_id: str) -> bool:
    return page.locator(f'input[data-id="{item_id}"]').is_checked()


def test_click_shows_live_on_the_same_page(tmp_path: Path, node_factory, browser) -> None:
    node = start_checklist_node(tmp_path / "a", node_factory)
    page = browser.new_page()
    page.goto(f"{node.url}/#token={node.token}")
    page.wait_for_selector('input[data-id="milk"]', timeout=15000)
    assert not box_state(page, "milk")
    page.locator('input[data-id="milk"]').click()
    page.wait_for_function(
        "document.querySelector('input[data-id=\"milk\"]').checked "
        "&& document.querySelector('label.done') !== null",
        timeout=15000,
    )
    # The server agrees: one click, box checked.
    _, q = node.request("GET", "/v1/query?q=checkbox(%22milk%22,%20S)")
    assert q["rows"] == [[True]]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "checklist-one-node.png"))
    page.close()


def test_two_nodes_two_pages_offline_toggles_merge_after_sync(
    tmp_path: Path, node_factory, browser
) -> None:
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    na = start_checklist_node(a.home, node_factory)
    b("init", "--join", na.url)
    b("load", str(EXAMPLE / "checklist.dl"))
    nb = node_factory(b.home, "--static-dir", str(EXAMPLE / "static"), "--epoch-interval", "0.5")
    nb.start()
    a("peers", "add", "b", nb.url, "--writer")
    b("peers", "add", "a", na.url)
    b("sync", "a")
    pa, pb = browser.new_page(), browser.new_page()
    pa.goto(f"{na.url}/#token={na.token}")
    pb.goto(f"{nb.url}/#token={nb.token}")
    for page in (pa, pb):
        page.wait_for_selector('input[data-id="bike"]', timeout=15000)
    # Both toggle while not syncing ("offline" from each other): different items.
    pa.locator('input[data-id="milk"]').click()
    pb.locator('input[data-id="bike"]').click()
    pa.wait_for_function("document.querySelector('input[data-id=\"milk\"]').checked")
    pb.wait_for_function("document.querySelector('input[data-id=\"bike\"]').checked")
    assert not box_state(pb, "milk") and not box_state(pa, "bike")
    # Sync from page B's own button; both pages update live via SSE.
    pb.fill("#peer", na.url)
    pb.click("#sync button")
    for page in (pa, pb):
        page.wait_for_function(
            "document.querySelector('input[data-id=\"milk\"]').checked && "
            "document.querySelector('input[data-id=\"bike\"]').checked",
            timeout=15000,
        )
    assert not box_state(pa, "bread") and not box_state(pb, "bread")
    ARTIFACTS.mkdir(exist_ok=True)
    pa.screenshot(path=str(ARTIFACTS / "checklist-node-a.png"))
    pb.screenshot(path=str(ARTIFACTS / "checklist-node-b.png"))
