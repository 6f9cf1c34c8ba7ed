"""A model plus its KV cache for one run: feed only the tokens it has not seen, crop on rejection."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def new_cache(model: torch.nn.Module):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def crop_to(cache, length: int) -> None:
    """Keep the first `length` positions of every layer."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@dataclass(frozen=True)
class Traced:
    """One recorded forward: the tokens fed from cache position `start` on, and the logits of the last rows."""
    start: int
    fed: list[int]
    logits: torch.Tensor          # (keep, V): row r predicts the token at position start + len(fed) - keep + r + 1

    def rows_on(self, sequence: list[int]):
        """(position, logits row) for the rows whose inputs all lie on `sequence` (the committed tokens)."""
        keep = self.logits.shape[0]
        for r in range(keep):
            position = self.start + len(self.fed) - keep + r + 1
            if self.fed[:position - self.start] == sequence[self.start:position]:
                yield position, self.logits[r]


class CachedLM:
    """Per-run state over a shared, read-only model: its KV cache and how many tokens it holds.

    Every forward runs the stock decoder, then the LM head on 2-D rows (keep, d): on a 3-D slice
    transformers' head goes through bmm and, in bf16, copies the whole transposed embedding every call.
    With pad_one_row, a forward of one new token feeds a padding row after it (dropped from the cache and
    the result), so no forward runs the one-row kernels (models.one_row_differs). With max_rows, a forward
    that carries drafts runs in pieces of at most that many rows (CPUs with AMX switch bf16 matmul kernels
    past 32 rows, which changes a row's bits: a 63-node Medusa tree would no longer verify bit for bit).
    With `fused` (models.fused.FusedLlama, a bf16 Llama on CPU) every forward runs that decoder over its own
    preallocated KVBuffer instead: row-invariant by construction, so no padding row and no pieces."""

    def __init__(self, model: torch.nn.Module, device: torch.device, pad_one_row: bool = False,
                 max_rows: int | None = None, fused=None):
        self.model = model
        self.device = device
        self.fused = fused
        self.pad_one_row = pad_one_row and fused is None
        self.max_rows = None if fused is not None else max_rows
        self.decoder = model.get_decoder()
        self.cache = fused.new_cache() if fused is not None else new_cache(model)
        self.seen = 0  # tokens whose keys/values are in the cache
        self.trace: list[Traced] | None = None  # set to a list to record every logits() forward

    @classmethod
    def of(cls, loaded) -> "CachedLM":
        """For a models.LoadedModel, with its padding rule and row limit, on its fused decoder where it has one."""
        return cls(loaded.model, loaded.device, loaded.pad_one_row, loaded.max_rows, loaded.fused)

    def _pieces(self, n: int, split: bool) -> list[tuple[int, int]]:
        """[a, b) bounds of about equal pieces of at most max_rows rows (none of one row) when split."""
        pieces = -(-n // self.max_rows) if split and self.max_rows and n > self.max_rows else 1
        bounds = [i * n // pieces for i in range(pieces + 1)]  # sizes differ by at most one: none of one row
        return list(zip(bounds, bounds[1:]))

    def _head(self, hidden: torch.Tensor, split: bool) -> torch.Tensor:
        """The LM head on rows (r, d), in the pieces _decode would use: (r, V) float32 on CPU."""
        if self.fused is not None:
            return self.fused.head(hidden)
        return torch.cat([lm_head(self.model, hidden[a:b]) for a, b in self._pieces(len(hidden), split)]).float().cpu()

    def _decode(self, input_ids: torch.Tensor, hidden_states: bool, split: bool = False, **inputs):
        """The decoder over input_ids (1, n) with the cache; split (a forward carrying drafts): in about equal
        pieces of at most max_rows rows (none of one row), each attending to the cache the pieces before it
        filled. Returns (last hidden state (n, d), the hidden states per layer, each (1, n, d), or None)."""
        n = input_ids.shape[1]
        mask, position_ids = inputs.get("attention_mask"), inputs.get("position_ids")
        if self.fused is not None:
            return self.fused.decode(self.cache, input_ids[0], self.seen, mask, position_ids, hidden_states)
        pieces = self._pieces(n, split)
        lasts, states = [], []
        for a, b in pieces:
            step = {}
            if mask is not None:  # (1, 1, n, kv): these queries, over the keys cached by the end of this piece
                step["attention_mask"] = mask[:, :, a:b, :mask.shape[-1] - (n - b)]
            if position_ids is not None:
                step["position_ids"] = position_ids[:, a:b]
            out = self.decoder(input_ids=input_ids[:, a:b], cache=self.cache, use_cache=True,
                               output_hidden_states=hidden_states, **step)
            lasts.append(out.last_hidden_state[0])
            states.append(out.hidden_states)
        if len(pieces) == 1:
            return lasts[0], states[0]
        return torch.cat(lasts), (tuple(torch.cat(layer, 1) for layer in zip(*states)) if hidden_states else None)

    @torch.inference_mode()
    def logits(self, tokens: list[int], extra: list[int] = (), keep: int = 1, features: bool = False):
        """Feed the unseen part of tokens + extra; return the last `keep` positions' logits (keep, V), float32 on CPU.
        With features also return every fed position's features: True, the final-norm hidden state (n, d), what
        EAGLE-1 and Medusa draft from; a tuple of hidden-state indices, those states side by side (n, len * d),
        what EAGLE-3 fuses."""
        if extra and len(tokens) - self.seen > 1:  # a prompt not in the cache yet: its own forward first, as plain
            # decoding runs it, so its keys and values have the same bits (AMX CPUs take other bf16 kernels past
            # 32 rows)
            first = self.logits(tokens, keep=max(1, keep - len(extra)), features=features)
            rest = self.logits(tokens, extra, keep=min(keep, len(extra)), features=features)
            if not features:
                return torch.cat([first, rest])[-keep:]
            return torch.cat([first[0], rest[0]])[-keep:], torch.cat([first[1], rest[1]])
        new = (list(tokens) + list(extra))[self.seen:]
        assert new, "nothing to feed: the cache already holds every token"
        pad = self.pad_one_row and len(new) == 1
        input_ids = torch.tensor([new + new[-1:] * pad], dtype=torch.long, device=self.device)  # (1, n [+ 1])
        hidden, states = self._decode(input_ids, isinstance(features, tuple), split=bool(extra))  # (n [+1], d)
        if pad:
            crop_to(self.cache, self.seen + 1)
            hidden = hidden[:1]
        logits = self._head(hidden[-keep:], split=bool(extra))  # (keep, V)
        if self.trace is not None:
            self.trace.append(Traced(self.seen, new, logits))
        self.seen += len(new)
        if not features:
            return logits
        return logits, fused(states, features, len(new)) if isinstance(features, tuple) else hidden

    @torch.inference_mode()
    def tree_logits(self, tokens: list[int], tree, node_tokens: list[int], features: bool = False):
        """Feed the unseen committed tokens (the last is the tree's root) and the tree's nodes in one forward,
        each node attending to the context and its own ancestors. Returns (1 + n, V): the root's row, then
        one row per node."""
        from specviz.core.trees import tree_inputs, tree_visible

        n_fed = len(tokens) - self.seen
        assert n_fed >= 1, "the root (last committed token) must not be in the cache yet"
        if self.fused is not None:  # its attention reads the visible slots, not a mask
            position_ids, mask = tree_visible(len(tokens), n_fed, tree)
        else:
            position_ids, mask = tree_inputs(len(tokens), n_fed, tree, self.model.config._attn_implementation,
                                             next(self.model.parameters()).dtype)
            position_ids, mask = position_ids.to(self.device), mask.to(self.device)
        input_ids = torch.tensor([list(tokens[self.seen:]) + list(node_tokens)], dtype=torch.long, device=self.device)
        hidden, states = self._decode(input_ids, isinstance(features, tuple), split=True, attention_mask=mask,
                                      position_ids=position_ids)  # (n_fed + n, d)
        self.seen += input_ids.shape[1]
        logits = self._head(hidden[n_fed - 1:], split=True)  # (1 + n, V)
        if not features:
            return logits
        return logits, fused(states, features, len(hidden)) if isinstance(features, tuple) else hidden

    def keep_path(self, n_committed: int, path: list[int]) -> None:
        """After a tree forward: keep the committed context and the accepted path's nodes, drop the rest."""
        positions = list(range(n_committed)) + [n_committed + i for i in path]
        if self.fused is not None:
            self.cache.keep(positions)
        else:
            keep_positions(self.cache, positions)
        self.seen = n_committed + len(path)

    def rollback(self, n_valid: int) -> None:
        """Forget every position from n_valid on (rejected drafts)."""
        if n_valid < self.seen:
            if self.fused is None:  # the fused decoder's KVBuffer just writes over the slots from n_valid on
                crop_to(self.cache, n_valid)
            self.seen = n_valid


def fused(hidden_states: tuple, layers: tuple, n: int) -> torch.Tensor:
    """The hidden states `layers` (indices into transformers' hidden_states: 0 = embeddings, i = after i layers)
    of the first n rows, side by side: (n, len(layers) * d)."""
    return torch.cat([hidden_states[i][0, :n] for i in layers], -1)


def lm_head(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """The model's output head on 2-D rows (r, d) -> (r, V), with the final logit soft-capping of models
    that have one (Gemma 2)."""
    logits = model.get_output_embeddings()(rows)
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def clock(device: torch.device) -> float:
    """perf_counter after the device has finished its queued work (honest GPU timings)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.inference_mode()
def keep_positions(cache, positions: list[int]) -> None:
    """Keep only the given cache positions (increasing: the committed context, then the accepted path of a tree)
    in every layer: the rows that move are written over the first dropped ones and the rest is cropped, so a step
    copies its path's few rows, not the whole cache (an index_select over every position cost a measurable share of
    a step: experiments/LOG.md)."""
    first = next((k for k, p in enumerate(positions) if p != k), len(positions))  # rows before it stay where they are
    index = None
    for layer in cache.layers if first < len(positions) else ():
        if getattr(layer, "keys", None) is None:
            continue
        if index is None:
            index = torch.tensor(positions[first:], dtype=torch.long, device=layer.keys.device)
        layer.keys[..., first:len(positions), :] = layer.keys.index_select(-2, index)
        layer.values[..., first:len(positions), :] = layer.values.index_select(-2, index)
    crop_to(cache, len(positions))
