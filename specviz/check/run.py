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
   from which the speedup is predicted as the batch grows;
4. why it misses (misses.py, over the greedy runs): the accepted-length histogram, the target's top-2 gap at each
   refusal (near ties against real disagreements), the contexts and tokens missed most, acceptance by position.

The CLI (`python -m specviz check`) and the app both call run_check; report.py renders the HTML.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from specviz import methods, metrics
from specviz.check import misses, stats
from specviz.check.measure import (
    Fidelity,
    Payoff,
    PromptResult,
    cost_profile,
    divergence,
    payoff,
    race_engine,
    sampling_fidelity,
    verify_logit_diff,
)
from specviz.check.options import CheckOptions, gamma_words
from specviz.config import DecodeConfig, check_prompt
from specviz.drafters import trained as drafters
from specviz.drafters.config import check_kind
from specviz.engines.ar import AREngine
from specviz.engines.pld import PromptLookupDrafter
from specviz.engines.speculative import ChainDrafter, SpeculativeEngine
from specviz.errors import ConfigError
from specviz.methods import CHECK_METHODS
from specviz.models.drafts import COMPRESSED_DRAFTS, int8_copy
from specviz.models.loader import LoadedModel, ModelError

Progress = Callable[[str, int, int], None]  # (stage, done, total); called with done=0 when a stage starts

STAGES = ("greedy identity", "sampling fidelity", "synthetic p/q", "hardware profile")

# A small built-in prompt set across categories (our evaluation set is never used by default).
DEFAULT_PROMPTS = [
    {"id": "qa-1", "category": "qa", "prompt": "Why is the sky blue? Answer in two sentences."},
    {"id": "writing-1", "category": "writing", "prompt": "Write a short poem about a lighthouse keeper."},
    {"id": "math-1", "category": "math",
     "prompt": "A train travels 120 km in 1.5 hours. What is its average speed? Show the steps."},
    {"id": "code-1", "category": "coding", "prompt": "Write a Python function that returns the n-th Fibonacci number."},
    {"id": "summary-1", "category": "summarization", "prompt": (
        "Summarize in one sentence: The city council met on Tuesday to discuss the new bike lanes. "
        "The bike lanes would connect the train station to the university. Council members agreed that the "
        "bike lanes are safer, but some shop owners worry that the bike lanes remove parking spaces.")},
    {"id": "rewrite-1", "category": "rewriting", "prompt": (
        "Correct the spelling in this sentence and repeat it: 'The quick brown fox jumpd over the lazzy dog "
        "and then the quick brown fox ran into the forrest.'")},
]


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


CHECKED_TRAINED = methods.names(lambda s: s.checkable and s.trained)


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
                             f"target {target.name!r} {target.vocab_size}: the draft must score every target token",
                             **comp)
    note = "" if not mismatch else f" (special tokens differ: {', '.join(mismatch)})"
    return Compatibility(True, f"same vocabulary: {names}{note}", **comp)


