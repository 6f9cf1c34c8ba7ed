"""The drafter sanity check: is a draft compatible with the target, is decoding with it exact, does it pay?

    report = run_check(target, drafter, draft=draft_model, prompts=rows, options=CheckOptions(), progress=cb)

answers, in order:
1. compatible: tokenizer and vocabulary comparison (sizes, special tokens, overlap); refuses with a
   one-line ModelError when the draft cannot propose the target's tokens;
2. correct: greedy identity against AR on every prompt (first divergence, its context and the target's
   top-2 logit gap there), exact-sampling fidelity of the first emitted token over many seeds
   (chi-square and TV against warp(target logits)), and the synthetic p/q suite of verify_chain;
3. does it pay: α and τ per category and per draft position, the cost ratio c, the measured speedup
   beside the Leviathan prediction, the best γ, and a target latency profile (1 … 64 tokens per forward)
   from which the speedup is predicted as the batch grows.

The CLI (`python -m specviz check`) and the app both call run_check; report.py renders the HTML.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from specviz.drafters import trained as drafters

from specviz import metrics

from specviz.check import stats
from specviz.core.cache import CachedLM, Traced
from specviz.config import CHECK_METHODS, GAMMA_MAX, TRAINED_METHODS, ConfigError, DecodeConfig, Gamma, _number, check_prompt
from specviz.engines import AREngine, SpeculativeEngine
from specviz.engines.draft_model import ModelDrafter
from specviz.engines.pld import PromptLookupDrafter
from specviz.engines.speculative import Drafter
from specviz.events import StepEvent
from specviz.core.lookup import RepeatSplit
from specviz.metrics import CostProfile
from specviz.models.loader import COMPRESSED_DRAFTS, LoadedModel, ModelError
from specviz.core.profile import SIZES as PROFILE_SIZES
from specviz.core.profile import verify_profile
from specviz.core.sampling import warp

Progress = Callable[[str, int, int], None]  # (stage, done, total); called with done=0 when a stage starts

STAGES = ("greedy identity", "sampling fidelity", "synthetic p/q", "hardware profile")

# A small built-in prompt set across categories (our evaluation set is never used by default).
DEFAULT_PROMPTS = [
    {"id": "qa-1", "category": "qa", "prompt": "Why is the sky blue? Answer in two sentences."},
    {"id": "writing-1", "category": "writing", "prompt": "Write a short poem about a lighthouse keeper."},
    {"id": "math-1", "category": "math", "prompt": "A train travels 120 km in 1.5 hours. What is its average speed? Show the steps."},
    {"id": "code-1", "category": "coding", "prompt": "Write a Python function that returns the n-th Fibonacci number."},
    {"id": "summary-1", "category": "summarization", "prompt": (
        "Summarize in one sentence: The city council met on Tuesday to discuss the new bike lanes. "
        "The bike lanes would connect the train station to the university. Council members agreed that the "
        "bike lanes are safer, but some shop owners worry that the bike lanes remove parking spaces.")},
    {"id": "rewrite-1", "category": "rewriting", "prompt": (
        "Correct the spelling in this sentence and repeat it: 'The quick brown fox jumpd over the lazzy dog "
        "and then the quick brown fox ran into the forrest.'")},
]


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
            raise ConfigError("temperature=0 is out of range for the sampling check: use a number > 0 (greedy is always checked)")
        set_("samples", _number("samples", self.samples, int))
        if not 20 <= self.samples <= 100_000:
            raise ConfigError(f"samples={self.samples} is out of range: use 20..100000")
        set_("synthetic_samples", _number("synthetic_samples", self.synthetic_samples, int))
        if not 0 <= self.synthetic_samples <= 1_000_000:
            raise ConfigError(f"synthetic_samples={self.synthetic_samples} is out of range: use 0 (skip)..1000000")


# ── 1. compatible? ──────────────────────────────────────────────────────────────────────────────────

SPECIAL = ("bos", "eos", "pad", "unk")


def _special_tokens(tok) -> dict[str, Optional[str]]:
    out = {}
    for name in SPECIAL:
        token_id = getattr(tok, f"{name}_token_id", None)
        text = getattr(tok, f"{name}_token", None)
        out[name] = None if token_id is None else f"{text if isinstance(text, str) else ''} ({token_id})".strip()
    return out


@dataclass(frozen=True)
class Compatibility:
    ok: bool
    message: str                       # one line: why it is compatible, or why it is refused
    draft_tokenizer: bool              # False for drafters without one (prompt lookup)
    target_tokenizer_class: str
    draft_tokenizer_class: Optional[str]
    target_vocab: int                  # tokenizer entries
    draft_vocab: Optional[int]
    target_rows: int                   # rows of the output embedding (logits per position)
    draft_rows: Optional[int]
    shared: Optional[int]              # (string, id) pairs in both vocabularies
    overlap: Optional[float]           # shared / union
    same_string_other_id: Optional[int]
    special_target: dict = field(default_factory=dict)
    special_draft: dict = field(default_factory=dict)
    special_mismatch: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


CHECKED_TRAINED = tuple(m for m in CHECK_METHODS if m in TRAINED_METHODS)


def _rows(model: LoadedModel) -> int:
    """Logits per position (a quantized head may hide its weight: fall back to the config)."""
    try:
        return model.vocab_size
    except AttributeError:
        return int(getattr(model.model.config, "vocab_size", None) or len(model.tokenizer))


def compare_tokenizers(target: LoadedModel, draft: Optional[LoadedModel]) -> Compatibility:
    t_tok = target.tokenizer
    t_vocab = t_tok.get_vocab()
    base = dict(target_tokenizer_class=type(t_tok).__name__, target_vocab=len(t_vocab),
                target_rows=target.vocab_size, special_target=_special_tokens(t_tok))
    if draft is None:
        return Compatibility(True, "no draft tokenizer: the drafter proposes tokens in the target's own vocabulary "
                             "(prompt lookup, or a drafter trained on this target)",
                             False, draft_tokenizer_class=None, draft_vocab=None, draft_rows=None, shared=None,
                             overlap=None, same_string_other_id=None, **base)
    d_tok = draft.tokenizer
    d_vocab = t_vocab if d_tok is t_tok else d_tok.get_vocab()
    shared = sum(1 for s, i in d_vocab.items() if t_vocab.get(s) == i)
    moved = sum(1 for s, i in d_vocab.items() if s in t_vocab and t_vocab[s] != i)
    union = len(t_vocab) + len(d_vocab) - shared
    special_draft = _special_tokens(d_tok)
    mismatch = [k for k in SPECIAL if base["special_target"][k] != special_draft[k]]
    if target.eos_ids != draft.eos_ids:
        mismatch.append("eos ids")
    comp = dict(draft_tokenizer=True, draft_tokenizer_class=type(d_tok).__name__, draft_vocab=len(d_vocab),
                draft_rows=_rows(draft), shared=shared, overlap=shared / union if union else 1.0,
                same_string_other_id=moved, special_draft=special_draft, special_mismatch=mismatch, **base)
    names = f"draft {draft.name!r} ({comp['draft_tokenizer_class']}, {len(d_vocab)} tokens) and target " \
            f"{target.name!r} ({base['target_tokenizer_class']}, {len(t_vocab)} tokens)"
    if d_vocab != t_vocab:
        return Compatibility(False, f"incompatible tokenizers: {names} share {shared} tokens "
                             f"({comp['overlap']:.0%} of the union, {moved} with different ids): "
                             "a draft must share the target's vocabulary", **comp)
    if _rows(draft) < target.vocab_size:
        return Compatibility(False, f"incompatible output sizes: draft {draft.name!r} scores {_rows(draft)} tokens, "
                             f"target {target.name!r} {target.vocab_size}: the draft must score every target token", **comp)
    note = "" if not mismatch else f" (special tokens differ: {', '.join(mismatch)})"
    return Compatibility(True, f"same vocabulary: {names}{note}", **comp)


def drafter_for(method: str, target: LoadedModel, draft_spec: Optional[str]) -> tuple[Drafter, Optional[LoadedModel]]:
    """The drafter for `method` and the draft model whose tokenizer is compared (None for prompt lookup and
    the trained drafters, which draft in the target's own vocabulary). A separate draft is loaded without
    the tokenizer check: compare_tokenizers reports it in full."""
    from specviz.models import loader as models

    if method == "pld":
        return PromptLookupDrafter(), None
    if method in CHECKED_TRAINED:
        from specviz import engines
        from specviz.engines.draft_model import DistilledDrafter
        from specviz.engines.eagle import EagleDrafter
        from specviz.engines.tree import MedusaChainDrafter

        folder = engines.drafter_folder(method, target, draft_spec)
        d = drafters.load(folder, target)
        if d.kind != method:
            raise ConfigError(f"drafter {str(folder)!r} is a {d.kind} drafter, not {method}: pick method {d.kind}")
        return {"eagle": EagleDrafter, "medusa": MedusaChainDrafter, "draft": DistilledDrafter}[method](d, str(folder)), None
    if method != "vanilla":
        raise ConfigError(f"method={method!r} cannot be checked: use one of {', '.join(CHECK_METHODS)}")
    spec = draft_spec or "int8"
    draft = models.int8_copy(target) if spec in COMPRESSED_DRAFTS else models.get(spec, target.device, target.dtype)
    return ModelDrafter(draft), draft


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


def _top2_gap(target: LoadedModel, ids: list[int]) -> float:
    logits = CachedLM.of(target).logits(ids)[0, :target.vocab_size]  # (V,)
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@torch.inference_mode()
def verify_logit_diff(target: LoadedModel, prompt_ids: list[int], committed: list[int], trace: list[Traced]) -> tuple[float, int]:
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


def _divergence(target: LoadedModel, prompt_ids: list[int], ar: list[int], spec: list[int], near_tie: float) -> Optional[Divergence]:
    i = metrics.first_divergence(ar, spec)
    if i is None:
        return None
    before = ar[max(0, i - CONTEXT_TOKENS):i]
    tok = lambda ids: ids[i] if i < len(ids) else None  # noqa: E731
    gap = _top2_gap(target, prompt_ids + ar[:i])
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

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fit"] = self.fit.to_dict()
        return d


def _first_drafted_step(engine: SpeculativeEngine, ids: list[int], cfg: DecodeConfig, given: Optional[int]) -> Optional[StepEvent]:
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


def sampling_fidelity(engine: SpeculativeEngine, target: LoadedModel, candidates: list[tuple[object, list[int]]],
                      options: CheckOptions, tick: Callable[[int], None]) -> Fidelity:
    """The first emitted token of the first drafted step over seeds 0, 1, ... against warp(target logits).
    Feature-reading drafters (EAGLE) first need the target's prefill, which drafts nothing: for them the
    test conditions on the prefill emitting the target's most likely first token, and counts the next step."""
    cfg = DecodeConfig(method="vanilla", gamma=options.gamma, temperature=options.temperature,
                       max_new_tokens=options.max_new_tokens)
    # a drafter reading the target's features has none before the target's prefill, so it drafts from step 2
    after_prefill = bool(getattr(engine.drafter.session(target.vocab_size, target.eos_ids), "needs_features", False))
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
        event = _first_drafted_step(engine, ids, cfg.with_(seed=seed), given)
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
                    fit.passed(options.p_value_min), top, seed, None if given is None else target.text_of(given))


