"""Headless Debian Chromium through Playwright, shared by the browser tests (never a downloaded browser)."""
from __future__ import annotations

from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update"]
ASSETS = Path(__file__).resolve().parent.parent / "assets"


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def plot_traces(page, elem_id: str) -> int:
    return page.evaluate(f"() => document.querySelector('#{elem_id} .js-plotly-plot')?.data?.length ?? 0")
