"""A separate draft model (or a compressed copy of the target) drafting a chain autoregressively."""
from __future__ import annotations

import torch

from specviz.cache import CachedLM
from specviz.config import DecodeConfig
from specviz.engines.speculative import Proposal, stop_drafting
from specviz.models import LoadedModel
from specviz.sampling import pick, warp


class ModelDrafter:
    def __init__(self, draft: LoadedModel):
        self.draft = draft
        self.name = draft.name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "ModelDraftSession":
        return ModelDraftSession(CachedLM(self.draft.model, self.draft.device), vocab_size, eos_ids)


class ModelDraftSession:
    def __init__(self, lm: CachedLM, vocab_size: int, eos_ids: frozenset[int]):
        self.lm = lm
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        while len(drafted) < gamma:
            q = warp(self.lm.logits(tokens, drafted)[0, :self.vocab_size], cfg)  # (V,)
            token = pick(q, cfg.greedy, generator)
            drafted.append(token)
            qs.append(q)
            if stop_drafting(token, float(q[token]), self.eos_ids, cfg):
                break
        return Proposal(drafted, torch.stack(qs), len(drafted))

    def rollback(self, n_valid: int) -> None:
        self.lm.rollback(n_valid)
