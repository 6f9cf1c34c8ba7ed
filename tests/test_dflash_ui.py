"""How the app shows DFlash, on golden hand-built events (no model): a block drafted in one forward is bracketed in
the pane with its cut mark, only where one drafter forward drafted two or more positions (a chain, or the race's
tree); the per-position plot sets lanes side by side; the step-through says the block came from one forward."""
from __future__ import annotations

from html.parser import HTMLParser

import plotly.graph_objects as go
import pytest

from specviz import hardware, paths
from specviz.config import DecodeConfig
from specviz.errors import ConfigError
from specviz.events import LOOKUP_HEAD, StepEvent
from specviz.events import DraftToken as D
from specviz.events import EmittedToken as E
from specviz.events import Verdict as V
from specviz.ui import lane_plots, many, plots, render, step, step_plots
from specviz.ui.logic import Lane
from specviz.ui.race_html import pane_html


def block(step: int, kept: int, drafted: int, forwards: int = 1, tree_size: int = 0) -> StepEvent:
    """A chain step of `drafted` drafts from `forwards` drafter forwards: the first `kept` accepted, the next refused,
    the rest never judged; then the target's own token (resampled, or the bonus when every draft was kept)."""
    words = [f" w{step}_{i}" for i in range(drafted)]
    drafts = tuple(D(100 + i, w, V.ACCEPTED if i < kept else V.REJECTED if i == kept else V.DISCARDED, 0.5,
                     None if i > kept else 0.4, None, i - 1, i) for i, w in enumerate(words))
    own = E(99, f" own{step}", V.RESAMPLED if kept < drafted else V.BONUS, 0.6)
    emitted = tuple(E(100 + i, words[i], V.ACCEPTED, 0.4) for i in range(kept)) + (own,)
    return StepEvent(step=step, drafts=drafts, emitted=emitted, draft_forwards=forwards, gamma=drafted,
                     tree_size=tree_size)


PREFILL = StepEvent(step=0, drafts=(), emitted=(E(1, "Hi", V.BONUS, 0.9),))
DFLASH = [PREFILL, block(1, 3, 7), block(2, 0, 7), block(3, 4, 4)]


class Blocks(HTMLParser):
    """Each sv-block's attributes and, in order, what it holds: the tokens' (verdict, text) and "CUT" for the cut mark;
    and every token outside a block."""

    def __init__(self):
        super().__init__()
        self.blocks: list[tuple[dict, list]] = []
        self.outside: list[tuple[str, str]] = []
        self.stack: list[str] = []  # "block" | "tok" | "other" for each open span
        self.text = ""

    def handle_starttag(self, tag, attrs):
        if tag != "span":
            return
        a = dict(attrs)
        classes = a.get("class", "").split()
        if "sv-block" in classes:
            self.blocks.append((a, []))
            self.stack.append("block")
        elif "sv-cut" in classes:
            self.blocks[-1][1].append("CUT")
            self.stack.append("other")
        elif "sv-tok" in classes:
            self.verdict, self.text = a["data-verdict"], ""
            self.stack.append("tok")
        else:
            self.stack.append("other")

    def handle_data(self, data):
        if "tok" in self.stack:
            self.text += data

    def handle_endtag(self, tag):
        if tag != "span":
            return
        kind = self.stack.pop()
        if kind == "tok" and "tok" not in self.stack:
            (self.blocks[-1][1] if "block" in self.stack else self.outside).append((self.verdict, self.text))


def parse(html_text: str) -> Blocks:
    p = Blocks()
    p.feed(html_text)
    return p


def test_a_block_drafted_in_one_forward_is_bracketed_with_its_cut():
    p = parse(render.pane_body_html(DFLASH, blocks=True))
    assert [(a["data-forwards"], a["data-drafted"], a["data-kept"]) for a, _ in p.blocks] == [
        ("1", "7", "3"), ("1", "7", "0"), ("1", "4", "4")]
    first = p.blocks[0][1]  # the kept drafts, the cut, the refusal, the never-judged ones: and nothing else
    assert first == [("accepted", " w1_0"), ("accepted", " w1_1"), ("accepted", " w1_2"), "CUT",
                     ("rejected", " w1_3")] + [("discarded", f" w1_{i}") for i in range(4, 7)]
    assert p.blocks[1][1][0] == "CUT"  # refused at its first draft: the cut opens the block
    assert "CUT" not in p.blocks[2][1] and len(p.blocks[2][1]) == 4  # every draft kept: no cut
    # the target's own tokens stand outside every bracket: the drafter did not draft them
    assert p.outside == [("bonus", "Hi"), ("resampled", " own1"), ("resampled", " own2"), ("bonus", " own3")]
    assert "cut it at position 4" in p.blocks[0][0]["title"] and "ONE drafter forward" in p.blocks[0][0]["title"]
    assert "kept it whole" in p.blocks[2][0]["title"]


