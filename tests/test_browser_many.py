"""The race of several drafters in headless Debian Chromium at a projector's 1280 pixels: three lanes beside plain
decoding on the default CPU pair, each pane reading as the same text as AR, and the leaderboard. Saves the README's
screenshot of it."""
from __future__ import annotations

import time

from tests.browser_kit import ASSETS, set_number
from tests.test_browser_race import READ_TEXT
from tests.test_cancel import running, steps, wait_for

LANES = "default, pld:2, draft"
N = 40


def test_three_lanes_read_as_plain_decoding_and_end_on_a_leaderboard(app_url, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(app_url)
    page.get_by_role("tab", name="Several drafters").click()
    page.wait_for_selector("#many-run")
    page.locator("#many-prompt textarea").fill("Write a Python function that adds two numbers.")
    page.locator("#many-lanes textarea, #many-lanes input").first.fill(LANES)
    set_number(page, "many-max-new-tokens", N)
    page.locator("#many-run").click()
    page.wait_for_selector("#many-board table.sv-board", timeout=600_000)
    for i in range(4):
        page.wait_for_selector(f"#many-pane-{i} .sv-pane-box[data-state=done]", timeout=60_000)
    ar = page.evaluate(READ_TEXT, "#many-pane-0")
    assert ar.strip()
    for i in (1, 2, 3):
        assert page.evaluate(READ_TEXT, f"#many-pane-{i}") == ar, i
    rows = page.locator("#many-board tr[data-lane]")
    assert rows.count() == 4  # three lanes and AR
    identical = page.evaluate("() => [...document.querySelectorAll('#many-board tr[data-lane]')]"
                              ".filter(r => r.dataset.lane !== 'ar').map(r => r.lastElementChild.textContent)")
    assert identical == ["✓"] * 3
    assert page.locator("#many-pane-3 [data-verdict=accepted]").count() > 0  # the draft model's drafts kept, drawn
    page.wait_for_timeout(300)
    page.screenshot(path=str(ASSETS / "screenshot-many.png"), full_page=True)


def test_a_visitor_waiting_behind_a_race_sees_their_place_in_the_queue(app_url, browser):
    """Two visitors: while the first one's race of several lanes holds the device's queue, the second one presses
    Run in the Race tab and its status line shows where it waits; its Stop says the race will not run, and once the
    first one stops, the second race ends without a step."""
    # the second visitor's page loads first, in a context of its own (a page loading beside a race of several
    # streaming lanes took over 30 s on a busy 2-core host)
    second = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    second.goto(app_url)
    second.wait_for_selector("#run", timeout=120_000)
    first = browser.new_page(viewport={"width": 1280, "height": 900})
    first.goto(app_url)
    first.get_by_role("tab", name="Several drafters").click()
    first.wait_for_selector("#many-run")
    set_number(first, "many-max-new-tokens", 400)
    first.locator("#many-run").click()
    first.wait_for_selector("#many-pane-0 .sv-pane-box[data-state=running]", timeout=120_000)
    second.locator("#run").click()
    second.wait_for_function("() => /queue/i.test(document.querySelector('#status')?.innerText ?? '')",
                             timeout=60_000)
    assert "Waiting for the device" in second.locator("#status").inner_text()  # and why, in words
    second.locator("#stop").click()  # while it waits: it says so, and it will run nothing
    second.wait_for_function("() => document.querySelector('#status').innerText.includes('stopped before it "
                             "started')", timeout=10_000)
    first.locator("#many-stop").click()
    wait_for(lambda: running(app_url) == 0, 30, "the first race ended")  # the queue reaches the second race now
    counted, quiet = steps(app_url), time.perf_counter()
    start = quiet
    while time.perf_counter() - quiet < 5:  # a race that ran would be stepping well before 5 quiet seconds
        assert time.perf_counter() - start < 30, "the race stopped while it waited ran"
        now = steps(app_url)  # (the first race's lanes may each finish the step they were in)
        if now != counted or running(app_url):
            counted, quiet = now, time.perf_counter()
        time.sleep(0.1)
    assert "stopped before it started" in second.locator("#status").inner_text()
    assert second.locator("#pane-spec .sv-tok, #pane-ar .sv-tok").count() == 0


def test_stop_mid_race_says_stopped_in_the_status_and_every_pane(app_url, browser):
    """Stop in the middle of a race of several drafters: the status gives each lane's count, every unfinished pane
    says where it stopped, and no late update of the cancelled race overwrites that."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(app_url)
    page.get_by_role("tab", name="Several drafters").click()
    page.wait_for_selector("#many-run")
    page.locator("#many-lanes textarea, #many-lanes input").first.fill("pld:2, draft")
    set_number(page, "many-max-new-tokens", 400)
    page.locator("#many-run").click()
    page.wait_for_function("() => document.querySelectorAll('#many-pane-0 .sv-pane .sv-tok').length > 8",
                           timeout=300_000)
    page.locator("#many-stop").dispatch_event("click")  # now: the growing panes never let the button sit still
    page.wait_for_function("() => document.querySelector('#many-status').innerText.includes('■ stopped at')",
                           timeout=10_000)
    page.wait_for_timeout(1500)  # a late update of the cancelled race would land by now
    status = page.locator("#many-status").inner_text()
    assert "plain" in status and "pld:2" in status and "draft" in status, status
    states = [page.locator(f"#many-pane-{i} .sv-pane-box").get_attribute("data-state") for i in range(3)]
    assert states == ["stopped"] * 3
    badges = page.evaluate("() => [0, 1, 2].map(i => document.querySelector(`#many-pane-${i} .sv-state`).textContent)")
    assert all(b.startswith("■ stopped at ") and b.endswith(" tokens") for b in badges), badges