def drafter_for(method: str, target: LoadedModel,
                draft_spec: Optional[str]) -> tuple[ChainDrafter, Optional[LoadedModel]]:
    """The drafter for `method` and the draft model whose tokenizer is compared (None for prompt lookup and
    the trained drafters, which draft in the target's own vocabulary). A separate draft is loaded without
    the tokenizer check: compare_tokenizers reports it in full."""
    from specviz.models import loader as models

    entry = methods.METHODS.get(method)
    if entry is None or not entry.checkable:
        raise ConfigError(f"method={method!r} cannot be checked: use one of {', '.join(CHECK_METHODS)}")
    if entry.trained:
        from specviz import engines

        folder = engines.drafter_folder(method, target, draft_spec)
        d = drafters.load(folder, target)
        check_kind(d.kind, method, str(folder))
        return methods.load(entry.drafter)(d, str(folder)), None
    if not entry.uses_draft_model:  # prompt lookup: no weights
        return methods.load(entry.drafter)(), None
    spec = draft_spec or "int8"
    draft = int8_copy(target) if spec in COMPRESSED_DRAFTS else models.get(spec, target.device, target.dtype)
    return methods.load(entry.drafter)(draft), draft


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
    misses: dict = field(default_factory=dict)  # why it misses, over the greedy runs (check/misses.py)

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict, "correct": self.correct, "problems": self.problems,
            "target": self.target, "drafter": self.drafter, "method": self.method,
            "environment": self.environment, "options": self.options,
            "compatibility": self.compatibility.to_dict(),
            "greedy": {"identical_all": all(r.identical for r in self.prompts), "near_ties": self.near_ties,
                       "verify_logit_max_abs_diff": max((r.verify_logit_max_abs_diff for r in self.prompts),
                                                        default=0.0),
                       "judged_positions": sum(r.judged_positions for r in self.prompts),
                       "guarantee": self.environment.get("guarantee"),
                       "prompts": [r.to_dict() for r in self.prompts]},
            "fidelity": self.fidelity.to_dict(),
            "synthetic": [c.to_dict() for c in self.synthetic],
            "payoff": self.payoff.to_dict(),
            "misses": self.misses,
            "seconds": self.seconds,
        }


def _environment(target: LoadedModel) -> dict:
    import transformers

    return {"device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
            "attention": target.attention, "pad_one_row": target.pad_one_row, "guarantee": target.guarantee,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}"}


RARELY_KEPT = 0.05  # a correct drafter whose α is below this is named as one that almost never guesses right


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
        problems.append(f"sampling is not exact: first-token distribution over {f.n} seeds differs from the target's "
                        f"({why})")
    for case in synthetic:
        if not case.ok:
            problems.append(f"synthetic p/q case {case.name} " + ("not detected" if case.planted_bug else
                            f"failed (p={case.fit.p_value:.2g}, TV {case.fit.tv:.3f})"))
    if problems:
        extra = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return False, problems, f"INCORRECT: {problems[0]}{extra}"
    ties = sum(1 for r in prompts if r.divergence)
    head = "correct" + (f" (greedy near-tie flips on {ties} prompt{'s' * (ties != 1)}, gap < {options.near_tie:g})"
                        if ties else "")
    if pay.speedup is None:
        return True, [], f"{head}; no speed measured"
    g = gamma_words(options.gamma, pay.gamma_mean)
    speed = (f"{pay.speedup:.2f}× faster than specviz AR" if pay.speedup >= 1
             else f"{pay.speedup:.2f}× (slower than specviz AR)")
    rarely = ("" if pay.alpha is None or pay.alpha >= RARELY_KEPT else
              f"; the target kept {pay.alpha:.0%} of its guesses: is it trained for this target, and long enough?")
    return True, [], f"{head}; {speed} at {g} on this machine{rarely}"


def run_check(target: LoadedModel, drafter: ChainDrafter, draft: Optional[LoadedModel] = None,
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
        div = divergence(target, ids, ar_ids, spec_ids, options.near_tie)
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
    fidelity = sampling_fidelity(race_engine(method, target, spec), target, candidates, options,  # a tree as raced
                                 lambda done: report(STAGES[1], done, options.samples), DecodeConfig(method=method))
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

    # a trained drafter (drafters.Drafter), whose vocabulary may be compressed
    trained = getattr(drafter, "drafter", None)
    block = trained.cfg.block_size if trained is not None and metrics.drafts_block(method) else 0
    pay = payoff(results, ar_runs, spec_runs, profile, options, encoded, getattr(trained, "vocab_ids", None), block)
    correct, problems, verdict = conclude(results, fidelity, synthetic, pay, options)
    opts = asdict(options)
    return CheckReport(verdict, correct, problems, target.name, getattr(drafter, "name", type(drafter).__name__),
                       method, _environment(target), opts, compat, results,
                       sum(1 for r in results if r.divergence and r.divergence.near_tie), fidelity, synthetic, pay,
                       seconds, misses.analyse((r.category, events) for r, events in zip(results, spec_runs)))
