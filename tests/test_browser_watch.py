"""The "Watch a server" tab in headless Debian Chromium (never a downloaded browser): watching the app's own /metrics,
its panels fill window by window while a client drives races, and in public mode it refuses a loopback URL while the
series on screen stays. Saves the README's screenshot of the tab."""
from __future__ import annotations

from specviz.ui.logic import DEFAULT_PROMPT
from tests.browser_kit import ASSETS, set_number

# windows of the watch that saw drafts, read from the acceptance panel as drawn
DRAWN_WINDOWS = """() => (document.querySelector('#watch-plot-acceptance .js-plotly-plot')?.data?.[0]?.y ?? [])
  .filter(y => y !== null).length"""


def status(page) -> str:
    return page.locator("#watch-status").inner_text()


def watch(page, url: str) -> None:
    page.locator("#watch-url").locator("textarea, input").first.fill(url)
    page.locator("#watch-start").click()


def test_the_tab_draws_live_panels_and_refuses_loopback_in_public_mode(app_url, browser, monkeypatch):
    from gradio_client import Client

    monkeypatch.delenv("SPECVIZ_PUBLIC", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.wait_for_selector("#run")
    page.wait_for_timeout(2_500)  # the race tab's start-up ticks settle first (they may re-render the form)
    page.get_by_role("tab", name="Watch a server").click()
    page.wait_for_selector("#watch-url")
    set_number(page, "watch-interval", 1)
    watch(page, app_url)
    page.wait_for_function("() => document.querySelector('#watch-status')?.innerText.includes('Watching')",
                           timeout=180_000)  # a fresh session's first scrape may wait behind the app's warm-up

    client = Client(app_url, verbose=False)  # the traffic: races through the API while the tab watches
    jobs = [client.submit(prompt=DEFAULT_PROMPT, max_new_tokens=128, api_name="/race")]  # this machine's default
    page.wait_for_function(f"() => ({DRAWN_WINDOWS})() >= 1", timeout=600_000)  # the panels fill as drafts are seen
    # the same prompt again: one that drafts half as well (the sky's, tried: acceptance 0.42, then 0.18-0.21 over its
    # last windows) makes the watch raise its alarm, rightly, where this test reads the healthy verdict
    jobs.append(client.submit(prompt=DEFAULT_PROMPT, max_new_tokens=128, api_name="/race"))
    for job in jobs:
        job.result()
    page.wait_for_function(f"() => ({DRAWN_WINDOWS})() >= 2", timeout=600_000)  # one a race at least
    page.wait_for_function("() => document.querySelector('#watch-verdict')?.innerText.startsWith('healthy')",
                           timeout=60_000)
    for panel in ("acceptance", "tau", "position", "rate"):
        assert page.evaluate(f"() => document.querySelector('#watch-plot-{panel} .js-plotly-plot')?.data?.length") >= 1
    bars = page.evaluate("() => document.querySelector('#watch-plot-position .js-plotly-plot').data[0].y")
    assert bars and 0 < bars[0] <= 1  # the share of drafts that kept position 1
    assert "specviz" in page.locator("#watch-figures").inner_text()
    page.wait_for_timeout(800)  # let Plotly finish drawing
    ASSETS.mkdir(exist_ok=True)
    page.screenshot(path=str(ASSETS / "screenshot-watch.png"), full_page=True)
    drawn = page.evaluate(DRAWN_WINDOWS)

    monkeypatch.setenv("SPECVIZ_PUBLIC", "1")  # read per call: this app is public from now on
    monkeypatch.setenv("SPECVIZ_WATCH_HOSTS", "127.0.0.1")  # even an allow-listed host is refused on loopback
    watch(page, app_url)
    page.wait_for_function("() => document.querySelector('#watch-status')?.innerText.includes('loopback')",
                           timeout=60_000)
    line = status(page)
    assert "resolves to 127.0.0.1, a loopback address" in line and "Traceback" not in line
    assert page.evaluate(DRAWN_WINDOWS) == drawn  # the series on screen stays
    page.locator("#watch-stop").click()
    page.wait_for_function("() => document.querySelector('#watch-status')?.innerText.includes('Stopped')",
                           timeout=60_000)
    page.close()
