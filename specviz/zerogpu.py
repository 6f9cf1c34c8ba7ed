"""ZeroGPU (Hugging Face Spaces): run every handler that runs a model for a visitor inside `spaces.GPU`.

On a ZeroGPU Space (SPACES_ZERO_GPU set and the `spaces` package importable) a GPU is attached only while a
function decorated with `spaces.GPU(duration=...)` runs, in a forked worker; its arguments and results
cross to that worker pickled. The app loads its models once at start (on the emulated CUDA device, no
forward) and wraps the race, the check and the step-through handlers with `gpu()`. Anywhere else `gpu()`
returns the function unchanged and `spaces` is never imported.

Durations (seconds) come from the deployment's caps (specviz/policy.py), not a fixed guess:
- a race, and every step-through handler (at most one capped run, replayed from its seed after a worker
  change): the run-time cap SPECVIZ_MAX_RUN_SECONDS (public default 120 s; 120 s where no cap is set), plus
  SETUP_S for the worker's first moves of the weights onto the GPU and the prompt's prefill;
- a check: the tokens it decodes (prompts × max new tokens, plus one step per sampling seed) at the rate
  the cap allows a race, max_run_seconds / max_new_tokens (public: 120 s / 256 tokens), plus SETUP_S.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from typing import Callable, TypeVar

from specviz.policy import Policy

ENV = "SPACES_ZERO_GPU"
SETUP_S = 30              # weights onto the GPU at a worker's first call, the prefill, the summary
UNCAPPED_RUN_S = 120      # the run budget where the policy sets no run-time cap (the public default)

F = TypeVar("F", bound=Callable)


def enabled() -> bool:
    """True on a ZeroGPU Space: SPACES_ZERO_GPU is set (not empty, 0 or false) and `spaces` can be imported."""
    flag = os.environ.get(ENV, "").strip().lower()
    return flag not in ("", "0", "false", "no", "off") and ("spaces" in sys.modules
                                                              or importlib.util.find_spec("spaces") is not None)


def activate() -> bool:
    """Import `spaces` on ZeroGPU, before any model touches CUDA (it must come first); True when active."""
    if not enabled():
        return False
    importlib.import_module("spaces")
    return True


def gpu(fn: F, duration: int | Callable[..., int]) -> F:
    """fn inside spaces.GPU(duration=...) on ZeroGPU; fn itself anywhere else. A callable duration is called
    with the handler's own arguments (spaces' dynamic duration)."""
    if not enabled():
        return fn
    import spaces

    return spaces.GPU(fn, duration=duration)


def run_seconds(policy: Policy) -> float:
    """The deployment's budget for one run: its run-time cap, or UNCAPPED_RUN_S where it sets none."""
    return policy.max_run_seconds if math.isfinite(policy.max_run_seconds) else float(UNCAPPED_RUN_S)


def run_duration(policy: Policy | None = None) -> int:
    """GPU seconds for one capped run (the race, the step-through)."""
    return math.ceil(run_seconds(policy or Policy.from_env()) + SETUP_S)


def check_duration(prompts: int, samples: int, max_new_tokens: int, policy: Policy | None = None) -> int:
    """GPU seconds for a check with these settings: the tokens it decodes (each prompt raced to max_new_tokens,
    one step per sampling seed) at the rate the run-time cap allows a race."""
    policy = policy or Policy.from_env()
    per_token = run_seconds(policy) / policy.max_new_tokens
    return math.ceil(SETUP_S + per_token * (prompts * max_new_tokens + samples))
