"""Headless Debian Chromium through Playwright, shared by the browser tests (never a downloaded browser)."""
from __future__ import annotations

from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update"]
ASSETS = Path(__file__).resolve().parent.parent / "assets"
# the race's settings fold under one closed accordion (ui/race.py's race_form)
SETTINGS = "#settings"


def reveal(page, elem_id: str) -> None:
    """Open the race's Settings accordion when `elem_id` is not on the page (a closed accordion renders none of its
    fields) or is one of its fields, and the accordion is closed (its method field is not shown)."""
    field = page.locator(f"#{elem_id}")
    if field.count() and (field.is_visible() or not page.locator(f"{SETTINGS} #{elem_id}").count()):
        return
    if not page.locator(SETTINGS).is_visible():  # another tab is shown: its field is not the race's
        return
    if not page.locator("#method").is_visible():
        page.locator(f"{SETTINGS} > button.label-wrap").click()
        page.locator("#method").wait_for(state="visible", timeout=10_000)


def fold_settings(page) -> None:
    """Close the race's Settings accordion if a helper opened it, and scroll back to the top: the first screen."""
    if page.locator("#method").is_visible():
        page.locator(f"{SETTINGS} > button.label-wrap").click()
        page.locator("#method").wait_for(state="hidden", timeout=10_000)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.wait_for_timeout(300)


def set_number(page, elem_id: str, value) -> None:
    """Type `value` into a number field (a slider's box) and check, a moment later, that it held: twice in CI a Run
    right after raced the slider's old length (27 tokens where 24 were set), and a wait for the slider to read the value
    timed out: a field that a fold opening has just mounted can take its stored value again after the typing, so the
    value is typed again until it holds."""
    reveal(page, elem_id)
    box = page.locator(f"#{elem_id} input[type=number]")
    bar = page.locator(f"#{elem_id} input[type=range]")  # set from the component's value, not from the typing
    for _ in range(5):
        box.fill(str(value))
        box.press("Enter")
        page.wait_for_timeout(400)
        if box.input_value() == str(value) and (not bar.count() or float(bar.input_value()) == float(value)):
            return
    raise AssertionError(f"#{elem_id} did not keep {value!r}: it reads {box.input_value()!r}"
                         + (f", its slider {bar.input_value()!r}" if bar.count() else ""))


def choose(page, elem_id: str, option: str) -> None:
    """Pick `option` in a dropdown (a no-op when it is chosen already)."""
    reveal(page, elem_id)
    if page.locator(f"#{elem_id} input").input_value() == option:
        return
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()
    page.wait_for_timeout(300)


def plot_traces(page, elem_id: str) -> int:
    return page.evaluate(f"() => document.querySelector('#{elem_id} .js-plotly-plot')?.data?.length ?? 0")


BOX = """(el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }"""


def in_viewport(page, locator) -> bool:
    """Whether the element's box lies wholly within the viewport as the page stands (no scrolling done), to a pixel
    (a zoomed page scrolled to an element's top can leave it a fraction of a pixel above the edge)."""
    left, top, right, bottom = locator.evaluate(BOX)
    size = page.viewport_size
    return left >= -1 and top >= -1 and right <= size["width"] + 1 and bottom <= size["height"] + 1
