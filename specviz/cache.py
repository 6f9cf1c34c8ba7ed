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
    def logits(self, tokens: list[int], extra: list[int] = (), keep: int = 1) -> torch.Tensor:
        """Feed the unseen part of tokens + extra; return the last `keep` positions' logits (keep, V), float32 on CPU."""
        new = (list(tokens) + list(extra))[self.seen:]
        assert new, "nothing to feed: the cache already holds every token"
        input_ids = torch.tensor([new], dtype=torch.long, device=self.device)  # (1, n)
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.seen += len(new)
        return out.logits[0, -keep:].float().cpu()  # (keep, V)

    def rollback(self, n_valid: int) -> None:
        """Forget every position from n_valid on (rejected drafts)."""
        if n_valid < self.seen:
            crop_to(self.cache, n_valid)
            self.seen = n_valid


def clock(device: torch.device) -> float:
    """perf_counter after the device has finished its queued work (honest GPU timings)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
