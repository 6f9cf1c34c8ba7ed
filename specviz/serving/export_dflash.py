"""A DFlash drafter in the layout vLLM 0.32 serves (`speculative_config={"method": "dflash"}`;
specviz/serving/engine_export.py has the overview).

vLLM builds any `"architectures": ["DFlashDraftModel"]` folder as DFlashQwen3ForCausalLM
(vllm/model_executor/models/registry.py; the model in models/qwen3_dflash.py, the proposer in
v1/spec_decode/dflash.py). "Qwen3" names only the drafter's own layers (Llama layers with per-head q_norm and
k_norm, which specviz's DFlash has): the target may be any model that hands vLLM its hidden states (SupportsEagle3:
vLLM's Llama does, as for EAGLE-3), so a Llama target such as SmolLM2 is served. What the folder holds:

- config.json: `model_type` qwen3 and the layers' widths; `dflash_config.target_layer_ids` = specviz's
  feature_layers - 1 (vLLM adds the 1 back: gpu_model_runner / eagle3_utils "convert DFlash's aux layer id
  semantics"); `dflash_config.mask_token_id`; `block_size`; all layers full and non-causal (specviz's block attends
  both ways); `draft_vocab_size` and `target_hidden_size`.
- model.safetensors: specviz's names as they are (fc, hidden_norm, layers.{i}.{input_layernorm,
  self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,up,down}_proj}, norm: z-lab's
  DFlashDraftModel's, which
  vLLM's loader prefixes with `model.` and stacks into qkv_proj / gate_up_proj), `lm_head` = the target's embedding
  rows at `vocab_ids`, and `d2t` = vocab_ids - arange (draft id -> target id offset; only with a cut vocabulary,
  which vLLM's compute_logits scatters into the full one, -inf elsewhere). No embed_tokens: vLLM shares the target's.

vLLM drafts num_speculative_tokens + 1 query slots (the verified token and the masks); specviz always runs the whole
block, so serving takes num_speculative_tokens = block_size - 1 (`serving_tokens`), the block it was trained on.

Checked: the folder is read the way vLLM reads it (config fields, every weight name its loader takes, none it would
refuse) and run by `vllm_logits`, a plain-torch transcription of DFlashQwen3Model's forward and compute_logits over
those tensors; its logits must equal specviz's own DFlash drafter's on random target states and a block.
"""
from __future__ import annotations

import json
from pathlib import Path

from specviz.serving.export_common import (
    TOLERANCE,
    DrafterExport,
    ExportError,
    drafter_arg,
    state_rows,
    target_tensors,
    vllm_command,
    vocab_ids_of,
)

ARCHITECTURE = "DFlashDraftModel"  # vLLM's registry: ("qwen3_dflash", "DFlashQwen3ForCausalLM")
LAYER_WEIGHTS = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "self_attn.q_norm", "self_attn.k_norm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                 "mlp.down_proj")


def serving_tokens(config: dict) -> int:
    """vLLM's num_speculative_tokens for an exported DFlash folder's config: its whole block after the first slot."""
    return int(config["block_size"]) - 1


def refuses(cfg) -> str | None:
    if not cfg.feature_layers or min(cfg.feature_layers) < 1:
        return "a DFlash reading the target's embeddings row (feature layer 0: vLLM reads layer outputs only)"
    if cfg.block_size < 2:
        return f"a block_size={cfg.block_size} DFlash (vLLM drafts a block of 2 or more)"
    return None


def dflash_config(cfg, tc: dict, n_draft: int) -> dict:
    """config.json for vLLM's DFlashDraftModel."""
    hd = cfg.hidden_size // cfg.num_attention_heads
    n = cfg.num_hidden_layers
    return {
        "architectures": [ARCHITECTURE], "model_type": "qwen3", "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": n,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps, "attention_bias": False,
        "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "max_position_embeddings": tc.get("max_position_embeddings", 8192), "vocab_size": cfg.vocab_size,
        "draft_vocab_size": n_draft, "target_hidden_size": cfg.hidden_size, "tie_word_embeddings": False,
        "use_sliding_window": False, "layer_types": ["full_attention"] * n, "block_size": cfg.block_size,
        "num_target_layers": tc.get("num_hidden_layers"),
        "dflash_config": {"mask_token_id": cfg.mask_token_id,
                          "target_layer_ids": [i - 1 for i in cfg.feature_layers], "causal": False},
        "torch_dtype": "float32", "dtype": "float32",
        "bos_token_id": tc.get("bos_token_id"), "eos_token_id": tc.get("eos_token_id"),
    }


def expected_names(config: dict) -> set[str]:
    """The tensor names vLLM 0.32's DFlashQwen3ForCausalLM.load_weights takes from a folder with this config (before
    it prefixes `model.` and stacks q/k/v and gate/up): d2t only with a cut vocabulary."""
    names = {"fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight"}
    names |= {f"layers.{i}.{w}.weight" for i in range(config["num_hidden_layers"]) for w in LAYER_WEIGHTS}
    if config["draft_vocab_size"] != config["vocab_size"]:
        names.add("d2t")
    return names


