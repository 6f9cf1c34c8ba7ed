"""An EAGLE-3 drafter in the layout vLLM and SGLang load, checked through specviz's own EAGLE-3 reader
(specviz/serving/engine_export.py has the overview)."""
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


def eagle3_tensors(cfg, state: dict, target_dir: Path):
    """(the EAGLE-3 tensors, the target's embedding, the draft vocabulary's size)."""
    import torch

    embed = target_tensors(target_dir)["model.embed_tokens.weight"]
    vocab_ids = vocab_ids_of(cfg, state)
    n = int(vocab_ids.numel())
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[vocab_ids] = True
    tensors = {k: v.to(torch.float32).contiguous() for k, v in state.items()
               if k.startswith(("fc.", "midlayer.", "norm."))}
    tensors.update({"lm_head.weight": embed[vocab_ids].contiguous(), "d2t": vocab_ids - torch.arange(n),
                    "t2d": t2d})
    return tensors, embed, n


def save_tensors(tensors: dict, out: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})


def llama_fields(cfg, tc: dict) -> dict:
    """The one-layer Llama the EAGLE-3 midlayer is, as both formats' configs give it."""
    return {"model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "num_hidden_layers": 1, "head_dim": cfg.hidden_size // cfg.num_attention_heads, "hidden_act": "silu",
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
            "max_position_embeddings": tc.get("max_position_embeddings", 8192), "vocab_size": cfg.vocab_size,
            "tie_word_embeddings": False, "torch_dtype": "float32", "dtype": "float32",
            "bos_token_id": tc.get("bos_token_id"), "eos_token_id": tc.get("eos_token_id")}


def write_eagle3(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    tensors, embed, n = eagle3_tensors(cfg, state, target_dir)
    save_tensors(tensors, out)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], **llama_fields(cfg, tc), "draft_vocab_size": n,
        "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.feature_layers),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.feature_layers), "use_aux_hidden_state": True,
                         "use_input_layernorm_in_first_layer": True},
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return check_eagle3(cfg, state, embed, tc, out)


def check_eagle3(cfg, state: dict, embed, tc: dict, out: Path, rows: int = 64, read: Path = None) -> dict:
    """Load the exported folder (`read`: a view of it in the EAGLE-3 layout, if given) back through specviz's EAGLE-3
    reader and compare its draft logits with the original drafter's on random target features and embeddings (fp32
    both): the largest difference and how many rows keep their greedy draft."""
    from types import SimpleNamespace

    import torch
    from transformers import LlamaConfig

    from specviz.drafters import trained
    from specviz.drafters.modules import load_into

    target = SimpleNamespace(model=SimpleNamespace(config=LlamaConfig(**{k: v for k, v in tc.items()
                                                                         if k not in ("architectures",)})),
                             name=cfg.target)
    cfg2, state2 = trained.read_layout(read or out, target)
    vocab_ids = state["vocab_ids"].long()
    if not torch.equal(state2.pop("vocab_ids").long(), vocab_ids):
        raise ExportError(f"{out}: d2t does not give back the drafter's vocab_ids")
    mine, theirs = trained.build_module(cfg).float(), trained.build_module(cfg2).float()
    load_into(mine, {k: v for k, v in state.items() if k != "vocab_ids"}, "drafter")
    load_into(theirs, state2, str(out))
    g = torch.Generator().manual_seed(0)
    d = cfg.hidden_size
    feats = torch.randn(1, rows, len(cfg.feature_layers) * d, generator=g)
    embeds = embed[torch.randint(0, cfg.vocab_size, (rows,), generator=g)][None]
    positions = torch.arange(rows)
    with torch.no_grad():
        a, _ = mine(mine.lift(feats), embeds, positions)
        b, _ = theirs(theirs.lift(feats), embeds, positions)
        la = mine.readout(a)[0] @ embed[vocab_ids].T      # (rows, N): the original, with the target's head rows
        lb = theirs.readout(b)[0] @ theirs.lm_head.weight.T  # the export, with its own lm_head
    diff = float((la - lb).abs().max())
    same = int((la.argmax(-1) == lb.argmax(-1)).sum())
    if diff > TOLERANCE or same != rows:
        raise ExportError(f"{out}: the exported EAGLE-3 drafter's logits differ from the original's by {diff:.2e} "
                          f"(greedy draft equal on {same}/{rows} rows)")
    return {"rows": rows, "max_abs_logit_diff": diff, "argmax_equal": same, "reader": "specviz _eagle3_layout"}


def readme(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    arg = drafter_arg(folder, cfg)
    return f"""# EAGLE-3 drafter for {cfg.target}, exported by specviz

From {folder} (`python -m specviz export {arg}`), in the EAGLE-3 layout vLLM and SGLang load: `fc` over the
target's hidden states after layers {list(cfg.feature_layers)}, `midlayer.*`, `norm`, `lm_head` (the target's
embedding rows at the drafter's {len(state_rows(cfg))} vocabulary ids), `d2t` (draft id → target id offset) and `t2d`.
The target is {target_dir} (`python -m specviz export target`).

Checked: loaded back through specviz's EAGLE-3 reader, its draft logits equal the original drafter's (largest
difference {check['max_abs_logit_diff']:.1e} over {check['rows']} rows, greedy draft equal on {check['argmax_equal']}).

Serve it (vLLM, built by `make vllm`; `python -m specviz serve --engine vllm --drafter {arg}` does this for you):

```bash
{vllm_command(target_dir, {"method": "eagle3", "model": str(out), "num_speculative_tokens": 3})}
```
SGLang: `--speculative-algorithm EAGLE3 --speculative-draft-model-path {out}` (not tried here: it needs a GPU).
"""


EXPORT = DrafterExport("EAGLE-3", "EAGLE-3", "eagle3", write_eagle3, readme,
                       lambda cfg: None if cfg.feature_layers else "an EAGLE-1",
                       formats={"speculators": "specviz.serving.export_speculators:EXPORT",
                                "gguf": "specviz.serving.gguf_spec:EAGLE3"})
