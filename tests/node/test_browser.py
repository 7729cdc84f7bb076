"""The checklist example in headless Chromium against real nodes: live updates, writes
made while the node is down kept in IndexedDB and replayed, add-wins ticks on two devices,
and the sync indicator (online/offline, last synced, pending writes, peers)."""

from __future__ import annotations

import socket
import time
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
BOX = "document.querySelector('input[data-id=\"{}\"]')"
# Null-safe: a predicate that throws (the list not rendered yet) fails the wait at once.
CHECKED = "(" + BOX + "?.checked === true)"
UNCHECKED = "(" + BOX + "?.checked === false)"


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium missing: run tests/setup.d/30-chromium.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(home: Path, node_factory, port: int | None = None):
    extra = ("--port", str(port)) if port else ()
    return node_factory(
        home, "--static-dir", str(EXAMPLE / "static"), "--epoch-interval", "0.5", *extra
    ).start()


def start_checklist_node(home: Path, node_factory, port: int | None = None):
    run = Cli(home)
    run("init")
    run("put", "-f", str(EXAMPLE / "items.dl"))
    run("load", str(EXAMPLE / "checklist.dl"))
    return serve(home, node_factory, port)


def box_state(page, item_id: str) -> bool:
    return page.locator(f'input[data-id="{item_id}"]').is_checked()


def indicator(page) -> str:
    return page.get_attribute("#indicator", "data-state") or ""


def open_app(context_or_browser, node):
    page = context_or_browser.new_page()
    page.goto(f"{node.url}/#token={node.token}")
    page.wait_for_selector('input[data-id="milk"]', timeout=15000)
    page.wait_for_function("document.getElementById('indicator').dataset.state === 'online'")
    return page


def test_click_shows_live_on_the_same_page(tmp_path: Path, node_factory, browser) -> None:
    node = start_checklist_node(tmp_path / "a", node_factory)
    page = open_app(browser, node)
    assert not box_state(page, "milk")
    page.locator('input[data-id="milk"]').click()
    page.wait_for_function(
        CHECKED.format("milk") + " && document.querySelector('label.done') !== null "
        "&& document.getElementById('pending').textContent === '0'",
        timeout=15000,
    )
    _, q = node.request("GET", "/v1/query?q=checkbox(%22milk%22,%20S)")
    assert q["rows"] == [[True]]
    # Unticking retracts done("milk"): set semantics, not a click count.
    page.locator('input[data-id="milk"]').click()
    deadline = time.monotonic() + 15
    while node.request("GET", "/v1/query?q=done(X)")[1]["rows"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert node.request("GET", "/v1/query?q=done(X)")[1]["rows"] == []
    page.wait_for_function(UNCHECKED.format("milk"), timeout=15000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "checklist-one-node.png"))
    page.close()


def test_edits_while_the_node_is_down_are_kept_and_replayed(
    tmp_path: Path, node_factory, browser
) -> None:
    port = _free_port()
    home = tmp_path / "a"
    node = start_checklist_node(home, node_factory, port)
    context = browser.new_context()
    page = open_app(context, node)
    node.stop()
    page.wait_for_function(
        "document.getElementById('indicator').dataset.state === 'offline'", timeout=15000
    )
    page.locator('input[data-id="milk"]').click()
    page.locator('input[data-id="bike"]').click()
    page.wait_for_function("document.getElementById('pending').textContent === '2'")
    assert box_state(page, "milk") and box_state(page, "bike")  # shown, marked pending
    assert page.locator("label.pending").count() == 2
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "checklist-offline.png"))
    # Close the page: the writes live in IndexedDB only. The node comes back, a new page
    # of the same browser profile replays them.
    page.close()
    node = serve(home, node_factory, port)
    _, q = node.request("GET", "/v1/query?q=done(X)")
    assert q["rows"] == []
    page = context.new_page()
    page.goto(f"{node.url}/#token={node.token}")
    page.wait_for_function(
        "document.getElementById('pending').textContent === '0' && "
        + CHECKED.format("milk")
        + " && "
        + CHECKED.format("bike")
        + " && document.querySelector('label.pending') === null",
        timeout=20000,
    )
    assert indicator(page) == "online"
    _, q = node.request("GET", "/v1/query?q=done(X)")
    assert sorted(q["rows"]) == [["bike"], ["milk"]]
    context.close()


def test_two_devices_ticking_the_same_item_apart_end_ticked(
    tmp_path: Path, node_factory, browser
) -> None:
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    na = start_checklist_node(a.home, node_factory)
    b("init", "--join", na.url, "--token", na.read_token)
    b("load", str(EXAMPLE / "checklist.dl"))
    nb = serve(b.home, node_factory)
    a("peers", "add", "b", nb.url, "--writer", "--token", nb.read_token)
    b("peers", "add", "a", na.url, "--token", na.read_token)
    b("sync", "a")
    pa, pb = open_app(browser, na), open_app(browser, nb)
    pb.wait_for_function("document.getElementById('peers').textContent.includes('a')")
    synced_before = float(pb.get_attribute("#synced", "data-ts") or 0)
    assert synced_before > 0  # B's node synced with A (the CLI sync above)
    # Apart (no sync): both tick bread, and each ticks one other item.
    for page, other in ((pa, "milk"), (pb, "bike")):
        page.locator('input[data-id="bread"]').click()
        page.locator(f'input[data-id="{other}"]').click()
        page.wait_for_function("document.getElementById('pending').textContent === '0'")
    assert not box_state(pb, "milk") and not box_state(pa, "bike")
    # Sync from page B's button; both pages follow live.
    pb.fill("#peer", "a")
    pb.click("#sync button")
    everything = " && ".join(CHECKED.format(i) for i in ("bread", "milk", "bike"))
    for page in (pa, pb):
        page.wait_for_function(everything, timeout=15000)
    for node in (na, nb):
        _, q = node.request("GET", "/v1/query?q=checkbox(%22bread%22,%20S)")
        assert q["rows"] == [[True]]
    # The indicator: B's last sync is now set, its peer listed.
    pb.wait_for_function(
        f"Number(document.getElementById('synced').dataset.ts) > {synced_before}", timeout=15000
    )
    assert pb.text_content("#peers") == "a" and indicator(pb) == "online"
    ARTIFACTS.mkdir(exist_ok=True)
    pa.screenshot(path=str(ARTIFACTS / "checklist-node-a.png"))
    pb.screenshot(path=str(ARTIFACTS / "checklist-node-b.png"))
