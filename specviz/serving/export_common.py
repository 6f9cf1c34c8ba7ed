"""What the exports share (specviz/serving/engine_export.py has the overview): the error, the round trip's tolerance,
how a method's drafters are exported (DrafterExport, named by its registry entry), and the tensors they read."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

TARGET_GGUF = "target-f32.gguf"  # the target's export for llama.cpp
TOLERANCE = 1e-4           # the largest logit difference a round trip may show (fp32 in both)
NATIVE = "native"          # `export --format`: each method's own engine layout (the default) ...
FORMATS = (NATIVE, "speculators", "gguf")  # ... or vLLM's `speculators` format, or a GGUF for llama-server


class ExportError(ValueError):
    """An export that cannot be made; str(exc) is one line naming the value and what is accepted."""


@dataclass(frozen=True)
class DrafterExport:
    """How one method's drafters are exported for serving engines (its registry entry's `exporter` names it)."""
    label: str         # what the log line calls the round trip: "EAGLE-3", "Medusa", "draft model"
    converts: str      # what it converts, for the refusal: "EAGLE-3", "Medusa heads over the target's LM head"
    suffix: str        # the export folder's suffix: smollm2-135m-eagle3
    write: Callable    # (cfg, state, target config, target folder, out) -> the round trip's check (a dict)
    readme: Callable   # (folder, out, target folder, cfg, check) -> the README's text
    refuses: Callable = lambda cfg: None  # cfg -> "an EAGLE-1"-style phrase when this drafter cannot be exported
    formats: dict = field(default_factory=dict)  # the other FORMATS it writes: name -> "module:attribute" of theirs


def check_format(fmt: str) -> str:
    """`fmt` when it is one of FORMATS; ExportError (one line) otherwise."""
    if fmt not in FORMATS:
        raise ExportError(f"format={fmt!r} is unknown: use one of {', '.join(FORMATS)}")
    return fmt


def drafter_arg(folder: Path, cfg) -> str:
    """How `export` and `serve` name this drafter in a README's commands: its kind where it is the drafter shipped
    for its target (`--drafter eagle`), else its folder (a user's own drafter)."""
    from specviz.paths import shipped_drafter

    return cfg.kind if Path(folder).resolve() == shipped_drafter(cfg.target, cfg.kind).resolve() else str(folder)


def vllm_command(target_dir: Path, speculative: dict) -> str:
    """The vLLM command line a README shows: the target folder served with `speculative` (its --speculative-config)."""
    return ("VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server "
            f"--model {target_dir} \\\n    --served-model-name {target_dir.name} --host 127.0.0.1 --port 8000 "
            "--dtype float32 -O0 "
            f"--max-model-len 2048 \\\n    --speculative-config '{json.dumps(speculative)}'")


def target_tensors(target_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(target_dir / "model.safetensors"))


def vocab_ids_of(cfg, state: dict):
    """The target ids of the drafter's draft vocabulary (all of the target's when it has none), int64."""
    import torch

    return state["vocab_ids"].long() if "vocab_ids" in state else torch.arange(cfg.vocab_size)


def draft_vocab_head(embed, vocab_ids):
    """A full-vocabulary LM head for engines that cannot cut one: the target's rows (its tied embedding) at the draft
    vocabulary's ids, zero elsewhere, so a greedy draft is specviz's unless every draft-vocabulary logit is negative."""
    import torch

    head = torch.zeros_like(embed)
    head[vocab_ids] = embed[vocab_ids]
    return head


def state_rows(cfg) -> range:
    return range(cfg.draft_vocab or cfg.vocab_size)
