"""LayerSkip: Elhoushi et al. 2024, "LayerSkip: Enabling Early Exit Inference and Self-Speculative Decoding"
(ACL 2024). Self-speculative decoding: the target's own first L layers plus a trained exit adapter
(drafters.modules.ExitAdapter) draft; the remaining layers verify.

One KV cache serves both, as in LayerSkip: drafting a token runs it through layers 0..L-1 (their keys and
values land in the target's cache), and verification runs only layers L..N-1 over the hidden states the
drafting already computed; only the last draft token still needs the first L layers. A rejection crops
every layer back to the accepted prefix. The stock transformers decoder layers are called one by one with
explicit positions and masks; no modeling code is forked.

The drafts form a chain, verified by the chain loop (speculative.py), which defines the verdicts (accepted, rejected,
discarded, resampled, bonus); γ is the number of tokens the early exit drafts per step, τ the tokens committed per
target forward.
"""
from __future__ import annotations

import torch

from specviz.config import DecodeConfig
from specviz.core.cache import CachedLM, lm_head
from specviz.drafters.trained import Drafter
from specviz.engines.speculative import Proposal, RunState, SpeculativeEngine, stop_drafting
from specviz.models.loader import LoadedModel


class SplitLM(CachedLM):
    """The target run in two halves over one cache: `early()` through layers 0..L-1 (drafting), then
    `logits()` through layers L..N-1 for everything the early half has seen (verification). With `fused`
    (models.fused.FusedLlama) both halves run that decoder, as plain decoding does (CachedLM.of)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, exit_layer: int, pad_one_row: bool = False,
                 fused=None):
        super().__init__(model, device, pad_one_row, fused=fused)
        self.exit_layer = exit_layer
        self.early_seen = 0                 # positions through layers 0..L-1
        self.pending: list[torch.Tensor] = []  # hidden states after layer L-1 of positions seen..early_seen-1

    def _layers(self, hidden: torch.Tensor, start: int, layers: range) -> torch.Tensor:
        """Run `layers` over hidden (1, q, d) at positions start..start+q-1. A single row is padded (a copy
        of itself one position on, dropped from the cache and the result) where models.one_row_differs."""
        if self.fused is not None:  # causal over the new rows, at cache slots start..
            return self.fused.layers(self.cache, hidden[0], start, layers=layers)[0][None]
        pad = self.pad_one_row and hidden.shape[1] == 1
        if pad:
            hidden = torch.cat([hidden, hidden], dim=1)
        q = hidden.shape[1]
        positions = torch.arange(start, start + q, device=self.device)[None]
        mask = None
        if q > 1:  # causal over the new positions, everything before them visible
            allowed = torch.arange(start + q, device=self.device)[None] <= positions[0, :, None]  # (q, start + q)
            if self.model.config._attn_implementation == "eager":  # eager adds its mask to the scores
                allowed = torch.zeros(allowed.shape, dtype=hidden.dtype, device=self.device).masked_fill(
                    ~allowed, torch.finfo(hidden.dtype).min)
            mask = allowed[None, None]
        rope = self.decoder.rotary_emb(hidden, position_ids=positions)
        for i in layers:
            hidden = self.decoder.layers[i](hidden, attention_mask=mask, position_embeddings=rope,
                                            position_ids=positions, cache=self.cache, use_cache=True)
        if pad:
            for i in layers:
                layer = self.cache.layers[i]
                layer.keys, layer.values = layer.keys[..., :start + 1, :], layer.values[..., :start + 1, :]
            hidden = hidden[:, :1]
        return hidden

    @torch.inference_mode()
    def early(self, tokens: list[int]) -> torch.Tensor:
        """Feed tokens[early_seen:] through the first L layers; the last position's hidden state (d,)."""
        new = tokens[self.early_seen:]
        ids = torch.tensor([new], dtype=torch.long, device=self.device)
        hidden = self._layers(self.decoder.embed_tokens(ids), self.early_seen, range(self.exit_layer))
        self.early_seen += len(new)
        self.pending.append(hidden)
        return hidden[0, -1]

    @torch.inference_mode()
    def logits(self, tokens: list[int], extra: list[int] = (), keep: int = 1, features: bool = False):
        full = list(tokens) + list(extra)
        if self.early_seen < len(full):
            self.early(full)
        late, outs = range(self.exit_layer, len(self.decoder.layers)), []
        if self.seen == 0 and len(self.pending) > 1:  # the prompt's last layers alone first, as plain decoding runs
            # them, so its keys and values have the same bits (AMX CPUs take other bf16 kernels past 32 rows)
            prompt = self.pending.pop(0)
            outs.append(self._layers(prompt, 0, late))
            self.seen = prompt.shape[1]
        if self.pending:  # (1, n, d) the positions the last layers have not seen
            outs.append(self._layers(torch.cat(self.pending, dim=1), self.seen, late))
        hidden = torch.cat(outs, dim=1)
        self.pending, self.seen = [], self.early_seen
        if self.fused is not None:
            return self.fused.head(self.fused.norm(hidden[0, -keep:]))  # (keep, V)
        return lm_head(self.model, self.decoder.norm(hidden[0, -keep:])).float().cpu()  # (keep, V)

    def rollback(self, n_valid: int) -> None:
        if n_valid < self.early_seen:
            for layer in self.cache.layers if self.fused is None else ():  # a KVBuffer's slots are written over
                if getattr(layer, "keys", None) is not None and layer.keys.shape[-2] > n_valid:
                    layer.keys = layer.keys[..., :n_valid, :]
                    layer.values = layer.values[..., :n_valid, :]
            self.early_seen = min(self.early_seen, n_valid)
            self.seen = min(self.seen, n_valid)
            self.pending = []


