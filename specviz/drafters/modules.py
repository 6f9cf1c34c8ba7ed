"""The trained drafters' torch modules: EAGLE-1 and EAGLE-3, Medusa heads, LayerSkip's exit adapter and the
distilled draft model, with the decoder pieces they share (RMSNorm, rotary, attention, MLP)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specviz.drafters.config import DrafterConfig, DrafterError


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(positions: torch.Tensor, hd: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding's (cos, sin) at positions (T,): (T, hd) each, in `dtype`."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=positions.device, dtype=torch.float32) / hd))  # (hd/2,)
    angles = positions.float()[:, None] * inv[None]  # (T, hd/2)
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (the Llama layout: halves rotated) of x (B, H, T, hd), with rotary()'s tables."""
    hd = x.shape[-1]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig, in_features: int | None = None):
        super().__init__()
        d, self.h, self.kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd, self.theta = d // self.h, cfg.rope_theta
        n_in = in_features or d
        self.q_proj = nn.Linear(n_in, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(n_in, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(n_in, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, past: tuple | None, mask: torch.Tensor | None = None):
        """x (B, T, d) at positions (T,), after `past` (keys, values) of shape (B, kv, S, hd). `mask` (T, S + T)
        bool overrides the default causal one (training unrolls the drafter over its own guesses)."""
        b, t, _ = x.shape
        cos, sin = rotary(positions, self.hd, self.theta, x.dtype)  # once for q and k
        q = rotate(self.q_proj(x).view(b, t, self.h, self.hd).transpose(1, 2), cos, sin)
        k = rotate(self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        s = 0
        if past is not None:
            s = past[0].shape[2]
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        if mask is not None:
            causal = False
        elif s == 0:
            mask, causal = None, t > 1
        else:
            mask = torch.arange(s + t, device=x.device)[None] <= (s + torch.arange(t, device=x.device))[:, None]
            causal = False
        rep = self.h // self.kv
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                             attn_mask=mask, is_causal=causal)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


class MLP(nn.Module):
    def __init__(self, d: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.input_norm else nn.Identity()
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, positions, past, mask=None):
        a, present = self.self_attn(self.input_layernorm(x), positions, past, mask)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), present


class Eagle(nn.Module):
    """EAGLE-1: next feature = layer(fc([embedding of the next token, this feature])); the feature is the
    target's final-norm hidden state, which the LM head reads as it is."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(cfg)])

    def lift(self, target_feats: torch.Tensor) -> torch.Tensor:
        """The target's features as the drafter's input (B, T, d): EAGLE-1 reads them as they are."""
        return target_feats

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """What the LM head reads from the drafter's output: EAGLE-1 predicts the final-norm feature itself."""
        return h

    def forward(self, feats: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, past=None, mask=None):
        """feats (lifted), embeds (B, T, d) → predicted next features (B, T, d) and the new (keys, values)."""
        return self.layers[0](self.fc(torch.cat([embeds, feats], -1)), positions, past, mask)

    @staticmethod
    def describe(cfg: DrafterConfig, vocab: str) -> str:
        return f"EAGLE, one decoder layer, {vocab}"


class Eagle3Layer(nn.Module):
    """EAGLE-3's one layer (`midlayer`): attention reads [norm(embedding), norm(hidden)] (2d wide); the residual
    stream is the hidden state, then an MLP as in a Llama layer."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        d = cfg.hidden_size
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, in_features=2 * d)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp = MLP(d, cfg.intermediate_size)

    def forward(self, embeds, hidden, positions, past, mask=None):
        a, present = self.self_attn(torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1),
                                    positions, past, mask)
        x = hidden + a
        return x + self.mlp(self.post_attention_layernorm(x)), present


class Eagle3(nn.Module):
    """EAGLE-3: `fc` fuses the target's hidden states from a low, a middle and a high layer into one (d); the
    layer turns (that, the next token's embedding) into the next hidden state, which drafts the following
    token through `norm` and the LM head and is itself the input of the next draft step (no fc there)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.feature_layers) * d, d, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        if cfg.own_lm_head:
            self.lm_head = nn.Linear(d, cfg.draft_vocab or cfg.vocab_size, bias=False)

    def lift(self, target_feats: torch.Tensor) -> torch.Tensor:
        """The target's fused features (B, T, len(feature_layers) * d) as the drafter's input (B, T, d)."""
        return self.fc(target_feats)

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)

    def forward(self, feats: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, past=None, mask=None):
        """feats (lifted, or the previous step's output), embeds (B, T, d) → next hidden (B, T, d), (keys, values)."""
        return self.midlayer(embeds, feats, positions, past, mask)

    @staticmethod
    def describe(cfg: DrafterConfig, vocab: str) -> str:
        return f"EAGLE-3, one decoder layer over the target's hidden states after layers {cfg.feature_layers}, {vocab}"


class ResBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)  # starts as the identity: every head first predicts like the LM head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class Medusa(nn.Module):
    """K heads; head k maps the feature at position t to one for the token at t + 1 + k (k = 1..K)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.heads = nn.ModuleList(
            [nn.Sequential(ResBlock(d), nn.Linear(d, cfg.vocab_size, bias=False)) if cfg.own_lm_heads
             else nn.Sequential(ResBlock(d)) for _ in range(cfg.medusa_heads)])

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """feats (..., d) → (K, ..., d) head features (before the LM head)."""
        return torch.stack([head[0](feats) for head in self.heads])

    @staticmethod
    def describe(cfg: DrafterConfig, vocab: str) -> str:
        return f"Medusa, {cfg.medusa_heads} heads, {vocab}"


class ExitAdapter(nn.Module):
    """LayerSkip's early exit: maps the hidden state after `exit_layer` target layers to one the target's
    final norm and LM head can read (a residual MLP, zero-initialised: it starts as the plain early exit)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        nn.init.zeros_(self.mlp.down_proj.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.norm(h))

    @staticmethod
    def describe(cfg: DrafterConfig, vocab: str) -> str:
        return f"LayerSkip: the target's first {cfg.exit_layer} layers and a trained exit adapter, {vocab}"


class DraftLM(nn.Module):
    """A small separate model: a few decoder layers (started from a selection of the target's and distilled)
    between the target's own embeddings and (compressed) LM head. Only its layers and final norm are its own."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in cfg.draft_layers])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, past: list | None = None):
        """embeds (B, T, d) at positions (T,) after `past` (a (keys, values) per layer) → final-norm
        features (B, T, d) and the new past."""
        x, present = embeds, []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, positions, None if past is None else past[i])
            present.append(kv)
        return self.norm(x), present

    @classmethod
    def from_target(cls, cfg: DrafterConfig, target_model: nn.Module) -> "DraftLM":
        """Its layers start as copies of the target's layers `cfg.draft_layers`, its norm as the target's."""
        module = cls(cfg)
        decoder = target_model.get_decoder()
        for mine, index in zip(module.layers, cfg.draft_layers):
            load_into(mine, decoder.layers[index].state_dict(), f"target layer {index}")
        module.norm.weight.data.copy_(decoder.norm.weight.data)
        return module

    @staticmethod
    def describe(cfg: DrafterConfig, vocab: str) -> str:
        return (f"a distilled draft model of {len(cfg.draft_layers)} decoder layers (started from the target's layers "
                f"{cfg.draft_layers}) sharing the target's embeddings and LM head, {vocab}")


def load_into(module: nn.Module, state: dict, name: str) -> None:
    """The weights into the module built from its config, each name and shape checked first (one line naming the
    first that does not fit, never torch's multi-line size-mismatch error)."""
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise DrafterError(f"drafter weights {name!r} do not match the layout: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    wrong = [k for k in own if tuple(state[k].shape) != tuple(own[k].shape)]
    if wrong:
        k = wrong[0]
        raise DrafterError(f"drafter weights {name!r} do not fit its config.json: {k} is {list(state[k].shape)}, the "
                           f"config makes it {list(own[k].shape)}" + (f" ({len(wrong) - 1} more differ)"
                                                                       if len(wrong) > 1 else ""))
    module.load_state_dict({k: v.float() for k, v in state.items()})
