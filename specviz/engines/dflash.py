"""DFlash: Chen, Liang, Liu 2026, "DFlash: Block Diffusion for Flash Speculative Decoding" (arXiv 2602.06036).

A trained drafter (drafters/dflash.py) drafts a whole block in ONE forward: the last committed token (the target's
own: resampled, bonus or the prefill's) at the block's first slot, mask tokens after it, reading the target's hidden
states at every committed position before it as keys and values (its context). Its output at slot i is read
through the target's (compressed) LM head as q_i, the drafter's distribution of the i-th token after the committed
one; the i-th draft is drawn from q_i (greedy: its argmax). q_i does not depend on the earlier drafts, which the
chain verification allows: each draft is still judged by min(1, p_i / q_i) against the distribution it was drawn
from, so the output is the target's, token for token when greedy (core.sampling.verify_chain, in the chain loop
of speculative.py, which defines the verdicts and the events).

The context's keys and values are cached per drafter layer and only ever hold true target states (a verified step
appends those of the positions it kept), so each step projects just the new rows, then runs the block's rows.

Terms: γ caps the drafts a step (at most block_size - 1: the slots after the first); τ is tokens committed per
target forward.
"""
from __future__ import annotations

import torch

from specviz.config import DecodeConfig
from specviz.drafters.trained import Drafter
from specviz.engines.features import FeatureHistory
from specviz.engines.speculative import Proposal, SpeculativeEngine, stop_drafting
from specviz.models.loader import LoadedModel


class DFlashDrafter:
    """DFlash as a chain drafter (speculative.Drafter)."""

    def __init__(self, drafter: Drafter, name: str = ""):
        self.drafter, self.name = drafter, name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "DFlashSession":
        return DFlashSession(self.drafter, vocab_size, eos_ids)


class DFlashSession(FeatureHistory):
    """One run's state: the target's hidden states of the committed positions (FeatureHistory) and every drafter
    layer's context (keys, values) over the first kv_len of them."""

    def __init__(self, drafter: Drafter, vocab_size: int, eos_ids: frozenset[int]):
        super().__init__(drafter, vocab_size, eos_ids)
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.kv_len = 0

    def rollback(self, n_valid: int) -> None:
        super().rollback(n_valid)
        if self.kv is not None and self.kv_len > n_valid:
            self.kv = [(k[:, :, :n_valid], v[:, :, :n_valid]) for k, v in self.kv]
            self.kv_len = n_valid

    def context(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's context over positions 0..n-1 (n: the positions with target states), projecting the rows
        not yet cached."""
        m, device = self._n, self.d.head_weight.device
        if m > self.kv_len:
            new = self.d.module.context_kv(self.d.inputs(self._rows[self.kv_len:m][None]),
                                           torch.arange(self.kv_len, m, device=device))
            self.kv = new if self.kv is None else [(torch.cat([k, nk], 2), torch.cat([v, nv], 2))
                                                   for (k, v), (nk, nv) in zip(self.kv, new)]
            self.kv_len = m
        return self.kv

    @torch.inference_mode()
    def block_logits(self, tokens: list[int]) -> torch.Tensor | None:
        """The drafter's one forward over the block after `tokens`: draft logits (block_size - 1, N) for the
        tokens after the last committed one. None before the target's first forward (no states yet)."""
        m = self._n
        if m == 0 or m != len(tokens) - 1:  # the block starts at the last committed token, whose state is not in
            return None
        cfg, device = self.d.cfg, self.d.head_weight.device
        ids = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.long, device=device)
        ids[0] = tokens[-1]
        out = self.d.module(self.d.embed(ids)[None], torch.arange(m, m + cfg.block_size, device=device),
                            self.context())
        return self.d.logits(out[0, 1:]).float().cpu()

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        logits = self.block_logits(tokens) if gamma > 0 else None
        if logits is None:  # the first step is the target's prefill
            return Proposal.empty(self.vocab_size)
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        for row in logits[:gamma]:  # each slot's draft from its own distribution: one forward drafted them all
            token, q, confidence = self.d.draw(row, cfg, generator)
            drafted.append(token)
            qs.append(q)
            if stop_drafting(token, confidence, self.eos_ids, cfg):
                break
        return Proposal(drafted, torch.stack(qs), 1)


def build(target: LoadedModel, drafter: Drafter, chain: bool = False, name: str = "") -> SpeculativeEngine:
    """DFlash's engine (methods.MethodSpec.engine): the block verified as a chain, γ capped by the block."""
    return DFlashEngine("dflash", target, DFlashDrafter(drafter, name))


class DFlashEngine(SpeculativeEngine):
    """The chain loop with γ capped at the drafter's block_size - 1 (a block drafts no more)."""

    def draft(self, run, gamma: int) -> Proposal:
        return super().draft(run, min(gamma, self.drafter.drafter.cfg.block_size - 1))
