"""DFlash in the app, in headless Debian Chromium: a DFlash race on the default CPU target reads as the plain lane's
text, and each of its steps is one bracketed block drafted in one forward, cut where the target cut it (also at a
phone's 390 pixels, inside the pane); the several-drafters tab races dflash against eagle and the default race and
sets their per-position acceptance side by side; the step-through walks one block. Saves assets/screenshot-dflash.png.

The drafter is the shipped one (paths.shipped_drafter) where there is one, else a random DFlash drafter built here for
the real target (tests/tiny.py): its blocks are refused at once, which the marks still show (data-kept 0, the bracket
and the cut drawn under "show every draft")."""
from __future__ import annotations

import pytest
import torch

from specviz import paths
from specviz.drafters import trained as drafters
from tests.browser_kit import ASSETS, choose, set_number
from tests.test_browser_race import READ_TEXT, race

N = 40
# each block in the speculative pane: [drafted, depth, kept, forwards, the index of the cut among its children (-1:
# none), the verdicts of the tokens inside it]
BLOCKS = """(sel) => [...document.querySelectorAll(sel + ' .sv-block[data-kept]')].map(b => [
  Number(b.dataset.drafted), Number(b.dataset.depth), Number(b.dataset.kept), Number(b.dataset.forwards),
  [...b.children].findIndex(c => c.classList.contains('sv-cut')),
  [...b.querySelectorAll('.sv-tok')].map(t => t.dataset.verdict)])"""


@pytest.fixture(scope="module")
def dflash_folder(target, tmp_path_factory):
    shipped = paths.shipped_drafter(target.name, "dflash")
    if shipped.is_dir():
        return shipped
    from tiny import random_drafter

    from specviz.drafters.dflash import dflash_layers, mask_token

    d = random_drafter(target, "dflash", torch.arange(4096), feature_layers=dflash_layers(
        target.model.config.num_hidden_layers), block_size=8, num_hidden_layers=1,
        mask_token_id=mask_token(target.tokenizer, target.vocab_size))
    folder = tmp_path_factory.mktemp("drafters") / f"{target.name}-dflash"
    drafters.save(folder, d.module, d.cfg, d.vocab_ids.cpu(), "# a random DFlash drafter (test_browser_dflash.py)\n")
    return folder


@pytest.fixture(scope="module")
def dflash_url(target, dflash_folder):
    """The app in-process on a free port, with `dflash_folder` as the shipped DFlash drafter (DFlash on the menus)."""
    import socket

    import app
    from specviz import hardware

    hardware.adopt(target)  # as conftest's app_url: this machine's default race, before DFlash is at hand
    real = paths.shipped_drafter
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "shipped_drafter", lambda t, m: dflash_folder if m == "dflash" else real(t, m))
        demo = app.build_ui()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        demo.queue(default_concurrency_limit=1).launch(prevent_thread_lock=True, server_name="127.0.0.1",
                                                       server_port=port, quiet=True, show_error=False,
                                                       **app.launch_options())
        try:
            yield f"http://127.0.0.1:{port}/"
        finally:
            demo.close()


