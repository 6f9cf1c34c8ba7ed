"""An EAGLE-3 drafter in vLLM's `speculators` format (`export eagle --format speculators`): the weights of the EAGLE-3
layout (export_eagle.py) and a config.json that vLLM 0.32 reads as a whole serving plan, so `vllm serve DRAFTER`
serves the verifier it names with this drafter (vllm/transformers_utils/config.py `maybe_override_with_speculators`,
transformers_utils/configs/speculators/):

- `speculators_model_type: "eagle3"` and `speculators_config`: `proposal_methods[0].speculative_tokens` (γ) and
  `verifier.name_or_path` (the exported target folder, an absolute path: vLLM serves it, with its tokenizer);
- `transformer_layer_config`: the one-layer Llama (vLLM builds the draft's config from it);
- beside it the EAGLE-3 fields vLLM copies: `draft_vocab_size`, `target_hidden_size`,
  `eagle_aux_hidden_state_layer_ids`, and the norm switches. vLLM's default for `norm_before_residual` is true in
  this format (false in the older layout), so it is written false: specviz's midlayer keeps the un-normed input as
  its residual.

Checked as the older layout is: the config is turned into what vLLM builds from it (`vllm_view`), its switches must
be specviz's, and that view with the weights is loaded back through specviz's EAGLE-3 reader and its logits compared.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from specviz.serving.export_common import DrafterExport, ExportError, drafter_arg, state_rows
from specviz.serving.export_eagle import check_eagle3, eagle3_tensors, llama_fields, save_tensors

SPECIALISED = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False}
# what specviz's EAGLE-3 midlayer does, under the names vLLM's speculators reader takes (and its defaults there)
VLLM_DEFAULTS = {"norm_before_residual": True, "norm_before_fc": False, "fc_norm": False, "norm_output": False}


def speculators_config(cfg, tc: dict, target_dir: Path, n_draft: int, gamma: int) -> dict:
    """The config.json of the speculators format for an EAGLE-3 drafter of `target_dir`."""
    layers = list(cfg.feature_layers)
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": gamma}],
            "verifier": {"name_or_path": str(Path(target_dir).resolve()), "architectures": tc.get("architectures")
                         or ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **llama_fields(cfg, tc),
                                     "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers,
                                                      "use_aux_hidden_state": True}},
        "draft_vocab_size": n_draft, "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": layers, **SPECIALISED, "torch_dtype": "float32",
    }


def vllm_view(config: dict) -> tuple[dict, dict]:
    """(the draft's config, the speculative settings) vLLM 0.32 builds from a speculators config.json
    (SpeculatorsConfig.extract_transformers_pre_trained_config, update_eagle3, build_vllm_speculative_config);
    ExportError where vLLM would refuse it."""
    try:
        spec = config["speculators_config"]
        tokens = spec["proposal_methods"][0]["speculative_tokens"]
        verifier = spec["verifier"]["name_or_path"]
        kind = config["speculators_model_type"]
        layer = dict(config["transformer_layer_config"])
    except (KeyError, IndexError, TypeError) as exc:
        raise ExportError(f"speculators config.json has no {exc}: vLLM refuses it") from None
    if kind != "eagle3" or layer.get("model_type", "llama") != "llama":
        raise ExportError(f"speculators config.json is {kind!r} over {layer.get('model_type')!r}: export writes "
                          "eagle3 over llama")
    layer["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        layer["target_hidden_size"] = config["target_hidden_size"]
    layer.update({k: config.get(k, default) for k, default in VLLM_DEFAULTS.items()})
    layer["architectures"] = ["Eagle3LlamaForCausalLM"]
    if config.get("eagle_aux_hidden_state_layer_ids"):
        layer["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    return layer, {"method": kind, "num_speculative_tokens": tokens, "verifier": verifier}


def write_speculators(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    from specviz.serving.engines import GAMMA

    tensors, embed, n = eagle3_tensors(cfg, state, target_dir)
    save_tensors(tensors, out)
    config = speculators_config(cfg, tc, target_dir, n, GAMMA)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return check_speculators(cfg, state, embed, tc, out)


def check_speculators(cfg, state: dict, embed, tc: dict, out: Path) -> dict:
    """What vLLM builds from the written config: its norm switches are specviz's, its verifier is a target folder, and
    (written in the older layout beside the weights) it loads back through specviz's reader with the same logits."""
    layer, speculative = vllm_view(json.loads((out / "config.json").read_text()))
    wrong = {k: layer[k] for k, v in SPECIALISED.items() if layer[k] != v}
    if wrong:
        raise ExportError(f"{out}: vLLM would build the drafter with {wrong}: specviz's EAGLE-3 needs {SPECIALISED}")
    if not (Path(speculative["verifier"]) / "config.json").is_file():
        raise ExportError(f"{out}: the verifier {speculative['verifier']!r} is not a model folder")
    with tempfile.TemporaryDirectory(prefix="speculators-view-") as tmp:
        view = Path(tmp)
        layers = layer["eagle_aux_hidden_state_layer_ids"]
        flat = {**layer, "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers}}
        (view / "config.json").write_text(json.dumps(flat))
        (view / "model.safetensors").symlink_to((out / "model.safetensors").resolve())
        check = check_eagle3(cfg, state, embed, tc, out, read=view)
    return {**check, "reader": "vLLM's speculators view, then specviz _eagle3_layout",
            "num_speculative_tokens": speculative["num_speculative_tokens"], "verifier": speculative["verifier"]}


def readme(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    arg = drafter_arg(folder, cfg)
    return f"""# EAGLE-3 drafter for {cfg.target} in the speculators format, exported by specviz

From {folder} (`python -m specviz export {arg} --format speculators`): the EAGLE-3 weights (`fc` over the target's
hidden states after layers {list(cfg.feature_layers)}, `midlayer.*`, `norm`, `lm_head` over
{len(state_rows(cfg))} draft ids, `d2t`, `t2d`) and a config.json in vLLM's `speculators` format: it names the
verifier, {check['verifier']} (`python -m specviz export target`), and γ = {check['num_speculative_tokens']}.

Checked: the config as vLLM reads it keeps specviz's norm order, and loaded back through specviz's EAGLE-3 reader
its draft logits equal the original drafter's (largest difference {check['max_abs_logit_diff']:.1e} over
{check['rows']} rows, greedy draft equal on {check['argmax_equal']}).

Serve it (vLLM, built by `make vllm`; `python -m specviz serve --engine vllm --drafter {arg} --format speculators`
does this for you): the drafter folder alone, vLLM finds the target in its config.

```bash
VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model {out} \\
    --host 127.0.0.1 --port 8000 --dtype float32 -O0 --max-model-len 2048
```
"""


EXPORT = DrafterExport("EAGLE-3 (speculators)", "EAGLE-3", "eagle3-speculators", write_speculators, readme,
                       lambda cfg: None if cfg.feature_layers else "an EAGLE-1")
