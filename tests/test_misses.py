"""Why a drafter misses (specviz/check/misses.py) on golden event lists: the accepted-length histogram, near ties
against real disagreements, the contexts and tokens missed most, acceptance by position."""
import json

import pytest

from specviz.check import misses
from specviz.events import DraftToken, EmittedToken, StepEvent, Verdict

A, R, D = Verdict.ACCEPTED, Verdict.REJECTED, Verdict.DISCARDED


def chain(step: int, texts: list[str], kept: int, target: str | None = None, gap: tuple | None = (0.9, 0.05),
          gamma: int = 4) -> StepEvent:
    """A chain step drafting `texts` (γ of them), the first `kept` accepted, then (if kept < γ) the target refusing
    the next with top-2 probabilities `gap` and emitting its own token `target`; a bonus "+" when all were kept."""
    drafts = []
    for i, t in enumerate(texts):
        v = A if i < kept else R if i == kept else D
        top = gap if v is R and gap else (None, None)
        drafts.append(DraftToken(100 + i, t, v, 0.5, p_target=0.5 if v is not D else None, parent=i - 1, depth=i,
                                 p_top1=top[0], p_top2=top[1]))
    emitted = [EmittedToken(100 + i, t, A) for i, t in enumerate(texts[:kept])]
    last = EmittedToken(7, target, Verdict.RESAMPLED) if kept < len(texts) else EmittedToken(8, "+", Verdict.BONUS)
    emitted.append(last)
    return StepEvent(step=step, drafts=tuple(drafts), emitted=tuple(emitted), gamma=gamma)


def prefill(text: str) -> StepEvent:
    return StepEvent(step=0, drafts=(), emitted=(EmittedToken(1, text, Verdict.PLAIN),))


def test_histogram_and_both_position_curves():
    events = [prefill("Hi"),
              chain(1, [" a", " b", " c", " d"], 2, " x"),  # kept 2 of 4
              chain(2, [" e", " f", " g", " h"], 4),        # kept all 4 (bonus)
              chain(3, [" i", " j", " k", " l"], 0, " y")]  # kept 0
    a = misses.analyse([("qa", events)])
    assert a["steps"] == 3 and a["accepted_length"] == [1, 0, 1, 0, 1]  # the prefill drafted nothing: not counted
    assert a["accepted_length_by_category"] == {"qa": [1, 0, 1, 0, 1]} and a["mean_accepted"] == 2.0
    pos = a["position"]
    assert pos["drafted"] == [3, 3, 3, 3] and pos["judged"] == [3, 2, 2, 1] and pos["kept"] == [2, 2, 1, 1]
    assert pos["conditional"] == [2 / 3, 1.0, 0.5, 1.0]       # kept at i / judged at i (earlier ones kept)
    assert pos["unconditional"] == [2 / 3, 2 / 3, 1 / 3, 1 / 3]  # kept at i / steps that drafted i
    assert a["refusals"] == 2


def test_per_category_histograms():
    a = misses.analyse([("qa", [chain(0, [" a", " b"], 1, " z", gamma=2)]),
                        ("code", [chain(0, [" a", " b"], 2, gamma=2), chain(1, [" c", " d"], 2, gamma=2)])])
    assert a["accepted_length_by_category"] == {"qa": [0, 1, 0], "code": [0, 0, 2]}
    assert a["accepted_length"] == [0, 1, 2]


