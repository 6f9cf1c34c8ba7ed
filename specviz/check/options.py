"""The drafter sanity check's options (python -m specviz check, the app's Check tab): what each part runs, with its
defaults and their validation. Read by run.py (the check in order) and measure.py (the parts it measures)."""
from __future__ import annotations

from dataclasses import dataclass

from specviz.config import DecodeConfig, Gamma, number
from specviz.core.profile import SIZES as PROFILE_SIZES
from specviz.errors import ConfigError


@dataclass(frozen=True)
class CheckOptions:
    gamma: Gamma = 4                 # drafted tokens per step for every part, or "auto"
    temperature: float = 1.0         # the sampling-fidelity part (the greedy part always uses 0)
    samples: int = 400               # seeds 0..samples-1 for the sampling-fidelity part
    max_new_tokens: int = 64         # per prompt, for the greedy identity and speed runs
    synthetic_samples: int = 4000    # Monte-Carlo draws per synthetic p/q case
    profile_sizes: tuple[int, ...] = PROFILE_SIZES  # tokens per target forward (python -m specviz profile's)
    profile_reps: int = 3            # median of this many timed forwards per size
    profile_context: int = 128       # tokens already in the KV cache when timing
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    near_tie: float = 1e-3           # a greedy flip with a top-2 logit gap below this is numerical, not a bug
    p_value_min: float = 1e-3        # the fidelity test fails below this chi-square p-value

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass normalisation)
        cfg = DecodeConfig(gamma=self.gamma, temperature=self.temperature, max_new_tokens=self.max_new_tokens)
        set_("gamma", cfg.gamma)
        set_("temperature", cfg.temperature)
        set_("max_new_tokens", cfg.max_new_tokens)
        if cfg.temperature <= 0:
            raise ConfigError("temperature=0 is out of range for the sampling check: use a number > 0 "
                              "(greedy is always checked)")
        set_("samples", number("samples", self.samples, int))
        if not 20 <= self.samples <= 100_000:
            raise ConfigError(f"samples={self.samples} is out of range: use 20..100000")
        set_("synthetic_samples", number("synthetic_samples", self.synthetic_samples, int))
        if not 0 <= self.synthetic_samples <= 1_000_000:
            raise ConfigError(f"synthetic_samples={self.synthetic_samples} is out of range: use 0 (skip)..1000000")


def gamma_words(gamma, mean) -> str:
    """The γ a check ran at, as its verdict says it: the one set, with the mean drafted a step where that differs
    (prompt lookup drafts only what it finds; an adaptive γ moves): "γ=4 (3.0 drafted a step on average)"."""
    if gamma == "auto":
        return f"γ auto ({mean:.1f} drafted a step on average)" if mean else "γ auto"
    return f"γ={gamma}" + (f" ({mean:.1f} drafted a step on average)" if mean and abs(mean - gamma) >= 0.05 else "")
