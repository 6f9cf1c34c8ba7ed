"""Golden, hand-built event lists -> rendered spans and HTML (no model, no torch)."""
from __future__ import annotations

import re

from specviz.ui import render
from specviz.events import DraftToken as D, EmittedToken as E, StepEvent, Verdict as V

# step 0: four drafts, two kept, the third refused (the fourth never judged), the target resamples " looks"
PARTIAL = StepEvent(0, (
    D(11, "The", V.ACCEPTED, 0.9, 0.95, 1.0, -1, 0),
    D(12, " sky", V.ACCEPTED, 0.8, 0.7, 0.875, 0, 1),
    D(13, " is", V.REJECTED, 0.6, 0.1, 0.1667, 1, 2),
    D(14, " red", V.DISCARDED, 0.5, None, None, 2, 3),
), (E(11, "The", V.ACCEPTED, 0.95), E(12, " sky", V.ACCEPTED, 0.7), E(15, " looks", V.RESAMPLED, 0.5)),
    0.01, 0.02, 4, 1, 4)
# step 1: both drafts kept, plus the target's bonus token
FULL = StepEvent(1, (
    D(16, " blue", V.ACCEPTED, 0.7, 0.9, 1.0, -1, 0),
    D(17, "\n", V.ACCEPTED, 0.6, 0.8, 1.0, 0, 1),
), (E(16, " blue", V.ACCEPTED, 0.9), E(17, "\n", V.ACCEPTED, 0.8), E(18, "<b>", V.BONUS, 0.4)),
    0.005, 0.02, 2, 1, 2, "length")
# prompt lookup found nothing: no drafts, the target's own token
NO_DRAFT = StepEvent(2, (), (E(19, "!", V.PLAIN, 0.3),), 0.0, 0.02, 0, 1, 0)
AR = [StepEvent(i, (), (E(t, s, V.PLAIN, 0.5),), 0.0, 0.02, 0, 1, 0) for i, (t, s) in enumerate([(11, "The"), (12, " sky")])]


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
    assert len(re.findall(r"<span ", out)) == len(verdicts)
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
