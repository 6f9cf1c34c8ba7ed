"""The distilled draft model as a Hugging Face Llama folder and a GGUF for llama.cpp, checked through
transformers (specviz/serving/engine_export.py has the overview)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from specviz.serving.export_common import (
    TARGET_GGUF,
    DrafterExport,
    ExportError,
    draft_vocab_head,
    drafter_arg,
    state_rows,
    target_tensors,
    vllm_command,
    vocab_ids_of,
)
from specviz.serving.gguf_export import write_gguf


def write_draft(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    embed = target_tensors(target_dir)["model.embed_tokens.weight"]
    vocab_ids = vocab_ids_of(cfg, state)
    head = draft_vocab_head(embed, vocab_ids)
    tensors = {"model." + k: v.to(torch.float32).contiguous() for k, v in state.items()
               if k.startswith(("layers.", "norm."))}
    tensors.update({"model.embed_tokens.weight": embed.contiguous(), "lm_head.weight": head})
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = {k: v for k, v in tc.items()}
    config.update(num_hidden_layers=len(cfg.draft_layers), tie_word_embeddings=False,
                  architectures=["LlamaForCausalLM"])
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "generation_config.json"):
        if (target_dir / name).is_file():
            shutil.copy(target_dir / name, out / name)
    check = check_draft(cfg, state, embed, vocab_ids, out)
    check["gguf"] = write_gguf(tensors, out / "draft.gguf", out, f"specviz draft model for {cfg.target}",
                               cfg.num_attention_heads, cfg.num_key_value_heads)
    return check


def check_draft(cfg, state: dict, embed, vocab_ids, out: Path, rows: int = 32) -> dict:
    """Load the exported draft model with transformers and compare its logits over the draft vocabulary with
    specviz's DraftLM (fp32 both)."""
    import torch
    from transformers import LlamaForCausalLM

    from specviz.drafters.modules import DraftLM, load_into

    mine = DraftLM(cfg).float()
    load_into(mine, {k: v for k, v in state.items() if k != "vocab_ids"}, "drafter")
    theirs = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, rows), generator=g)
    with torch.no_grad():
        h, _ = mine(embed[ids], torch.arange(rows))
        la = h[0] @ embed[vocab_ids].T
        lb = theirs(input_ids=ids).logits[0][:, vocab_ids]
    diff = float((la - lb).abs().max())
    same = int((la.argmax(-1) == lb.argmax(-1)).sum())
    if diff > 1e-3 or same != rows:
        raise ExportError(f"{out}: the exported draft model's logits differ from the original's by {diff:.2e} "
                          f"(greedy draft equal on {same}/{rows} rows)")
    return {"rows": rows, "max_abs_logit_diff": diff, "argmax_equal": same, "reader": "transformers LlamaForCausalLM"}


def readme(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    arg = drafter_arg(folder, cfg)
    return f"""# Draft model for {cfg.target}, exported by specviz

From {folder} (`python -m specviz export {arg}`): a Llama of {len(cfg.draft_layers)} layers with the target's
embeddings and a full-vocabulary head whose rows are the target's at the drafter's {len(state_rows(cfg))} vocabulary
ids and zero elsewhere (so greedy drafts equal specviz's unless every draft-vocabulary logit is negative), the
target's tokenizer. `draft.gguf` is the same model for llama.cpp (F32).

Checked: loaded back with transformers, its logits over the draft vocabulary equal specviz's draft model's
(largest difference {check['max_abs_logit_diff']:.1e} over {check['rows']} rows, greedy equal on
{check['argmax_equal']}).

Serve it:

```bash
# llama.cpp (`make server`; `python -m specviz serve --engine llama.cpp --drafter {arg}`)
.venv/bin/llama-server -m {target_dir}/{TARGET_GGUF} --model-draft {out}/draft.gguf --spec-type draft-simple \\
    --spec-draft-n-max 3 --metrics \\
    --host 127.0.0.1 --port 8080
# vLLM (`make vllm`; `python -m specviz serve --engine vllm --drafter {arg}`)
{vllm_command(target_dir, {"method": "draft_model", "model": str(out), "num_speculative_tokens": 3})}
```
"""


EXPORT = DrafterExport("draft model", "the draft model", "draft", write_draft, readme)
