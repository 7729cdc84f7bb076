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


@pytest.fixture(scope="module")
def _chromium():
    """One headless Chromium for the module: a launch takes 1-3 s, and every test works
    in contexts of its own (``new_page`` opens one too), which share no storage."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium missing: run tests/setup.d/30-chromium.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def browser(_chromium):
    """The module's Chromium; the contexts (and pages) a test opened and left open are
    closed after it, so no page of it polls on into the next test."""
    before = set(_chromium.contexts)
    yield _chromium
    for context in _chromium.contexts:
        if context not in before:
            context.close()


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
    # A's page counts that sync too, although B started it (A's peer b: last_incoming).
    pa.wait_for_function("Number(document.getElementById('synced').dataset.ts) > 0", timeout=15000)
    a_synced_before = float(pa.get_attribute("#synced", "data-ts") or 0)
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
    pa.wait_for_function(
        f"Number(document.getElementById('synced').dataset.ts) > {a_synced_before}",
        timeout=15000,
    )
    ARTIFACTS.mkdir(exist_ok=True)
    pa.screenshot(path=str(ARTIFACTS / "checklist-node-a.png"))
    pb.screenshot(path=str(ARTIFACTS / "checklist-node-b.png"))


def _status_polls(page) -> list[int]:
    """A list that grows by one each time the page's status poll is answered."""
    polls: list[int] = []
    page.on("response", lambda r: polls.append(1) if r.url.endswith("/v1/status") else None)
    return polls


def _wait_polls(page, polls: list[int], n: int) -> None:
    """Let the page answer ``n`` more status polls (each used to re-render the list)."""
    target = len(polls) + n
    deadline = time.monotonic() + 30
    while len(polls) < target:
        assert time.monotonic() < deadline, "the page stopped polling its node"
        page.wait_for_timeout(100)


def test_refreshes_never_lose_a_click_or_the_focus(tmp_path: Path, node_factory, browser) -> None:
    """The page used to rebuild the whole list every second: an idle page mutated it, a
    box replaced between press and release lost the click, and a focused box lost the
    focus (Space then did nothing). Now an idle page leaves the list alone, and items
    are updated in place, even when the list does change during a click."""
    node = start_checklist_node(tmp_path / "a", node_factory)
    page = open_app(browser, node)
    polls = _status_polls(page)
    page.evaluate(
        "window.__mutations = 0; new MutationObserver((l) => { window.__mutations += l.length })"
        ".observe(document.getElementById('items'),"
        " {childList: true, subtree: true, attributes: true, characterData: true})"
    )
    _wait_polls(page, polls, 3)
    assert page.evaluate("window.__mutations") == 0  # idle: nothing re-rendered

    # A press held across status polls and a real change of another item: it counts.
    box = page.locator('input[data-id="milk"]').bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    status, _ = node.request("POST", "/v1/facts", {"assert": 'done("bread").'})
    assert status == 200
    page.wait_for_function(CHECKED.format("bread"), timeout=15000)
    _wait_polls(page, polls, 2)
    page.mouse.up()
    page.wait_for_function(
        CHECKED.format("milk") + " && document.getElementById('pending').textContent === '0'",
        timeout=15000,
    )
    _, q = node.request("GET", "/v1/query?q=done(X)")
    assert sorted(q["rows"]) == [["bread"], ["milk"]]

    # Keyboard: a focused box keeps the focus across refreshes, and Space ticks it.
    page.focus('input[data-id="bike"]')
    _wait_polls(page, polls, 2)
    assert page.evaluate("document.activeElement.dataset.id") == "bike"
    page.keyboard.press("Space")
    page.wait_for_function(CHECKED.format("bike"), timeout=15000)
    deadline = time.monotonic() + 15
    while ["bike"] not in node.request("GET", "/v1/query?q=done(X)")[1]["rows"]:
        assert time.monotonic() < deadline, "Space on the focused box sent no write"
        time.sleep(0.1)
    page.close()


