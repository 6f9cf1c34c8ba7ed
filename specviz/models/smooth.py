"""SmoothQuant for the CPU int8 draft (models/drafts.py int8_copy): activation outliers moved into the weights, the
same fp32 function up to rounding, so dynamic int8 loses less. Xiao et al. 2023, https://arxiv.org/abs/2211.10438."""
from __future__ import annotations

import torch

# Short prompts (our own, not the evaluation set) whose activations calibrate the CPU int8 copy.
CALIBRATION_PROMPTS = (
    "Describe the water cycle in simple terms.",
    "Write a haiku about autumn leaves, then explain its imagery.",
    "List three tips for learning a new programming language.",
    "Summarize the causes of the French Revolution.",
)
SMOOTH_ALPHA = 0.6


@torch.no_grad()
def activation_amax(target, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x| seen by every nn.Linear of `model` on the calibration prompts."""
    amax: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(_module, inputs, _output):
            a = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0).float()  # (in,)
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    try:
        for prompt in CALIBRATION_PROMPTS:
            model(input_ids=torch.tensor([target.encode_prompt(prompt)], device=target.device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return amax


def smooth_scale(x_amax: torch.Tensor, w_amax: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel s = max|X|^a / max|W|^(1-a)."""
    return (x_amax.clamp_min(1e-5) ** alpha / w_amax.clamp_min(1e-5) ** (1 - alpha)).clamp_min(1e-5)


@torch.no_grad()
def smooth_llama(model: torch.nn.Module, amax: dict[str, torch.Tensor], alpha: float) -> None:
    """Migrate activation outliers into the weights, exactly (same fp32 function up to rounding):
    divide each Linear input channel by s and multiply the weight's column by s, folding 1/s into the
    op that produces that input: RMSNorm weights (q/k/v, gate/up), up_proj rows (down_proj) and
    v_proj rows (o_proj; one s per KV channel, shared by the query heads of its group)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    n_kv = cfg.num_key_value_heads
    group = cfg.num_attention_heads // n_kv
    col_amax = lambda *linears: torch.stack([lin.weight.abs().amax(0) for lin in linears]).amax(0)  # noqa: E731
    for i, layer in enumerate(model.model.layers):
        attn, mlp, pre = layer.self_attn, layer.mlp, f"model.layers.{i}."
        qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
        for norm, linears, name in ((layer.input_layernorm, qkv, "self_attn.q_proj"),
                                    (layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj), "mlp.gate_proj")):
            s = smooth_scale(amax[pre + name], col_amax(*linears), alpha)
            norm.weight.div_(s)
            for lin in linears:
                lin.weight.mul_(s)
        s = smooth_scale(amax[pre + "mlp.down_proj"], col_amax(mlp.down_proj), alpha)
        mlp.up_proj.weight.div_(s[:, None])
        mlp.down_proj.weight.mul_(s)
        x_o = amax[pre + "self_attn.o_proj"].view(n_kv, group, head_dim).amax(1)
        w_o = col_amax(attn.o_proj).view(n_kv, group, head_dim).amax(1)
        s = smooth_scale(x_o, w_o, alpha)  # (n_kv, head_dim)
        attn.v_proj.weight.div_(s.reshape(-1)[:, None])
        attn.o_proj.weight.mul_(s[:, None, :].expand(-1, group, -1).reshape(-1))


def smoothable(model: torch.nn.Module) -> bool:
    """A Llama-style decoder (RMSNorm -> q/k/v and gate/up; up -> down; v -> o), bias-free."""
    try:
        cfg, layers = model.config, model.model.layers
        linears = [getattr(layer.self_attn, n) for layer in layers for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        linears += [getattr(layer.mlp, n) for layer in layers for n in ("gate_proj", "up_proj", "down_proj")]
        norms = [n.weight for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        return (all(isinstance(lin, torch.nn.Linear) and lin.bias is None for lin in linears)
                and all(n.dim() == 1 for n in norms) and cfg.num_attention_heads % cfg.num_key_value_heads == 0)
    except (AttributeError, TypeError):
        return False
