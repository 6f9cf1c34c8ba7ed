"""Events -> numbers. Definitions (DESIGN.md): α = accepted / judged drafted tokens (ACCEPTANCE); τ = tokens
emitted per target forward (the resampled/bonus token included; AR has τ = 1); tok/s = emitted tokens / engine
compute seconds; c = seconds of one draft forward / seconds of one AR target forward. Where the kept guesses came
from (the drafter, prompt lookup, the datastore) and why a measured speedup differs from its prediction: why_line.
No torch here."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional

from specviz import methods
from specviz.errors import ConfigError
from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD, StepEvent, Verdict
from specviz.methods import drafts_block

# The one definition of acceptance that the race, bench, check and the app's summary show (RunSummary.alpha) ...
ACCEPTANCE = ("α = drafted tokens the target kept / drafted tokens it judged (kept or refused): a chain's drafts up "
              "to its first refusal, a tree's nodes on the verified path and the refused children of its end")
# ... and the one the app's /metrics exports and Watch shows (RunSummary.proposed), as vLLM counts it
PROPOSED_ACCEPTANCE = ("kept / every drafted token, judged or not (a chain's γ, a tree's every node), as vLLM's "
                       "spec_decode counters and the app's /metrics count them")
# where a kept guess came from (source_of): the trained or draft model, prompt lookup's copies, the datastore
DRAFTER, LOOKUP, DATASTORE = "drafter", "lookup", "datastore"


@dataclass(frozen=True)
class RunSummary:
    method: str
    new_tokens: int
    steps: int                      # target forwards
    seconds: float                  # engine compute seconds (draft + verify)
    draft_s: float
    verify_s: float
    draft_forwards: int
    drafted: int                    # drafted tokens judged by the target (accepted + rejected)
    accepted: int
    tok_per_s: float
    alpha: Optional[float]          # None when nothing was drafted
    tau: float
    alpha_by_position: list[Optional[float]] = field(default_factory=list)  # α_i, i from 0 (DESIGN.md)
    reached_by_position: list[int] = field(default_factory=list)  # the steps α_i counts: a draft judged at i
    finish_reason: Optional[str] = None
    proposed: int = 0               # every drafted token, judged or not (PROPOSED_ACCEPTANCE: accepted / proposed)
    kept_from: dict[str, int] = field(default_factory=dict)  # accepted drafted tokens by source_of (0: it proposed
                                                             # guesses, none kept)

    @property
    def proposed_acceptance(self) -> Optional[float]:
        """accepted / every drafted token (PROPOSED_ACCEPTANCE): what /metrics and Watch show for this run."""
        return _ratio(self.accepted, self.proposed)

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(a: float, b: float) -> Optional[float]:
    return a / b if b else None


def source_of(d, method: str) -> str:
    """Where drafted token `d` came from: a grafted branch's source (prompt lookup, the datastore), prompt lookup for
    a lookup method's chain, else the method's drafter. A guess two sources shared is its first proposer's (the
    drafter's: grafting follows the nodes that already carry its tokens)."""
    if d.head == LOOKUP_HEAD:
        return LOOKUP
    if d.head == RETRIEVAL_HEAD:
        return DATASTORE
    try:
        return LOOKUP if methods.spec(method).family == "lookup" else DRAFTER
    except ConfigError:  # a name the registry does not know: its drafter
        return DRAFTER


