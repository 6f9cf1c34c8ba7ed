"""One race, two named definitions of acceptance (metrics.ACCEPTANCE, metrics.PROPOSED_ACCEPTANCE), each checked
against the race's own events: the α the race's summary shows (kept / judged drafts: the drafts on the verified path)
and the draft acceptance Watch computes from the app's /metrics text (kept / every drafted token, as vLLM counts)."""
from __future__ import annotations

import pytest

from specviz.config import DecodeConfig
from specviz.events import Verdict
from specviz.serving import export
from specviz.serving import prometheus as prom
from specviz.ui import logic, race_html


def race_and_watch(prompt: str, cfg: DecodeConfig, **target):
    """Run one race through the app's metered stream (what feeds /metrics) and watch /metrics across it as Watch
    does: a scrape before, one after. Returns the finished snapshot and Watch's summary."""
    from specviz.ui import race

    before = prom.parse(export.APP.text(), t=0.0)
    snap = None
    for snap in race.metered(logic.race_stream(prompt, cfg, **target)):
        pass
    watch = prom.Watch()
    watch.add(before)
    watch.add(prom.parse(export.APP.text(), t=1.0))
    return snap, watch.summary()


def check_both(snap, s) -> tuple[float, float]:
    """The race's α and Watch's acceptance, each equal to its definition counted on the events; returned."""
    drafts = [d for e in snap.lanes["spec"].events for d in e.drafts]
    kept = sum(d.verdict is Verdict.ACCEPTED for d in drafts)
    judged = sum(d.verdict in (Verdict.ACCEPTED, Verdict.REJECTED) for d in drafts)
    spec = snap.comparison.spec
    assert kept and judged, "the race kept no draft: nothing to compare"
    assert spec.alpha == pytest.approx(kept / judged)                # the race: drafts on the verified path
    assert s["acceptance_rate"] == pytest.approx(kept / len(drafts))  # Watch on /metrics: every drafted token
    assert (s["accepted_tokens"], s["draft_tokens"]) == (kept, len(drafts))
    assert spec.proposed_acceptance == pytest.approx(s["acceptance_rate"])
    # the summary shows both, each with its counts, so that neither is read as the other
    note = race_html.alpha_note(spec)
    assert f"{kept} of the {judged} guesses the target judged" in note and f"{kept} of {len(drafts)}" in note
    return spec.alpha, s["acceptance_rate"]


def test_race_alpha_and_watch_acceptance_each_match_their_definition(tiny_target):
    # prompt lookup on a repeating prompt: chains of 4, some refused before their end (drafts never judged)
    cfg = DecodeConfig(method="pld", gamma=4, max_new_tokens=24)
    snap, s = race_and_watch("5 6 7 8 5 6 7 8 5 6 7 8 5 6 1 2 5 6", cfg, target=tiny_target)
    alpha, every = check_both(snap, s)
    assert every < alpha  # some drafts went unjudged (after a refusal): the two definitions part


@pytest.mark.integration
def test_a_tree_race_alpha_and_watch_acceptance_each_match_their_definition(target):
    """EAGLE's tree with prompt lookup's branch on the real target: every node is a drafted token for /metrics (as
    vLLM counts), only the verified path and its end's refused children for α, so the two differ."""
    cfg = DecodeConfig(method="eagle", gamma=1, lookup=3, max_new_tokens=48)
    snap, s = race_and_watch("Write a short, cheerful poem about a lighthouse keeper who loves tea.", cfg)
    alpha, every = check_both(snap, s)
    assert every < alpha
