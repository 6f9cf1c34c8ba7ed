"""A separate draft model drafting a chain autoregressively: the setting of Leviathan et al. 2023, "Fast Inference
from Transformers via Speculative Decoding", and Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling".

The draft is a smaller model sharing the target's tokenizer (method "vanilla": by default an int8 copy of the target),
or a few decoder layers distilled from the target over its embeddings and LM head (method "draft":
drafters.modules.DraftLM). Either draws γ tokens one by one from its own warped distribution q over its own KV cache;
the chain loop (speculative.py) verifies them and defines the verdicts and τ.
"""
from __future__ import annotations

import torch

from specviz.config import DecodeConfig
from specviz.core.cache import CachedLM
from specviz.core.sampling import pick, warp
from specviz.engines.speculative import Proposal, SpeculativeEngine, stop_drafting
from specviz.models.drafts import load_draft
from specviz.models.loader import LoadedModel


class ModelDrafter:
    def __init__(self, draft: LoadedModel):
        self.draft = draft
        self.name = draft.name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "ModelDraftSession":
        return ModelDraftSession(CachedLM.of(self.draft), vocab_size, eos_ids)


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


class DistilledDrafter:
    """A trained drafter of kind "draft" (drafters.DraftLM): a few decoder layers of its own between the
    target's embeddings and (compressed) LM head, drafting a chain over its own KV cache."""

    def __init__(self, drafter, name: str):
        self.drafter, self.name = drafter, name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "DistilledDraftSession":
        return DistilledDraftSession(self.drafter, eos_ids)


class DistilledDraftSession:
    def __init__(self, drafter, eos_ids: frozenset[int]):
        self.d, self.eos_ids = drafter, eos_ids
        self.past: list | None = None  # per layer (keys, values) of the tokens fed so far
        self.seen = 0

    def _feed(self, new: list[int]) -> torch.Tensor:
        """Run the unseen tokens through the layers; the last one's feature (d,)."""
        device = self.d.head_weight.device
        ids = torch.tensor([new], dtype=torch.long, device=device)
        out, self.past = self.d.module(self.d.embed(ids), torch.arange(self.seen, self.seen + len(new), device=device),
                                       self.past)
        self.seen += len(new)
        return out[0, -1]

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        while len(drafted) < gamma:
            token, q, confidence = self.d.draw(self.d.logits(self._feed((list(tokens) + drafted)[self.seen:])), cfg,
                                               generator)
            drafted.append(token)
            qs.append(q)
            if stop_drafting(token, confidence, self.eos_ids, cfg):
                break
        return Proposal(drafted, torch.stack(qs), len(drafted))

    def rollback(self, n_valid: int) -> None:
        if self.seen > n_valid:
            self.past = [(k[:, :, :n_valid], v[:, :, :n_valid]) for k, v in self.past]
            self.seen = n_valid


def build_vanilla(target: LoadedModel, source, chain: bool = False, name: str = "") -> SpeculativeEngine:
    """vanilla's engine (methods.MethodSpec.engine): `source` is the draft, a LoadedModel or a model spec."""
    draft = source if isinstance(source, LoadedModel) else load_draft(source, target)
    return SpeculativeEngine("vanilla", target, ModelDrafter(draft))


def build_distilled(target: LoadedModel, drafter, chain: bool = False, name: str = "") -> SpeculativeEngine:
    """The distilled draft model's engine (methods.MethodSpec.engine): a chain, its drafter named `name`."""
    return SpeculativeEngine("draft", target, DistilledDrafter(drafter, name))