def test_near_ties_against_real_disagreements():
    events = [prefill("x"), chain(1, [" a"], 0, " b", (0.45, 0.40), 1), chain(2, [" c"], 0, " d", (0.9, 0.02), 1),
              chain(3, [" e"], 0, " f", (0.5, 0.41), 1), chain(4, [" g"], 0, " h", None, 1)]
    a = misses.analyse([("-", events)])
    assert a["near_tie_threshold"] == misses.NEAR_TIE == 0.1
    assert a["refusals"] == 4 and a["gap_unknown"] == 1  # events without the top-2 (older JSON) are counted apart
    assert a["near_ties"] == 2 and a["disagreements"] == 1 and a["near_tie_share"] == pytest.approx(2 / 3)
    assert a["gap_histogram"] == [2, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    assert misses.analyse([("-", events)], near_tie=0.06)["near_ties"] == 1
    line = misses.summary_line(a)
    assert "4 refusals" in line and "67% near ties" in line and "< 0.1" in line


@pytest.mark.parametrize("before,token,expected", [
    ("", "Hello", "start of the answer"),
    ("Hello.\n", "The", "after a newline"),
    ("def f():\n    ", "return", "after a newline"),
    ("Hello", "\n\n", "newline"),
    ("Hello", " ", "whitespace"),
    ("speed is", " 80", "digits"),
    ("Hello", ",", "punctuation"),
    ("Hello", " world", "start of a word"),
    ('say "', "hi", "start of a word"),
    ("Hel", "lo", "inside a word"),
])
def test_context_classes(before, token, expected):
    assert misses.context_class(before, token) == expected


def test_contexts_and_tokens_missed_most():
    """Refusals after a newline, and one at a digit: "after a newline" leads with its count and rate; the top tokens
    are the target's own tokens there, with what the drafter drafted instead."""
    events = [prefill("Intro"),
              chain(1, ["\n", " x"], 1, "The", gamma=2),     # "The" after a newline: missed
              chain(2, [" is", " 4"], 2, gamma=2),
              chain(3, [".\n", " z"], 1, "The", gamma=2),    # again
              chain(4, ["\n", " q"], 1, "-", gamma=2),       # "-" after a newline
              chain(5, [" 3"], 0, " 5", gamma=1)]            # a digit
    a = misses.analyse([("-", events)])
    first = a["contexts"][0]
    assert first["context"] == "after a newline" and first["refusals"] == 3 and first["positions"] == 3
    assert first["miss_rate"] == 1.0 and first["share"] == 0.75
    digits = next(c for c in a["contexts"] if c["context"] == "digits")
    assert digits["refusals"] == 1 and digits["positions"] == 2  # " 4" kept, " 5" missed
    top = a["top_missed"]
    assert top[0] == {"token": "The", "context": "after a newline", "refusals": 2, "near_ties": 0,
                      "drafted_instead": " x", "before": "Intro\n"}
    tied = [("-", "after a newline"), (" 5", "digits")]  # equal counts: by context, then token
    assert [(t["token"], t["context"]) for t in top[1:]] == tied
    assert "missed most after a newline (3 of 4 refusals, 100% of its 3 positions)" in misses.summary_line(a)


def test_a_tree_step_counts_one_refusal_at_the_paths_end():
    """A tree: two siblings refused at the path's end (one refusal, its row's top-2), a sibling refused before the
    accepted node at depth 0 is not the step's refusal; the path's length is what the step kept."""
    nodes = (DraftToken(1, " a", R, 0.3, 0.1, parent=-1, depth=0, rank=0, p_top1=0.6, p_top2=0.3),
             DraftToken(2, " b", A, 0.3, 0.6, parent=-1, depth=0, rank=1),
             DraftToken(3, " c", R, 0.3, 0.1, parent=1, depth=1, rank=0, p_top1=0.5, p_top2=0.45),
             DraftToken(4, " d", R, 0.3, 0.1, parent=1, depth=1, rank=1, p_top1=0.5, p_top2=0.45),
             DraftToken(5, " e", D, 0.3, None, parent=2, depth=2))
    step = StepEvent(step=1, drafts=nodes, emitted=(EmittedToken(2, " b", A), EmittedToken(9, " f", Verdict.RESAMPLED)),
                     gamma=5)
    a = misses.analyse([("-", [prefill("x"), step])])
    assert a["accepted_length"] == [0, 1, 0, 0] and a["refusals"] == 1 and a["near_ties"] == 1
    assert a["position"]["judged"] == [1, 1, 0] and a["position"]["conditional"] == [1.0, 0.0, None]
    assert a["top_missed"][0]["token"] == " f" and a["top_missed"][0]["drafted_instead"] == " c"


def test_no_drafts_and_json():
    a = misses.analyse([("-", [prefill("x")])])
    assert a["steps"] == 0 and a["accepted_length"] == [] and a["near_tie_share"] is None
    assert misses.summary_line(a) == "why it misses: no step judged a draft"
    full = misses.analyse([("-", [prefill("x"), chain(1, [" a"], 0, " b", gamma=1)])])
    assert json.loads(json.dumps(full)) == full


def test_top2_round_trips_and_older_events_load():
    step = chain(1, [" a", " b"], 1, " c", (0.7, 0.2), 2)
    back = StepEvent.from_dict(json.loads(json.dumps(step.to_dict())))
    assert back == step and back.drafts[1].p_top1 == 0.7 and back.drafts[1].p_top2 == 0.2
    old = step.to_dict()
    for d in old["drafts"]:
        del d["p_top1"], d["p_top2"]
    assert StepEvent.from_dict(old).drafts[1].p_top1 is None


def test_bench_json_carries_why_it_misses_per_method():
    """bench --json: each speculative method's summary gets the analysis over its prompts, by category; the plain
    references (no events) get none."""
    from specviz.cli.bench import why_it_misses

    rows = [{"id": 1, "category": "qa"}, {"id": 2, "category": "code"}]
    runs = {"eagle": [([prefill("x"), chain(1, [" a", " b"], 1, " c", gamma=2)], []),
                      ([prefill("y"), chain(1, [" a", " b"], 2, gamma=2)], [])]}
    summary = [{"method": "eagle"}, {"method": "ar-fp32"}]
    lines = why_it_misses(summary, rows, runs)
    assert summary[0]["misses"]["accepted_length_by_category"] == {"qa": [0, 1, 0], "code": [0, 0, 1]}
    assert "misses" not in summary[1] and list(lines) == ["eagle"] and lines["eagle"].startswith("why it misses: 1 ")
    assert json.loads(json.dumps(summary)) == summary