# ── 3. does it pay? ─────────────────────────────────────────────────────────────────────────────────

def cost_profile(target: LoadedModel, options: CheckOptions, tick: Callable[[int], None]) -> CostProfile:
    return verify_profile(target, options.profile_sizes, options.profile_context, options.profile_reps, tick)


def speedup_at(alpha: float, gamma: int, c: float, batch: int, profile: CostProfile) -> float:
    """The batching model. Per step, at batch b: AR runs one forward of b tokens, T(b), for b tokens.
    Speculative decoding drafts γ forwards costing c·T(b) each (the draft scales like the target) and
    verifies b·(γ+1) tokens in one forward, T(b(γ+1)), for b·E[tokens per step] tokens. So
    S(b) = E·T(b) / (γ·c·T(b) + T(b(γ+1))). At b = 1 with a flat T this is Leviathan's formula."""
    t_b = profile.time(batch)
    return metrics.expected_tokens_per_step(alpha, gamma) * t_b / (gamma * c * t_b + profile.time(batch * (gamma + 1)))


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
           vocab_ids: Optional[torch.Tensor] = None) -> Payoff:
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
        sp = (a.seconds / a.new_tokens) / (s.seconds / s.new_tokens) if a.new_tokens and s.new_tokens and s.seconds else None
        by_cat.append(GroupStats(cat, len(idx), s.new_tokens, s.alpha, s.tau, sp))
    alpha = spec_all.alpha
    predicted = best_g = best_s = best_hw = best_hw_s = None
    curve, batch_curve = [], []
    if alpha is not None and c is not None and gamma_mean:
        predicted = metrics.predicted_speedup(alpha, round(gamma_mean), c)
        lev = {g: metrics.predicted_speedup(alpha, g, c) for g in range(1, GAMMA_MAX + 1)}
        best_g, best_s = _best(lev)
        hw = {g: speedup_at(alpha, g, c, 1, profile) for g in lev} if profile else {}
        best_hw, best_hw_s = _best(hw)
        curve = [{"gamma": g, "leviathan": lev[g], "with_profile": hw.get(g)} for g in lev]
        if profile:
            g_run = round(gamma_mean)
            for b in options.batch_sizes:
                at_b = {g: speedup_at(alpha, g, c, b, profile) for g in lev}
                g_b, s_b = _best(at_b)
                batch_curve.append({"batch": b, "gamma": g_run, "speedup": at_b[g_run], "best_gamma": g_b,
                                    "best_speedup": s_b, "verify_tokens": b * (g_run + 1),
                                    "extrapolated": b * (g_run + 1) > max(profile.tokens)})
    split = sum((RepeatSplit.of(ids, run) for ids, run in zip(prompt_ids or [], spec_events)), RepeatSplit())
    ar_ids = [t for r in results for t in r.ar_ids]
    covered = drafters.coverage(vocab_ids, ar_ids)
    vocab = None if covered is None else {"size": len(vocab_ids), "coverage": covered}
    return Payoff(gamma_mean, alpha, spec_all.tau, spec_all.alpha_by_position, reached, c, basis,
                  ar_all.tok_per_s, spec_all.tok_per_s, speedup, speedup_total, predicted, best_g, best_s, best_hw, best_hw_s,
                  by_cat, curve, profile, batch_curve, split.to_dict(), vocab)


