"""The measured parts of the drafter sanity check (run.py): greedy identity against AR (first divergence and
the target's top-2 logit gap there), exact-sampling fidelity of the first emitted token, and the payoff
(α, τ, the cost ratio c, measured and predicted speedups, the best γ and the batching model)."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from specviz import methods, metrics
from specviz.check import stats
from specviz.check.options import CheckOptions
from specviz.config import GAMMA_MAX, DecodeConfig
from specviz.core.cache import CachedLM, Traced
from specviz.core.lookup import RepeatSplit
from specviz.core.profile import verify_profile
from specviz.core.sampling import warp
from specviz.drafters import trained as drafters
from specviz.engines.features import FeatureReader
from specviz.engines.speculative import SpeculativeEngine
from specviz.engines.tree import TreeEngine
from specviz.events import StepEvent
from specviz.metrics import CostProfile
from specviz.models.loader import LoadedModel

# ── 2. correct? ─────────────────────────────────────────────────────────────────────────────────────

CONTEXT_TOKENS = 8


@dataclass(frozen=True)
class Divergence:
    index: int                   # position among the new tokens
    context: str                 # the text of up to CONTEXT_TOKENS tokens before it
    ar_token: Optional[str]      # None when that output ended first
    spec_token: Optional[str]
    ar_id: Optional[int]
    spec_id: Optional[int]
    top2_gap: float              # target's top-1 minus top-2 logit at that position (its own dtype)
    near_tie: bool               # gap < near_tie: a numerical flip, not a bug


@dataclass(frozen=True)
class PromptResult:
    id: object
    category: str
    prompt: str
    prompt_tokens: int
    ar_text: str
    ar_ids: list[int]
    spec_ids: list[int]
    identical: bool
    divergence: Optional[Divergence]
    comparison: metrics.Comparison
    verify_logit_max_abs_diff: float = 0.0  # largest |Δlogit|, verification vs one-token decoding, on the path
    judged_positions: int = 0               # positions that comparison covered

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("id", "category", "prompt", "prompt_tokens", "ar_text", "ar_ids",
                                            "spec_ids", "identical", "verify_logit_max_abs_diff", "judged_positions")}
        d["divergence"] = asdict(self.divergence) if self.divergence else None
        d["comparison"] = self.comparison.to_dict()
        return d


def top2_gap(target: LoadedModel, ids: list[int]) -> float:
    """The target's top-1 minus top-2 logit after `ids`: how close a greedy flip there was to a tie."""
    logits = CachedLM.of(target).logits(ids)[0, :target.vocab_size]  # (V,)
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@torch.inference_mode()
def verify_logit_diff(target: LoadedModel, prompt_ids: list[int], committed: list[int],
                      trace: list[Traced]) -> tuple[float, int]:
    """The largest |Δlogit| between the target's verification rows (the speculative run's trace) and plain
    one-token decoding of the same committed tokens, over every position both computed, with how many
    positions that was. 0.0 means verification was bitwise one-token decoding there."""
    sequence = list(prompt_ids) + list(committed)
    lm = CachedLM.of(target)
    lm.trace = []
    lm.logits(sequence[:len(prompt_ids)])
    for end in range(len(prompt_ids) + 1, len(sequence)):
        lm.logits(sequence[:end])
    one_token = {p: row for t in lm.trace for p, row in t.rows_on(sequence)}
    diffs = [float((row - one_token[p]).abs().max()) for t in trace for p, row in t.rows_on(sequence) if p in one_token]
    return max(diffs, default=0.0), len(diffs)


def divergence(target: LoadedModel, prompt_ids: list[int], ar: list[int], spec: list[int],
               near_tie: float) -> Optional[Divergence]:
    """Where the speculative greedy output first differs from AR's, with its context and the target's top-2 gap
    there; None when they are identical."""
    i = metrics.first_divergence(ar, spec)
    if i is None:
        return None
    before = ar[max(0, i - CONTEXT_TOKENS):i]
    tok = lambda ids: ids[i] if i < len(ids) else None  # noqa: E731
    gap = top2_gap(target, prompt_ids + ar[:i])
    return Divergence(i, "".join(target.text_of(t) for t in before),
                      target.text_of(tok(ar)) if tok(ar) is not None else None,
                      target.text_of(tok(spec)) if tok(spec) is not None else None,
                      tok(ar), tok(spec), gap, gap < near_tie)