def summarize(method: str, events: Iterable[StepEvent]) -> RunSummary:
    events = list(events)
    kept_from: dict[str, int] = {}  # every source that proposed a guess, with how many of its guesses were kept
    for e in events:
        for d in e.drafts:
            source = source_of(d, method)
            kept_from[source] = kept_from.get(source, 0) + (d.verdict is Verdict.ACCEPTED)
    new_tokens = sum(len(e.emitted) for e in events)
    seconds = sum(e.seconds for e in events)
    drafted = sum(e.n_judged for e in events)
    accepted = sum(e.n_accepted for e in events)
    # per-position acceptance α_i = P(position i accepted | positions before it accepted), counted by step so that a
    # chain and a tree compare: a step reached position i when the target judged a draft there (so it kept every
    # position before it), and kept i when its verified path is longer than i (a tree keeps at most one node a depth)
    reached: list[int] = []
    kept: list[int] = []
    for e in events:
        for depth in {d.depth for d in e.drafts if d.verdict in (Verdict.ACCEPTED, Verdict.REJECTED)}:
            while len(reached) <= depth:
                reached.append(0)
                kept.append(0)
            reached[depth] += 1
            kept[depth] += e.n_accepted > depth
    return RunSummary(
        method=method,
        new_tokens=new_tokens,
        steps=len(events),
        seconds=seconds,
        draft_s=sum(e.draft_s for e in events),
        verify_s=sum(e.verify_s for e in events),
        draft_forwards=sum(e.draft_forwards for e in events),
        drafted=drafted,
        accepted=accepted,
        tok_per_s=_ratio(new_tokens, seconds) or 0.0,
        alpha=_ratio(accepted, drafted),
        tau=_ratio(new_tokens, len(events)) or 0.0,
        alpha_by_position=[_ratio(k, r) for k, r in zip(kept, reached)],
        reached_by_position=reached,
        finish_reason=events[-1].finish_reason if events else None,
        proposed=sum(len(e.drafts) for e in events),
        kept_from=kept_from,
    )


def cost_ratio(spec: RunSummary, ar: RunSummary) -> Optional[float]:
    """c = seconds of one draft forward / seconds of one AR target forward (None without drafts)."""
    if not spec.draft_forwards or not ar.steps or not ar.seconds:
        return None
    return (spec.draft_s / spec.draft_forwards) / (ar.seconds / ar.steps)


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """Leviathan et al. (2023): E[tokens per target forward] = (1 − α^(γ+1)) / (1 − α)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def alpha_for_tau(tau: float, gamma: int) -> float:
    """The per-token α whose Leviathan expectation over a chain of γ is `tau` (expected_tokens_per_step inverted, by
    bisection): what a served τ says of α, where an engine's acceptance rate counts every drafted token (the drafts
    after a refusal included) and so reads lower than Leviathan's α."""
    if tau <= 1.0:
        return 0.0
    if tau >= gamma + 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_step(mid, gamma) < tau else (lo, mid)
    return (lo + hi) / 2


def draft_cost(gamma: int, c: float, block: bool = False) -> float:
    """A step's drafting in AR steps: γ forwards of c each (Leviathan's γc), or one forward of c for a drafter that
    drafts its whole block at once (DFlash: `block`, methods.MethodSpec.drafts_block)."""
    return c if block else gamma * c


def predicted_speedup(alpha: float, gamma: int, c: float, block: bool = False) -> float:
    """Leviathan et al. (2023): S = (1 − α^(γ+1)) / ((1 − α)(γc + 1)); a block drafter pays c once: E / (c + 1)."""
    return expected_tokens_per_step(alpha, gamma) / (draft_cost(gamma, c, block) + 1.0)


@dataclass(frozen=True)
class CostProfile:
    """Median seconds of one target forward of n new tokens over a KV cache of `context` tokens, as the
    engines run it (python -m specviz profile; specviz/core/profile.py measures it)."""
    device: str
    dtype: str
    attention: str
    context: int
    reps: int
    tokens: list[int]
    seconds: list[float]         # made monotone: a forward of fewer tokens never costs more (noise removed)
    raw_seconds: list[float]     # the medians as measured

    def time(self, n: float) -> float:
        """Seconds for a forward of n tokens: linear between measured sizes, linear beyond the largest
        (past a few dozen tokens a forward is compute-bound and grows in proportion)."""
        xs, ys = self.tokens, self.seconds
        if n <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), ys[-1] / xs[-1]) if len(xs) > 1 else ys[-1]
        return ys[-1] + slope * (n - xs[-1])

    def ratio(self, n: float) -> float:
        """T(n)/T(1): what verifying n tokens costs in one-token steps."""
        return self.time(n) / self.time(1)

    def to_dict(self) -> dict:
        return asdict(self)