# ── the whole check ─────────────────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class CheckReport:
    verdict: str                 # one line: "correct; 1.7× faster at γ=4 on this machine" or what failed
    correct: bool
    problems: list[str]
    target: str
    drafter: str
    method: str
    environment: dict
    options: dict
    compatibility: Compatibility
    prompts: list[PromptResult]
    near_ties: int
    fidelity: Fidelity
    synthetic: list[stats.SyntheticCase]
    payoff: Payoff
    seconds: dict                # wall seconds per part

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict, "correct": self.correct, "problems": self.problems,
            "target": self.target, "drafter": self.drafter, "method": self.method,
            "environment": self.environment, "options": self.options,
            "compatibility": self.compatibility.to_dict(),
            "greedy": {"identical_all": all(r.identical for r in self.prompts), "near_ties": self.near_ties,
                       "verify_logit_max_abs_diff": max((r.verify_logit_max_abs_diff for r in self.prompts), default=0.0),
                       "judged_positions": sum(r.judged_positions for r in self.prompts),
                       "guarantee": self.environment.get("guarantee"),
                       "prompts": [r.to_dict() for r in self.prompts]},
            "fidelity": self.fidelity.to_dict(),
            "synthetic": [c.to_dict() for c in self.synthetic],
            "payoff": self.payoff.to_dict(),
            "seconds": self.seconds,
        }