# DFlash's block verified as a tree (the race): each position's top-2, with prompt lookup's branch grafted at the root.
# The path keeps " a" then " b"; " c" (depth 2) is refused; " x" (a sibling of " a"), " y" (under " b") are off the
# path; the grafted " g" is refused; the target resamples " r".
TREE_BLOCK = StepEvent(step=1, drafts=(
    D(1, " a", V.ACCEPTED, 0.6, 0.7, None, -1, 0), D(2, " x", V.DISCARDED, 0.3, None, None, -1, 0, 0, 1),
    D(3, " b", V.ACCEPTED, 0.5, 0.6, None, 0, 1), D(4, " y", V.DISCARDED, 0.2, None, None, 0, 1, 0, 1),
    D(5, " c", V.REJECTED, 0.5, 0.1, None, 2, 2), D(6, " g", V.REJECTED, 1.0, 0.1, None, -1, 0, LOOKUP_HEAD)),
    emitted=(E(1, " a", V.ACCEPTED, 0.7), E(3, " b", V.ACCEPTED, 0.6), E(7, " r", V.RESAMPLED, 0.5)),
    draft_forwards=1, gamma=3, tree_size=6)


def test_a_tree_drafted_in_one_forward_is_a_block_and_a_graft_stands_outside_it():
    p = parse(render.pane_body_html([PREFILL, TREE_BLOCK], blocks=True))
    (attrs, inside), = p.blocks
    assert (attrs["data-drafted"], attrs["data-depth"], attrs["data-kept"]) == ("5", "3", "2")
    assert inside == [("accepted", " a"), ("accepted", " b"), "CUT", ("discarded", " x"), ("discarded", " y"),
                      ("rejected", " c")]
    assert p.outside == [("bonus", "Hi"), ("rejected", " g"), ("resampled", " r")]  # the lookup's draft: not the block


def test_only_drafts_of_one_forward_over_two_positions_are_a_block():
    eagle_chain = [PREFILL, block(1, 2, 3, forwards=3)]   # a forward per draft: no block
    siblings = [PREFILL, StepEvent(step=1, drafts=(D(1, " a", V.REJECTED, 0.6, 0.1), D(2, " b", V.REJECTED, 0.3, 0.1)),
                                   emitted=(E(3, " c", V.RESAMPLED, 0.5),), draft_forwards=1, gamma=1, tree_size=2)]
    single = [PREFILL, block(1, 0, 1)]                   # one draft: nothing to bracket
    looked_up = StepEvent(step=1, drafts=tuple(
        D(i, f" l{i}", V.ACCEPTED, 1.0, 0.9, None, i - 1, i, LOOKUP_HEAD) for i in range(2)) + TREE_BLOCK.drafts[1:2]
        + TREE_BLOCK.drafts[3:5],
        emitted=(E(0, " l0", V.ACCEPTED), E(1, " l1", V.ACCEPTED), E(9, " z", V.RESAMPLED)), draft_forwards=1,
        gamma=3, tree_size=5)  # the path is prompt lookup's: its tokens were not drafted by the forward
    for events in (eagle_chain, siblings, single, [PREFILL, looked_up]):
        assert "sv-block" not in render.pane_body_html(events, blocks=True)
    assert "sv-block" not in render.pane_body_html(DFLASH)  # not asked for: the pane as before


def test_the_pane_brackets_blocks_for_a_drafter_with_weights_only_and_keys_them():
    lane = Lane(DFLASH, clock=0.5, done=True)
    dflash = pane_html("Speculative (DFlash)", lane, False, method="dflash")
    assert dflash.count('class="sv-block"') == 3 and "sv-block-key" in dflash and "1 forward" in dflash
    lookup = pane_html("Speculative (prompt lookup)", lane, False, method="pld")  # a lookup, no drafter forward
    assert "sv-block" not in lookup
    assert "sv-block" not in pane_html("x", lane, False, method="no-such-method")


def test_the_pane_still_reads_as_the_committed_text():
    """Hidden drafts (the stylesheet hides .sv-off) left out, a pane with blocks reads as what was committed."""
    class Text(HTMLParser):
        def __init__(self):
            super().__init__()
            self.out, self.skip = [], []

        def handle_starttag(self, tag, attrs):
            c = dict(attrs).get("class", "")
            self.skip.append("sv-off" in c.split() or "sv-rejected" in c.split() or tag == "summary")

        def handle_endtag(self, tag):
            self.skip.pop()

        def handle_data(self, data):
            if not any(self.skip):
                self.out.append(data)

    t = Text()
    t.feed(render.pane_body_html(DFLASH, blocks=True))
    assert "".join(t.out) == "".join(x.text for e in DFLASH for x in e.emitted)


# EAGLE-3 on the same prompt, as a tree: depth 0 has two candidates (the second kept), depth 1 one (refused)
EAGLE_TREE = StepEvent(step=1, drafts=(D(1, " a", V.REJECTED, 0.6, 0.1), D(2, " b", V.ACCEPTED, 0.3, 0.5, None, -1, 0),
                                       D(3, " c", V.REJECTED, 0.5, 0.1, None, 1, 1)),
                       emitted=(E(2, " b", V.ACCEPTED, 0.5), E(4, " d", V.RESAMPLED, 0.5)), draft_forwards=2, gamma=2,
                       tree_size=3)


