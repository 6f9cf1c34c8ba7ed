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
  `--format speculators`: the same weights with a config.json in vLLM's `speculators` format, naming the target
  folder as its verifier (export_speculators.py), so `vllm serve DRAFTER` serves the pair.
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

from specviz import methods
from specviz.serving.export_common import (
    NATIVE,
    TARGET_GGUF,
    DrafterExport,
    ExportError,
    check_format,
    vllm_command,
)
from specviz.serving.gguf_export import write_gguf

ROOT = Path("out/export")
FORMAT = 2                 # bump when an export's layout changes: older exports are redone
KINDS = methods.names(lambda s: bool(s.exporter))  # what `export` converts (the registry's exporters; LayerSkip has
# none: no engine serves it)
SHIPPED = {kind: f"smollm2-135m-{kind}" for kind in KINDS}  # the shipped drafters, under specviz.paths.DRAFTERS










def exporter(kind: str, fmt: str = NATIVE) -> Optional[DrafterExport]:
    """The export of `kind`'s drafters (methods.MethodSpec.exporter) in `fmt`, None when it has none; ExportError
    (one line) when `fmt` is unknown or not one this method's drafters are written in."""
    spec = methods.METHODS.get(kind)
    export = methods.load(spec.exporter) if spec is not None and spec.exporter else None
    if check_format(fmt) == NATIVE or export is None:
        return export
    if fmt not in export.formats:
        takes = [k for k in KINDS if fmt in methods.load(methods.METHODS[k].exporter).formats]
        raise ExportError(f"format={fmt!r} is written for {', '.join(takes)} drafters only, not {kind}: use "
                          f"--format {NATIVE}")
    return methods.load(export.formats[fmt])


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
    fmt = manifest.get("export_format", NATIVE)
    keys = ("kind", "format", "source_sha256", "target_sha256") + (() if fmt == NATIVE else ("target",))  # it
    return all(old.get(k) == manifest.get(k) for k in keys) and old.get("export_format", NATIVE) == fmt  # names it


def _finish(tmp: Path, out: Path, manifest: dict, readme: str) -> Path:
    (tmp / "export.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (tmp / "README.md").write_text(readme)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def check_out(out: Path, source: str) -> None:
    """A folder the export of `source` (a target spec or a drafter folder) may replace: new, empty, or an earlier
    export of the same source (its export.json names it); ExportError otherwise, before anything is exported
    (_finish removes the old folder). Another drafter's export, or the target's that a drafter's export reads, is
    never replaced."""
    out = Path(out)
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / "export.json").is_file():
        raise ExportError(f"out={str(out)!r} holds files that are not an export (no export.json): an export replaces "
                          "its whole folder, so give a new or empty folder")
    try:
        old = json.loads((out / "export.json").read_text()).get("source")
    except (ValueError, AttributeError):
        old = None
    if not isinstance(old, str) or not (old == str(source) or Path(old).resolve() == Path(source).resolve()):
        held = f"the export of {old!r}" if isinstance(old, str) else "an export whose export.json names no source"
        raise ExportError(f"out={str(out)!r} holds {held}, not of {str(source)!r}: an export replaces its whole "
                          "folder, so give another --out (or remove that folder yourself)")


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
    check_out(out, spec)
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


def slug(spec: str) -> str:
    return Path(spec.rstrip("/")).name.removesuffix(".gguf") or "target"


# -- drafters ----------------------------------------------------------------------------------------------------

def read_drafter(folder: Path):
    """(DrafterConfig, state dict) of a drafter folder in specviz's layout; ExportError naming what is wrong."""
    from specviz.drafters.config import DrafterConfig, DrafterError, read_config
    from specviz.models.weights import load_state_dict

    folder = Path(folder)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise ExportError(f"drafter folder {str(folder)!r} has no config.json and model.safetensors: give a folder "
                          f"written by `python -m specviz train` (or one of {', '.join(SHIPPED.values())})")
    try:
        raw = read_config(folder)
        if "kind" not in raw:
            raise ExportError(f"drafter folder {str(folder)!r} is not in specviz's layout (its config.json has no "
                              "'kind'): export converts drafters trained here")
        return DrafterConfig.from_dict(raw, f"drafter {str(folder)!r}"), load_state_dict(weights)
    except DrafterError as exc:
        raise ExportError(str(exc)) from None


def shipped(kind: str) -> Path:
    from specviz.paths import DRAFTERS

    return DRAFTERS / SHIPPED[kind]


def default_out(folder: Path, kind: str, spec: str, root: Path = ROOT, fmt: str = NATIVE) -> Path:
    """Where a drafter's export goes: out/export/smollm2-135m-eagle3 for a shipped one, else named after its folder
    (train's out/train/NAME/drafter -> NAME); the suffix names the format (eagle3-speculators)."""
    suffix = exporter(kind, fmt).suffix
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
                   force: bool = False, log: Callable[[str], None] = print, fmt: str = NATIVE) -> Path:
    """A drafter folder in the layout engines load: EAGLE-3 (eagle), vLLM's Medusa (medusa) or a Llama draft model +
    GGUF (draft); `fmt` "speculators": EAGLE-3 in vLLM's speculators format (export_speculators.py)."""
    folder = Path(folder)
    check_format(fmt)
    cfg, state = read_drafter(folder)
    tc = _check_pair(cfg, folder, target_dir, spec)
    export = exporter(cfg.kind, fmt)
    refused = export.refuses(cfg) if export else f"a {cfg.kind}"
    if refused:
        converts = ", ".join(f"{exporter(k).converts} ({k})" for k in KINDS)
        raise ExportError(f"drafter {str(folder)!r} is {refused} drafter: export converts {converts}")
    files = [folder / "model.safetensors", folder / "config.json"]
    out = Path(out or default_out(folder, cfg.kind, spec, fmt=fmt))
    manifest = {"kind": cfg.kind, "format": FORMAT, "export_format": fmt, "source": str(folder),
                "source_sha256": _sha(files),
                "target": str(target_dir), "target_sha256": json.loads((target_dir / "export.json").read_text())
                .get("source_sha256")}
    if not force and _cached(out, manifest):
        log(f"reusing {out} (the export of {folder})")
        return out
    check_out(out, str(folder))
    tmp = _fresh(out)
    manifest["check"] = check = export.write(cfg, state, tc, target_dir, tmp)
    log(f"{export.label} round trip through {check['reader']}: largest logit difference "
        f"{check['max_abs_logit_diff']:.2e}, greedy draft equal on {check['argmax_equal']}/{check['rows']} rows")
    readme = export.readme(folder, out, target_dir, cfg, check)
    manifest["drafter_config"] = {k: v for k, v in asdict(cfg).items() if k != "training"}
    _finish(tmp, out, manifest, readme)
    log(f"wrote {out}")
    return out