@dataclass(frozen=True)
class Fidelity:
    prompt_id: object
    prompt_entropy: float        # nats, of the exact distribution tested (the most spread prompt is used)
    temperature: float
    samples: int                 # drafted steps counted
    with_drafts: int             # samples whose step verified at least one drafted token
    first_accepted: int          # ... and kept the first drafted token
    fit: stats.Fit
    passed: bool
    top: list[dict]              # the most likely tokens: text, expected and observed frequency
    seeds: int = 0               # seeds run (more than samples when conditioned)
    given: Optional[str] = None  # the first token the tested step follows, for drafters whose first step is the prefill
    engine: str = "chain"        # what was tested: "chain" (the chain loop) or "tree" (a tree drafter's tree, as raced)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fit"] = self.fit.to_dict()
        return d


def first_drafted_step(engine: SpeculativeEngine | TreeEngine, ids: list[int], cfg: DecodeConfig,
                       given: Optional[int]) -> Optional[StepEvent]:
    """The first step that can draft: the first step, or (given a token) the second when the first step
    emitted exactly `given`; None when it emitted another token (the sample is not counted)."""
    steps = engine.steps(ids, cfg)
    try:
        event = next(steps)
        if given is None:
            return event
        return next(steps) if event.emitted[0].token_id == given else None
    finally:
        steps.close()


def race_engine(method: str, target: LoadedModel, chain: SpeculativeEngine) -> SpeculativeEngine | TreeEngine:
    """The engine the race runs over a chain engine's trained drafter: a tree drafter's tree engine (Medusa; EAGLE
    when its drafter names a tree), else the chain engine itself."""
    trained = getattr(chain.drafter, "drafter", None)  # a trained drafter's drafters.Drafter
    entry = methods.spec(method)
    if not entry.tree or trained is None:
        return chain
    return methods.load(entry.engine)(target, trained, False, getattr(chain.drafter, "name", ""))


def sampling_fidelity(engine: SpeculativeEngine | TreeEngine, target: LoadedModel,
                      candidates: list[tuple[object, list[int]]], options: CheckOptions, tick: Callable[[int], None],
                      base: Optional[DecodeConfig] = None) -> Fidelity:
    """The first emitted token of the first drafted step over seeds 0, 1, ... against warp(target logits).
    Feature-reading drafters (EAGLE, and every tree engine: EAGLE's and Medusa's trees) first need the target's
    prefill, which drafts nothing: for them the test conditions on the prefill emitting the target's most likely
    first token, and counts the next step. `base` carries the settings options do not (the method, top-k, top-p,
    a tree's grafted branches: lookup, retrieve)."""
    cfg = (base or DecodeConfig(method="vanilla")).with_(gamma=options.gamma, temperature=options.temperature,
                                                         max_new_tokens=options.max_new_tokens)
    # a drafter reading the target's features has none before the target's prefill, so it drafts from step 2
    after_prefill = isinstance(engine, TreeEngine) or isinstance(
        engine.drafter.session(target.vocab_size, target.eos_ids), FeatureReader)
    best = None
    for prompt_id, ids in candidates:  # the prompt whose tested token is most spread shows a skew best
        logits = CachedLM.of(target).logits(ids)[0, :target.vocab_size]  # (V,)
        p = warp(logits, cfg).double()  # (V,) the exact distribution of the first emitted token
        given, weight = None, 1.0
        if after_prefill:
            given = int(p.argmax())
            weight = float(p[given])
            logits = CachedLM.of(target).logits(ids + [given])[0, :target.vocab_size]
            p = warp(logits, cfg).double()
        entropy = float(-(p[p > 0] * p[p > 0].log()).sum())
        score = entropy if weight >= 0.2 else entropy * weight  # conditioning on a rare token wastes seeds
        if best is None or score > best[0]:
            best = (score, prompt_id, ids, entropy, p, given)
    _, prompt_id, ids, entropy, p, given = best
    counts = torch.zeros(p.shape[0], dtype=torch.float64)
    with_drafts = first_accepted = kept = seed = 0
    while kept < options.samples and seed < 20 * options.samples:
        event = first_drafted_step(engine, ids, cfg.with_(seed=seed), given)
        seed += 1
        if event is None:
            continue
        counts[event.emitted[0].token_id] += 1
        kept += 1
        with_drafts += event.n_judged > 0
        first_accepted += bool(event.drafts) and event.drafts[0].verdict.value == "accepted"
        tick(kept)
    fit = stats.fit(counts, p)
    order = torch.argsort(p, descending=True)[:10].tolist()
    top = [{"token": target.text_of(t), "id": t, "expected": float(p[t]), "observed": float(counts[t]) / max(kept, 1)}
           for t in order]
    return Fidelity(prompt_id, entropy, options.temperature, kept, with_drafts, first_accepted, fit,
                    fit.passed(options.p_value_min), top, seed, None if given is None else target.text_of(given),
                    "tree" if isinstance(engine, TreeEngine) else "chain")


