"""One prompt, prepared for the engines: validated settings, the loaded pair, the prompt's token ids.

The CLI and the app both go through here, so they check inputs and build engines the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from specviz import engines, models
from specviz.config import ConfigError, DecodeConfig, check_prompt
from specviz.events import StepEvent
from specviz.race import Tick, race


@dataclass
class Prepared:
    target: models.LoadedModel
    spec: engines.Engine
    ar: engines.Engine
    prompt_ids: list[int]
    cfg: DecodeConfig

    def race(self) -> Iterator[Tick]:
        """AR and the speculative engine side by side on the race clock (lanes "ar" and "spec")."""
        return race({"ar": self.ar.steps(self.prompt_ids, self.cfg), "spec": self.spec.steps(self.prompt_ids, self.cfg)})

    def spec_steps(self) -> Iterator[StepEvent]:
        return self.spec.steps(self.prompt_ids, self.cfg)


def prepare(prompt: str, cfg: DecodeConfig, target: str | models.LoadedModel, draft: str) -> Prepared:
    """Validate the prompt, load (or reuse) the models and build both engines. Raises ConfigError/ModelError."""
    check_prompt(prompt)
    tgt = target if isinstance(target, models.LoadedModel) else models.get(target)
    ids = tgt.encode_prompt(prompt)
    limit = getattr(tgt.model.config, "max_position_embeddings", None)
    if limit and len(ids) + cfg.max_new_tokens > limit:
        raise ConfigError(f"prompt ({len(ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                          f"model's context of {limit} tokens: shorten the prompt or lower max_new_tokens")
    spec = engines.build(cfg.method, tgt, draft)
    return Prepared(tgt, spec, engines.build("ar", tgt), ids, cfg)