def test_per_position_acceptance_sets_lanes_side_by_side():
    fig = lane_plots.positions_figure({"dflash": DFLASH, "eagle": [PREFILL, EAGLE_TREE]})
    go.Figure(fig.to_dict())  # plotly's own validation (built unvalidated for speed)
    dflash, eagle = fig.data
    # DFlash: position 1 reached by all 3 blocks, kept by 2; 2 and 3 reached by 2, kept by 2; 4 by 2, kept by 1 ...
    assert list(dflash.x) == [1, 2, 3, 4] and list(dflash.customdata) == [3, 2, 2, 2]
    assert list(dflash.y) == pytest.approx([2 / 3, 1.0, 1.0, 0.5])
    # a tree counts by step, as a chain does: depth 0 kept (by its second candidate), depth 1 refused
    assert list(eagle.y) == [1.0, 0.0] and list(eagle.customdata) == [1, 1]
    # the race tab's "share kept at i" counts the same way (it counted each judged node, siblings too: 0.5 here)
    assert list(plots.accept_figure([PREFILL, EAGLE_TREE]).data[1].y) == list(eagle.y)
    assert dflash.name.startswith("dflash (τ ") and dflash.marker.pattern.shape != eagle.marker.pattern.shape
    empty = lane_plots.positions_figure({})
    assert not empty.data and "appears when" in empty.layout.annotations[-1].text


def test_a_lane_whose_drafter_is_not_shipped_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(paths, "shipped_drafter", lambda target, method: tmp_path / f"{target}-{method}")
    with pytest.raises(ConfigError, match=r"lane 'dflash': no dflash drafter is shipped for .* yet"):
        many.parse_lanes("dflash, eagle", DecodeConfig(), hardware.default_pair())
    (tmp_path / "smollm2-135m-dflash").mkdir()
    (tmp_path / "smollm2-135m-eagle").mkdir()
    lanes = many.parse_lanes("dflash, eagle, default", DecodeConfig(), hardware.default_pair())
    assert [cfg.method for cfg, _ in lanes.values()][:2] == ["dflash", "eagle"]
    # a bare dflash races its whole block as bench does (a dynamic tree); a race written as the start line names
    # DFlash's fastest one is that race: its first slot as a chain, with both branches
    assert (lanes["dflash"][0].tree, lanes["dflash"][0].tree_nodes) == ("dynamic", hardware.CPU_TREES[0][1])
    cfg = many.parse_lanes("dflash:1+pld:4+ret:2", DecodeConfig(), hardware.default_pair())["dflash:1+pld:4+ret:2"][0]
    assert (cfg.gamma, cfg.tree, cfg.lookup, cfg.retrieve) == (1, "static", 4, 2)


def test_the_step_through_says_the_block_came_from_one_forward():
    note = step.block_note_html(DFLASH[1], "dflash")
    assert "One forward, a whole block" in note and "these 7 tokens" in note
    assert "kept 3 and cut the block at position 4; the positions after it were never judged" in note
    assert "kept every position" in step.block_note_html(DFLASH[3], "dflash")
    tree = step.block_note_html(TREE_BLOCK, "dflash")  # the race's tree: the graft is not the drafter's
    assert "these 5 candidates for 3 positions" in tree and "kept 2 and cut the block at position 3." in tree
    assert step.block_note_html(block(1, 2, 3, forwards=3), "eagle") == ""  # EAGLE's chain: a forward a guess
    assert step.block_note_html(DFLASH[1], "pld") == ""
    text = parse(step.step_text_html(DFLASH, "dflash"))
    assert len(text.blocks) == 3 and text.blocks[0][1][3] == "CUT"


def test_the_step_through_theory_prices_a_block_at_one_drafter_forward():
    """Leviathan's S = E / (γc + 1) counts γ drafter forwards a step; a block drafted in one costs c: E / (c + 1)."""
    e4 = (1 - 0.7 ** 5) / (1 - 0.7)
    assert step_plots.theory_figure(0.7, 0.1).data[1].y[3] == pytest.approx(e4 / (4 * 0.1 + 1))
    fig = step_plots.theory_figure(0.7, 0.1, {"alpha": 0.7, "tau": 2.0, "gamma": 4, "c": 0.1}, block=True)
    assert fig.data[1].y[3] == pytest.approx(e4 / (0.1 + 1)) and fig.data[-1].y[0] == pytest.approx(e4 / 1.1)
    assert "one drafter forward" in fig.layout.annotations[1].text

    class Session:  # what drafts_a_block reads of a step-through session
        def __init__(self, method, events):
            self.cfg, self.events = DecodeConfig(method=method), events

    assert step.drafts_a_block(Session("dflash", DFLASH))
    assert not step.drafts_a_block(Session("dflash", [PREFILL]))  # nothing drafted yet
    assert not step.drafts_a_block(Session("eagle", [PREFILL, block(1, 2, 3, forwards=3)]))
    assert not step.drafts_a_block(None)
