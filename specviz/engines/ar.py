"""Plain autoregressive (AR) decoding: the baseline every speedup is measured against.

Each step runs one target forward over the tokens its cache has not seen and picks the next token from the warped
distribution (argmax when greedy). Every emitted token is `plain`: nothing is drafted, so nothing is accepted,
rejected or discarded, and τ (tokens per target forward) is 1 by construction.
"""
from __future__ import annotations

from typing import Iterator

import torch

from specviz.config import DecodeConfig
from specviz.core.cache import CachedLM, clock
from specviz.core.sampling import pick, warp
from specviz.engines.base import commit
from specviz.events import StepEvent, Verdict
from specviz.models.loader import LoadedModel


class AREngine:
    method = "ar"

    def __init__(self, target: LoadedModel):
        self.target = target

    def steps(self, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[StepEvent]:
        generator = torch.Generator().manual_seed(cfg.seed)
        target = CachedLM.of(self.target)
        tokens = list(prompt_ids)
        step = 0
        while True:
            t0 = clock(self.target.device)
            p_next = warp(target.logits(tokens)[0], cfg)  # (V,)
            token = pick(p_next, cfg.greedy, generator)
            t1 = clock(self.target.device)
            emitted, finish = commit([(token, Verdict.PLAIN, float(p_next[token]))], len(tokens) - len(prompt_ids),
                                     cfg, self.target.eos_ids, self.target.text_of)
            tokens.append(token)
            yield StepEvent(step=step, drafts=(), emitted=tuple(emitted), draft_s=0.0, verify_s=t1 - t0,
                            draft_forwards=0, target_forwards=1, gamma=0, finish_reason=finish)
            if finish:
                return
            step += 1


def build(target: LoadedModel, source=None, chain: bool = False, name: str = "") -> AREngine:
    """AR's engine (methods.MethodSpec.engine): it drafts nothing, so `source` is ignored."""
    return AREngine(target)
