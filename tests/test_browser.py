"""The app in a real browser: headless Debian Chromium through Playwright (never a downloaded browser)."""
from __future__ import annotations

import time

from specviz import hardware
from specviz.ui.logic import method_label
from tests.browser_kit import ASSETS, choose, set_number

PROMPT = "Write a haiku about the sea."
N = 24
PLOTS = ("plot-alpha", "plot-speed", "plot-accept", "plot-tree")


def test_run_in_browser(app_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.wait_for_selector("#run")
    page.locator("#prompt textarea").fill(PROMPT)
    set_number(page, "max-new-tokens", N)
    assert page.locator("#explainer").is_visible()  # the accordion is there, collapsed
    before = page.evaluate("() => [document.querySelector('#max-new-tokens input[type=number]')?.value, "
                           "document.querySelectorAll('#pane-ar [data-verdict]').length, "
                           "document.querySelector('#status')?.innerText]")
    t0 = time.perf_counter()
    page.locator("#run").click()
    page.wait_for_selector("#pane-ar [data-verdict]", timeout=120_000)
    first_tokens_s = time.perf_counter() - t0
    page.wait_for_selector("#pane-ar .sv-pane-box[data-state=done]", timeout=180_000)
    page.wait_for_selector("#pane-spec .sv-pane-box[data-state=done]", timeout=180_000)
    page.wait_for_selector("#summary .sv-badge", timeout=60_000)
    print(f"\nfirst tokens visible {first_tokens_s:.2f} s after clicking Run")

    assert page.locator("#pane-spec [data-verdict=accepted]").count() > 0
    plain = page.locator("#pane-ar [data-verdict=plain]").count()
    assert plain == N, (plain, before, page.locator("#status").inner_text(), page.locator("#pane-ar").inner_text())
    assert "identical to plain decoding" in page.locator("#summary").inner_text()
    pair = hardware.default_pair()  # the default method, with its branches where it has them
    label = method_label(pair.method, pair.lookup_for(pair.method), pair.retrieve_for(pair.method))
    assert f"Speculative ({label})" in page.locator("#pane-spec").inner_text()
    legend = page.locator("#legend")
    assert legend.is_visible()
    for verdict in ("accepted", "rejected", "discarded", "resampled", "bonus"):
        assert legend.locator(f"[data-verdict={verdict}]").count() == 1
    title = page.locator("#pane-spec [data-verdict=accepted]").first.get_attribute("title")
    assert "q_draft=" in title and "p_target=" in title
    page.wait_for_timeout(500)  # let Plotly finish drawing the final figures
    for plot in PLOTS:
        n = page.evaluate(f"() => document.querySelector('#{plot} .js-plotly-plot')?.data?.length ?? 0")
        assert n >= 1, plot
    page.close()  # the README's race screenshots: tests/test_browser_race.py


def test_bad_input_shows_a_readable_message(app_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.wait_for_selector("#run")
    page.locator("#prompt textarea").fill("   ")
    page.locator("#run").click()
    page.wait_for_selector("#status .sv-status-error", timeout=60_000)
    assert "prompt is empty" in page.locator("#status").inner_text()
    page.close()


def spec_token_count(page) -> int:
    return page.locator("#pane-spec [data-verdict]").count()


def test_stop_cancels_promptly_and_the_app_keeps_serving(app_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.wait_for_selector("#run")
    page.locator("#prompt textarea").fill("Tell me a long story about a dragon.")
    set_number(page, "max-new-tokens", 1000)
    page.locator("#run").click()
    page.wait_for_selector("#pane-spec [data-verdict]", timeout=120_000)
    page.locator("#stop").click()
    page.wait_for_timeout(1500)
    frozen = spec_token_count(page)
    page.wait_for_timeout(1500)
    assert spec_token_count(page) == frozen  # no more updates after Stop
    assert page.locator("#pane-spec .sv-pane-box[data-state=done]").count() == 0
    # a new run starts at once and finishes
    set_number(page, "max-new-tokens", 8)
    page.locator("#run").click()
    page.wait_for_selector("#pane-spec .sv-pane-box[data-state=done]", timeout=60_000)
    page.wait_for_selector("#pane-ar .sv-pane-box[data-state=done]", timeout=60_000)  # speculation may finish first
    assert page.locator("#pane-ar [data-verdict=plain]").count() == 8
    page.close()


def test_medusa_tree_in_browser(app_url, browser):
    """Pick the trained Medusa drafter in the dropdown: the run stays exact and the tree panel draws a
    real candidate tree (several nodes, more than one at some depth)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.wait_for_selector("#run")
    page.locator("#prompt textarea").fill("Explain why the sky is blue.")
    set_number(page, "max-new-tokens", N)  # opens the folded Settings
    choose(page, "method", "medusa")
    pair = hardware.default_pair()  # the γ and lookup fields follow the method
    for field, value in (("gamma", pair.gamma_for("medusa")), ("lookup", pair.lookup_for("medusa")),
                         ("retrieve", pair.retrieve_for("medusa"))):
        # null-safe: the field is re-rendered when the method changes, and a thrown predicate ends the wait
        page.wait_for_function(f"() => document.querySelector('#{field} input')?.value === '{value}'", timeout=10_000)
    page.locator("#run").click()
    page.wait_for_selector("#pane-spec .sv-pane-box[data-state=done]", timeout=180_000)
    page.wait_for_selector("#summary .sv-badge", timeout=60_000)
    label = method_label("medusa", pair.lookup_for("medusa"), pair.retrieve_for("medusa"))
    assert f"Speculative ({label})" in page.locator("#pane-spec").inner_text()
    assert "identical to plain decoding" in page.locator("#summary").inner_text()
    set_number(page, "tree-step", 2)  # step 1 is the target's prefill; step 2 is the first tree
    page.wait_for_timeout(1500)
    nodes = page.evaluate("() => document.querySelector('#plot-tree .js-plotly-plot').data"
                          ".reduce((n, t) => n + (t.mode && t.mode.includes('markers') ? t.x.length : 0), 0)")
    import json

    tree = json.loads((ASSETS / "drafters" / "smollm2-135m-medusa" / "config.json").read_text())["tree"]
    assert nodes >= len(tree) + 1  # the root and the shipped tree's nodes (3 candidates on this CPU class)
    assert sum(len(p) == 1 for p in tree) > 1  # more than one candidate at depth 1: a tree, not a chain
    page.locator("#plot-tree").screenshot(path=str(ASSETS / "screenshot-medusa-tree.png"))
    page.close()