def _environment(target: LoadedModel) -> dict:
    import transformers

    return {"device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
            "attention": target.attention, "pad_one_row": target.pad_one_row, "guarantee": target.guarantee,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}"}


def conclude(prompts: list[PromptResult], fidelity: Fidelity, synthetic: list[stats.SyntheticCase], pay: Payoff,
             options: CheckOptions) -> tuple[bool, list[str], str]:
    problems = []
    for r in prompts:
        d = r.divergence
        if d and not d.near_tie:
            problems.append(f"greedy output differs from AR on prompt {r.id} at token {d.index} "
                            f"({d.ar_token!r} vs {d.spec_token!r}, top-2 gap {d.top2_gap:.3g})")
    f = fidelity.fit
    if not fidelity.passed:
        why = (f"{f.impossible} impossible tokens" if f.impossible else
               f"p={f.p_value:.2g}" + (f", TV {f.tv:.3f} > bound {f.tv_bound:.3f}" if f.tv > f.tv_bound else ""))
        problems.append(f"sampling is not exact: first-token distribution over {f.n} seeds differs from the target's ({why})")
    for case in synthetic:
        if not case.ok:
            problems.append(f"synthetic p/q case {case.name} " + ("not detected" if case.planted_bug else
                            f"failed (p={case.fit.p_value:.2g}, TV {case.fit.tv:.3f})"))
    if problems:
        extra = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return False, problems, f"INCORRECT: {problems[0]}{extra}"
    ties = sum(1 for r in prompts if r.divergence)
    head = "correct" + (f" (greedy near-tie flips on {ties} prompt{'s' * (ties != 1)}, gap < {options.near_tie:g})" if ties else "")
    if pay.speedup is None:
        return True, [], f"{head}; no speed measured"
    g = f"γ={round(pay.gamma_mean)}" if pay.gamma_mean else "γ=?"
    g += " (auto)" if options.gamma == "auto" else ""
    speed = f"{pay.speedup:.2f}× faster" if pay.speedup >= 1 else f"{pay.speedup:.2f}× (slower than AR)"
    return True, [], f"{head}; {speed} at {g} on this machine"


