"""A model plus its KV cache for one run: feed only the tokens it has not seen, crop on rejection."""
from __future__ import annotations

import time

import torch


def new_cache(model: torch.nn.Module):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def crop_to(cache, length: int) -> None:
    """Keep the first `length` positions of every layer."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class CachedLM:
    """Per-run state over a shared, read-only model: its KV cache and how many tokens it holds."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.cache = new_cache(model)
        self.seen = 0  # tokens whose keys/values are in the cache

    @torch.inference_mode()
    def logits(self, tokens: list[int], extra: list[int] = (), keep: int = 1, features: bool = False):
        """Feed the unseen part of tokens + extra; return the last `keep` positions' logits (keep, V), float32 on CPU.
        With features=True also return the final-norm hidden state of every fed position (n, d): what
        feature-reading drafters (EAGLE, Medusa) draft from."""
        new = (list(tokens) + list(extra))[self.seen:]
        assert new, "nothing to feed: the cache already holds every token"
        input_ids = torch.tensor([new], dtype=torch.long, device=self.device)  # (1, n)
        out = self._forward(features, input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.seen += len(new)
        logits = out.logits[0, -keep:].float().cpu()  # (keep, V)
        return (logits, out.hidden[0]) if features else logits

    def _forward(self, features: bool, logits_to_keep: int, **inputs):
        """The model's forward; with features, its decoder then its LM head, keeping the hidden states."""
        if not features:
            return self.model(logits_to_keep=logits_to_keep, **inputs)
        hidden = self.model.get_decoder()(**inputs).last_hidden_state  # (1, n, d)
        logits = self.model.get_output_embeddings()(hidden[:, -logits_to_keep:])
        return _Out(logits, hidden)

    @torch.inference_mode()
    def tree_logits(self, tokens: list[int], tree, node_tokens: list[int], features: bool = False):
        """Feed the unseen committed tokens (the last is the tree's root) and the tree's nodes in one forward,
        each node attending to the context and its own ancestors. Returns (1 + n, V): the root's row, then
        one row per node."""
        from specviz.trees import tree_inputs

        n_fed = len(tokens) - self.seen
        assert n_fed >= 1, "the root (last committed token) must not be in the cache yet"
        position_ids, mask = tree_inputs(len(tokens), n_fed, tree, self.model.config._attn_implementation,
                                         next(self.model.parameters()).dtype)
        input_ids = torch.tensor([list(tokens[self.seen:]) + list(node_tokens)], dtype=torch.long, device=self.device)
        out = self._forward(features, input_ids=input_ids, attention_mask=mask.to(self.device),
                            position_ids=position_ids.to(self.device), cache=self.cache, use_cache=True,
                            logits_to_keep=tree.size + 1)
        self.seen += input_ids.shape[1]
        logits = out.logits[0].float().cpu()  # (1 + n, V)
        return (logits, out.hidden[0]) if features else logits

    def keep_path(self, n_committed: int, path: list[int]) -> None:
        """After a tree forward: keep the committed context and the accepted path's nodes, drop the rest."""
        keep_positions(self.cache, list(range(n_committed)) + [n_committed + i for i in path])
        self.seen = n_committed + len(path)

    def rollback(self, n_valid: int) -> None:
        """Forget every position from n_valid on (rejected drafts)."""
        if n_valid < self.seen:
            crop_to(self.cache, n_valid)
            self.seen = n_valid


class _Out:
    def __init__(self, logits: torch.Tensor, hidden: torch.Tensor):
        self.logits, self.hidden = logits, hidden


def clock(device: torch.device) -> float:
    """perf_counter after the device has finished its queued work (honest GPU timings)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def keep_positions(cache, positions: list[int]) -> None:
    """Keep only the given cache positions, in order (the accepted path of a tree), in every layer."""
    index = None
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None:
            continue
        if index is None:
            index = torch.tensor(positions, dtype=torch.long, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)