def read_as_vllm(folder: Path, target_layers: int | None = None) -> tuple[dict, dict]:
    """(the config, the tensors) as vLLM reads them; ExportError (one line) for anything it would refuse or misread:
    a weight name it does not take or lacks, an fc width other than target_hidden_size x len(target_layer_ids), a
    target layer the target does not have, a mask token outside the vocabulary, a causal layer."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    if config.get("architectures") != [ARCHITECTURE]:
        raise ExportError(f"{folder}: architectures={config.get('architectures')} is not vLLM's [{ARCHITECTURE!r}]")
    expect = expected_names(config)
    missing, extra = sorted(expect - set(tensors)), sorted(set(tensors) - expect)
    if missing or extra:
        raise ExportError(f"{folder}: vLLM's DFlash loader would miss {missing or 'nothing'} and reject "
                          f"{extra or 'nothing'} (it takes {len(expect)} tensors)")
    dc = config.get("dflash_config") or {}
    layers = dc.get("target_layer_ids") or []
    want = config["target_hidden_size"] * len(layers)
    if tuple(tensors["fc.weight"].shape) != (config["hidden_size"], want):
        raise ExportError(f"{folder}: fc.weight is {tuple(tensors['fc.weight'].shape)}, vLLM builds "
                          f"({config['hidden_size']}, {want}) from {len(layers)} target_layer_ids")
    if target_layers is not None and (not layers or min(layers) < 0 or max(layers) >= target_layers - 1):
        raise ExportError(f"{folder}: target_layer_ids={layers}: the target's {target_layers} layers give ids 0.."
                          f"{target_layers - 2} (a layer's output, before the last)")
    if not 0 <= dc.get("mask_token_id", -1) < config["vocab_size"]:
        raise ExportError(f"{folder}: mask_token_id={dc.get('mask_token_id')!r} is not a token id below "
                          f"{config['vocab_size']}")
    if dc.get("causal") is not False or any(t != "full_attention" for t in config.get("layer_types") or []):
        raise ExportError(f"{folder}: vLLM would run causal or sliding layers; specviz's block attends both ways")
    if "block_size" not in config or serving_tokens(config) < 1:
        raise ExportError(f"{folder}: block_size={config.get('block_size')!r}: vLLM needs a block of 2 or more")
    return config, tensors


def vllm_logits(config: dict, tensors: dict, embed, feats, block_ids):
    """DFlashQwen3Model as vLLM 0.32 runs it, in plain torch over the exported tensors: the context's keys and
    values from fc(feats) -> hidden_norm -> each layer's k/v projections, k_norm, RoPE (neox) at 0..C-1
    (precompute_and_store_context_kv), then the block's embeddings at C..C+B-1 through the layers, attending to the
    context and the whole block (non-causal), the final norm, lm_head, and d2t's scatter into the full vocabulary
    (-inf elsewhere). feats (C, target_hidden_size * L), block_ids (B,) -> logits (B, vocab_size)."""
    import torch
    import torch.nn.functional as F

    d, h, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    hd, eps = config.get("head_dim") or d // h, config["rms_norm_eps"]
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x, pos):  # x (T, heads, hd)
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        ang = pos.float()[:, None] * inv[None]
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def w(name):
        return tensors[name].float()

    c, b = feats.shape[0], block_ids.shape[0]
    ctx_pos, pos = torch.arange(c), torch.arange(c, c + b)
    ctx = rms(feats.float() @ w("fc.weight").T, w("hidden_norm.weight"))
    x = embed[block_ids].float()
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        y = rms(x, w(p + "input_layernorm.weight"))
        q = rope(rms((y @ w(p + "self_attn.q_proj.weight").T).view(b, h, hd), w(p + "self_attn.q_norm.weight")), pos)
        keys = [rope(rms((z @ w(p + "self_attn.k_proj.weight").T).view(-1, kv, hd), w(p + "self_attn.k_norm.weight")),
                     zp) for z, zp in ((ctx, ctx_pos), (y, pos))]
        values = [(z @ w(p + "self_attn.v_proj.weight").T).view(-1, kv, hd) for z in (ctx, y)]
        k, v = torch.cat(keys).repeat_interleave(h // kv, 1), torch.cat(values).repeat_interleave(h // kv, 1)
        a = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        x = x + a.transpose(0, 1).reshape(b, h * hd) @ w(p + "self_attn.o_proj.weight").T
        y = rms(x, w(p + "post_attention_layernorm.weight"))
        x = x + (F.silu(y @ w(p + "mlp.gate_proj.weight").T) * (y @ w(p + "mlp.up_proj.weight").T)) \
            @ w(p + "mlp.down_proj.weight").T
    draft = rms(x, w("norm.weight")) @ w("lm_head.weight").T  # (B, draft_vocab_size)
    if "d2t" not in tensors:
        return draft
    full = draft.new_full((b, config["vocab_size"]), float("-inf"))
    full[:, torch.arange(config["draft_vocab_size"]) + tensors["d2t"].long()] = draft
    return full


def write_dflash(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    if max(cfg.feature_layers) >= tc["num_hidden_layers"]:
        raise ExportError(f"feature_layers={list(cfg.feature_layers)}: the target's {tc['num_hidden_layers']} layers "
                          f"give vLLM hidden states 1..{tc['num_hidden_layers'] - 1} (its last is normed in specviz)")
    embed = target_tensors(target_dir)["model.embed_tokens.weight"].float()
    vocab_ids = vocab_ids_of(cfg, state)
    n = int(vocab_ids.numel())
    tensors = {k: v.to(torch.float32).contiguous() for k, v in state.items() if k != "vocab_ids"}
    tensors["lm_head.weight"] = embed[vocab_ids].contiguous()
    if n != cfg.vocab_size:
        tensors["d2t"] = (vocab_ids - torch.arange(n)).contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(dflash_config(cfg, tc, n), indent=1) + "\n")
    return check_dflash(cfg, state, embed, tc, out)


def check_dflash(cfg, state: dict, embed, tc: dict, out: Path, context: int = 24) -> dict:
    """The folder read as vLLM reads it and run by vllm_logits, against specviz's own DFlash module (fp32 both) on
    random target states for `context` positions and a block of a random token and masks: the largest logit
    difference over the draft vocabulary, and how many block slots keep their greedy draft."""
    import torch

    from specviz.drafters import trained
    from specviz.drafters.modules import load_into

    config, tensors = read_as_vllm(out, tc.get("num_hidden_layers"))
    mine = trained.build_module(cfg).float()
    load_into(mine, {k: v for k, v in state.items() if k != "vocab_ids"}, "drafter")
    vocab_ids = vocab_ids_of(cfg, state)
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(context, len(cfg.feature_layers) * cfg.hidden_size, generator=g)
    first = int(torch.randint(0, cfg.vocab_size, (1,), generator=g))
    ids, theirs = (torch.tensor([first] + [mask] * (cfg.block_size - 1))  # the block: the token, then masks
                   for mask in (cfg.mask_token_id, config["dflash_config"]["mask_token_id"]))
    with torch.no_grad():
        kv = mine.context_kv(feats[None], torch.arange(context))
        h = mine(embed[ids][None], torch.arange(context, context + cfg.block_size), kv)[0]
        la = h @ embed[vocab_ids].T                                  # specviz: slots x draft vocabulary
        lb = vllm_logits(config, tensors, embed, feats, theirs)[:, vocab_ids]
    rows = slice(1, None)  # slot 0 holds the verified token: vLLM samples slots 1.. only
    diff = float((la[rows] - lb[rows]).abs().max())
    same = int((la[rows].argmax(-1) == lb[rows].argmax(-1)).sum())
    slots = cfg.block_size - 1
    if not diff <= TOLERANCE or same != slots:
        raise ExportError(f"{out}: the exported DFlash drafter's logits (as vLLM computes them) differ from the "
                          f"original's by {diff:.2e} (greedy draft equal on {same}/{slots} block slots)")
    return {"rows": slots, "max_abs_logit_diff": diff, "argmax_equal": same, "context": context,
            "reader": "vLLM's DFlashQwen3 read and forward, transcribed (export_dflash.vllm_logits)",
            "num_speculative_tokens": serving_tokens(config)}


def readme(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    layers = [i - 1 for i in cfg.feature_layers]
    arg = drafter_arg(folder, cfg)
    return f"""# DFlash drafter for {cfg.target}, exported by specviz