class LayerSkipSession:
    own_cache = False  # the engine's: the verifier runs the later layers on the first layers' cache

    def __init__(self, lm: SplitLM, drafter: Drafter, eos_ids: frozenset[int]):
        self.lm, self.d, self.eos_ids = lm, drafter, eos_ids

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        while len(drafted) < gamma:
            h = self.lm.early(list(tokens) + drafted)
            if self.own_cache:
                self.lm.pending = []  # only the first layers run here: the target verifies on its own cache
            logits = self.d.logits(self.d.final_norm(self.d.module(self.d.inputs(h))))
            token, q, confidence = self.d.draw(logits, cfg, generator)
            drafted.append(token)
            qs.append(q)
            if stop_drafting(token, confidence, self.eos_ids, cfg):
                break
        if not drafted:
            return Proposal.empty(self.empty_vocab)
        return Proposal(drafted, torch.stack(qs), len(drafted))

    @property
    def empty_vocab(self) -> int:
        return self.d.cfg.vocab_size

    def rollback(self, n_valid: int) -> None:
        pass  # the shared SplitLM is rolled back by the engine as the target


class LayerSkipEngine(SpeculativeEngine):
    """The chain loop of SpeculativeEngine over one SplitLM shared by the drafter and the verifier."""

    def __init__(self, target: LoadedModel, drafter: Drafter):
        super().__init__("layerskip", target, drafter)

    def start(self, prompt_ids: list[int], cfg: DecodeConfig) -> RunState:
        lm = SplitLM(self.target.model, self.target.device, self.drafter.cfg.exit_layer, self.target.pad_one_row,
                     self.target.fused)
        return RunState(cfg=cfg, target=lm, drafts=LayerSkipSession(lm, self.drafter, self.target.eos_ids),
                        generator=torch.Generator().manual_seed(cfg.seed), prompt_len=len(prompt_ids),
                        tokens=list(prompt_ids), gamma=cfg.initial_gamma())


def build(target: LoadedModel, drafter: Drafter, chain: bool = False, name: str = "") -> LayerSkipEngine:
    """LayerSkip's engine (methods.MethodSpec.engine): always a chain, over one SplitLM."""
    return LayerSkipEngine(target, drafter)
