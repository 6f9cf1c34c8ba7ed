"""The engine interface: `steps()` yields one StepEvent per target forward; `generate()` folds it."""
from __future__ import annotations

from typing import Callable, Iterator, Protocol

from specviz.config import DecodeConfig
from specviz.events import EmittedToken, Run, StepEvent, Verdict


class Engine(Protocol):
    method: str

    def steps(self, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[StepEvent]:
        """Generate from prompt_ids, one event per target forward; the last event has finish_reason."""
        ...


def generate(engine: Engine, prompt_ids: list[int], cfg: DecodeConfig) -> Run:
    """The non-streaming API: a fold over the stream."""
    run = Run(engine.method)
    for event in engine.steps(prompt_ids, cfg):
        run.events.append(event)
    return run


def commit(
    candidates: list[tuple[int, Verdict, float | None]],
    n_new: int,
    cfg: DecodeConfig,
    eos_ids: frozenset[int],
    text_of: Callable[[int], str],
) -> tuple[list[EmittedToken], str | None]:
    """Emit candidates in order, stopping exactly at EOS (kept) or at max_new_tokens.

    Returns the emitted tokens and the finish reason ("eos" | "length" | None)."""
    out: list[EmittedToken] = []
    for token_id, verdict, p in candidates:
        if n_new + len(out) >= cfg.max_new_tokens:
            return out, "length"
        out.append(EmittedToken(token_id, text_of(token_id), verdict, p))
        if token_id in eos_ids:
            return out, "eos"
    if n_new + len(out) >= cfg.max_new_tokens:
        return out, "length"
    return out, None
