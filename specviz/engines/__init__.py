"""Engines by method name."""
from __future__ import annotations

from specviz.config import DEFAULT_DRAFT, DecodeConfig
from specviz.engines.ar import AREngine
from specviz.engines.base import Engine, generate
from specviz.engines.draft_model import ModelDrafter
from specviz.engines.pld import PromptLookupDrafter
from specviz.engines.speculative import SpeculativeEngine
from specviz.models import LoadedModel, load_draft

__all__ = ["AREngine", "Engine", "SpeculativeEngine", "build", "generate"]


def build(method: str, target: LoadedModel, draft: str | LoadedModel = DEFAULT_DRAFT) -> Engine:
    """The engine for `method` ("ar" | "vanilla" | "pld") over `target`."""
    DecodeConfig(method=method)  # validates the name with the shared message
    if method == "ar":
        return AREngine(target)
    if method == "pld":
        return SpeculativeEngine("pld", target, PromptLookupDrafter())
    draft_model = draft if isinstance(draft, LoadedModel) else load_draft(draft, target)
    return SpeculativeEngine("vanilla", target, ModelDrafter(draft_model))
