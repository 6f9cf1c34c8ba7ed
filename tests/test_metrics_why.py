"""Where the kept guesses came from and why measured and predicted differ (metrics.why_line), on hand-built events."""
from __future__ import annotations

import math

import pytest

from specviz import metrics
from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD, DraftToken, EmittedToken, StepEvent, Verdict

A, R, D = Verdict.ACCEPTED, Verdict.REJECTED, Verdict.DISCARDED


def node(verdict, head=0, depth=0, parent=-1):
    return DraftToken(7, "x", verdict, 0.5, parent=parent, depth=depth, head=head)


def step(i, drafts=(), seconds=1.0, draft_s=0.0):
    kept = sum(d.verdict is A for d in drafts)
    emitted = tuple(EmittedToken(1, "t", Verdict.ACCEPTED) for _ in range(kept)) + (EmittedToken(1, "t",
                                                                                                   Verdict.BONUS),)
    return StepEvent(step=i, drafts=tuple(drafts), emitted=emitted, draft_s=draft_s, verify_s=seconds - draft_s,
                     draft_forwards=1 if drafts else 0, gamma=len(drafts))


def ar_run(n, seconds=1.0):
    return [StepEvent(step=i, drafts=(), emitted=(EmittedToken(1, "t", Verdict.PLAIN),), verify_s=seconds)
            for i in range(n)]


def test_source_of_reads_the_grafted_head_and_the_method():
    assert metrics.source_of(node(A, LOOKUP_HEAD), "eagle") == metrics.LOOKUP
    assert metrics.source_of(node(A, RETRIEVAL_HEAD), "eagle") == metrics.DATASTORE
    assert metrics.source_of(node(A, 0), "eagle") == metrics.DRAFTER
    assert metrics.source_of(node(A, 0), "pld") == metrics.LOOKUP  # a lookup chain: every guess is a copy
    assert metrics.source_of(node(A, 0), "vanilla") == metrics.DRAFTER
    assert metrics.source_of(node(A, 0), "no-such-method") == metrics.DRAFTER


def test_summary_counts_kept_guesses_by_source_and_every_proposed_token():
    # a tree: drafter root kept, its child refused, a lookup branch of two kept... (one path: the lookup's)
    tree = [node(A, 0), node(R, 1, 1, 0), node(D, LOOKUP_HEAD), node(D, RETRIEVAL_HEAD)]
    look = [node(A, LOOKUP_HEAD), node(A, LOOKUP_HEAD, 1, 0), node(D, 0)]
    s = metrics.summarize("eagle", [step(0), step(1, tree), step(2, look)])
    assert s.kept_from == {metrics.DRAFTER: 1, metrics.LOOKUP: 2, metrics.DATASTORE: 0}
    assert sum(s.kept_from.values()) == s.accepted == 3
    assert (s.drafted, s.proposed) == (4, 7)  # judged: 2 + 2; every node: 4 + 3
    assert s.alpha == pytest.approx(3 / 4) and s.proposed_acceptance == pytest.approx(3 / 7)


def test_kept_line_says_the_answer_repeats_itself_when_lookup_supplied_the_kept_guesses():
    spec = [step(0)] + [step(i, [node(A, LOOKUP_HEAD), node(A, LOOKUP_HEAD, 1, 0), node(R, 1)]) for i in range(1, 4)]
    spec.append(step(4, [node(A, 0), node(R, 1, 1, 0)]))
    line = metrics.kept_line(metrics.summarize("eagle", spec), "eagle")
    assert line.startswith("86% of kept guesses were copies of earlier text (prompt lookup), 14% EAGLE's own")
    assert "this answer repeats itself" in line


def test_kept_line_says_the_answer_hardly_repeats_when_lookup_proposed_but_kept_nothing():
    spec = [step(0)] + [step(i, [node(A, 0), node(R, 1, 1, 0), node(R, LOOKUP_HEAD)]) for i in range(1, 9)]
    line = metrics.kept_line(metrics.summarize("eagle", spec), "eagle")
    assert line.startswith("all 8 kept guesses were EAGLE's own guesses")
    assert "hardly repeats itself" in line
    assert "No guess was kept" in metrics.kept_line(metrics.summarize("pld", [step(0), step(1, [node(R)])]), "pld")