def run_check(target: LoadedModel, drafter: Drafter, draft: Optional[LoadedModel] = None,
              prompts: Optional[list[dict]] = None, options: Optional[CheckOptions] = None,
              progress: Optional[Progress] = None, method: Optional[str] = None) -> CheckReport:
    """Run the three parts in order; raise ModelError (one line) when the draft is incompatible.
    `draft` is the model whose tokenizer is compared (None: a drafter without one, like prompt lookup);
    prompts are rows {id, category, prompt} (default: DEFAULT_PROMPTS)."""
    options = options or CheckOptions()
    prompts = prompts or DEFAULT_PROMPTS
    report = progress or (lambda stage, done, total: None)
    method = method or ("pld" if isinstance(drafter, PromptLookupDrafter) else "vanilla")
    seconds = {}

    compat = compare_tokenizers(target, draft)
    if not compat.ok:
        raise ModelError(compat.message)
    for row in prompts:
        check_prompt(row["prompt"])
    spec = SpeculativeEngine(method, target, drafter)
    ar = AREngine(target)
    greedy = DecodeConfig(method=method, gamma=options.gamma, temperature=0.0, max_new_tokens=options.max_new_tokens)
    encoded = [target.encode_prompt(r["prompt"]) for r in prompts]
    warm = greedy.with_(max_new_tokens=4)  # first-call allocations are not billed to either engine
    for engine in (ar, spec):
        list(engine.steps(encoded[0], warm))

    t0 = time.perf_counter()
    report(STAGES[0], 0, len(prompts))
    results, ar_runs, spec_runs = [], [], []
    for k, (row, ids) in enumerate(zip(prompts, encoded)):
        ar_events = list(ar.steps(ids, greedy.with_(method="ar")))
        run = spec.start(ids, greedy)
        run.target.trace = []
        spec_events = []
        while run.finish_reason is None:
            spec_events.append(spec.cycle(run).event)
        ar_ids = [t.token_id for e in ar_events for t in e.emitted]
        spec_ids = [t.token_id for e in spec_events for t in e.emitted]
        div = _divergence(target, ids, ar_ids, spec_ids, options.near_tie)
        logit_diff, judged = verify_logit_diff(target, ids, spec_ids, run.target.trace)
        results.append(PromptResult(row.get("id", k + 1), str(row.get("category", "-")), row["prompt"], len(ids),
                                    target.decode(ar_ids), ar_ids, spec_ids, div is None, div,
                                    metrics.compare(ar_events, spec_events, method, True), logit_diff, judged))
        ar_runs.append(ar_events)
        spec_runs.append(spec_events)
        report(STAGES[0], k + 1, len(prompts))
    seconds["greedy"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    report(STAGES[1], 0, options.samples)
    candidates = [(r.get("id", k + 1), ids) for k, (r, ids) in enumerate(zip(prompts, encoded))]
    fidelity = sampling_fidelity(spec, target, candidates, options,
                                 lambda done: report(STAGES[1], done, options.samples))
    seconds["fidelity"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    cases = stats.SYNTHETIC_CASES if options.synthetic_samples else ()
    report(STAGES[2], 0, len(cases))
    synthetic = []
    for k, case in enumerate(cases):
        synthetic.append(stats.synthetic_case(case, options.synthetic_samples))
        report(STAGES[2], k + 1, len(cases))
    seconds["synthetic"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    report(STAGES[3], 0, len(options.profile_sizes))
    profile = cost_profile(target, options, lambda done: report(STAGES[3], done, len(options.profile_sizes)))
    seconds["profile"] = time.perf_counter() - t0

    trained = getattr(drafter, "drafter", None)  # a trained drafter (drafters.Drafter), whose vocabulary may be compressed
    pay = payoff(results, ar_runs, spec_runs, profile, options, encoded, getattr(trained, "vocab_ids", None))
    correct, problems, verdict = conclude(results, fidelity, synthetic, pay, options)
    opts = asdict(options)
    return CheckReport(verdict, correct, problems, target.name, getattr(drafter, "name", type(drafter).__name__),
                       method, _environment(target), opts, compat, results,
                       sum(1 for r in results if r.divergence and r.divergence.near_tie), fidelity, synthetic, pay,
                       seconds)
