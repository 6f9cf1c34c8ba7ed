"""Prompt lookup decoding: draft the tokens that followed the latest n-gram's last occurrence. No model."""
from __future__ import annotations

import torch

from specviz.config import DecodeConfig
from specviz.engines.speculative import Proposal


def lookup(tokens: list[int], gamma: int, n_max: int, n_min: int, stop: frozenset[int] = frozenset()) -> list[int]:
    """The up-to-γ tokens after the most recent earlier match of the longest suffix n-gram, up to and including the
    first `stop` token (an EOS: what follows it in the context, such as the chat template's next turn, is never
    generated, and would only cost verification rows)."""
    return match(tokens, gamma, n_max, n_min, stop)[0]


def match(tokens: list[int], gamma: int, n_max: int, n_min: int,
          stop: frozenset[int] = frozenset()) -> tuple[list[int], int]:
    """lookup's tokens and the length n of the suffix n-gram they follow (0: no match)."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # most recent match first
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + gamma]
                ends = [i for i, t in enumerate(follow) if t in stop]
                if follow:
                    return follow[:ends[0] + 1] if ends else follow, n
    return [], 0


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
