"""DFlash (Chen, Liang, Liu, "Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036): a drafter that
drafts a whole block in one forward. The block is the verified next token followed by block_size - 1 copies of a
mask token; a few Llama-style decoder layers (between the target's own embeddings and LM head) read the target's
hidden states from several of its layers, concatenated, projected by `fc` to the hidden size and normed
(`hidden_norm`), as extra keys and values ("the context") in every layer. Attention is bidirectional within the
block and sees the whole context (the target's states at the positions before the block). The output at block
slot k (1..block_size - 1) is read through `norm` and the target's LM head as the draft of the token at slot k.

Parameter names follow the published layout (z-lab's DFlashDraftModel, vLLM's DFlash drafter): fc, hidden_norm,
layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm,
mlp.{gate,up,down}_proj}, norm; its feature_layers are indices into transformers' hidden_states (0 = embeddings),
so the published target_layer_ids are feature_layers - 1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specviz.drafters.config import DrafterConfig
from specviz.drafters.modules import MLP, RMSNorm, rotary, rotate

DEFAULT_LAYERS = 5  # target hidden states the context fuses (the paper's choice)


def dflash_layers(n_layers: int, count: int = DEFAULT_LAYERS) -> list[int]:
    """The target hidden states a DFlash drafter reads: `count` spread evenly from after its second layer to after
    all but its last two (the reference's target_layer_ids 1 .. L - 3, plus one for transformers' embeddings row),
    deduplicated for shallow targets."""
    lo, hi = min(2, n_layers), max(1, n_layers - 2)
    if count <= 1 or hi <= lo:
        return sorted({lo, hi})[:max(1, count)]
    return sorted({round(lo + (hi - lo) * i / (count - 1)) for i in range(count)})


def mask_token(tokenizer, vocab_size: int) -> int:
    """The token whose embedding fills a block's masked slots: the highest-id special token that is not the
    BOS, EOS or padding token (SmolLM2 has several unused ones), else the last id of the vocabulary."""
    skip = {getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    special = [i for i in getattr(tokenizer, "all_special_ids", []) or [] if i not in skip and 0 <= i < vocab_size]
    return max(special) if special else vocab_size - 1


class DFlashAttention(nn.Module):
    """Queries from the block; keys and values from the context rows and the block's rows, each through this
    layer's own k_proj / v_proj; per-head RMS norms on queries and keys (the published layout's q_norm, k_norm)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        d, self.h, self.kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd, self.theta = d // self.h, cfg.rope_theta
        self.q_proj = nn.Linear(d, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)

    def keys(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows x (B, T, d) at positions (T,) as (keys, values), each (B, kv, T, hd)."""
        b, t, _ = x.shape
        cos, sin = rotary(positions, self.hd, self.theta, x.dtype)
        k = rotate(self.k_norm(self.k_proj(x).view(b, t, self.kv, self.hd)).transpose(1, 2), cos, sin)
        return k, self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)

    def forward(self, x, positions, context: tuple, mask=None):
        """The block's rows x (B, T, d) at positions (T,) or (B, T); `context` the context's (keys, values);
        `mask` (B, 1, T, S + T) bool, None = every key visible."""
        b, t, _ = x.shape
        flat = positions.reshape(-1)
        cos, sin = rotary(flat, self.hd, self.theta, x.dtype)
        if positions.dim() == 2:  # a position per row (training: blocks at different anchors)
            cos, sin = cos.view(b, 1, t, -1), sin.view(b, 1, t, -1)
        q = rotate(self.q_norm(self.q_proj(x).view(b, t, self.h, self.hd)).transpose(1, 2), cos, sin)
        k = rotate(self.k_norm(self.k_proj(x).view(b, t, self.kv, self.hd)).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        k, v = torch.cat([context[0], k], 2), torch.cat([context[1], v], 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.h != self.kv)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, positions, context, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), positions, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlash(nn.Module):
    """fc and hidden_norm turn the target's fused hidden states into context rows; each layer projects them into
    keys and values of its own (`context_kv`, cached across steps while drafting); `forward` runs the block."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.feature_layers) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(d, cfg.rms_norm_eps)

    @staticmethod
    def default_layers(n_layers: int) -> list[int]:
        """The target hidden states a new drafter of this kind fuses (train/loop.py's feature_layers)."""
        return dflash_layers(n_layers)

    def context_kv(self, target_feats: torch.Tensor, positions: torch.Tensor) -> list[tuple]:
        """The target's fused hidden states (B, C, len(feature_layers) * d) at positions (C,) as every layer's
        context (keys, values)."""
        ctx = self.hidden_norm(self.fc(target_feats))
        return [layer.self_attn.keys(ctx, positions) for layer in self.layers]

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, context: list[tuple], mask=None) -> torch.Tensor:
        """The block's embeddings (B, T, d) at positions (T,) or (B, T), with each layer's context (keys, values)
        → the normed outputs (B, T, d), which the LM head reads."""
        x = embeds
        for layer, kv in zip(self.layers, context):
            x = layer(x, positions, kv, mask)
        return self.norm(x)

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        return h  # forward's outputs are already normed

    @staticmethod
    def describe(cfg: DrafterConfig, vocab: str) -> str:
        return (f"DFlash, {cfg.num_hidden_layers} decoder layers drafting blocks of {cfg.block_size} in one forward "
                f"over the target's hidden states after layers {cfg.feature_layers}, {vocab}")