def test_the_gap_factors_multiply_to_measured_over_predicted():
    ar = ar_run(12, 1.0)
    spec = [step(0, seconds=3.0)] + [step(i, [node(A), node(A, depth=1), node(R, depth=2)], seconds=1.4,
                                          draft_s=0.2) for i in range(1, 4)] + [step(4, seconds=1.0)]
    c = metrics.compare(ar, spec, "vanilla", greedy=True)
    g = c.gap
    assert c.predicted_speedup and g is not None
    assert g.tokens * g.cost * g.prefill == pytest.approx(c.speedup / c.predicted_speedup)
    assert g.prefill < 1 and g.prefill_share == pytest.approx(3.0 / sum(e.seconds for e in spec))
    assert g.undrafted == pytest.approx(1 / 4)


def test_gap_line_names_the_largest_cause_and_is_empty_when_close():
    ar = ar_run(12, 1.0)
    # α = 4/7 at γ = 2: 1.90 tokens a step predicted, 2 measured; each step costs what Leviathan prices, 2c + 1
    pattern = ([A, A], [R, D], [A, R], [A, R])
    drafted = [step(i, [node(v, depth=d) for d, v in enumerate(vs)], seconds=1.4, draft_s=0.2)
               for i, vs in enumerate(pattern, 1)]
    slow_prefill = metrics.compare(ar, [step(0, seconds=8.0)] + drafted, "vanilla", greedy=True)
    line = metrics.gap_line(slow_prefill)
    assert "slower than predicted" in line and "the prompt's first pass" in line
    assert abs(math.log(slow_prefill.gap.prefill)) > abs(math.log(slow_prefill.gap.tokens))
    # the same steps with a prefill as long as AR's: measured within GAP of the prediction, nothing to explain
    even = metrics.compare(ar, [step(0, seconds=1.0)] + drafted, "vanilla", greedy=True)
    assert abs(even.speedup / even.predicted_speedup - 1) <= metrics.GAP
    assert metrics.gap_line(even) == ""
    assert metrics.why_line(even).endswith(".") and "\n" not in metrics.why_line(slow_prefill)
    assert even.cost_ratio == pytest.approx(0.2) and "a plain step here" not in metrics.why_line(even)
    # a draft forward dearer than a plain step (an int8 copy on a CPU without VNNI): said, whatever the acceptance
    dear = [step(i, [node(A, depth=0), node(A, depth=1)], seconds=4.2, draft_s=3.0) for i in range(1, 5)]
    line = metrics.why_line(metrics.compare(ar, [step(0)] + dear, "vanilla", greedy=True))
    assert "each draft forward cost 3.0× a plain step here (c ≥ 1)" in line, line  # 3 s a forward, 1 s a step


def test_a_block_drafter_pays_one_forward_a_step_in_every_prediction():
    """DFlash drafts its whole block in one forward: Leviathan's prediction, profile's best γ and check's batching
    model price its drafting at c a step, not γ·c (a drafter of a forward per draft still pays γ·c)."""
    from specviz.check import measure

    assert metrics.drafts_block("dflash") and not metrics.drafts_block("eagle") and not metrics.drafts_block("x")
    e = metrics.expected_tokens_per_step(0.6, 3)
    assert metrics.predicted_speedup(0.6, 3, 0.5, block=True) == pytest.approx(e / 1.5)
    assert metrics.predicted_speedup(0.6, 3, 0.5) == pytest.approx(e / 2.5)
    flat = metrics.CostProfile("cpu", "float32", "sdpa", 0, 1, [1, 64], [0.01, 0.01], [0.01, 0.01])
    assert metrics.profiled_speedup(0.6, 3, 0.5, flat, block=True) == pytest.approx(e / 1.5)
    assert metrics.best_gamma(0.6, 0.5, flat, range(1, 8), block=True) == 7  # deeper is free for a block
    assert metrics.best_gamma(0.6, 0.5, flat, range(1, 8)) < 7
    assert measure.speedup_at(0.6, 3, 0.5, 1, flat, block=True) == pytest.approx(e / 1.5)
    assert measure.speedup_at(0.6, 3, 0.5, 1, flat) == pytest.approx(e / 2.5)
