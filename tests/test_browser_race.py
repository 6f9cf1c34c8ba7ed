"""The race tab as a workshop sees it, in headless Debian Chromium (never a downloaded browser): the speculative
pane reads as the same text as the plain one, "show every draft" brings every draft back, a step's count opens its
candidates and selects it in the tree panel, the form shows only the fields the method takes, and a replay at 0.5×
takes about twice the recorded compute and ends where the race did; the prompt, Run, Stop and the first line of both
panes are on the first screen at 1280×720 and on a phone. Saves the README's race screenshots."""
from __future__ import annotations

import re
import time

import pytest

from specviz import hardware, methods
from specviz.ui import controls, replay
from specviz.ui.common import at_hand
from specviz.ui.logic import DEFAULT_PROMPT, SPEC_METHODS
from tests.browser_kit import ASSETS, choose, fold_settings, in_viewport, set_number

PROMPT = "Write a Python function that adds two numbers."
N = 40

# the text a reader sees in a pane: its visible tokens, less the small refused one
READ_TEXT = """(sel) => [...document.querySelectorAll(sel + ' .sv-pane .sv-tok')]
  .filter(t => t.checkVisibility() && t.dataset.verdict !== 'rejected')
  .map(t => t.textContent).join('')"""
# visible drafted tokens (kept, refused, never judged) in the speculative pane
VISIBLE_DRAFTS = """() => [...document.querySelectorAll('#pane-spec .sv-pane .sv-tok')]
  .filter(t => t.checkVisibility()
          && ['accepted', 'rejected', 'discarded'].includes(t.dataset.verdict)).length"""
# per step: the refusals and never-judged drafts a reader sees inline
INLINE_OFF_PATH = """() => [...document.querySelectorAll('#pane-spec .sv-step')].map(s =>
  [...s.children].filter(t => t.classList.contains('sv-tok') && t.checkVisibility()
                      && ['rejected', 'discarded'].includes(t.dataset.verdict)).length)"""
COUNTS = """() => [...document.querySelectorAll('#pane-spec .sv-more > summary')]
  .map(s => Number(s.textContent.replace('+', '')))"""


def race(page, method: str, tokens: int, prompt: str = PROMPT) -> None:
    page.locator("#prompt textarea").fill(prompt)
    set_number(page, "max-new-tokens", tokens)
    choose(page, "method", method)
    page.locator("#run").click()
    page.wait_for_selector("#pane-ar .sv-pane-box[data-state=done]", timeout=600_000)
    page.wait_for_selector("#pane-spec .sv-pane-box[data-state=done]", timeout=600_000)
    page.wait_for_selector("#summary #lesson", timeout=60_000)
    page.wait_for_timeout(800)  # let Plotly draw the final figures


def visible(page, elem_id: str) -> bool:
    return page.evaluate(f"() => document.querySelector('#{elem_id}')?.checkVisibility() ?? false")


# the first line of a pane: its first visible token
FIRST_TOKEN = "#{pane} .sv-pane .sv-tok:visible >> nth=0"


