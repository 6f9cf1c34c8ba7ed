"""Golden, hand-built event lists -> rendered spans and HTML (no model, no torch)."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from specviz.events import DraftToken as D
from specviz.events import EmittedToken as E
from specviz.events import StepEvent
from specviz.events import Verdict as V
from specviz.ui import render

# step 0: four drafts, two kept, the third refused (the fourth never judged), the target resamples " looks"
PARTIAL = StepEvent(step=0, drafts=(
    D(11, "The", V.ACCEPTED, 0.9, 0.95, 1.0, -1, 0),
    D(12, " sky", V.ACCEPTED, 0.8, 0.7, 0.875, 0, 1),
    D(13, " is", V.REJECTED, 0.6, 0.1, 0.1667, 1, 2),
    D(14, " red", V.DISCARDED, 0.5, None, None, 2, 3),
), emitted=(E(11, "The", V.ACCEPTED, 0.95), E(12, " sky", V.ACCEPTED, 0.7), E(15, " looks", V.RESAMPLED, 0.5)),
    draft_s=0.01, verify_s=0.02, draft_forwards=4, target_forwards=1, gamma=4)
# step 1: both drafts kept, plus the target's bonus token
FULL = StepEvent(step=1, drafts=(
    D(16, " blue", V.ACCEPTED, 0.7, 0.9, 1.0, -1, 0),
    D(17, "\n", V.ACCEPTED, 0.6, 0.8, 1.0, 0, 1),
), emitted=(E(16, " blue", V.ACCEPTED, 0.9), E(17, "\n", V.ACCEPTED, 0.8), E(18, "<b>", V.BONUS, 0.4)),
    draft_s=0.005, verify_s=0.02, draft_forwards=2, target_forwards=1, gamma=2, finish_reason="length")
# prompt lookup found nothing: no drafts, the target's own token
NO_DRAFT = StepEvent(step=2, drafts=(), emitted=(E(19, "!", V.PLAIN, 0.3),), draft_s=0.0, verify_s=0.02,
                     draft_forwards=0, target_forwards=1, gamma=0)
AR = [StepEvent(step=i, drafts=(), emitted=(E(t, s, V.PLAIN, 0.5),), draft_s=0.0, verify_s=0.02, draft_forwards=0,
                target_forwards=1, gamma=0)
      for i, (t, s) in enumerate([(11, "The"), (12, " sky")])]


def test_spans_order_kept_then_refused_then_resampled():
    got = [(s.text, s.verdict) for s in render.spans([PARTIAL, FULL, NO_DRAFT])]
    assert got == [
        ("The", V.ACCEPTED), (" sky", V.ACCEPTED),        # kept drafts
        (" is", V.REJECTED), (" red", V.DISCARDED),       # then refused / never judged
        (" looks", V.RESAMPLED),                          # then the target's own token
        (" blue", V.ACCEPTED), ("\n", V.ACCEPTED), ("<b>", V.BONUS),
        ("!", V.PLAIN),
    ]


def test_spans_carry_probabilities_for_the_hover_title():
    s = render.spans([PARTIAL])
    assert (s[0].q_draft, s[0].p_target, s[0].accept_prob) == (0.9, 0.95, 1.0)
    assert (s[2].q_draft, s[2].p_target) == (0.6, 0.1)
    assert s[3].p_target is None  # never judged
    assert s[4].q_draft is None and s[4].p_target == 0.5  # the target's own token was not drafted


def test_ar_spans_are_plain():
    assert [(s.text, s.verdict) for s in render.spans(AR)] == [("The", V.PLAIN), (" sky", V.PLAIN)]


def test_html_every_token_has_data_verdict_and_title():
    out = render.to_html(render.spans([PARTIAL, FULL, NO_DRAFT]))
    verdicts = re.findall(r'data-verdict="(\w+)"', out)
    assert verdicts == ["accepted", "accepted", "rejected", "discarded", "resampled", "accepted", "accepted",
                        "bonus", "plain"]
    assert len(re.findall(r'<span class="sv-tok', out)) == len(verdicts)  # every token span has a verdict
    titles = re.findall(r'title="([^"]*)"', out)
    assert len(titles) == len(verdicts)
    assert "q_draft=0.800" in titles[1] and "p_target=0.700" in titles[1] and "min(1, p/q)=0.875" in titles[1]
    assert "&lt;b&gt;" in out and "<b>" not in out.replace('<span', '')  # token text is escaped
    assert "↵<br>" in out  # a newline token stays visible


def test_legend_has_every_drafting_verdict_once():
    out = render.legend_html()
    assert 'id="legend"' in out
    assert re.findall(r'data-verdict="(\w+)"', out) == ["accepted", "rejected", "discarded", "resampled", "bonus"]


def test_css_gives_each_verdict_a_second_cue_beside_colour():
    css = render.CSS
    for cls, cue in (("accepted", "underline"), ("rejected", "line-through"), ("discarded", "line-through"),
                     ("resampled", "font-weight"), ("bonus", "font-weight")):
        rule = re.search(r"\.sv-%s \{([^}]*)\}" % cls, css).group(1)
        assert cue in rule, cls


def test_ansi_without_colour_is_the_committed_text():
    assert render.to_ansi(render.spans([PARTIAL, FULL]), colour=False) == "The sky looks blue\n<b>"


# a tree step: "The sky" kept on the path; two children of the path's end refused (the drafter's first guess " is",
# then the lookup's " was"); two nodes on another branch never judged; the target writes " looks"
TREE = StepEvent(step=3, drafts=(
    D(11, "The", V.ACCEPTED, 0.9, 0.95, None, -1, 0),
    D(21, "A", V.DISCARDED, 0.05, None, None, -1, 0, rank=1),
    D(12, " sky", V.ACCEPTED, 0.8, 0.7, None, 0, 1),
    D(22, " cat", V.DISCARDED, 0.3, None, None, 1, 1),
    D(13, " is", V.REJECTED, 0.6, 0.1, None, 2, 2),
    D(23, " was", V.REJECTED, 0.2, 0.05, None, 2, 2, head=-1),
), emitted=(E(11, "The", V.ACCEPTED, 0.95), E(12, " sky", V.ACCEPTED, 0.7), E(15, " looks", V.RESAMPLED, 0.5)),
    draft_s=0.01, verify_s=0.02, draft_forwards=1, target_forwards=1, gamma=6)


class _Reader(HTMLParser):
    """The text a reader sees in a pane with the off-path drafts and the counts hidden, less the small refused
    token: the committed tokens only (what the browser test reads from the page)."""

    def __init__(self):
        super().__init__()
        self.stack, self.text = [], []

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        skip = "sv-off" in cls or "sv-rejected" in cls or tag == "details"
        self.stack.append(skip or (bool(self.stack) and self.stack[-1]))

    def handle_endtag(self, tag):
        self.stack.pop()

    def handle_data(self, data):
        if self.stack and not self.stack[-1]:
            self.text.append(data)


def committed_text(html: str) -> str:
    reader = _Reader()
    reader.feed(html.replace("<br>", ""))
    return "".join(reader.text).replace("↵", "\n")


def test_only_the_refusal_on_the_verified_path_stays_inline():
    items = render.step_spans(TREE)
    shown = [(s.text, s.verdict) for s in items if not s.off_path]
    assert shown == [("The", V.ACCEPTED), (" sky", V.ACCEPTED), (" is", V.REJECTED), (" looks", V.RESAMPLED)]
    assert sorted(s.text for s in items if s.off_path) == [" cat", " was", "A"]  # other branches, other refusals
    assert render.refusal_index(TREE) == 4 and render.refusal_index(FULL) is None
    chain = render.step_spans(PARTIAL)  # a chain: the refusal stays, the draft after it is off the path
    assert [(s.text, s.off_path) for s in chain if s.verdict in (V.REJECTED, V.DISCARDED)] == [(" is", False),
                                                                                                 (" red", True)]


def test_pane_body_bands_each_step_and_counts_its_off_path_drafts():
    out = render.pane_body_html([PARTIAL, FULL, TREE, NO_DRAFT])
    steps = [(re.search(r"sv-band-(\d)", tag).group(1), re.search(r'data-step="(\d+)"', tag).group(1))
             for tag in re.findall(r"<span [^>]*>", out) if "sv-step" in tag]
    assert steps == [("0", "0"), ("1", "1"), ("1", "3"), ("0", "2")]  # one band per target forward, alternating
    assert 'class="sv-tok sv-plain sv-step sv-band-0" data-step="2" data-verdict="plain"' in out  # one token: its band
    counts = re.findall(r'<details class="sv-more" data-step="(\d+)"><summary[^>]*>\+(\d+)</summary>', out)
    assert counts == [("0", "1"), ("3", "3")]  # no count where every draft was on the path
    assert len(re.findall(r'class="sv-tok sv-\w+ sv-off"', out)) == 1 + 3  # inline, hidden unless asked for
    assert re.search(r":has\(> \.sv-more\[open\]\) > \.sv-off \{ display: inline", render.CSS)  # opening shows them


def test_a_pane_without_its_hidden_drafts_reads_as_the_committed_text():
    spec = render.pane_body_html([PARTIAL, FULL, TREE])
    committed = "".join(t.text for e in (PARTIAL, FULL, TREE) for t in e.emitted)
    assert committed_text(spec) == committed


def test_a_refused_newline_breaks_no_line():
    e = StepEvent(step=0, drafts=(D(30, "\n", V.REJECTED, 0.5, 0.1, None, -1, 0),),
                  emitted=(E(31, "!", V.RESAMPLED, 0.6),))
    out = render.to_html(render.step_spans(e))
    assert "↵<br>" not in out and "↵" in out
    assert "↵<br>" in render.to_html(render.spans([FULL]))  # a committed one still does


def test_spaces_are_not_underlined_or_struck():
    out = render.to_html(render.spans([PARTIAL]))
    assert '<span class="sv-sp"> </span>sky' in out
    assert re.search(r"\.sv-sp \{[^}]*inline-block", render.CSS)


# a chat model's turn ends: the special token arrives as a bonus token after a kept draft
TURN_END = StepEvent(step=0, drafts=(D(20, " done.", V.ACCEPTED, 0.9, 0.9, 1.0, -1, 0),
                                     D(21, "<|im_end|>", V.REJECTED, 0.5, 0.1, 0.2, 0, 1)),
                     emitted=(E(20, " done.", V.ACCEPTED, 0.9), E(2, "<|im_end|>", V.RESAMPLED, 0.9)),
                     draft_s=0.0, verify_s=0.02, draft_forwards=2, target_forwards=1, gamma=2)


def test_special_tokens_are_labelled_chips_not_raw_markup():
    body = render.pane_body_html([TURN_END])
    assert "<|im_end|>" not in body and "&lt;|im_end|&gt;" not in re.sub(r'title="[^"]*"', "", body)
    chips = re.findall(r'<span class="sv-special"[^>]*title="special token &lt;\|im_end\|&gt;">([^<]*)</span>', body)
    assert chips == ["end of turn", "end of turn"]  # the refused draft and the target's own token
    assert render.special_label("<|endoftext|>") == "end of text" and render.special_label("</s>") == "end of text"
    assert render.special_label("<|fim_middle|>") == "special: fim_middle"
    assert render.to_html(render.spans([FULL])).count("sv-special") == 0  # "<b>" is text, not a special token
    assert "&lt;b&gt;" in render.to_html(render.spans([FULL]))
    assert "[end of turn]" in render.to_ansi(render.spans([TURN_END]))
    assert render.to_ansi(render.spans([TURN_END]), colour=False) == " done.<|im_end|>"  # a pipe gets the text
    assert committed_text(body) == " done.end of turn"  # a reader sees the label where the turn ends


@pytest.mark.browser
def test_a_refused_special_token_is_struck_through_like_any_refused_draft(browser):
    """A special token is drawn as a chip (an inline-block), which a refused draft's line-through does not reach by
    itself: prompt lookup copies the chat template's <|im_start|> and <|im_end|> from the prompt, the target refuses
    them, and unstruck they read as the answer ending mid-text. Rendered in headless Chromium with the app's CSS."""
    spans = [render.Span("<|im_end|>", V.REJECTED, 0), render.Span("<|im_start|>", V.DISCARDED, 0),
             render.Span("<|im_end|>", V.PLAIN, 1)]
    page = browser.new_page()
    try:
        page.set_content(f"<style>{render.CSS}</style><div>{render.to_html(spans)}</div>")
        lines = page.eval_on_selector_all(".sv-special", "els => els.map(e => getComputedStyle(e).textDecorationLine)")
    finally:
        page.close()
    assert lines[0] == lines[1] == "line-through" and lines[2] == "none", lines
