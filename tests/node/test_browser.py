"""The checklist example in headless Chromium: two nodes, two pages, live updates via SSE."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Cli

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