From {folder} (`python -m specviz export {arg}`), in the layout vLLM serves as DFlash
(`"architectures": ["{ARCHITECTURE}"]`, built as DFlashQwen3ForCausalLM): {cfg.num_hidden_layers} decoder layers
drafting blocks of {cfg.block_size} (the verified token, then mask token {cfg.mask_token_id}) in one forward over the
target's hidden states at target_layer_ids {layers} (specviz's feature_layers {list(cfg.feature_layers)} - 1);
`lm_head` is the target's embedding rows at the drafter's {len(state_rows(cfg))} vocabulary ids, `d2t` maps them back.
The target is {target_dir} (`python -m specviz export target`), a Llama: vLLM's DFlash needs only its hidden states.

Checked: read as vLLM reads it and run through a transcription of vLLM's DFlash forward, its draft logits equal
the original drafter's (largest difference {check['max_abs_logit_diff']:.1e} over the {check['rows']} drafted slots
of a block after {check['context']} context positions, greedy draft equal on {check['argmax_equal']}).

Serve it (vLLM, built by `make vllm`; `python -m specviz serve --engine vllm --drafter {arg}` does this for you):
num_speculative_tokens is the block after its first slot, {check['num_speculative_tokens']}, so vLLM runs the block
the drafter was trained on, as specviz does.

```bash
{vllm_command(target_dir, {"method": "dflash", "model": str(out),
                           "num_speculative_tokens": check['num_speculative_tokens']})}
```
"""


EXPORT = DrafterExport("DFlash", "DFlash", "dflash", write_dflash, readme, refuses,
                       formats={"gguf": "specviz.serving.gguf_spec:DFLASH"})