@pytest.mark.parametrize("width, height", [(1280, 720), (390, 844)])
def test_the_race_is_on_the_first_screen(app_url, browser, width, height):
    """Before any scrolling: the prompt, the preset, Run and Stop, and once a race runs the first text line of both
    panes, side by side; the settings folded; on a phone every tab's name shown (none behind a menu)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(app_url)
    page.wait_for_selector("#run")
    assert not page.locator("#method").is_visible()  # folded under Settings
    for sel in ("#prompt", "#preset", "#run", "#stop", "#settings"):
        assert in_viewport(page, page.locator(sel)), (sel, width)
    tabs = page.get_by_role("tab")
    assert tabs.count() >= 5 and all(tabs.nth(i).is_visible() for i in range(tabs.count()))
    assert not page.locator("button[aria-label='More tabs']").is_visible()
    for fold in ("#settings", "#examples"):  # each fold's arrow inside its box (a two-line label once pushed it out)
        box, arrow = (page.locator(sel).first.bounding_box() for sel in (fold, f"{fold} .label-wrap .icon"))
        assert box["x"] <= arrow["x"] and arrow["x"] + arrow["width"] <= box["x"] + box["width"], (fold, width)
    page.locator("#run").click()
    for pane in ("pane-ar", "pane-spec"):
        page.wait_for_selector(FIRST_TOKEN.format(pane=pane), timeout=600_000)
    assert page.evaluate("() => window.scrollY") == 0
    for pane in ("pane-ar", "pane-spec"):
        assert in_viewport(page, page.locator(FIRST_TOKEN.format(pane=pane))), (pane, width)
    ar, spec = (page.locator(f"#{pane}").evaluate("(e) => e.getBoundingClientRect().toJSON()")
                for pane in ("pane-ar", "pane-spec"))
    assert ar["right"] <= spec["left"] and abs(ar["top"] - spec["top"]) < 2  # two lanes side by side
    page.locator("#stop").click()
    page.close()


LABEL_LINES = """(ids) => ids.map((id) => { const r = document.createRange();
    r.selectNodeContents(document.querySelector('#' + id));
    return new Set([...r.getClientRects()].map((b) => Math.round(b.top))).size; })"""


def test_on_a_projector_run_brings_the_race_into_view(app_url, browser):
    """A 1024 x 768 projector at 150% zoom (683 x 512 CSS pixels): the header and the form fill the first screen, so
    Run scrolls the race's status line to the top, with the first lines of both panes under it."""
    page = browser.new_context(viewport={"width": 683, "height": 512}, device_scale_factor=1.5).new_page()
    page.goto(app_url)
    page.wait_for_selector("#run")
    for sel in ("#prompt", "#preset", "#run", "#stop"):
        assert in_viewport(page, page.locator(sel)), sel
    lines = page.evaluate(LABEL_LINES, ["run", "stop", "replay"])
    assert lines == [1, 1, 1], lines  # each button's label on one line (Replay's wrapped onto two)
    top = page.locator("#race-panes").evaluate("(e) => e.getBoundingClientRect().top")
    assert top + 120 > 512, top  # the panes' first lines start below the screen
    page.locator("#run").click()
    for pane in ("pane-ar", "pane-spec"):
        page.wait_for_selector(FIRST_TOKEN.format(pane=pane), timeout=600_000)
    shown = ("#status", FIRST_TOKEN.format(pane="pane-ar"), FIRST_TOKEN.format(pane="pane-spec"))
    for _ in range(50):  # the smooth scroll takes a moment
        if all(in_viewport(page, page.locator(sel)) for sel in shown):
            break
        page.wait_for_timeout(200)
    assert page.evaluate("() => window.scrollY") > 0
    for sel in shown:
        assert in_viewport(page, page.locator(sel)), sel
    page.locator("#stop").click()
    page.close()


