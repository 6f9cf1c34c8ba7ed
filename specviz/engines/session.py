"""One prompt, prepared for the engines: validated settings, the loaded pair, the prompt's token ids.

The CLI and the app both go through here, so they check inputs (and the deployment's policy) and build
engines the same way.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

from specviz import engines, methods
from specviz.config import DecodeConfig, check_prompt
from specviz.core.race import Tick, race
from specviz.engines.base import Engine
from specviz.errors import ConfigError
from specviz.events import StepEvent
from specviz.methods import TRAINED_METHODS
from specviz.models import loader as models
from specviz.policy import Policy


@dataclass
class Prepared:
    target: models.LoadedModel
    engine: Engine   # the speculative engine (methods.spec(cfg.method)'s), raced against `ar`
    ar: Engine
    prompt_ids: list[int]
    cfg: DecodeConfig
    max_run_seconds: float = float("inf")

    def race(self) -> Iterator[Tick]:
        """AR and the speculative engine side by side on the race clock (lanes "ar" and "spec"), stopping
        with a ConfigError once the run exceeds the deployment's wall-time cap."""
        return capped(race({"ar": self.ar.steps(self.prompt_ids, self.cfg),
                            "spec": self.engine.steps(self.prompt_ids, self.cfg)}), self.max_run_seconds)

    def spec_steps(self) -> Iterator[StepEvent]:
        return self.engine.steps(self.prompt_ids, self.cfg)


def prepare(prompt: str, cfg: DecodeConfig, target: str | models.LoadedModel, draft: str | None,
            chain: bool = False) -> Prepared:
    """Validate the prompt and settings against the policy, load (or reuse) the models and build both
    engines. Raises ConfigError/ModelError with one-line messages."""
    policy = Policy.from_env()
    policy.check_prompt(check_prompt(prompt))
    cfg = policy.check_config(cfg)
    if isinstance(target, str):
        target = models.get(policy.check_model(target, "target"))
    if methods.spec(cfg.method).uses_draft_model and isinstance(draft, str):
        policy.check_model(draft, "draft")
    if cfg.method in TRAINED_METHODS and policy.public:
        draft = None  # public mode: only the drafters shipped with the app, never a local folder
    ids = target.encode_prompt(prompt)
    limit = getattr(target.model.config, "max_position_embeddings", None)
    if limit and len(ids) + cfg.max_new_tokens > limit:
        raise ConfigError(f"prompt ({len(ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                          f"model's context of {limit} tokens: shorten the prompt or lower max_new_tokens")
    engine = engines.build(cfg.method, target, draft, chain)
    return Prepared(target, engine, engines.build("ar", target), ids, cfg, policy.max_run_seconds)


def capped(ticks: Iterator[Tick], seconds: float) -> Iterator[Tick]:
    """A race's ticks, stopped with a ConfigError once the run exceeds the deployment's wall-time cap."""
    start = time.perf_counter()
    for tick in ticks:
        yield tick
        if time.perf_counter() - start > seconds:
            raise ConfigError(f"the run was stopped after {seconds:g} s, the limit here: lower max_new_tokens")


@dataclass
class PreparedLanes:
    """Several speculative engines beside AR on one prompt (the app's race of several drafters)."""
    target: models.LoadedModel
    ar: Engine
    lanes: dict[str, tuple[Engine, DecodeConfig]]  # lane name -> its engine and settings
    prompt_ids: list[int]
    max_run_seconds: float = float("inf")

    def race(self) -> Iterator[Tick]:
        """AR (lane "ar") and every lane on one race clock, capped as Prepared.race is. AR runs with the first
        lane's settings: the lanes share temperature, top-p, seed and length."""
        first = next(iter(self.lanes.values()))[1]
        streams = {"ar": self.ar.steps(self.prompt_ids, first)}
        streams.update({name: engine.steps(self.prompt_ids, cfg) for name, (engine, cfg) in self.lanes.items()})
        return capped(race(streams), self.max_run_seconds)


def prepare_lanes(prompt: str, lanes: dict[str, tuple[DecodeConfig, str | None]],
                  target: str | models.LoadedModel) -> PreparedLanes:
    """prepare() for each lane (name -> (settings, draft)): every lane's settings checked as a single race's are,
    the models loaded once."""
    prepared = [prepare(prompt, cfg, target, draft) for cfg, draft in lanes.values()]
    first = prepared[0]
    return PreparedLanes(first.target, first.ar, {name: (p.engine, p.cfg) for name, p in zip(lanes, prepared)},
                         first.prompt_ids, first.max_run_seconds)