def test_a_missing_or_wrong_token_is_shown_and_the_writes_kept(
    tmp_path: Path, node_factory, browser
) -> None:
    """Opened without a token, with a wrong one or the read token, the page said
    "offline (writes are kept and sent later)" and then dropped the writes as
    unauthorized. It now says what is wrong with the token and keeps the writes, which
    a page opened with the write token sends."""
    node = start_checklist_node(tmp_path / "a", node_factory)
    context = browser.new_context()
    page = context.new_page()
    reason = "document.getElementById('indicator').dataset.reason === '{}'"
    unauthorized = "document.getElementById('indicator').dataset.state === 'unauthorized' && "

    page.goto(f"{node.url}/")
    page.wait_for_function(unauthorized + reason.format("missing"), timeout=15000)
    assert "no token" in page.text_content("#conn")
    page.fill("#text", "Water the plants")
    page.click("#add button")
    page.wait_for_function("document.getElementById('pending').textContent === '1'")

    page.goto(f"{node.url}/#token=not-the-token")  # same page: the fragment changes
    page.wait_for_function(unauthorized + reason.format("wrong"), timeout=15000)
    assert "token refused" in page.text_content("#conn")

    page.goto(f"{node.url}/#token={node.read_token}")
    page.wait_for_selector('input[data-id="milk"]', timeout=15000)  # it reads
    page.wait_for_function(unauthorized + reason.format("readonly"), timeout=15000)
    assert "read-only token" in page.text_content("#conn")
    assert "offline" not in page.text_content("#conn")
    assert page.text_content("#pending") == "1"
    assert page.locator("label.pending").count() == 1  # the item, not sent yet
    assert "dropped" not in page.text_content("#message")
    _, q = node.request("GET", "/v1/query?q=item(X,%20%22Water%20the%20plants%22)")
    assert q["rows"] == []
    page.close()

    page = context.new_page()  # reopened with the write token: the write is sent
    page.goto(f"{node.url}/#token={node.token}")
    page.wait_for_function(
        "document.getElementById('pending').textContent === '0' && "
        "document.getElementById('indicator').dataset.state === 'online' && "
        "[...document.querySelectorAll('#items span')]"
        ".some((s) => s.textContent.includes('Water the plants'))",
        timeout=20000,
    )
    _, q = node.request("GET", "/v1/query?q=item(X,%20%22Water%20the%20plants%22)")
    assert len(q["rows"]) == 1
    context.close()


def test_a_write_this_node_may_not_make_yet_is_kept_until_a_grant_arrives(
    tmp_path: Path, node_factory, browser
) -> None:
    """On a device that joined the list and was not granted, every click was answered
    403 and the app dropped the write with a message. It keeps such writes now, says why,
    and sends them once a writer's grant has reached the device by sync."""
    na = start_checklist_node(tmp_path / "a", node_factory)
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    b("init", "--join", na.url, "--token", na.read_token)
    b("load", str(EXAMPLE / "checklist.dl"))
    nb = serve(tmp_path / "b", node_factory)
    a("peers", "add", "b", nb.url, "--token", nb.read_token)  # may sync, may not write
    b("peers", "add", "a", na.url, "--token", na.read_token)
    b("sync", "a")
    page = open_app(browser, nb)
    page.fill("#text", "Water the plants")
    page.click("#add button")
    # Both read in one evaluation: each status poll clears the reason (a grant may have
    # arrived) until the retried write is refused again, so two reads could straddle it.
    page.wait_for_function(
        "document.getElementById('indicator').dataset.reason === 'notwriter'"
        " && document.getElementById('conn').textContent.includes('not a writer')",
        timeout=15000,
    )
    time.sleep(2.5)  # refused again on the status polls meanwhile: still kept
    assert page.text_content("#pending") == "1"
    assert "dropped" not in page.text_content("#message")

    a("writers", "grant", "b")
    b("sync", "a")  # the grant reaches the device; the next poll sends the write
    page.wait_for_function(
        "document.getElementById('pending').textContent === '0' && "
        "document.getElementById('indicator').dataset.state === 'online'",
        timeout=15000,
    )
    _, q = nb.request("GET", "/v1/query?q=item(X,%20%22Water%20the%20plants%22)")
    assert len(q["rows"]) == 1
    page.close()


