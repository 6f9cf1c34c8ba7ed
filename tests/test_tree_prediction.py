"""The tree prediction: expected tokens a step from per-node acceptance, against a simulated tree whose
per-node acceptance is known."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from specviz import metrics
from specviz.events import DraftToken, EmittedToken, StepEvent, Verdict
from specviz.metrics import CostProfile

A, B, A1 = 0, 1, 2   # the tree: the root's children A (rank 0) and B (rank 1), and A's child A1
P_A, P_B, P_A1 = 0.5, 0.2, 0.7  # P(A kept), P(B kept) (exclusive: one child of a node is kept), P(A1 | A kept)
EXPECTED = 1 + P_A + P_B + P_A * P_A1


def simulated_step(rng: random.Random, step: int) -> StepEvent:
    u = rng.random()
    path = [A] + ([A1] if rng.random() < P_A1 else []) if u < P_A else ([B] if u < P_A + P_B else [])
    verdict = {n: Verdict.ACCEPTED if n in path else Verdict.REJECTED for n in (A, B, A1)}
    if A not in path:
        verdict[A1] = Verdict.DISCARDED
    drafts = (DraftToken(11, "a", verdict[A], 0.5, parent=-1, depth=0, head=0, rank=0),
              DraftToken(12, "b", verdict[B], 0.2, parent=-1, depth=0, head=0, rank=1),
              DraftToken(13, "c", verdict[A1], 0.4, parent=0, depth=1, head=1, rank=0))
    emitted = tuple(EmittedToken(1, "x", Verdict.ACCEPTED) for _ in path) + (EmittedToken(2, "y", Verdict.BONUS),)
    return StepEvent(step=step, drafts=drafts, emitted=emitted, draft_s=0.001, verify_s=0.01, draft_forwards=2)


def test_the_tree_formula_recovers_the_simulated_expectation():
    rng = random.Random(0)
    n = 6000
    events = [StepEvent(step=0, drafts=(), emitted=(EmittedToken(1, "x", Verdict.PLAIN),), verify_s=0.02)]
    events += [simulated_step(rng, i) for i in range(1, n + 1)]
    rates = metrics.node_acceptance(events)
    assert rates[(0, 0, 0)] == pytest.approx(P_A, abs=4 * math.sqrt(P_A * (1 - P_A) / n))
    assert rates[(1, 1, 0)] == pytest.approx(P_A1, abs=4 * math.sqrt(P_A1 * (1 - P_A1) / (n * P_A)))
    predicted = metrics.tree_expected_tokens(events[1].drafts, rates)
    sd = 0.8  # τ's standard deviation a step is below 1 (it lies in 1..3)
    assert predicted == pytest.approx(EXPECTED, abs=4 * sd / math.sqrt(n))
    tau = sum(len(e.emitted) for e in events[1:]) / n
    assert predicted == pytest.approx(tau, abs=4 * sd / math.sqrt(n))
    # the known rates give the expectation exactly
    exact = {(0, 0, 0): P_A, (0, 0, 1): P_B, (1, 1, 0): P_A1}
    assert metrics.tree_expected_tokens(events[1].drafts, exact) == pytest.approx(EXPECTED)


def test_the_tree_prediction_prices_rows_with_the_profile():
    rng = random.Random(1)
    events = [StepEvent(step=0, drafts=(), emitted=(EmittedToken(1, "x", Verdict.PLAIN),), verify_s=0.02)]
    events += [simulated_step(rng, i) for i in range(1, 2001)]
    flat = CostProfile("cpu", "bf16", "fused", 128, 1, [1, 4], [0.01, 0.01], [0.01, 0.01])
    steep = CostProfile("cpu", "bf16", "fused", 128, 1, [1, 4], [0.01, 0.02], [0.01, 0.02])
    free = metrics.tree_prediction(events, 0.0, flat)
    assert free.cost_per_step == pytest.approx(1.0) and free.speedup == pytest.approx(free.tokens_per_step)
    costly = metrics.tree_prediction(events, 0.1, steep)
    assert costly.cost_per_step == pytest.approx(2.0 + 2 * 0.1) and costly.formula == "tree"
    assert metrics.tree_prediction(events[:1], 0.1, flat) is None  # nothing drafted: no prediction


def test_compare_predicts_a_tree_race_from_its_nodes_and_a_chain_with_leviathan():
    from specviz.config import DecodeConfig
    from specviz.ui import logic, race_html

    rng = random.Random(2)
    ar = [StepEvent(step=i, drafts=(), emitted=(EmittedToken(1, "x", Verdict.PLAIN),), verify_s=0.01)
          for i in range(0, 400)]
    tree = [ar[0]] + [simulated_step(rng, i) for i in range(1, 300)]
    cmp = metrics.compare(ar, tree, "eagle", True)
    assert cmp.prediction_formula == metrics.TREE_FORMULA == "tree: per-node acceptance"
    c = cmp.cost_ratio
    assert cmp.predicted_speedup == pytest.approx(metrics.tree_prediction(tree, c).speedup)
    chain = [ar[0]] + [StepEvent(step=i, drafts=(DraftToken(5, "a", Verdict.ACCEPTED, 0.5, parent=-1, depth=0),
                                                 DraftToken(6, "b", Verdict.REJECTED, 0.5, parent=0, depth=1)),
                                 emitted=(EmittedToken(5, "a", Verdict.ACCEPTED), EmittedToken(2, "y", Verdict.BONUS)),
                                 draft_s=0.001, verify_s=0.01, draft_forwards=2, gamma=2)
                           for i in range(1, 50)]
    chained = metrics.compare(ar, chain, "pld", True)
    assert chained.prediction_formula == metrics.CHAIN_FORMULA == "Leviathan (chain)"
    assert chained.predicted_speedup == pytest.approx(metrics.predicted_speedup(0.5, 2, chained.cost_ratio))
    # a name the registry does not know: the events decide (a grafted head, a second child of the root)
    assert metrics.compare(ar, tree, "custom", True).prediction_formula == metrics.TREE_FORMULA
    assert metrics.compare(ar, chain, "custom", True).prediction_formula == metrics.CHAIN_FORMULA
    assert metrics.compare(ar, ar, "pld", True).prediction_formula is None  # nothing drafted
    # the summary card says which formula it used
    for method, events, words in (("eagle", tree, "formula: tree, per-node acceptance"),
                                  ("pld", chain, "formula: Leviathan et al. (2023), chain")):
        snap = logic.RaceSnapshot(DecodeConfig(method=method), "int8", phase="done")
        snap.lanes["ar"].events, snap.lanes["spec"].events = ar, events
        snap.comparison = metrics.compare(ar, events, method, True)
        assert words in race_html.summary_html(snap)


def test_a_tree_races_prediction_prices_the_steps_bookkeeping():
    rng = random.Random(3)
    ar = [StepEvent(step=i, drafts=(), emitted=(EmittedToken(1, "x", Verdict.PLAIN),), verify_s=0.01)
          for i in range(0, 200)]
    steps = [simulated_step(rng, i) for i in range(1, 200)]
    flat = CostProfile("cpu", "bf16", "fused", 128, 1, [1, 4], [0.01, 0.01], [0.01, 0.01])
    slow = [ar[0]] + [replace(e, verify_s=0.015) for e in steps]  # half a step more than the forward, every step
    assert metrics.step_overhead(ar, slow, flat) == pytest.approx(0.5)
    cmp = metrics.compare(ar, slow, "medusa", True, flat)
    tree = metrics.tree_prediction(slow, cmp.cost_ratio, flat)
    assert cmp.predicted_speedup == pytest.approx(tree.tokens_per_step / (tree.cost_per_step + 0.5))
    assert metrics.step_overhead(ar, [ar[0]] + steps, flat) == 0.0  # the forward alone: nothing on top
