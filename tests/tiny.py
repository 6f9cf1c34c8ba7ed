"""Tiny random models for fast tests, on any device: a 2-layer Llama with a 64-token vocabulary, and random
trained drafters for it. Imports torch, transformers and specviz's engine modules only (no gradio), so the
GPU self-check (tests/test_gpu.py, run without conftest.py) can use them too."""
from __future__ import annotations

import torch

from specviz.drafters import trained as drafters
from specviz.drafters.config import DrafterConfig
from specviz.models import loader as models


class TinyTokenizer:
    """Enough of a tokenizer for engines on a tiny random model: token i reads as '<i>'."""

    def __init__(self, vocab: int, eos: int):
        self.vocab, self.eos_token_id, self.chat_template = vocab, eos, None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)

    def get_vocab(self):
        return {f"<{i}>": i for i in range(self.vocab)}

    def __len__(self):
        return self.vocab

    def __call__(self, text):
        return {"input_ids": [int(t) % self.vocab for t in text.split()]}


def tiny_model(seed: int = 0, vocab: int = 64, layers: int = 2, eos: int = 63,
               device: str | torch.device = "cpu") -> models.LoadedModel:
    """A random Llama in fp32 (the same weights on every device for a seed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=eos, bos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so greedy runs are not all near-ties
        model.lm_head.weight.mul_(40.0)
    device = torch.device(device)
    return models.LoadedModel(f"tiny-{seed}", model.to(device), TinyTokenizer(vocab, eos), device, torch.float32)


def random_drafter(target: models.LoadedModel, kind: str, vocab_ids=None, seed: int = 1, **extra) -> drafters.Drafter:
    """A trained drafter of `kind` for `target` with random weights, on the target's device and dtype."""
    cfg = DrafterConfig.for_target(kind, target.name, target.model.config,
                                            0 if vocab_ids is None else len(vocab_ids), **extra)
    torch.manual_seed(seed)
    module = drafters.build_module(cfg)
    for p in module.parameters():  # a drafter that is wrong in varied ways, not only at rank 0
        torch.nn.init.normal_(p, std=0.3)
    module.to(device=target.device, dtype=target.dtype)
    return drafters.Drafter(module, cfg, target.model, None if vocab_ids is None else vocab_ids.to(target.device))