def test_a_node_running_no_program_is_said_on_the_page(
    tmp_path: Path, node_factory, browser
) -> None:
    """QA: on a device whose node runs no program (or a failing one) the live query is
    refused, the list stayed empty under "online", and nothing said why. The page says
    so, and the line goes once the program is loaded."""
    run = Cli(tmp_path / "h")
    run("init")
    run("put", "-f", str(EXAMPLE / "items.dl"))
    node = serve(run.home, node_factory)
    page = browser.new_page()
    page.goto(f"{node.url}/#token={node.token}")
    page.wait_for_function(
        "document.getElementById('message').textContent.includes('runs no program')",
        timeout=15000,
    )
    run("load", str(EXAMPLE / "checklist.dl"))
    page.wait_for_selector('input[data-id="milk"]', timeout=15000)
    page.wait_for_function("document.getElementById('message').textContent === ''")


def test_values_of_any_type_rows_of_one_id_and_two_tabs(
    tmp_path: Path, node_factory, browser
) -> None:
    """QA, with real writes another app could make: an item whose text was a number
    threw in every render and emptied the list on every device; ids 1, 1.0, true, "1"
    and x"01" merged into fewer rows and a click on some of them threw and was lost;
    retracting one of two texts of an id removed both rows; the read token showed
    "online" until the first click; and two open tabs each sent the shared queue, so
    writes went to the node twice. Each is fixed and checked here."""
    port = _free_port()
    home = tmp_path / "a"
    node = start_checklist_node(home, node_factory, port)
    errors: list[str] = []
    context = browser.new_context()
    page = open_app(context, node)
    page.on("pageerror", lambda e: errors.append(str(e)))
    body = 'item("num", 42). item(1, "id 1"). item(1.0, "id 1.0"). item(true, "id true").'
    body += ' item("1", "id string"). item(x"01", "id bytes").'
    body += ' item("dup", "Dup one"). item("dup", "Dup two").'
    assert node.request("POST", "/v1/facts", {"assert": body})[0] == 200
    texts = "[...document.querySelectorAll('#items span')].map((s) => s.textContent.trim())"
    page.wait_for_function(
        f"{texts}.includes('42') && {texts}.filter((t) => t.startsWith('id ')).length === 5"
        f" && {texts}.includes('Dup one') && {texts}.includes('Dup two')",
        timeout=15000,
    )
    # A click on the float id ticks done(1.0), not done(1) or done("1").
    page.locator("li", has_text="id 1.0").locator("input").click()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        _, q = node.request("GET", "/v1/query?q=done(X)")
        if q["rows"]:
            break
        time.sleep(0.1)
    assert q["rows"] == [[1.0]] and isinstance(q["rows"][0][0], float), q
    assert node.request("POST", "/v1/facts", {"retract": 'item("dup", "Dup one").'})[0] == 200
    page.wait_for_function(
        f"!{texts}.includes('Dup one') && {texts}.includes('Dup two')", timeout=15000
    )
    assert errors == []
    page.close()

    reader = context.new_page()  # the read token: said at once, before any click
    reader.goto(f"{node.url}/#token={node.read_token}")
    reader.wait_for_function(
        "document.getElementById('indicator').dataset.reason === 'readonly'", timeout=15000
    )
    reader.close()

    # Two tabs of one browser, writes queued while the node is down: sent once each.
    tabs = [open_app(context, node), open_app(context, node)]
    node.stop()
    tabs[0].wait_for_function(
        "document.getElementById('indicator').dataset.state === 'offline'", timeout=15000
    )
    for _ in range(6):
        tabs[0].locator('input[data-id="milk"]').click()
    tabs[0].wait_for_function("document.getElementById('pending').textContent === '6'")
    posts: list[int] = []  # writes the node answered (a refused connection is a retry)

    def answered(response, i: int) -> None:
        request = response.request
        if request.method == "POST" and request.url.endswith("/v1/facts"):
            if request.post_data != '{"assert": []}' and response.status == 200:
                posts.append(i)

    for i, tab in enumerate(tabs):
        tab.on("response", lambda r, i=i: answered(r, i))
    node = serve(home, node_factory, port)
    for tab in tabs:
        tab.wait_for_function(
            "document.getElementById('pending').textContent === '0'", timeout=30000
        )
    tabs[1].wait_for_timeout(2000)  # a second sender would be at it by now
    assert len(posts) == 6, posts
    _, q = node.request("GET", "/v1/query?q=done(X)")
    assert [1.0] in q["rows"] and ["milk"] not in q["rows"]  # six clicks: unticked again
    context.close()