def open_app(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#run")
    page.wait_for_timeout(2_500)  # the race tab's start-up ticks settle first (they may re-render the form)


def check_blocks(blocks: list) -> None:
    """Each block: one forward; its kept drafts first, the cut right after them where the path stopped short of the
    block's depth, then drafts the target refused or never judged; the target's own token outside it."""
    assert blocks
    for drafted, depth, kept, forwards, cut, verdicts in blocks:
        assert forwards == 1 and depth >= 2 and drafted >= depth and len(verdicts) == drafted, (drafted, verdicts)
        assert verdicts[:kept] == ["accepted"] * kept and "accepted" not in verdicts[kept:], verdicts
        assert cut == (kept if kept < depth else -1), (cut, kept, depth)


def test_a_dflash_race_marks_each_block_and_reads_as_plain_decoding(dflash_url, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    open_app(page, dflash_url)
    race(page, "dflash", N)
    assert page.evaluate(READ_TEXT, "#pane-ar") == page.evaluate(READ_TEXT, "#pane-spec")
    assert "identical to plain decoding" in page.locator("#summary").inner_text()
    blocks = page.evaluate(BLOCKS, "#pane-spec")
    check_blocks(blocks)
    # a step is no block where prompt lookup's or the datastore's branch made the path (the race grafts them)
    assert 0 < len(blocks) < page.locator("#pane-spec .sv-step").count()
    assert page.locator("#pane-spec .sv-block-key").is_visible() and page.locator("#pane-ar .sv-block").count() == 0
    if all(kept == 0 for _, _, kept, *_ in blocks):  # a drafter refused at once: its brackets show with every draft
        page.locator("#show-drafts input").check()
        page.wait_for_timeout(300)
    shown = page.evaluate("() => [...document.querySelectorAll('#pane-spec .sv-block[data-kept]')].filter(b => "
                          "getComputedStyle(b).borderTopWidth !== '0px').length")
    assert shown > 0
    page.locator("#race-panes").scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    page.screenshot(path=str(ASSETS / "screenshot-dflash.png"))
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: the blocks wrap inside the pane
    page.wait_for_timeout(500)
    overflow = page.evaluate("() => { const p = document.querySelector('#pane-spec .sv-pane');"
                             " return p.scrollWidth - p.clientWidth; }")
    assert overflow <= 1
    page.locator("#pane-spec").screenshot(path=str(tmp_path / "phone.png"))
    page.close()


def test_several_drafters_race_dflash_against_eagle_and_the_default(dflash_url, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    open_app(page, dflash_url)
    page.get_by_role("tab", name="Several drafters").click()
    page.wait_for_selector("#many-run")
    page.locator("#many-prompt textarea").fill("Write a Python function that adds two numbers.")
    page.locator("#many-lanes textarea, #many-lanes input").first.fill("dflash, eagle, default")
    set_number(page, "many-max-new-tokens", 24)
    page.locator("#many-run").click()
    page.wait_for_selector("#many-board table.sv-board", timeout=600_000)
    identical = page.evaluate("() => [...document.querySelectorAll('#many-board tr[data-lane]')]"
                              ".filter(r => r.dataset.lane !== 'ar').map(r => r.lastElementChild.textContent)")
    assert identical == ["✓"] * 3
    check_blocks(page.evaluate(BLOCKS, "#many-pane-1"))
    assert page.locator("#many-pane-2 .sv-block, #many-pane-3 .sv-block").count() == 0  # EAGLE: a forward a level
    page.wait_for_function("() => document.querySelector('#many-positions .js-plotly-plot')?.data?.length === 3",
                           timeout=30_000)
    names = page.evaluate("() => document.querySelector('#many-positions .js-plotly-plot').data.map(t => t.name)")
    assert names[0].startswith("dflash") and names[1].startswith("eagle"), names
    page.close()


def test_the_step_through_walks_one_block(dflash_url, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    open_app(page, dflash_url)
    page.get_by_role("tab", name="Step through").click()
    page.wait_for_selector("#step-next")
    choose(page, "step-method", "dflash")
    for n in (1, 2):  # the first cycle is the target's prefill; the second drafts a block
        page.locator("#step-next").click()
        so_far = f"{n} step{'s' * (n != 1)} so far"
        page.wait_for_function(f"() => document.querySelector('#step-status').innerText.includes('{so_far}')",
                               timeout=120_000)
    page.wait_for_selector("#step-block-note", timeout=120_000)
    note = page.locator("#step-block-note").inner_text()
    assert "One forward, a whole block" in note
    assert "cut the block at position" in note or "kept every position" in note
    rows = page.locator("#step-table-rows tr[data-verdict]").count()
    drafted = int(page.locator("#step-text .sv-block[data-kept]").last.get_attribute("data-drafted"))
    assert rows >= 2 and drafted >= 2
    page.close()
