"""LayerSkip as a chain drafter for the check (`specviz check --method layerskip`, the app's Check tab): the target's
own first L layers and the trained exit adapter draft, as in LayerSkip's engine (engines/layerskip.py), but over a
KV cache of their own, so any chain loop can verify the drafts with the full target on its cache. The engine shares
one cache between drafting and verification (the verifier skips the first L layers); here those layers run twice,
so the check's timing of LayerSkip is pessimistic by them, while its exactness and acceptance figures are the
engine's (the same drafts from the same layers and adapter).
"""
from __future__ import annotations

import torch

from specviz.config import DecodeConfig
from specviz.engines.layerskip import SplitLM
from specviz.engines.speculative import Proposal, stop_drafting


class LayerSkipChainDrafter:
    """A trained drafter of kind "layerskip" (drafters.modules.ExitAdapter) as a chain drafter."""

    def __init__(self, drafter, name: str):
        self.drafter, self.name = drafter, name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "LayerSkipChainSession":
        return LayerSkipChainSession(self.drafter, vocab_size, eos_ids)


class LayerSkipChainSession:
    def __init__(self, drafter, vocab_size: int, eos_ids: frozenset[int]):
        self.d, self.vocab_size, self.eos_ids = drafter, vocab_size, eos_ids
        self.lm = SplitLM(drafter.target_model, drafter.head_weight.device, drafter.cfg.exit_layer)

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        while len(drafted) < gamma:
            h = self.lm.early(list(tokens) + drafted)
            self.lm.pending = []  # only the first layers run here: the target verifies on its own cache
            logits = self.d.logits(self.d.final_norm(self.d.module(self.d.inputs(h))))
            token, q, confidence = self.d.draw(logits, cfg, generator)
            drafted.append(token)
            qs.append(q)
            if stop_drafting(token, confidence, self.eos_ids, cfg):
                break
        if not drafted:
            return Proposal.empty(self.vocab_size)
        return Proposal(drafted, torch.stack(qs), len(drafted))

    def rollback(self, n_valid: int) -> None:
        self.lm.rollback(n_valid)