def test_the_default_race_reads_as_the_same_text_as_plain_decoding(app_url, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(app_url)
    page.wait_for_selector("#run")
    race(page, hardware.default_pair().method, N)
    assert "identical" in page.locator("#lesson").inner_text()
    fold_settings(page)
    ASSETS.mkdir(exist_ok=True)
    page.screenshot(path=str(ASSETS / "screenshot.png"))  # the first screen, as a projector shows it

    plain, spec = page.evaluate(READ_TEXT, "#pane-ar"), page.evaluate(READ_TEXT, "#pane-spec")
    assert len(plain) > N and spec == plain  # the same text, read from the page, hidden drafts excluded
    assert all(n <= 1 for n in page.evaluate(INLINE_OFF_PATH))  # at most the one refusal on the path per step
    assert page.locator("#pane-spec .sv-tok[data-verdict=discarded]:visible").count() == 0
    kept_and_refused, counts = page.evaluate(VISIBLE_DRAFTS), page.evaluate(COUNTS)
    assert counts and sum(counts) > 0  # the default race's tree drafts more than its path

    page.locator("#show-drafts input").check()  # every draft inline again
    page.wait_for_timeout(200)
    assert page.evaluate(VISIBLE_DRAFTS) == kept_and_refused + sum(counts)
    assert page.locator("#pane-spec .sv-more:visible").count() == 0
    page.locator("#pane-spec").screenshot(path="/tmp/specviz-every-draft.png")
    page.locator("#show-drafts input").uncheck()
    page.wait_for_timeout(200)
    assert page.evaluate(READ_TEXT, "#pane-spec") == plain

    more = page.locator("#pane-spec .sv-more").nth(len(counts) // 2)  # a step's count opens its candidates
    step, n = int(more.get_attribute("data-step")), int(more.locator("summary").inner_text().strip("+"))
    drafts = page.locator(f"#pane-spec .sv-step[data-step='{step}'] > .sv-tok.sv-off")
    assert drafts.count() == n
    assert page.locator(f"#pane-spec .sv-step[data-step='{step}'] > .sv-off:visible").count() == 0
    more.locator("summary").click()
    page.wait_for_timeout(200)
    assert page.locator(f"#pane-spec .sv-step[data-step='{step}'] > .sv-off:visible").count() == n  # shown in place
    page.wait_for_function("(v) => document.querySelector('#tree-step input[type=number]')?.value === v",
                           arg=str(step + 1), timeout=30_000)  # ... and selects that step in the tree panel
    page.wait_for_function("(t) => document.querySelector('#plot-tree')?.innerText.includes(t)",
                           arg=f"Candidate tree of step {step + 1}:", timeout=30_000)

    page.set_viewport_size({"width": 390, "height": 844})
    more.locator("summary").click()  # closed again
    fold_settings(page)
    page.wait_for_timeout(500)
    page.screenshot(path=str(ASSETS / "screenshot-narrow.png"))  # a phone's first screen
    page.close()


def test_the_form_shows_only_the_fields_the_method_takes(app_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.wait_for_selector("#run")
    seen = {}
    for method in at_hand(SPEC_METHODS):  # the menu offers what a visitor can run (no DFlash until one is shipped)
        choose(page, "method", method)
        fields = controls.race_fields(method)
        expected = {"draft": fields.draft, "gamma": fields.gamma, "lookup": fields.lookup, "retrieve": fields.retrieve}
        page.wait_for_function("(want) => Object.entries(want).every(([id, v]) => "
                               "(document.querySelector('#' + id)?.checkVisibility() ?? false) === v)",
                               arg=expected, timeout=10_000)
        note = page.locator("#method-note").inner_text() if visible(page, "method-note") else ""
        assert ("No draft model" in note) == (not fields.draft), method
        seen[method] = expected
    # the facts a workshop meets, independent of how the registry words them
    assert seen["vanilla"]["draft"] and not seen["vanilla"]["lookup"]
    assert not seen["pld"]["draft"] and not seen["pld"]["lookup"] and not seen["pld"]["retrieve"]
    assert not seen["eagle"]["draft"] and seen["eagle"]["lookup"] and seen["eagle"]["retrieve"]

    page.get_by_role("tab", name="Step through").click()
    page.wait_for_selector("#step-method")
    for method in at_hand(methods.names(lambda s: s.chain)):
        choose(page, "step-method", method)
        want = methods.spec(method).uses_draft_model
        page.wait_for_function("(want) => (document.querySelector('#step-draft')?.checkVisibility() ?? false) === want",
                               arg=want, timeout=10_000)
        assert visible(page, "step-gamma")
        assert visible(page, "step-method-note") == (not want), method
    page.close()


def test_a_replay_at_half_speed_takes_twice_the_compute_and_ends_where_the_race_did(app_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.wait_for_selector("#run")
    race(page, "vanilla", 32, DEFAULT_PROMPT)  # the int8 draft refuses now and then on the poem
    page.screenshot(path=str(ASSETS / "screenshot-vanilla.png"), full_page=True)
    # what the panes and the summary show (their own HTML, not gradio's progress wrapper around it)
    final = {sel: page.locator(sel).inner_html() for sel in ("#pane-ar .sv-pane-box", "#pane-spec .sv-pane-box",
                                                              "#summary .sv-summary")}
    page.locator("#replay-pace").get_by_label(replay.DEFAULT_PACE).check()
    assert replay.DEFAULT_PACE == "0.5×"
    t0 = time.perf_counter()
    page.locator("#replay").click()
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Replayed')",
                           timeout=600_000)
    wall = time.perf_counter() - t0
    status = page.locator("#status").inner_text()
    took, compute = map(float, re.search(r"in ([\d.]+) s: ([\d.]+) s of recorded compute", status).groups())
    print(f"\nreplay at 0.5x: {took:.2f} s on the server, {wall:.2f} s in the browser, {compute:.2f} s of compute")
    assert 1.5 <= took / compute <= 3.0, status
    assert wall >= 1.5 * compute
    page.wait_for_timeout(500)
    assert {sel: page.locator(sel).inner_html() for sel in final} == final  # the same end state
    page.close()