def profiled_speedup(alpha: float, gamma: int, c: float, profile: CostProfile, block: bool = False) -> float:
    """Leviathan's prediction with the measured verification cost: E[tokens per step] / (γc + T(γ+1)/T(1)) (c
    once for a block drafter). With a flat T (verification as cheap as one step) it is Leviathan's formula."""
    return expected_tokens_per_step(alpha, gamma) / (draft_cost(gamma, c, block) + profile.ratio(gamma + 1))


def best_gamma(alpha: float, c: float, profile: CostProfile, gammas=range(1, 17), block: bool = False) -> int:
    """The γ with the highest profiled_speedup."""
    return max(gammas, key=lambda g: profiled_speedup(alpha, g, c, profile, block))


@dataclass(frozen=True)
class Comparison:
    """One prompt, two engines, same settings: what the app's summary and the bench rows report."""
    ar: RunSummary
    spec: RunSummary
    speedup: Optional[float]            # AR seconds / method seconds (same tokens)
    cost_ratio: Optional[float]
    mean_gamma: Optional[float]
    predicted_speedup: Optional[float]  # chains: Leviathan's prediction at the measured α, mean γ and c (and
                                        # T(γ+1)/T(1) from the verify profile when there is one); trees:
                                        # tree_prediction, from the measured acceptance of each kind of node
    identical: Optional[bool]           # greedy: token ids equal; None when sampling
    first_divergence: Optional[int]     # index of the first differing token, if any
    prediction_formula: Optional[str] = None  # TREE_FORMULA | CHAIN_FORMULA (None: no prediction)
    gap: Optional["Gap"] = None         # why measured and predicted differ (None without a prediction)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ar"] = self.ar.to_dict()
        d["spec"] = self.spec.to_dict()
        return d


