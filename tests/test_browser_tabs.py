"""The "Check a drafter" and "Step through" tabs in headless Debian Chromium (never a downloaded browser):
click through a few cycles and a quick check, and save the screenshots in assets/."""
from __future__ import annotations

from tests.browser_kit import ASSETS, plot_traces, set_number


def test_step_through_in_browser(app_url, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(app_url)
    page.get_by_role("tab", name="Step through").click()
    page.wait_for_selector("#step-next")
    set_number(page, "step-seed", 3)
    page.locator("#step-reset").click()
    page.wait_for_function("() => document.querySelector('#step-status')?.innerText.includes('ready')",
                           timeout=120_000)
    assert "Seed 3" in page.locator("#step-status").inner_text()
    for k in (1, 2):
        page.locator("#step-next").click()
        so_far = f"{k} step{'s' * (k != 1)} so far"
        page.wait_for_function(f"() => document.querySelector('#step-status')?.innerText.includes('{so_far}')",
                               timeout=60_000)
    page.wait_for_selector("#step-table tr[data-verdict]")
    page.wait_for_timeout(600)  # let Plotly draw
    assert plot_traces(page, "step-bars") >= 2 and plot_traces(page, "step-theory") >= 4
    assert page.locator("#step-text [data-verdict]").count() > 0
    table = page.locator("#step-table").inner_text()
    assert "min(1, p/q)" in table and "u" in table
    ASSETS.mkdir(exist_ok=True)
    page.screenshot(path=str(ASSETS / "screenshot-step.png"), full_page=True)
    page.locator("#step-run").click()
    page.wait_for_function("() => document.querySelector('#step-status')?.innerText.includes('done: ')",
                           timeout=120_000)
    page.close()


def test_step_through_medusa_in_browser(app_url, browser):
    """Step through the shipped Medusa heads: after the prefill, each head's guess is a bar chart row of the
    drafted chain, judged by the same acceptance test."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(app_url)
    page.get_by_role("tab", name="Step through").click()
    page.wait_for_selector("#step-next")
    page.locator("#step-method input").fill("medusa")
    page.locator("#step-method input").press("Enter")
    page.wait_for_timeout(300)
    page.locator("#step-reset").click()
    page.wait_for_function("() => document.querySelector('#step-status')?.innerText.includes('ready')",
                           timeout=120_000)
    for k in (1, 2):  # step 1 is the target's prefill; step 2 drafts from the heads
        page.locator("#step-next").click()
        so_far = f"{k} step{'s' * (k != 1)} so far"
        page.wait_for_function(f"() => document.querySelector('#step-status')?.innerText.includes('{so_far}')",
                               timeout=60_000)
    page.wait_for_selector("#step-table tr[data-verdict]")
    page.wait_for_timeout(600)  # let Plotly draw
    assert "medusa" in page.locator("#step-status").inner_text()
    assert plot_traces(page, "step-bars") >= 2
    page.screenshot(path=str(ASSETS / "screenshot-step-medusa.png"), full_page=True)
    page.close()


def test_check_in_browser(app_url, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(app_url)
    page.get_by_role("tab", name="Check a drafter").click()
    page.wait_for_selector("#check-run")
    page.locator("#check-method input").click()  # the shipped EAGLE, the drafter of the app's default race
    page.locator("[role=option]", has_text="eagle").first.click()
    set_number(page, "check-samples", 60)
    set_number(page, "check-prompts", 2)
    set_number(page, "check-max-new-tokens", 16)
    page.locator("#check-run").click()
    page.wait_for_selector(".progress-level", timeout=60_000)  # the check's progress, once, where its verdict goes
    bars = page.locator(".progress-level")
    assert bars.count() == 1 and page.locator("#check-verdict .progress-level").count() == 1, bars.count()
    page.wait_for_selector("#check-verdict .sv-verdict-ok, #check-verdict .sv-verdict-bad", timeout=300_000)
    page.wait_for_selector("#check-json a", timeout=30_000)
    page.wait_for_selector("#check-html a", timeout=30_000)
    verdict = page.locator("#check-verdict").inner_text()
    assert "correct" in verdict
    figures = page.locator("#check-figures").text_content()
    assert "copies? repeats / new" in figures and "of AR's tokens are among its" in figures
    page.wait_for_timeout(800)
    for plot in ("check-plot-fidelity", "check-plot-alpha", "check-plot-gamma", "check-plot-batch"):
        assert plot_traces(page, plot) >= 1, plot
    page.screenshot(path=str(ASSETS / "screenshot-check.png"), full_page=True)
    page.close()
