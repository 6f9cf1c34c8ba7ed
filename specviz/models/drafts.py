"""A draft model for a target: a compressed copy of the target (int8), or a separate model that shares its vocabulary.

  int8     dynamic int8 on CPU (SmoothQuant, per-channel weight scales, 8-bit activations where the CPU has VNNI),
           weight-only int8 on GPU; built once per target and kept while the target is loaded
  a spec   any model models/loader.py resolves, refused unless its tokenizer's vocabulary is the target's
"""
from __future__ import annotations

import copy
import threading
import weakref

import torch

from specviz import zerogpu
from specviz.models import kernels, smooth
from specviz.models.loader import LoadedModel, ModelError, get, warm_up

COMPRESSED_DRAFTS = ("int8",)


class Int8Linear(torch.nn.Module):
    """Weight-only int8 linear layer (per-output-channel scales), for GPUs."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()                       # (out, in)
        scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-8) / 127.0  # (out, 1)
        self.register_buffer("weight_int8", torch.round(w / scale).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_int8.to(x.dtype) * self.scale.to(x.dtype)  # (out, in)
        return torch.nn.functional.linear(x, w, self.bias)


def _swap_linears(module: torch.nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            _swap_linears(child)


# target model -> its int8 copy; the copy goes when the target is dropped from the cache (and a recycled
# id() can never hand one model's copy to another)
_int8_copies: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = weakref.WeakKeyDictionary()
_int8_lock = threading.Lock()


def _cpu_has_vnni() -> bool:
    """AVX512-VNNI: fbgemm's u8 x s8 products then accumulate straight into int32 (no int16 saturation)."""
    return "avx512_vnni" in kernels.cpu_flags()


class _DynamicLinear8bit(torch.ao.nn.quantized.dynamic.Linear):
    """Dynamic int8 linear with full 8-bit activations (the stock module uses 7: reduce_range=True)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, reduce_range=False).to(x.dtype)


def _make_int8(target: LoadedModel) -> torch.nn.Module:
    """The int8 draft, a compressed copy of the target.

    GPU: weight-only int8 (Int8Linear). CPU: dynamic int8 (torch.ao quantize_dynamic), made accurate by
      1. SmoothQuant (alpha 0.6) on Llama-style models: per-channel activation maxima from a forward of
         four short built-in prompts, folded exactly into RMSNorm / up_proj / v_proj weights;
      2. per-output-channel weight scales;
      3. 8-bit (not 7-bit) dynamic activations where the CPU has AVX512-VNNI.
    Deterministic, a second or two of extra build time. 1 and 2 raise the copy's top-1 agreement with the fp32
    target well above plain quantize_dynamic's at the same 1-token latency (the figures: experiments/LOG.md).
    """
    import warnings

    model = copy.deepcopy(target.model)
    kernels.swap_out(model)  # plain nn.Linear modules again, for quantize_dynamic
    if target.device.type == "cpu":  # fbgemm's dynamic int8 takes fp32 activations, whatever the target's dtype
        model = torch.nn.Module.float(model)  # (transformers refuses .float() on a model loaded from GGUF)
        model.set_attn_implementation("sdpa")  # the draft need not be bitwise anything; sdpa is faster
        if smooth.smoothable(model):
            smooth.smooth_llama(model, smooth.activation_amax(target, model), smooth.SMOOTH_ALPHA)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(
                model, {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8)
        if _cpu_has_vnni():
            for module in model.modules():
                if type(module) is torch.ao.nn.quantized.dynamic.Linear and module._packed_params.dtype == torch.qint8:
                    module.__class__ = _DynamicLinear8bit
    else:
        _swap_linears(model)
    if not zerogpu.enabled():
        warm_up(model, target.device)
    return model.eval()


def int8_copy(target: LoadedModel) -> LoadedModel:
    """A compressed copy of the target: dynamic int8 on CPU, weight-only int8 on GPU."""
    with _int8_lock:
        model = _int8_copies.get(target.model)
        if model is None:
            model = _int8_copies[target.model] = _make_int8(target)
    dtype = torch.float32 if target.device.type == "cpu" else target.dtype
    return LoadedModel(f"int8({target.name})", model, target.tokenizer, target.device, dtype, _texts=target._texts)


def load_draft(spec: str, target: LoadedModel) -> LoadedModel:
    """A draft model for `target`: a compressed copy (int8) or a separate model sharing its tokenizer."""
    if spec in COMPRESSED_DRAFTS:
        return int8_copy(target)
    draft = get(spec, target.device, target.dtype)
    check_tokenizers(target, draft)
    return draft


def check_tokenizers(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose vocabulary differs from the target's, naming both tokenizers."""
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    t_name = f"{type(t_tok).__name__} of {target.name!r} ({len(t_tok)} tokens)"
    d_name = f"{type(d_tok).__name__} of {draft.name!r} ({len(d_tok)} tokens)"
    if t_tok.get_vocab() != d_tok.get_vocab():
        raise ModelError(f"draft tokenizer {d_name} differs from target tokenizer {t_name}: a draft must share the "
                         "target's vocabulary")