# ── 3. does it pay? ─────────────────────────────────────────────────────────────────────────────────

def cost_profile(target: LoadedModel, options: CheckOptions, tick: Callable[[int], None]) -> CostProfile:
    return verify_profile(target, options.profile_sizes, options.profile_context, options.profile_reps, tick)


def speedup_at(alpha: float, gamma: int, c: float, batch: int, profile: CostProfile, block: bool = False) -> float:
    """The batching model. Per step, at batch b: AR runs one forward of b tokens, T(b), for b tokens.
    Speculative decoding drafts γ forwards costing c·T(b) each (the draft scales like the target; a block drafter
    one forward) and verifies b·(γ+1) tokens in one forward, T(b(γ+1)), for b·E[tokens per step] tokens. So
    S(b) = E·T(b) / (γ·c·T(b) + T(b(γ+1))). At b = 1 with a flat T this is Leviathan's formula."""
    t_b = profile.time(batch)
    return metrics.expected_tokens_per_step(alpha, gamma) * t_b / (
        metrics.draft_cost(gamma, c, block) * t_b + profile.time(batch * (gamma + 1)))


@dataclass(frozen=True)
class GroupStats:
    name: str
    prompts: int
    new_tokens: int
    alpha: Optional[float]
    tau: float
    speedup: Optional[float]


@dataclass(frozen=True)
class Payoff:
    gamma_mean: Optional[float]
    alpha: Optional[float]
    tau: float
    alpha_by_position: list[Optional[float]]
    drafted_by_position: list[int]
    cost_ratio: Optional[float]         # c: seconds per draft forward / seconds per AR step
    cost_ratio_basis: str               # "per draft forward" or "per drafted token (no draft model)"
    ar_tok_per_s: float
    spec_tok_per_s: float
    speedup: Optional[float]            # measured: median over prompts of AR s/token ÷ speculative s/token
    speedup_total: Optional[float]      # the same over all tokens of all prompts
    predicted_speedup: Optional[float]  # Leviathan at the measured α, γ and c
    best_gamma: Optional[int]           # argmax of the Leviathan prediction over 1..GAMMA_MAX
    best_gamma_speedup: Optional[float]
    best_gamma_hw: Optional[int]        # argmax with the measured verification cost T(γ+1)/T(1)
    best_gamma_hw_speedup: Optional[float]
    by_category: list[GroupStats]
    gamma_curve: list[dict]             # γ, Leviathan, with hardware profile
    profile: Optional[CostProfile]
    batch_curve: list[dict]             # b, speedup at the run's γ, best γ at b and its speedup
    first_draft: dict = field(default_factory=dict)  # RepeatSplit.to_dict(): does the drafter copy?
    draft_vocab: Optional[dict] = None  # a compressed draft vocabulary: {"size", "coverage" of AR's tokens}; None: full

    def to_dict(self) -> dict:
        return asdict(self)


def _best(values: dict[int, float]) -> tuple[Optional[int], Optional[float]]:
    if not values:
        return None, None
    g = max(values, key=values.get)
    return g, values[g]


