"""Plain autoregressive decoding: the baseline, one token per target forward."""
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
            yield StepEvent(step, (), tuple(emitted), 0.0, t1 - t0, 0, 1, 0, finish)
            if finish:
                return
            step += 1


def build(target: LoadedModel, source=None, chain: bool = False, name: str = "") -> AREngine:
    """AR's engine (methods.MethodSpec.engine): it drafts nothing, so `source` is ignored."""
    return AREngine(target)
