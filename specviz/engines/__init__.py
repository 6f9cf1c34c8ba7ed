"""Engines by method name."""
from __future__ import annotations

from pathlib import Path

from specviz import methods, paths
from specviz.config import DEFAULT_DRAFT, DecodeConfig
from specviz.engines.ar import AREngine
from specviz.engines.base import Engine, generate
from specviz.engines.speculative import SpeculativeEngine
from specviz.errors import ConfigError
from specviz.models.loader import LoadedModel
from specviz.paths import DRAFTERS

__all__ = ["AREngine", "Engine", "SpeculativeEngine", "build", "build_trained", "generate"]

SHIPPED = DRAFTERS


def drafter_folder(method: str, target: LoadedModel, draft: str | None) -> Path:
    """A trained drafter's folder: `draft` when it names one, else the one shipped for this target."""
    if draft and Path(draft).is_dir():
        return Path(draft)
    if draft and draft != DEFAULT_DRAFT and draft.count("/") == 1 and not draft.startswith((".", "/", "~")):
        return _download(draft)  # a published drafter on the Hub (Medusa-1, EAGLE-1, EAGLE-3 or ours)
    if draft and draft != DEFAULT_DRAFT:
        from specviz.drafters.config import not_a_drafter_folder

        raise ConfigError(not_a_drafter_folder(draft, method))
    shipped = paths.shipped_drafter(target.name, method)
    if not shipped.is_dir():
        raise ConfigError(f"no {method} drafter is shipped for target {target.name!r}: train one with "
                          f"python -m specviz train {method} --target {target.name} --out DIR, "
                          "then pass --draft DIR/drafter")
    return shipped


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.pt", "*.bin", "*.md"]))
    except Exception as exc:  # offline, unknown repo, gated: one line, whatever the cause
        raise ConfigError(f"drafter {repo_id!r} could not be downloaded ({type(exc).__name__}): give a local folder "
                          "written by python -m specviz train, or a Hub id of a Medusa-1, EAGLE-1 or EAGLE-3 "
                          "drafter") from None


def build_trained(folder: str | Path, target: LoadedModel, chain: bool = False, method: str | None = None) -> Engine:
    """A trained drafter's engine, built as its kind's registry entry says (methods.MethodSpec.engine): Medusa
    verifies trees and EAGLE drafts one when its config names one; with chain=True (the step-through view) both
    draft a chain, as LayerSkip and the draft model always do. With `method`, a drafter of another kind is refused."""
    from specviz.drafters import trained as drafters
    from specviz.drafters.config import check_kind

    d = drafters.load(folder, target)
    if method:
        check_kind(d.kind, method, str(folder))
    engine = methods.load(methods.spec(d.kind).engine)(target, d, chain, str(folder))
    engine.draft_vocab_ids = d.vocab_ids  # the target ids it can draft (None: all), for the bench's coverage figure
    engine.block_size = d.cfg.block_size if methods.spec(d.kind).drafts_block else 0  # one forward drafts a block
    return engine


def build(method: str, target: LoadedModel, draft: str | LoadedModel = DEFAULT_DRAFT, chain: bool = False) -> Engine:
    """The engine for `method` ("ar" | "vanilla" | "pld" | "eagle" | "medusa" | "layerskip" | "draft") over `target`;
    chain=True asks for a chain-drafting engine (one with `cycle()` views, as the step-through needs)."""
    DecodeConfig(method=method)  # validates the name with the shared message
    spec = methods.spec(method)
    if spec.trained:
        return build_trained(drafter_folder(method, target, draft if isinstance(draft, str) else None), target, chain,
                             method)
    return methods.load(spec.engine)(target, draft, chain, "")
