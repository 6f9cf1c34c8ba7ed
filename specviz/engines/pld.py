"""Prompt lookup decoding: Saxena 2023, "Prompt Lookup Decoding" (github.com/apoorvumang/prompt-lookup-decoding).

No model drafts: the drafts are the tokens that followed the last occurrence, earlier in the context, of the
context's latest n-gram (the longest of pld_ngram_max..pld_ngram_min tokens that occurs; core.lookup). They are
exact copies, not draws, so their q is one-hot: sampling accepts a copied token with probability p_target(token)
and otherwise resamples from the target's residual. The chain loop (speculative.py) verifies them and defines the
verdicts; γ is the most tokens copied per step, τ the tokens committed per target forward. A lookup counts as one
draft "forward", so its cost ratio c is measured like any drafter's.
"""
from __future__ import annotations

import torch

from specviz.config import DecodeConfig
from specviz.core.lookup import lookup
from specviz.engines.speculative import Proposal, SpeculativeEngine


class PromptLookupDrafter:
    name = "prompt lookup"

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "PromptLookupSession":
        return PromptLookupSession(vocab_size, eos_ids)


class PromptLookupSession:
    def __init__(self, vocab_size: int, eos_ids: frozenset[int] = frozenset()):
        self.vocab_size, self.eos_ids = vocab_size, eos_ids

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        drafted = lookup(tokens, gamma, cfg.pld_ngram_max, cfg.pld_ngram_min, self.eos_ids)
        q = torch.zeros(len(drafted), self.vocab_size)  # (γ', V) deterministic proposals: one-hot q
        if drafted:
            q[torch.arange(len(drafted)), torch.tensor(drafted)] = 1.0
        return Proposal(drafted, q, 1)  # one draft step: its lookup (so c, its cost ratio, is measured too)

    def rollback(self, n_valid: int) -> None:
        pass  # stateless: it reads the committed tokens each step


def build(target, source=None, chain: bool = False, name: str = "") -> SpeculativeEngine:
    """Prompt lookup's engine (methods.MethodSpec.engine): it drafts from the context, so `source` is ignored."""
    return SpeculativeEngine("pld", target, PromptLookupDrafter())
