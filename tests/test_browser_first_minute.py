"""The first minute as a new user walks it (issue 50), in one page session of headless Debian Chromium at 1280×720:
open the page while the models load (the start-up's progress line, then its ready line), Run the default prompt and
read the why-line, Run again and Stop mid-race, switch to the "Prompt lookup" preset, and race the pair of examples
that repeats or not. Each step asserts what the page shows. Saves assets/screenshot-first-minute-open.png (the page
just opened) and assets/screenshot-first-minute.png (a finished race with its why-line)."""
from __future__ import annotations

import re

import pytest

from specviz.ui import logic, presets, startup
from specviz.ui.common import MAX_NEW_TOKENS
from tests.browser_kit import ASSETS, choose, fold_settings, set_number

pytestmark = pytest.mark.browser

TOKENS = 48       # short races: the walk stays near a minute on 2 busy cores
STOP_TOKENS = MAX_NEW_TOKENS  # the race that is stopped: still running when Stop lands, on a quiet fast host too
PAIR = logic.EXAMPLE_PAIRS[0]  # ("repeats or not", the poem, the sky)
COPIED = re.compile(r"\((\d+)% of it copied\)")
# the why-line names where the kept guesses came from (metrics.kept_line)
SOURCES = re.compile(r"kept guesses were (copies of earlier text \(prompt lookup\)|.+'s own guesses|the datastore's)")


@pytest.fixture
def starting_up(app_url):
    """The app's start-up in the background, as `python app.py` runs it (startup.warm_up: the models, a first short
    race, this machine's calibration, kept by the session's first browser module); forgotten afterwards."""
    state = startup.STATE
    saved = (state.line, state.begun, state.done, state.failed)
    thread = state.begin(startup.warm_up)
    yield app_url
    thread.join(600)
    state.line, state.begun, state.done, state.failed = saved


MARK_OLD = """() => document.querySelectorAll('#race-panes .sv-pane-box, #status .sv-status, #why-line')
  .forEach(e => { e.dataset.old = '1'; })"""
# both panes redrawn by this race, and done
BOTH_DONE = """() => { const boxes = [...document.querySelectorAll('#race-panes .sv-pane-box:not([data-old])')];
  return boxes.length === 2 && boxes.every(b => b.dataset.state === 'done'); }"""


def pane_states(page) -> list[str]:
    return [page.locator(f"#{p} .sv-pane-box").get_attribute("data-state") for p in ("pane-ar", "pane-spec")]


def race_to_the_end(page) -> str:
    """Run, wait for both panes and the summary; the why-line's text."""
    page.evaluate(MARK_OLD)  # the last race's panes, status and why-line: this race's replace them
    page.locator("#run").click()
    page.wait_for_function(BOTH_DONE, timeout=300_000)
    page.wait_for_selector("#summary #why-line:not([data-old])", timeout=60_000)
    page.wait_for_selector("#status .sv-status:not([data-old])", timeout=10_000)
    assert page.locator("#status").inner_text().startswith("Done"), page.locator("#status").inner_text()
    return page.locator("#why-line").inner_text()


def copied(why: str) -> int:
    """The share of the answer copied by prompt lookup, as the why-line says it (none kept: 0)."""
    m = COPIED.search(why)
    return int(m.group(1)) if m else 0


def test_the_first_minute(starting_up, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(starting_up)
    page.wait_for_selector("#run")
    # 1. the page answers at once; the start-up's progress line says what it does, then that it is ready
    line = page.locator("#startup-line")
    line.wait_for(state="visible", timeout=30_000)
    assert re.match(r"[●✓⚠] \S", line.inner_text())
    page.screenshot(path=str(ASSETS / "screenshot-first-minute-open.png"))
    page.wait_for_selector("#startup-line[data-done=true]", timeout=300_000)
    assert line.inner_text().startswith("✓ ready: "), line.inner_text()
    assert page.locator("#preset input").input_value() == presets.BEST
    assert page.locator("#prompt textarea").input_value() == logic.DEFAULT_PROMPT

    # 2. Run on the default prompt: the why-line names where the kept guesses came from
    set_number(page, "max-new-tokens", TOKENS)  # the length is the reader's own: no preset changes
    fold_settings(page)
    assert page.locator("#preset input").input_value() == presets.BEST
    why = race_to_the_end(page)
    assert SOURCES.search(why), why
    # the status line at the top: both panes, then the summary's why-line, in one screen
    page.evaluate("() => window.scrollTo(0, document.querySelector('#status').getBoundingClientRect().top "
                  "+ window.scrollY - 8)")
    page.wait_for_timeout(500)
    page.screenshot(path=str(ASSETS / "screenshot-first-minute.png"))
    page.evaluate("() => window.scrollTo(0, 0)")

    # 3. Run again and Stop mid-race: the status and the unfinished panes say stopped, Replay is enabled
    set_number(page, "max-new-tokens", STOP_TOKENS)
    fold_settings(page)
    page.locator("#run").click()
    page.wait_for_selector("#pane-spec .sv-pane-box[data-state=running] .sv-tok", timeout=120_000)
    page.locator("#stop").click()
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('stopped')", timeout=5_000)
    assert "■ stopped at" in page.locator("#status").inner_text()
    states = pane_states(page)
    assert "running" not in states and "stopped" in states, states
    assert "■ stopped at" in page.locator("#race-panes").inner_text()
    assert page.locator("#replay").is_enabled()

    # 4. the "Prompt lookup" preset fills the settings (the selector keeps its name); a field edited by hand: Custom
    choose(page, "preset", "Prompt lookup")
    set_number(page, "max-new-tokens", TOKENS)
    assert page.locator("#method input").input_value() == "pld"
    assert page.locator("#preset input").input_value() == "Prompt lookup"
    gamma = page.locator("#gamma input").input_value()
    choose(page, "gamma", "2" if gamma != "2" else "3")
    page.wait_for_function("() => document.querySelector('#preset input').value === 'Custom'", timeout=5_000)
    choose(page, "preset", "Prompt lookup")
    assert page.locator("#gamma input").input_value() == gamma
    fold_settings(page)

    # 5. the pair that repeats or not, from the labelled examples: the poem copies more of itself than the sky
    title, repeats, new_words = PAIR
    page.locator("#examples > button.label-wrap").click()
    whys = []
    for side, example in zip("AB", (repeats, new_words)):
        page.get_by_text(f"{title} · {side}:").click()  # its label: the pair's lesson, what this side shows
        page.wait_for_function(f"() => document.querySelector('#prompt textarea').value === {example.prompt!r}",
                               timeout=5_000)
        whys.append(race_to_the_end(page))
        assert page.locator("#pane-spec .sv-pane-title").inner_text().startswith("Speculative (pld")
    assert "copies of earlier text (prompt lookup)" in whys[0], whys
    assert copied(whys[0]) > copied(whys[1]), whys
    page.close()
