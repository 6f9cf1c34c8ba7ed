"""Medusa heads in the layout vLLM's Medusa loads, checked by reading them back as vLLM does
(specviz/serving/engine_export.py has the overview)."""
from __future__ import annotations

import json
from pathlib import Path

from specviz.serving.export_common import (
    TOLERANCE,
    DrafterExport,
    ExportError,
    draft_vocab_head,
    drafter_arg,
    state_rows,
    target_tensors,
    vllm_command,
    vocab_ids_of,
)


def write_medusa(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    """vLLM's Medusa layout (model_executor/models/medusa.py): `blocks.K.layers.0` the head's residual block,
    `lm_heads.0` one LM head shared by every head (`original_lm_head`): the target's rows at the drafter's vocabulary
    ids, zero elsewhere, as the draft model's export (vLLM 0.32's `token_map` cut fails to load: "Following weights
    were not initialized from checkpoint: {'token_map'}"), so its greedy drafts are specviz's unless every
    draft-vocabulary logit is negative."""
    import torch
    from safetensors.torch import save_file

    embed = target_tensors(target_dir)["model.embed_tokens.weight"]
    vocab_ids = vocab_ids_of(cfg, state)
    tensors = {f"blocks.{k}.layers.0.{p}": state[f"heads.{k}.0.linear.{p}"].to(torch.float32).contiguous()
               for k in range(cfg.medusa_heads) for p in ("weight", "bias")}
    tensors["lm_heads.0.weight"] = draft_vocab_head(embed, vocab_ids)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": cfg.hidden_size,
              "vocab_size": cfg.vocab_size, "num_heads": cfg.medusa_heads, "num_hidden_layers": 1,
              "original_lm_head": True, "medusa_fc_bias": True,
              "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return check_medusa(cfg, state, embed, vocab_ids, out)


def check_medusa(cfg, state: dict, embed, vocab_ids, out: Path, rows: int = 64) -> dict:
    """Read the exported files back as vLLM's Medusa reads them (x + silu(W x + b) per head, then lm_heads.0) and
    compare each head's logits over the draft vocabulary, and its greedy draft over the whole vocabulary, with
    specviz's Medusa module's on random final-norm features."""
    import torch
    from safetensors.torch import load_file

    from specviz.drafters.modules import Medusa, load_into

    mine = Medusa(cfg).float()
    load_into(mine, {k: v for k, v in state.items() if k != "vocab_ids"}, "drafter")
    theirs = load_file(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    head = theirs["lm_heads.0.weight"]
    feats = torch.randn(rows, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    diff, same = 0.0, 0
    with torch.no_grad():
        ours = mine(feats) @ embed[vocab_ids].T  # (K, rows, N)
        for k in range(config["num_heads"]):
            w, b = theirs[f"blocks.{k}.layers.0.weight"], theirs[f"blocks.{k}.layers.0.bias"]
            logits = (feats + torch.nn.functional.silu(feats @ w.T + b)) @ head.T
            diff = max(diff, float((ours[k] - logits[:, vocab_ids]).abs().max()))
            same += int((vocab_ids[ours[k].argmax(-1)] == logits.argmax(-1)).sum())
    n = rows * config["num_heads"]
    if diff > TOLERANCE or same != n:
        raise ExportError(f"{out}: the exported Medusa heads' logits differ from the original's by {diff:.2e} "
                          f"(greedy draft equal on {same}/{n} rows)")
    return {"rows": n, "max_abs_logit_diff": diff, "argmax_equal": same, "reader": "vLLM's Medusa layout, by hand"}


def readme(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    arg = drafter_arg(folder, cfg)
    return f"""# Medusa heads for {cfg.target}, exported by specviz

From {folder} (`python -m specviz export {arg}`), in the layout vLLM's Medusa loads: {cfg.medusa_heads} heads, each
one residual block (`blocks.K.layers.0`) over the target's final-norm hidden state, sharing one LM head
(`lm_heads.0`, `original_lm_head`): the target's embedding rows at the drafter's {len(state_rows(cfg))} vocabulary
ids and zero elsewhere (vLLM 0.32 fails to load a `token_map` cut), so greedy drafts equal specviz's unless every
draft-vocabulary logit is negative. vLLM drafts a chain: head K's argmax for position K.

Checked: read back as vLLM's Medusa reads it, each head's draft logits equal specviz's (largest difference
{check['max_abs_logit_diff']:.1e} over {check['rows']} head-rows, greedy draft equal on {check['argmax_equal']}).

Serve it (vLLM, built by `make vllm`; `python -m specviz serve --engine vllm --drafter {arg}` does this for you):

```bash
{vllm_command(target_dir, {"method": "medusa", "model": str(out), "num_speculative_tokens": 3})}
```
"""


EXPORT = DrafterExport("Medusa", "Medusa heads over the target's LM head", "medusa", write_medusa, readme,
                       lambda cfg: "a Medusa with its own LM heads" if cfg.own_lm_heads else None)
