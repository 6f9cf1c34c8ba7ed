"""The Watch tab's alarm, drafter-kind field and address hint, and the Check tab's draft field following the method,
in headless Debian Chromium, on a page of those two tabs alone (no model loads): a planted collapse (a local server
whose acceptance drops to 0) raises the red alarm within two windows of the drop. Saves the screenshots looked at."""
from __future__ import annotations

import re

import gradio as gr
from test_watch_alarm import COLLAPSED, HEALTHY, planted  # noqa: F401  (the fixture)

from specviz.ui import check, watch
from tests.browser_kit import ASSETS, set_number
from tests.conftest import serving


def test_the_alarm_shows_and_the_fields_follow(browser, planted, monkeypatch):  # noqa: F811
    for name in ("SPECVIZ_PUBLIC", "SPACE_ID", "SPECVIZ_WATCH_HOSTS", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    healthy = 3
    url = planted([HEALTHY] * healthy + [COLLAPSED] * 200)
    with gr.Blocks() as demo:
        check.check_tab()
        watch.watch_tab()
    with serving(demo) as app:
        port = int(re.search(r":(\d+)/", app).group(1))
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(app)
        page.get_by_role("tab", name="Check a drafter").click()
        page.wait_for_selector("#check-draft")
        assert page.locator("#check-draft input").input_value() == "int8"
        page.locator("#check-method input").click()
        page.get_by_role("option", name="eagle", exact=True).click()
        page.wait_for_function("() => document.querySelector('#check-draft input')?.value === 'shipped'")
        page.wait_for_timeout(600)  # the list closes
        assert "EAGLE drafter" in page.locator("#check-draft").inner_text()
        page.screenshot(path=str(ASSETS / "screenshot-check-eagle-field.png"))

        page.get_by_role("tab", name="Watch a server").click()
        page.wait_for_selector("#watch-url")
        intro = page.locator("#watch-intro").inner_text()
        assert f"http://127.0.0.1:{port}" in intro and "link-local" in intro  # the port it is really served on
        page.locator("#watch-drafter input").click()
        page.get_by_role("option", name="EAGLE (eagle)").click()
        set_number(page, "watch-interval", 1)
        page.locator("#watch-url").locator("textarea, input").first.fill(url)
        page.locator("#watch-start").click()
        page.wait_for_selector("#watch-alarm", timeout=60_000)
        windows = page.evaluate("() => document.querySelector('#watch-plot-tau .js-plotly-plot').data[0].y.length")
        assert windows <= healthy + 2 + 1  # within two windows of the drop (one more may land while we look)
        assert "τ stayed near 1.0" in page.locator("#watch-alarm").inner_text()
        page.wait_for_timeout(800)
        page.screenshot(path=str(ASSETS / "screenshot-watch-alarm.png"), full_page=True)
        page.locator("#watch-stop").click()
        page.close()
