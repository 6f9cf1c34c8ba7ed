"""What a target forward of k tokens costs, and what each drafter's step costs: `python -m specviz profile`.

T(k) is measured through the engines' own CachedLM (the same head, attention and padding as a run), so
T(1) is the one-token step as AR runs it. The check's cost profile, the app's prediction and the choice of
γ all read this one measurement.
"""
from __future__ import annotations

import statistics
import threading
import weakref
from typing import Callable, Optional

import torch

from specviz import methods as registry
from specviz import metrics
from specviz.config import DecodeConfig
from specviz.core.cache import CachedLM, clock
from specviz.metrics import CostProfile
from specviz.models.loader import LoadedModel

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)   # tokens per target forward
CONTEXT = 128                                    # tokens already in the KV cache
REPS = 5                                         # timed forwards per size (median), after one warm-up
COST_PROMPT = "Explain how a refrigerator keeps food cold, step by step."
COST_METHODS = registry.names(lambda s: s.has_weights)  # the methods whose drafting costs a forward of weights


@torch.inference_mode()
def verify_profile(target: LoadedModel, sizes=SIZES, context: int = CONTEXT, reps: int = REPS,
                   tick: Optional[Callable[[int], None]] = None) -> CostProfile:
    """Median seconds of a forward of k new tokens (and their logits) over `context` cached tokens. The sizes are
    timed in rounds, each round every size once, so a slow spell of a shared machine falls on all of them alike
    rather than on the one size being timed (timed size after size, a slow spell can make T(2) cheaper than T(1))."""
    lm = CachedLM.of(target)
    prefix = [(7 * i + 11) % target.vocab_size for i in range(context)]
    lm.logits(prefix)
    extras = [[(13 * j + 5) % target.vocab_size for j in range(k)] for k in sizes]
    times: list[list[float]] = [[] for _ in sizes]
    for rep in range(reps + 1):  # the first round is a warm-up
        for i, (k, extra) in enumerate(zip(sizes, extras)):
            t0 = clock(target.device)
            lm.logits(prefix, extra, keep=k)
            t1 = clock(target.device)
            lm.rollback(context)
            if rep:
                times[i].append(t1 - t0)
        if tick:
            tick(round(len(sizes) * (rep + 1) / (reps + 1)))
    seconds = [statistics.median(t) for t in times]
    monotone = [min(seconds[i:]) for i in range(len(seconds))]
    return CostProfile(str(target.device), str(target.dtype).replace("torch.", ""), target.attention, context, reps,
                       list(sizes), monotone, seconds)


APP_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 17)   # up to γ + 1 for γ <= 16: what the app's prediction reads
APP_REPS = 5  # its rounds: with 2, T(8)/T(1) came out 1.67 in one start-up against 1.17 measured with 7
_profiles: "weakref.WeakKeyDictionary[torch.nn.Module, CostProfile]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def profile_of(target: LoadedModel, measure: bool = True) -> Optional[CostProfile]:
    """The verify profile of a loaded target, measured once (APP_REPS rounds of every size: about a second on a
    2-core CPU) and kept with the model; None when not measured yet and measure=False."""
    with _lock:
        if target.model not in _profiles and measure:
            _profiles[target.model] = verify_profile(target, APP_SIZES, reps=APP_REPS)
        return _profiles.get(target.model)


def drafter_cost(target: LoadedModel, method: str, ar_events: list, draft: Optional[str] = None,
                 max_new_tokens: int = 48) -> dict:
    """c for one method: seconds per draft forward / seconds per AR step (AR's events on the same prompt and
    settings given), from a greedy run on one built-in prompt (the engines' own timers), with its α."""
    from specviz import engines

    ids = target.encode_prompt(COST_PROMPT)
    cfg = DecodeConfig(method=method, max_new_tokens=max_new_tokens)
    engine = engines.build(method, target, draft) if draft else engines.build(method, target)
    engines.generate(engine, ids, cfg.with_(max_new_tokens=4))  # first-call allocations are not billed
    cmp = metrics.compare(ar_events, engines.generate(engine, ids, cfg).events, method, True)
    return {"method": method, "c": cmp.cost_ratio, "alpha": cmp.spec.alpha, "tau": cmp.spec.tau,
            "draft_forwards": cmp.spec.draft_forwards, "ar_step_ms": 1000 * cmp.ar.seconds / max(cmp.ar.steps, 1)}


def drafter_costs(target: LoadedModel, methods=COST_METHODS, draft: Optional[str] = None,
                  max_new_tokens: int = 48) -> list[dict]:
    """drafter_cost for every method that has a drafter for this target (the shipped ones, the int8 copy),
    against one timed AR run."""
    from specviz import engines
    from specviz.errors import ConfigError
    from specviz.models.loader import ModelError

    ids = target.encode_prompt(COST_PROMPT)
    ar, cfg = engines.build("ar", target), DecodeConfig(method="ar", max_new_tokens=max_new_tokens)
    engines.generate(ar, ids, cfg.with_(max_new_tokens=4))  # warm-up, not timed
    ar_events = engines.generate(ar, ids, cfg).events
    out = []
    for method in methods:
        try:
            out.append(drafter_cost(target, method, ar_events,
                                    draft if registry.spec(method).uses_draft_model else None, max_new_tokens))
        except (ConfigError, ModelError) as exc:  # no drafter shipped for this target
            out.append({"method": method, "c": None, "skipped": str(exc)})
    return out


def format_profile(profile: CostProfile) -> str:
    lines = [f"verify profile: {profile.device}, {profile.dtype}, attention {profile.attention}, "
             f"{profile.context} tokens cached, median of {profile.reps}",
             "| k | T(k) ms | T(k)/T(1) |", "|---|---|---|"]
    for k, raw in zip(profile.tokens, profile.raw_seconds):
        lines.append(f"| {k} | {1000 * raw:.1f} | {raw / profile.raw_seconds[0]:.2f} |")
    return "\n".join(lines)


def format_costs(costs: list[dict]) -> str:
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["| method | c (draft forward / AR step) | α (γ=4, one prompt) | best γ here | predicted speedup at it |",
             "|---|---|---|---|---|"]
    for row in costs:
        lines.append(f"| {row['method']} | {f(row.get('c'), '.3f')} | {f(row.get('alpha'), '.2f')} | "
                     f"{f(row.get('best_gamma'), 'd')} | {f(row.get('predicted_speedup'), '.2f')}× |")
    return "\n".join(lines)