def payoff(results: list[PromptResult], ar_events: list[list[StepEvent]], spec_events: list[list[StepEvent]],
           profile: Optional[CostProfile], options: CheckOptions, prompt_ids: Optional[list[list[int]]] = None,
           vocab_ids: Optional[torch.Tensor] = None, block: int = 0) -> Payoff:
    """`block`: the block size of a drafter that drafts its whole block in one forward (DFlash), else 0: its
    drafting is priced at one forward a step, and γ goes to block - 1 at most."""
    ar_all = metrics.summarize("ar", [e for run in ar_events for e in run])
    spec_flat = [e for run in spec_events for e in run]
    spec_all = metrics.summarize("spec", spec_flat)
    gammas = [e.gamma for e in spec_flat if e.gamma]
    gamma_mean = sum(gammas) / len(gammas) if gammas else None
    c, basis = metrics.cost_ratio(spec_all, ar_all), "per draft forward"
    if c is None and gamma_mean and ar_all.steps and spec_all.steps:
        c = (spec_all.draft_s / spec_all.steps / gamma_mean) / (ar_all.seconds / ar_all.steps)
        basis = "per drafted token (no draft model)"
    speedup_total = None
    if ar_all.new_tokens and spec_all.new_tokens and spec_all.seconds and ar_all.seconds:
        speedup_total = (ar_all.seconds / ar_all.new_tokens) / (spec_all.seconds / spec_all.new_tokens)
    per_prompt = [r.comparison.speedup for r in results if r.comparison.speedup is not None]
    speedup = statistics.median(per_prompt) if per_prompt else speedup_total  # robust to one noisy prompt
    reached: list[int] = []
    for e in spec_flat:
        for d in e.drafts:
            if d.verdict.value in ("accepted", "rejected"):
                reached.extend([0] * (d.depth + 1 - len(reached)))
                reached[d.depth] += 1
    by_cat = []
    for cat in dict.fromkeys(r.category for r in results):
        idx = [i for i, r in enumerate(results) if r.category == cat]
        a = metrics.summarize("ar", [e for i in idx for e in ar_events[i]])
        s = metrics.summarize("spec", [e for i in idx for e in spec_events[i]])
        sp = ((a.seconds / a.new_tokens) / (s.seconds / s.new_tokens)
              if a.new_tokens and s.new_tokens and s.seconds else None)
        by_cat.append(GroupStats(cat, len(idx), s.new_tokens, s.alpha, s.tau, sp))
    alpha = spec_all.alpha
    predicted = best_g = best_s = best_hw = best_hw_s = None
    curve, batch_curve = [], []
    if alpha is not None and c is not None and gamma_mean:
        one = bool(block)
        predicted = metrics.predicted_speedup(alpha, round(gamma_mean), c, one)
        lev = {g: metrics.predicted_speedup(alpha, g, c, one) for g in range(1, (block - 1 if one else GAMMA_MAX) + 1)}
        best_g, best_s = _best(lev)
        hw = {g: speedup_at(alpha, g, c, 1, profile, one) for g in lev} if profile else {}
        best_hw, best_hw_s = _best(hw)
        curve = [{"gamma": g, "leviathan": lev[g], "with_profile": hw.get(g)} for g in lev]
        if profile:
            g_run = round(gamma_mean)
            for b in options.batch_sizes:
                at_b = {g: speedup_at(alpha, g, c, b, profile, one) for g in lev}
                g_b, s_b = _best(at_b)
                batch_curve.append({"batch": b, "gamma": g_run, "speedup": at_b[g_run], "best_gamma": g_b,
                                    "best_speedup": s_b, "verify_tokens": b * (g_run + 1),
                                    "extrapolated": b * (g_run + 1) > max(profile.tokens)})
    split = sum((RepeatSplit.of(ids, run) for ids, run in zip(prompt_ids or [], spec_events)), RepeatSplit())
    ar_ids = [t for r in results for t in r.ar_ids]
    covered = drafters.coverage(vocab_ids, ar_ids)
    vocab = None if covered is None else {"size": len(vocab_ids), "coverage": covered}
    return Payoff(gamma_mean, alpha, spec_all.tau, spec_all.alpha_by_position, reached, c, basis,
                  ar_all.tok_per_s, spec_all.tok_per_s, speedup, speedup_total, predicted, best_g, best_s, best_hw,
                  best_hw_s,
                  by_cat, curve, profile, batch_curve, split.to_dict(), vocab)
