"""What a target forward of k tokens costs (T(k)): `python -m specviz profile` (each drafter's step cost is
specviz/engines/costs.py's).

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

from specviz.core.cache import CachedLM, clock
from specviz.metrics import CostProfile
from specviz.models.loader import LoadedModel

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)   # tokens per target forward
CONTEXT = 128                                    # tokens already in the KV cache
REPS = 5                                         # timed forwards per size (median), after one warm-up


@torch.inference_mode()
def verify_profile(target: LoadedModel, sizes=SIZES, context: int = CONTEXT, reps: int = REPS,
                   tick: Optional[Callable[[int], None]] = None) -> CostProfile:
    """Median seconds of a forward of k new tokens (and their logits) over `context` cached tokens. The sizes are
    timed in rounds, each round every size once, so a slow spell of a shared machine falls on all of them alike
    rather than on the one size being timed (timed size after size, a slow spell can make T(2) cheaper than T(1)).
    Size 1 is always measured, and the sizes in order: every ratio is over T(1) (CostProfile.ratio)."""
    sizes = sorted({1, *sizes})
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


def keep(target: LoadedModel, profile: CostProfile) -> None:
    """Take `profile` as the target's verify profile (this machine's kept calibration: specviz/calibration.py)."""
    with _lock:
        _profiles[target.model] = profile


def format_profile(profile: CostProfile) -> str:
    lines = [f"verify profile: {profile.device}, {profile.dtype}, attention {profile.attention}, "
             f"{profile.context} tokens cached, median of {profile.reps}",
             "| k | T(k) ms | T(k)/T(1) |", "|---|---|---|"]
    for k, raw in zip(profile.tokens, profile.raw_seconds):
        lines.append(f"| {k} | {1000 * raw:.1f} | {raw / profile.raw_seconds[0]:.2f} |")
    return "\n".join(lines)
