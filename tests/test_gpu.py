"""The GPU self-check (`make gpu-check`): every engine greedy-identical to AR on CUDA, exact sampling (the
synthetic p/q suite with its planted-bug control, and an engine's first sampled token against the target's
exact distribution on CUDA, with a planted bug that must be caught), tree verification on CUDA, and the
verify profile T(k) printed as a table.

A tiny random Llama in fp32 (tests/tiny.py): torch, transformers and pytest are all it needs (no gradio, no
Hub, no GGUF); `make gpu-check` runs it without conftest.py. The CPU suite's own checks are reused on CUDA
models (test_engines, test_drafters, test_trees), so both suites test one definition of each property.
Without CUDA every test is skipped, saying why.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import test_drafters
import test_engines
import test_trees
import torch
from tiny import tiny_model

from specviz import engines, hardware
from specviz.check import measure, stats
from specviz.check.options import CheckOptions
from specviz.config import DecodeConfig
from specviz.core import profile
from specviz.engines.draft_model import ModelDrafter
from specviz.engines.speculative import SpeculativeEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here (torch.cuda.is_available() is False): "
    "the GPU self-check runs on a machine with an NVIDIA GPU")]

PROMPTS = ([5, 9, 17, 3], [1, 2, 3], [7, 7, 8])
SAMPLES = 500          # seeds for the engine's sampling test (a planted bug gives p ≈ 1e-12 at this size)
TEMPERATURE = 3.0      # spreads the tiny model's sharp distributions so every rule of the sampler is used
TRAINED = [("eagle", {}, False), ("eagle", {}, True), ("medusa", {"medusa_heads": 3}, True),
           ("layerskip", {"exit_layer": 1}, False), ("draft", {"draft_layers": [0]}, False)]


@pytest.fixture(scope="module")
def cuda_target():
    return tiny_model(0, device="cuda")


@pytest.fixture(scope="module")
def cuda_draft():
    return tiny_model(1, device="cuda")


# ── greedy identity ──────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("gamma", [1, 3, 5, "auto"])
def test_chain_engines_greedy_identical_to_ar(cuda_target, cuda_draft, gamma):
    """vanilla (a draft model, a perfect drafter), pld: the same tokens as AR, on CUDA."""
    test_engines.test_greedy_identity_tiny(cuda_target, cuda_draft, gamma)


def test_int8_draft_and_scripted_partial_acceptance(cuda_target):
    """The GPU's weight-only int8 draft, and verdicts at planted rejections, on CUDA."""
    cfg = DecodeConfig(max_new_tokens=40, gamma=4)
    ar = engines.generate(engines.build("ar", cuda_target), test_engines.PROMPT, cfg).token_ids
    assert engines.generate(engines.build("vanilla", cuda_target, "int8"), test_engines.PROMPT, cfg).token_ids == ar
    test_engines.test_scripted_partial_acceptance(cuda_target)


@pytest.mark.parametrize("kind,extra,tree", TRAINED)
@pytest.mark.parametrize("compressed", [False, True])
def test_trained_engines_greedy_identical_to_ar(cuda_target, kind, extra, tree, compressed):
    """EAGLE (chain and tree), Medusa (tree), LayerSkip and the distilled draft model, random weights, on CUDA."""
    test_drafters.test_greedy_identity_tiny(cuda_target, kind, extra, tree, compressed)


# ── exact sampling ───────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("case", stats.SYNTHETIC_CASES)
def test_synthetic_pq_suite(case):
    """The sampler every engine uses (it verifies on float32 rows the target's forward returns to the host)."""
    assert stats.synthetic_case(case, 4000).ok, case


class GreedyDraftBug:
    """A planted bug: draft the argmax of q while reporting q as the distribution drawn from."""
    name = "greedy-draft-bug"

    def __init__(self, inner):
        self.inner = inner

    def session(self, vocab_size, eos_ids):
        return _BuggySession(self.inner.session(vocab_size, eos_ids))


class _BuggySession:
    def __init__(self, session):
        self.session = session

    def propose(self, tokens, gamma, cfg, generator):
        proposal = self.session.propose(tokens, gamma, cfg, generator)
        return replace(proposal, token_ids=proposal.q_draft.argmax(-1).tolist())

    def rollback(self, n_valid):
        self.session.rollback(n_valid)


def engine_fidelity(target, drafter) -> measure.Fidelity:
    options = CheckOptions(gamma=3, temperature=TEMPERATURE, samples=SAMPLES, max_new_tokens=8)
    engine = SpeculativeEngine("vanilla", target, drafter)
    return measure.sampling_fidelity(engine, target, list(enumerate(PROMPTS)), options, lambda done: None)


def test_engine_sampling_follows_the_target_on_cuda(cuda_target, cuda_draft):
    fidelity = engine_fidelity(cuda_target, ModelDrafter(cuda_draft))
    assert fidelity.passed, fidelity.fit
    assert fidelity.first_accepted > 0 and fidelity.with_drafts == SAMPLES  # both rules were exercised


def test_engine_sampling_check_catches_a_planted_bug_on_cuda(cuda_target, cuda_draft):
    assert not engine_fidelity(cuda_target, GreedyDraftBug(ModelDrafter(cuda_draft))).passed


# ── trees ────────────────────────────────────────────────────────────────────────────────────────────

def test_tree_verification_on_cuda(cuda_target):
    """One tree forward (4D mask, explicit positions) equals a chain forward per path; greedy tree acceptance
    equals chain verification; keeping the accepted path's KV equals a fresh prefix."""
    test_trees.test_tree_logits_equal_chain_logits_per_path(cuda_target)
    test_trees.test_greedy_tree_acceptance_matches_chain_verification(cuda_target)
    for path in ([1, 5], [0, 4, 7], [0, 3, 6], []):
        test_trees.test_keep_path_equals_fresh_prefix(cuda_target, path)


# ── the verify profile ───────────────────────────────────────────────────────────────────────────────

def verify_profile_rows(target) -> list[tuple[int, float]]:
    """(k, median seconds of one target forward of k new tokens over a KV cache), every forward synchronized."""
    measured = profile.verify_profile(target)  # what python -m specviz profile measures
    return list(zip(measured.tokens, measured.raw_seconds))


def test_verify_profile_table(cuda_target, capsys):
    rows = verify_profile_rows(cuda_target)
    assert rows and all(seconds > 0 for _, seconds in rows)
    t1 = rows[0][1]
    lines = [f"verify profile on {hardware.describe(cuda_target.device, cuda_target.dtype)} (tiny random Llama)",
             "| k | T(k) ms | T(k)/T(1) |", "|---|---|---|"]
    lines += [f"| {k} | {seconds * 1e3:.3f} | {seconds / t1:.2f} |" for k, seconds in rows]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