def first_divergence(a: list[int], b: list[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


TREE_FORMULA = "tree: per-node acceptance"
CHAIN_FORMULA = "Leviathan (chain)"


def drafts_tree(method: str, spec_events: Iterable[StepEvent]) -> bool:
    """The race drafted trees: the method's registry entry says so (methods.MethodSpec.tree); for a name the registry
    does not know, its steps hold a node off the chain of positions or a grafted branch (a head < 0)."""
    try:
        return methods.spec(method).tree
    except ConfigError:  # a name the registry does not know: its events decide
        pass
    return any(d.head < 0 or d.depth != i or (d.parent >= 0 and d.parent != i - 1)
               for e in spec_events for i, d in enumerate(e.drafts))


def step_overhead(ar_events: list[StepEvent], spec_events: list[StepEvent], profile: Optional[CostProfile]) -> float:
    """A speculative step's seconds outside its target forward and its drafting (the verdicts, grafting, the cache), in
    AR steps: the median over its decode steps of its seconds less drafting, less T(rows)/T(1) (rows: a full step each
    without a profile), never below 0. specviz/whatif.py's Recorded.bookkeeping measures the same."""
    ar = ar_events[1:]
    ar_tokens = sum(len(e.emitted) for e in ar)
    ar_step = sum(e.seconds for e in ar) / ar_tokens if ar_tokens else 0.0
    steps = [(e.seconds, e.draft_s, 1 + len(e.drafts)) for e in spec_events[1:]]
    return median_overhead(steps, ar_step, profile.ratio if profile else float)


def median_overhead(steps, ar_step: float, ratio) -> float:
    """The median over (seconds, draft seconds, rows) steps of seconds less drafting, in AR steps of `ar_step`
    seconds, less ratio(rows) (the forward); never below 0, and 0 without steps or an AR step."""
    steps = list(steps)
    if not ar_step or not steps:
        return 0.0
    return max(0.0, statistics.median((s - d) / ar_step - ratio(rows) for s, d, rows in steps))


def compare(ar_events: list[StepEvent], spec_events: list[StepEvent], method: str, greedy: bool,
            profile: Optional[CostProfile] = None) -> Comparison:
    ar = summarize("ar", ar_events)
    spec = summarize(method, spec_events)
    ar_ids = [t.token_id for e in ar_events for t in e.emitted]
    spec_ids = [t.token_id for e in spec_events for t in e.emitted]
    # compare speed over the same number of tokens: AR seconds per token x the method's tokens
    speedup = None
    if ar.new_tokens and spec.seconds and ar.seconds:
        speedup = (ar.seconds / ar.new_tokens) / (spec.seconds / spec.new_tokens) if spec.new_tokens else None
    c = cost_ratio(spec, ar)
    gammas = [e.gamma for e in spec_events if e.gamma]
    mean_gamma = sum(gammas) / len(gammas) if gammas else None
    predicted, formula, tokens, cost = None, None, None, None
    if drafts_tree(method, spec_events):
        tree = tree_prediction(spec_events, c or 0.0, profile)  # c None: no drafter forwards to price
        if tree:
            tokens, cost = tree.tokens_per_step, tree.cost_per_step + step_overhead(ar_events, spec_events, profile)
            predicted, formula = tokens / cost, TREE_FORMULA
    elif spec.alpha is not None and c is not None and mean_gamma:
        g, block = round(mean_gamma), drafts_block(method)
        tokens = expected_tokens_per_step(spec.alpha, g)
        cost = draft_cost(g, c, block) + (profile.ratio(g + 1) if profile else 1.0)
        predicted = tokens / cost
        formula = CHAIN_FORMULA
    div = first_divergence(ar_ids, spec_ids) if greedy else None
    identical = (div is None) if greedy else None
    gap = gap_of(ar_events, spec_events, speedup, tokens, cost, profile is not None) if predicted else None
    return Comparison(ar, spec, speedup, c, mean_gamma, predicted, identical, div, formula, gap)


@dataclass(frozen=True)
class Gap:
    """Why a measured speedup differs from its prediction: three factors whose product is measured / predicted.
    tokens: the decode steps' tokens a step / the predicted tokens a step; cost: the predicted cost of a step / its
    measured cost (both in AR decode steps); prefill: the whole run's speedup / its decode steps' alone (the prompt's
    first forward, which speculation cannot shorten, counts in the measured figure only)."""
    tokens: float
    cost: float
    prefill: float
    prefill_share: float  # the share of the speculative lane's seconds its first forward (the prefill) took
    profiled: bool = False  # rows were priced by this machine's verify profile (else each row as a full step)
    undrafted: float = 0.0  # the share of decode steps that drafted nothing (prompt lookup without a match)


def gap_of(ar_events: list[StepEvent], spec_events: list[StepEvent], speedup: Optional[float],
           tokens: Optional[float], cost: Optional[float], profiled: bool = False) -> Optional[Gap]:
    """The Gap of a race whose prediction is `tokens` a step at `cost` AR steps a step (None where either lane has no
    decode step or any figure is missing)."""
    ar, spec = ar_events[1:], spec_events[1:]
    ar_tokens, ar_s = sum(len(e.emitted) for e in ar), sum(e.seconds for e in ar)
    spec_tokens, spec_s = sum(len(e.emitted) for e in spec), sum(e.seconds for e in spec)
    if not (speedup and tokens and cost and ar_tokens and ar_s and spec_tokens and spec_s):
        return None
    tau = spec_tokens / len(spec)
    measured_cost = (spec_s / len(spec)) / (ar_s / ar_tokens)
    total = spec_s + spec_events[0].seconds
    return Gap(tau / tokens, cost / measured_cost, speedup / (tau / measured_cost), spec_events[0].seconds / total,
               profiled, sum(not e.drafts for e in spec) / len(spec))


REPEATS = 0.2      # copies of earlier text (prompt lookup's kept guesses) this share of the answer: it repeats itself
NO_REPEATS = 0.05  # ... below this share, where lookup was asked for: it hardly does
GAP = 0.15         # measured and predicted further apart than this: why_line says why
FACTOR = 0.07      # a Gap factor further from 1 than this is named as a reason


def kept_line(spec: RunSummary, method: str) -> str:
    """Where the kept guesses came from, in words: "61% of kept guesses were copies of earlier text (prompt lookup),
    39% EAGLE's own: this answer repeats itself"."""
    if not spec.proposed:
        return "Nothing was drafted: every token took a full target forward, as plain decoding does"
    if not spec.accepted:
        return "No guess was kept: every step gave one token, as plain decoding does, and paid for the guessing"
    try:
        label = methods.spec(method).label
    except ConfigError:
        label = method
    names = {LOOKUP: "copies of earlier text (prompt lookup)", DRAFTER: f"{label}'s own guesses",
             DATASTORE: "the datastore's continuations of past answers"}
    shares = sorted(((n / spec.accepted, s) for s, n in spec.kept_from.items() if n), reverse=True)
    first, *rest = shares
    if rest:
        line = f"{first[0]:.0%} of kept guesses were {names[first[1]]}"
        line += "".join(f", {share:.0%} {names[s]}" for share, s in rest)
    else:
        line = f"all {spec.accepted} kept guesses were {names[first[1]]}"
    copies = spec.kept_from.get(LOOKUP, 0) / spec.new_tokens if spec.new_tokens else 0.0
    if copies >= REPEATS:
        line += f": this answer repeats itself ({copies:.0%} of it copied)"
    elif LOOKUP in spec.kept_from and copies < NO_REPEATS:
        line += f": this answer hardly repeats itself ({copies:.0%} of it copied)"
    return line


def gap_line(c: Comparison) -> str:
    """Why measured and predicted differ, when they differ by more than GAP ("" otherwise): the Gap's factors
    furthest from 1, in words."""
    if not (c.gap and c.speedup and c.predicted_speedup) or abs(c.speedup / c.predicted_speedup - 1) <= GAP:
        return ""
    g = c.gap
    said = {
        "tokens": (f"kept guesses came in runs (a repeat, once found, keeps matching): {g.tokens - 1:.0%} more "
                   "tokens a step than the average acceptance predicts") if g.tokens > 1 else
                  (f"{1 - g.tokens:.0%} fewer tokens a step than the average acceptance predicts: "
                   + (f"{g.undrafted:.0%} of steps found nothing to guess and gave one token" if g.undrafted > FACTOR
                      else "refusals came early in the steps")),
        "cost": (f"a step cost {1 - 1 / g.cost:.0%} less than priced" + (
                 "" if g.profiled else " (no verify profile here: every row priced as a full step)")) if g.cost > 1 else
                (f"a step cost {1 / g.cost - 1:.0%} more than priced (drafting, verifying, bookkeeping: a busy "
                 "machine, or costs the profile misses)"),
        "prefill": (f"the prompt's first pass, {g.prefill_share:.0%} of the time, cannot be sped up (a short run)"
                    if g.prefill < 1 else "the two lanes' first passes took different times (noise)"),
    }
    factors = sorted(((abs(math.log(f)), k) for k, f in (("tokens", g.tokens), ("cost", g.cost),
                                                          ("prefill", g.prefill)) if abs(f - 1) > FACTOR),
                     reverse=True)[:2]
    side = "faster" if c.speedup > c.predicted_speedup else "slower"
    why = "; ".join(said[k] for _, k in factors) or "no one cause stands out"
    line = (f"Measured ×{c.speedup:.2f} is {side} than predicted from this run's acceptance, "
            f"×{c.predicted_speedup:.2f}: {why}")
    if c.identical is None:
        line += "; sampled, so acceptance is lower than greedy and varies from run to run"
    return line


def cost_line(c: Comparison) -> str:
    """When one draft forward cost at least a plain step (c >= 1), in words: no acceptance makes such a drafter pay
    ("" otherwise)."""
    if c.cost_ratio is None or c.cost_ratio < 1:
        return ""
    return (f"each draft forward cost {c.cost_ratio:.1f}× a plain step here (c ≥ 1): a drafter as dear as the target "
            "cannot pay, however often it is right")


def why_line(c: Comparison) -> str:
    """One plain line, words first: where the kept guesses came from, when a draft forward cost a plain step or more
    (cost_line), and, when measured and predicted differ by more than GAP, why."""
    line = ". ".join(x for x in (kept_line(c.spec, c.spec.method), cost_line(c), gap_line(c)) if x) + "."
    return line[:1].upper() + line[1:]


def vocab_sentence(vocab: dict) -> str:
    """A compressed draft vocabulary's ceiling, from Payoff.draft_vocab: the share of the target's tokens it holds."""
    return (f"draft vocabulary of {vocab['size']} tokens holds {vocab['coverage']:.1%} of the target's tokens here; "
            "it can never draft the rest")


def node_kind(d) -> tuple[int, int, int]:
    """What a tree node's acceptance is pooled by: (its head: the drafter's depth, or a grafted branch's source,
    events.LOOKUP_HEAD / RETRIEVAL_HEAD), its depth and its rank among siblings."""
    return d.head, d.depth, d.rank


def node_acceptance(events: Iterable[StepEvent]) -> dict[tuple[int, int, int], float]:
    """P(node accepted | its parent accepted), per node_kind, measured over a tree run's steps (the root counts as
    accepted). Greedy or sampled alike: a node whose parent was kept either joined the path or did not."""
    reached: dict[tuple[int, int, int], int] = {}
    kept: dict[tuple[int, int, int], int] = {}
    for e in events:
        for d in e.drafts:
            if d.parent >= 0 and e.drafts[d.parent].verdict is not Verdict.ACCEPTED:
                continue
            kind = node_kind(d)
            reached[kind] = reached.get(kind, 0) + 1
            kept[kind] = kept.get(kind, 0) + (d.verdict is Verdict.ACCEPTED)
    return {kind: kept[kind] / n for kind, n in reached.items()}


def tree_expected_tokens(drafts, rates: dict[tuple[int, int, int], float]) -> float:
    """E[tokens a step] for one step's tree: 1 + Σ over nodes of P(every node on its path accepted), with each node
    accepted given its parent at its kind's rate. Exact when the rates are the true conditional ones: the kept nodes
    are one path, so their expected number is the sum of each node's chance of being on it."""
    reach: list[float] = []
    for d in drafts:
        reach.append((reach[d.parent] if d.parent >= 0 else 1.0) * rates.get(node_kind(d), 0.0))
    return 1.0 + sum(reach)


@dataclass(frozen=True)
class TreePrediction:
    tokens_per_step: float      # expected, from the per-node acceptance
    cost_per_step: float        # in AR steps: T(rows)/T(1) from the verify profile (rows without one) + drafting
    speedup: float
    formula: str = "tree"


def tree_prediction(spec_events: list[StepEvent], c: float, profile: Optional[CostProfile] = None
                    ) -> Optional[TreePrediction]:
    """The speedup a tree race predicts from its measured per-node acceptance, its rows a step priced by the
    verify profile (each row a full step without one) and its drafter's cost c per draft forward."""
    steps = [e for e in spec_events[1:] if e.drafts] or [e for e in spec_events if e.drafts]
    if not steps:
        return None
    rates = node_acceptance(steps)
    plain = [e for e in spec_events[1:] if not e.drafts]  # steps that drafted nothing: one row, one token
    tokens = sum(tree_expected_tokens(e.drafts, rates) for e in steps) + len(plain)
    verify = (lambda k: profile.ratio(k)) if profile else float
    cost = sum(verify(1 + len(e.drafts)) + e.draft_forwards * c for e in steps) + len(plain)
    n = len(steps) + len(plain)
    return TreePrediction(tokens / n, cost / n, tokens / cost)
