"""`python -m specviz export`: the target and a drafter trained here, in the layouts serving engines load.

- **target** → a Hugging Face Llama folder (`model.safetensors` in fp32, `config.json` with
  `"architectures": ["LlamaForCausalLM"]`, the tokenizer and its chat template). transformers' `save_pretrained`
  refuses a model loaded from GGUF, so the tensors are written with safetensors and the config by hand. The
  embedded GGUF is Q4_1: its dequantised weights are exact in fp32 (bf16 would round them).
- **eagle** (EAGLE-3) → vLLM's and SGLang's EAGLE-3 layout: `fc`, `midlayer.*` and `norm` as they are (the names,
  widths, norm order and layers already match), `lm_head` = the target's embedding rows at `vocab_ids` (specviz's
  drafters share the target's tied head), `d2t` = vocab_ids − arange (draft id → target id offset), `t2d` (the
  target ids in the draft vocabulary), and a config with `"architectures": ["LlamaForCausalLMEagle3"]`,
  `draft_vocab_size` and `eagle_aux_hidden_state_layer_ids`. Checked by loading it back through specviz's own
  EAGLE-3 reader (drafters/trained.py `_eagle3_layout`) and comparing logits with the original drafter's.
- **draft** (the distilled draft model) → a Hugging Face Llama folder of its own layers, the target's embeddings,
  and a full-vocabulary head whose rows are the target's at `vocab_ids` and zero elsewhere (vLLM's draft-model
  method), and the same as a GGUF for llama.cpp's `--model-draft` (the `gguf` package). Greedy drafts equal
  specviz's unless every draft-vocabulary logit is negative (a zero row's logit is 0).

Every export writes `export.json` (what it came from, with the source's SHA-256: a later export of the same
source reuses it) and a README.md with the serving command. Exports live under out/export/ by default.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

ROOT = Path("out/export")
FORMAT = 2                 # bump when an export's layout changes: older exports are redone
SHIPPED = {"eagle": "smollm2-135m-eagle", "medusa": "smollm2-135m-medusa", "draft": "smollm2-135m-draft"}  # under
# specviz.paths.DRAFTERS
KINDS = ("eagle", "medusa", "draft")  # what `export` converts (LayerSkip: no engine serves it)
TARGET_GGUF = "target-f32.gguf"  # the target's export for llama.cpp
TOLERANCE = 1e-4           # the largest logit difference a round trip may show (fp32 in both)


class ExportError(ValueError):
    """An export that cannot be made; str(exc) is one line naming the value and what is accepted."""


def _sha(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _cached(out: Path, manifest: dict) -> bool:
    """Is `out` already the export `manifest` describes (same kind, source, source hash and format)?"""
    path = out / "export.json"
    if not path.is_file():
        return False
    try:
        old = json.loads(path.read_text())
    except ValueError:
        return False
    keys = ("kind", "format", "source_sha256", "target_sha256")
    return all(old.get(k) == manifest.get(k) for k in keys)


def _finish(tmp: Path, out: Path, manifest: dict, readme: str) -> Path:
    (tmp / "export.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (tmp / "README.md").write_text(readme)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _fresh(out: Path) -> Path:
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


# -- the target ------------------------------------------------------------------------------------------------

def target_source(spec: str):
    """(Source, the weight files hashed) of a target spec; ExportError when it is not a local GGUF or folder."""
    from specviz.models.loader import ModelError, resolve

    try:
        source = resolve(spec)
    except ModelError as exc:
        raise ExportError(str(exc)) from None
    folder = Path(source.location)
    if source.gguf_file:
        return source, [folder / source.gguf_file]
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        raise ExportError(f"target {spec!r} is not on this machine (a Hub id): export needs the embedded "
                          "smollm2-135m, a .gguf file or a local folder")
    return source, files


def export_target(spec: str = "smollm2-135m", out: Optional[Path] = None, force: bool = False,
                  log: Callable[[str], None] = print) -> Path:
    """The target as a Hugging Face Llama folder (fp32 safetensors, config.json, tokenizer); reused when cached."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, files = target_source(spec)
    out = Path(out or ROOT / slug(spec))
    manifest = {"kind": "target", "format": FORMAT, "source": spec, "source_files": [str(f) for f in files],
                "source_sha256": _sha(files), "dtype": "float32"}
    if not force and _cached(out, manifest):
        log(f"reusing {out} (the export of {spec})")
        return out
    log(f"exporting the target {spec} to {out} (fp32 safetensors + config.json + tokenizer)")
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(source.location, dtype=torch.float32, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(source.location, **kwargs)
    if model.config.model_type != "llama":
        raise ExportError(f"target {spec!r} is a {model.config.model_type!r} model: export writes Llama targets only")
    tmp = _fresh(out)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    for key in ("_model_name_or_path", "_name_or_path", "quantization_config"):  # vLLM reads the GGUF's
        config.pop(key, None)  # quantization_config as a quantization method it does not have
    rope = config.get("rope_parameters") or {}
    config.update(architectures=["LlamaForCausalLM"], torch_dtype="float32", dtype="float32",
                  rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    manifest["gguf"] = write_gguf(state, tmp / TARGET_GGUF, tmp, f"{spec} (fp32, specviz export)",
                                  model.config.num_attention_heads, model.config.num_key_value_heads)
    readme = f"""# {spec}: the target, exported by specviz

`python -m specviz export target` wrote this folder from {files[0].name}: fp32 safetensors (the GGUF's dequantised
weights), config.json with `"architectures": ["LlamaForCausalLM"]`, the tokenizer and its chat template, and
`{TARGET_GGUF}`, the same fp32 weights for llama.cpp (`serve --engine llama.cpp` serves it, so both engines and
specviz's `probe --local` decode the same numbers; the embedded Q4_1 GGUF gives other greedy answers).

Serve it (vLLM, built by `make vllm`; `python -m specviz serve --engine vllm --drafter ngram` does this for you):

```bash
{vllm_command(out, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})}
```
"""
    _finish(tmp, out, manifest, readme)
    log(f"wrote {out}")
    return out


def vllm_command(target_dir: Path, speculative: dict) -> str:
    """The vLLM command line a README shows: the target folder served with `speculative` (its --speculative-config)."""
    return ("VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server "
            f"--model {target_dir} \\\n    --served-model-name {target_dir.name} --host 127.0.0.1 --port 8000 "
            "--dtype float32 -O0 "
            f"--max-model-len 2048 \\\n    --speculative-config '{json.dumps(speculative)}'")


def slug(spec: str) -> str:
    return Path(spec.rstrip("/")).name.removesuffix(".gguf") or "target"


# -- drafters ----------------------------------------------------------------------------------------------------

def read_drafter(folder: Path):
    """(DrafterConfig, state dict) of a drafter folder in specviz's layout; ExportError naming what is wrong."""
    from specviz.drafters.config import DrafterConfig
    from specviz.models.weights import load_state_dict

    folder = Path(folder)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise ExportError(f"drafter folder {str(folder)!r} has no config.json and model.safetensors: give a folder "
                          f"written by `python -m specviz train` (or one of {', '.join(SHIPPED.values())})")
    raw = json.loads(cfg_path.read_text())
    if "kind" not in raw:
        raise ExportError(f"drafter folder {str(folder)!r} is not in specviz's layout (its config.json has no "
                          "'kind'): export converts drafters trained here")
    known = set(DrafterConfig.__dataclass_fields__)
    return DrafterConfig(**{k: v for k, v in raw.items() if k in known}), load_state_dict(weights)


def shipped(kind: str) -> Path:
    from specviz.paths import DRAFTERS

    return DRAFTERS / SHIPPED[kind]


def default_out(folder: Path, kind: str, spec: str, root: Path = ROOT) -> Path:
    """Where a drafter's export goes: out/export/smollm2-135m-eagle3 for a shipped one, else named after its folder
    (train's out/train/NAME/drafter -> NAME)."""
    suffix = {"eagle": "eagle3", "medusa": "medusa", "draft": "draft"}[kind]
    folder = Path(folder)
    if folder.resolve() == shipped(kind).resolve():
        return root / f"{slug(spec)}-{suffix}"
    name = folder.parent.name if folder.name == "drafter" else folder.name
    return root / f"{name}-{suffix}"


def drafter_folder(value: str) -> Path:
    """A drafter argument: a shipped kind (eagle, medusa, draft) or a folder."""
    if value in SHIPPED:
        return shipped(value)
    path = Path(value)
    if path.is_dir():
        return path
    raise ExportError(f"drafter {value!r} is neither a shipped drafter ({', '.join(SHIPPED)}) nor a folder")


def _target_tensors(target_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(target_dir / "model.safetensors"))


def _target_config(target_dir: Path) -> dict:
    return json.loads((target_dir / "config.json").read_text())


def _check_pair(cfg, folder: Path, target_dir: Path, spec: str) -> dict:
    """The target's config; ExportError when the drafter was trained for another target."""
    tc = _target_config(target_dir)
    if cfg.target != slug(spec) or cfg.hidden_size != tc["hidden_size"] or cfg.vocab_size != tc["vocab_size"]:
        raise ExportError(f"drafter {str(folder)!r} was trained for {cfg.target} (hidden {cfg.hidden_size}, vocab "
                          f"{cfg.vocab_size}); the target {spec} has hidden {tc['hidden_size']}, vocab "
                          f"{tc['vocab_size']}: export a drafter trained for {spec}")
    return tc


def export_drafter(folder: Path, target_dir: Path, spec: str = "smollm2-135m", out: Optional[Path] = None,
                   force: bool = False, log: Callable[[str], None] = print) -> Path:
    """A drafter folder in the layout engines load: EAGLE-3 (eagle), vLLM's Medusa (medusa) or a Llama draft model +
    GGUF (draft)."""
    folder = Path(folder)
    cfg, state = read_drafter(folder)
    tc = _check_pair(cfg, folder, target_dir, spec)
    if (cfg.kind not in KINDS or (cfg.kind == "eagle" and not cfg.feature_layers)
            or (cfg.kind == "medusa" and cfg.own_lm_heads)):
        what = {"eagle": "EAGLE-1", "medusa": "Medusa with its own LM heads"}.get(cfg.kind, cfg.kind)
        raise ExportError(f"drafter {str(folder)!r} is a {what} drafter: export converts EAGLE-3 (eagle), Medusa "
                          "heads over the target's LM head (medusa) and the draft model (draft)")
    files = [folder / "model.safetensors", folder / "config.json"]
    out = Path(out or default_out(folder, cfg.kind, spec))
    manifest = {"kind": cfg.kind, "format": FORMAT, "source": str(folder), "source_sha256": _sha(files),
                "target": str(target_dir), "target_sha256": json.loads((target_dir / "export.json").read_text())
                .get("source_sha256")}
    if not force and _cached(out, manifest):
        log(f"reusing {out} (the export of {folder})")
        return out
    tmp = _fresh(out)
    if cfg.kind == "eagle":
        manifest["check"] = _write_eagle3(cfg, state, tc, target_dir, tmp)
        log(f"EAGLE-3 round trip through specviz's EAGLE-3 reader: largest logit difference "
            f"{manifest['check']['max_abs_logit_diff']:.2e}, greedy draft equal on "
            f"{manifest['check']['argmax_equal']}/{manifest['check']['rows']} rows")
        readme = _eagle_readme(folder, out, target_dir, cfg, manifest["check"])
    elif cfg.kind == "medusa":
        manifest["check"] = _write_medusa(cfg, state, target_dir, tmp)
        log(f"Medusa round trip through vLLM's layout: largest logit difference "
            f"{manifest['check']['max_abs_logit_diff']:.2e}, greedy draft equal on "
            f"{manifest['check']['argmax_equal']}/{manifest['check']['rows']} rows")
        readme = _medusa_readme(folder, out, target_dir, cfg, manifest["check"])
    else:
        manifest["check"] = _write_draft(cfg, state, tc, target_dir, tmp)
        log(f"draft model round trip through transformers: largest logit difference "
            f"{manifest['check']['max_abs_logit_diff']:.2e} over the draft vocabulary, greedy draft equal on "
            f"{manifest['check']['argmax_equal']}/{manifest['check']['rows']} rows")
        readme = _draft_readme(folder, out, target_dir, cfg, manifest["check"])
    manifest["drafter_config"] = {k: v for k, v in asdict(cfg).items() if k != "training"}
    _finish(tmp, out, manifest, readme)
    log(f"wrote {out}")
    return out


def _vocab_ids(cfg, state: dict):
    """The target ids of the drafter's draft vocabulary (all of the target's when it has none), int64."""
    import torch

    return state["vocab_ids"].long() if "vocab_ids" in state else torch.arange(cfg.vocab_size)


def _draft_vocab_head(embed, vocab_ids):
    """A full-vocabulary LM head for engines that cannot cut one: the target's rows (its tied embedding) at the draft
    vocabulary's ids, zero elsewhere, so a greedy draft is specviz's unless every draft-vocabulary logit is negative."""
    import torch

    head = torch.zeros_like(embed)
    head[vocab_ids] = embed[vocab_ids]
    return head


def _write_eagle3(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    embed = _target_tensors(target_dir)["model.embed_tokens.weight"]
    vocab_ids = _vocab_ids(cfg, state)
    n = int(vocab_ids.numel())
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[vocab_ids] = True
    tensors = {k: v.to(torch.float32).contiguous() for k, v in state.items()
               if k.startswith(("fc.", "midlayer.", "norm."))}
    tensors.update({"lm_head.weight": embed[vocab_ids].contiguous(), "d2t": vocab_ids - torch.arange(n),
                    "t2d": t2d})
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "num_hidden_layers": 1, "head_dim":
        cfg.hidden_size // cfg.num_attention_heads, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "max_position_embeddings": tc.get("max_position_embeddings", 8192), "vocab_size": cfg.vocab_size,
        "draft_vocab_size": n, "tie_word_embeddings": False, "torch_dtype": "float32", "dtype": "float32",
        "bos_token_id": tc.get("bos_token_id"), "eos_token_id": tc.get("eos_token_id"),
        "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.feature_layers),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.feature_layers), "use_aux_hidden_state": True,
                         "use_input_layernorm_in_first_layer": True},
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return check_eagle3(cfg, state, embed, tc, out)


def check_eagle3(cfg, state: dict, embed, tc: dict, out: Path, rows: int = 64) -> dict:
    """Load the exported folder back through specviz's EAGLE-3 reader and compare its draft logits with the
    original drafter's on random target features and embeddings (fp32 both): the largest difference and how many
    rows keep their greedy draft."""
    from types import SimpleNamespace

    import torch
    from transformers import LlamaConfig

    from specviz.drafters import trained
    from specviz.drafters.modules import load_into

    target = SimpleNamespace(model=SimpleNamespace(config=LlamaConfig(**{k: v for k, v in tc.items()
                                                                         if k not in ("architectures",)})),
                             name=cfg.target)
    cfg2, state2 = trained.read_layout(out, target)
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


def _write_medusa(cfg, state: dict, target_dir: Path, out: Path) -> dict:
    """vLLM's Medusa layout (model_executor/models/medusa.py): `blocks.K.layers.0` the head's residual block,
    `lm_heads.0` one LM head shared by every head (`original_lm_head`): the target's rows at the drafter's vocabulary
    ids, zero elsewhere, as the draft model's export (vLLM 0.32's `token_map` cut fails to load: "Following weights
    were not initialized from checkpoint: {'token_map'}"), so its greedy drafts are specviz's unless every
    draft-vocabulary logit is negative."""
    import torch
    from safetensors.torch import save_file

    embed = _target_tensors(target_dir)["model.embed_tokens.weight"]
    vocab_ids = _vocab_ids(cfg, state)
    tensors = {f"blocks.{k}.layers.0.{p}": state[f"heads.{k}.0.linear.{p}"].to(torch.float32).contiguous()
               for k in range(cfg.medusa_heads) for p in ("weight", "bias")}
    tensors["lm_heads.0.weight"] = _draft_vocab_head(embed, vocab_ids)
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


def _write_draft(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    embed = _target_tensors(target_dir)["model.embed_tokens.weight"]
    vocab_ids = _vocab_ids(cfg, state)
    head = _draft_vocab_head(embed, vocab_ids)
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


def _permute(w, n_head: int):
    """HF's q/k rows -> llama.cpp's rotary layout (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(tensors: dict, path: Path, hf_dir: Path, name: str, heads: int, kv_heads: int) -> dict:
    """A Llama folder's tensors as an F32 GGUF for llama.cpp (the target's `-m`, the draft model's --model-draft):
    the embedded target GGUF's tokenizer and metadata with these tensors and their layer count; checked by loading
    it with transformers' GGUF reader and comparing its logits with the Hugging Face folder's."""
    import gguf
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM

    from specviz.serving.server import embedded_gguf

    reader = gguf.GGUFReader(str(embedded_gguf()))
    writer = gguf.GGUFWriter(str(path), "llama")
    skip = {"general.architecture", "general.file_type", "general.quantization_version", "llama.block_count",
            "general.name"}
    for key, field in reader.fields.items():
        if key in skip or key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    writer.add_name(name)
    writer.add_block_count(len({k.split(".")[2] for k in tensors if k.startswith("model.layers.")}))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    t = {k: v.float().numpy() for k, v in tensors.items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, value in t.items():
        if name in names:
            writer.add_tensor(names[name], np.ascontiguousarray(value))
            continue
        i, rest = name.removeprefix("model.layers.").split(".", 1)
        part = rest.removesuffix(".weight")
        if part == "self_attn.q_proj":
            value = _permute(value, heads)
        elif part == "self_attn.k_proj":
            value = _permute(value, kv_heads)
        writer.add_tensor(f"blk.{i}.{parts[part]}.weight", np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ids = torch.randint(0, t["model.embed_tokens.weight"].shape[0], (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()(input_ids=ids).logits
        b = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()(
            input_ids=ids).logits
    diff = float((a - b).abs().max())
    if diff > 1e-3:
        raise ExportError(f"{path}: the GGUF's logits differ from the Hugging Face export's by {diff:.2e}")
    return {"file": path.name, "max_abs_logit_diff": diff, "reader": "transformers GGUF"}


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


def _eagle_readme(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    return f"""# EAGLE-3 drafter for {cfg.target}, exported by specviz

From {folder} (`python -m specviz export eagle`), in the EAGLE-3 layout vLLM and SGLang load: `fc` over the
target's hidden states after layers {list(cfg.feature_layers)}, `midlayer.*`, `norm`, `lm_head` (the target's
embedding rows at the drafter's {len(state_rows(cfg))} vocabulary ids), `d2t` (draft id → target id offset) and `t2d`.
The target is {target_dir} (`python -m specviz export target`).

Checked: loaded back through specviz's EAGLE-3 reader, its draft logits equal the original drafter's (largest
difference {check['max_abs_logit_diff']:.1e} over {check['rows']} rows, greedy draft equal on {check['argmax_equal']}).

Serve it (vLLM, built by `make vllm`; `python -m specviz serve --engine vllm --drafter eagle` does this for you):

```bash
{vllm_command(target_dir, {"method": "eagle3", "model": str(out), "num_speculative_tokens": 3})}
```
SGLang: `--speculative-algorithm EAGLE3 --speculative-draft-model-path {out}` (not tried here: it needs a GPU).
"""


def _medusa_readme(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    return f"""# Medusa heads for {cfg.target}, exported by specviz

From {folder} (`python -m specviz export medusa`), in the layout vLLM's Medusa loads: {cfg.medusa_heads} heads, each
one residual block (`blocks.K.layers.0`) over the target's final-norm hidden state, sharing one LM head
(`lm_heads.0`, `original_lm_head`): the target's embedding rows at the drafter's {len(state_rows(cfg))} vocabulary
ids and zero elsewhere (vLLM 0.32 fails to load a `token_map` cut), so greedy drafts equal specviz's unless every
draft-vocabulary logit is negative. vLLM drafts a chain: head K's argmax for position K.

Checked: read back as vLLM's Medusa reads it, each head's draft logits equal specviz's (largest difference
{check['max_abs_logit_diff']:.1e} over {check['rows']} head-rows, greedy draft equal on {check['argmax_equal']}).

Serve it (vLLM, built by `make vllm`; `python -m specviz serve --engine vllm --drafter medusa` does this for you):

```bash
{vllm_command(target_dir, {"method": "medusa", "model": str(out), "num_speculative_tokens": 3})}
```
"""


def state_rows(cfg) -> range:
    return range(cfg.draft_vocab or cfg.vocab_size)


def _draft_readme(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    return f"""# Draft model for {cfg.target}, exported by specviz

From {folder} (`python -m specviz export draft`): a Llama of {len(cfg.draft_layers)} layers with the target's
embeddings and a full-vocabulary head whose rows are the target's at the drafter's {len(state_rows(cfg))} vocabulary
ids and zero elsewhere (so greedy drafts equal specviz's unless every draft-vocabulary logit is negative), the
target's tokenizer. `draft.gguf` is the same model for llama.cpp (F32).

Checked: loaded back with transformers, its logits over the draft vocabulary equal specviz's draft model's
(largest difference {check['max_abs_logit_diff']:.1e} over {check['rows']} rows, greedy equal on
{check['argmax_equal']}).

Serve it:

```bash
# llama.cpp (`make server`; `python -m specviz serve --engine llama.cpp --drafter draft`)
.venv/bin/llama-server -m {target_dir}/{TARGET_GGUF} --model-draft {out}/draft.gguf --spec-type draft-simple \\
    --spec-draft-n-max 3 --metrics \\
    --host 127.0.0.1 --port 8080
# vLLM (`make vllm`; `python -m specviz serve --engine vllm --drafter draft`)
{vllm_command(target_dir, {"method": "draft_model", "model": str(out), "num_speculative_tokens": 3})}
```
"""
