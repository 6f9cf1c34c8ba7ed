"""The race in dark mode, as a reader whose system is set dark sees it (Gradio follows prefers-color-scheme): every
piece of the race's text (the title, the panes' titles and tokens, each verdict, the legend, the status, the summary)
reads against the background it is drawn on, at WCAG's 4.5:1 for body text. Headless Debian Chromium with a dark
colour scheme; saves assets/screenshot-dark.png (looked at)."""
from __future__ import annotations

from tests.browser_kit import ASSETS, fold_settings, set_number

N = 24
MIN_CONTRAST = 4.5  # WCAG 2 AA, normal text

# each visible element's text colour and the first opaque background behind it, as [r, g, b, a] lists
COLOURS = """(sel) => {
  const rgba = (s) => (s.match(/[\\d.]+/g) || []).map(Number).concat([1]).slice(0, 4);
  const behind = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0.5) return c;
    }
    return rgba(getComputedStyle(document.body).backgroundColor);
  };
  return [...document.querySelectorAll(sel)].filter((e) => e.checkVisibility() && e.textContent.trim())
    .map((e) => ({text: e.textContent.trim().slice(0, 30), fg: rgba(getComputedStyle(e).color), bg: behind(e),
                  opacity: Number(getComputedStyle(e).opacity)}));
}"""


def luminance(rgb) -> float:
    def channel(v: float) -> float:
        v /= 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(v) for v in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg, bg) -> float:
    a = fg[3] if len(fg) > 3 else 1.0
    mixed = [fg[i] * a + bg[i] * (1 - a) for i in range(3)]  # a translucent colour, over what is behind it
    hi, lo = sorted((luminance(mixed), luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_dark_mode_text_reads_against_its_background(app_url, browser):
    page = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="dark").new_page()
    page.goto(app_url)
    page.wait_for_selector("#run")
    assert page.evaluate("() => document.body.classList.contains('dark')")  # Gradio took the reader's setting
    page.locator("#prompt textarea").fill("Write a haiku about the sea.")
    set_number(page, "max-new-tokens", N)
    page.locator("#run").click()
    page.wait_for_selector("#summary .sv-badge", timeout=300_000)
    page.wait_for_timeout(500)
    checked, poor = 0, []
    for sel in ("#title h1", "#title p", ".sv-pane-title", "#pane-ar .sv-tok", "#pane-spec .sv-tok", ".sv-stats",
                "#legend .sv-tok", "#legend .sv-legend-item", "#status .sv-status", "#summary .sv-badge",
                "#summary .sv-card-k", "#summary .sv-card-v", ".sv-lesson"):
        for item in page.evaluate(COLOURS, sel):
            if item["opacity"] < 1:  # a faded never-judged draft: its strike-through and its grey are its cues
                continue
            checked += 1
            ratio = contrast(item["fg"], item["bg"])
            if ratio < MIN_CONTRAST:
                poor.append(f"{sel} {item['text']!r}: {ratio:.2f}:1")
    assert checked > 20, checked
    assert not poor, poor[:12]
    fold_settings(page)  # the first screen: the form, both panes
    ASSETS.mkdir(exist_ok=True)
    page.screenshot(path=str(ASSETS / "screenshot-dark.png"))
    page.close()
