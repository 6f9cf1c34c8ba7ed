"""Why a drafter misses: step events -> a plain dict (JSON-ready). No torch here.

    analysis = misses.analyse([(category, events), ...])   # one (category, events) per prompt, events in order

What it holds:
- accepted_length: steps that kept 0, 1, 2, ... drafts (the accepted path's length), overall and per category;
  only steps where the target judged a draft count (the prefill and steps that drafted nothing are left out);
- the refusals: each step that refused a draft, with the target's top-1 − top-2 probability gap at that position
  (DraftToken.p_top1/p_top2, from the target's distribution as verification warped it: plain softmax when greedy);
  a gap below NEAR_TIE is a near tie, where the target did not care which token came, against a real disagreement;
- contexts: each judged position classed by its context (CONTEXTS: "after a newline", "digits", "punctuation", ...),
  with how many refusals fell there, out of how many judged positions; and the tokens missed most (the target's own
  token at a refusal, what the drafter should have drafted), each with its context class;
- position: acceptance by draft position i (0-based here, 1-based when shown), both
  conditional α_i = P(position i kept | positions before it kept) = kept at i / judged at i, and
  unconditional P(position i kept) = kept at i / steps that drafted position i.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from specviz.events import StepEvent, Verdict

NEAR_TIE = 0.1  # a refusal is a near tie when the target's top-1 − top-2 probability there is below this
TOP = 10        # most-missed tokens listed
CONTEXT_CHARS = 24  # text kept before a missed token, for the report
GAP_BINS = 10   # the refusal gaps' histogram: [0, 0.1), [0.1, 0.2), ... [0.9, 1]

# context classes, in the order a position is tested against them (the first that fits names it)
CONTEXTS = {
    "start of the answer": "the answer's first token (nothing of it before)",
    "after a newline": "the token after a line break (the line's first token, indentation included)",
    "newline": "the target's token is (or holds) a line break",
    "whitespace": "spaces or tabs only",
    "digits": "a number, or its first digits",
    "punctuation": "punctuation or symbols only",
    "start of a word": "a word's first piece (after a space or punctuation)",
    "inside a word": "a later piece of a word",
}


def context_class(before: str, token: str) -> str:
    """The class of the target's token `token` after the answer text `before` (CONTEXTS, first match)."""
    if not before:
        return "start of the answer"
    if before.rstrip(" \t").endswith("\n"):
        return "after a newline"
    if "\n" in token or "\r" in token:
        return "newline"
    stripped = token.strip()
    if not stripped:
        return "whitespace"
    if stripped[0].isdigit():
        return "digits"
    if not any(c.isalnum() for c in stripped):
        return "punctuation"
    if token[0].isspace() or not before[-1].isalnum():
        return "start of a word"
    return "inside a word"


def _judged(e: StepEvent) -> list:
    return [d for d in e.drafts if d.verdict in (Verdict.ACCEPTED, Verdict.REJECTED)]


def _ratio(num: int, den: int) -> Optional[float]:
    return num / den if den else None


def _padded(counts: Counter, size: int) -> list[int]:
    return [counts.get(i, 0) for i in range(size)]


@dataclass
class _Tally:
    """What analyse() counts while it walks the steps."""
    lengths: Counter = field(default_factory=Counter)
    by_cat: dict = field(default_factory=dict)     # category -> Counter of accepted lengths
    drafted: Counter = field(default_factory=Counter)  # per draft position
    judged: Counter = field(default_factory=Counter)
    kept: Counter = field(default_factory=Counter)
    positions: Counter = field(default_factory=Counter)    # per context class
    refusals_at: Counter = field(default_factory=Counter)
    missed: Counter = field(default_factory=Counter)       # (class, token text) -> refusals
    ties_of: Counter = field(default_factory=Counter)      # (class, token text) -> of them near ties
    instead: dict = field(default_factory=dict)            # (class, token text) -> what the drafter drafted there
    example: dict = field(default_factory=dict)            # (class, token text) -> the text before its first refusal
    gaps: list = field(default_factory=list)
    refusals: int = 0
    unknown_gap: int = 0
    depth_max: int = 0

    def refusal(self, cls: str, tok: str, draft, before: str, near_tie: float) -> None:
        self.refusals += 1
        self.refusals_at[cls] += 1
        key = (cls, tok)
        self.missed[key] += 1
        self.instead.setdefault(key, Counter())[draft.text] += 1
        self.example.setdefault(key, before[-CONTEXT_CHARS:])
        if draft.p_top1 is None or draft.p_top2 is None:
            self.unknown_gap += 1
        else:
            gap = draft.p_top1 - draft.p_top2
            self.gaps.append(gap)
            self.ties_of[key] += gap < near_tie


def analyse(runs: Iterable[tuple[str, Sequence[StepEvent]]], near_tie: float = NEAR_TIE, top: int = TOP) -> dict:
    """Every run's steps, in order, each run labelled by its prompt's category (see the module docstring)."""
    t = _Tally()
    for category, events in runs:
        cat = t.by_cat.setdefault(str(category), Counter())
        text = ""  # the answer so far
        for e in events:
            judged_here = _judged(e)
            if judged_here:
                n_kept = e.n_accepted
                depth = 1 + max(d.depth for d in e.drafts)
                t.depth_max = max(t.depth_max, depth)
                t.lengths[n_kept] += 1
                cat[n_kept] += 1
                t.drafted.update(range(depth))
                judged_depths = sorted({d.depth for d in judged_here})
                t.judged.update(judged_depths)
                t.kept.update(i for i in judged_depths if i < n_kept)
                before = text
                for i in judged_depths:  # the target's token at each judged position, in its context
                    if i >= len(e.emitted):
                        break
                    tok = e.emitted[i].text
                    cls = context_class(before, tok)
                    t.positions[cls] += 1
                    refused = [d for d in judged_here if d.verdict is Verdict.REJECTED and d.depth == i]
                    if refused and i == n_kept and e.emitted[i].verdict is Verdict.RESAMPLED:
                        t.refusal(cls, tok, refused[0], before, near_tie)
                    before += tok
            text += "".join(x.text for x in e.emitted)
    return _summarise(t, near_tie, top)


def _summarise(t: _Tally, near_tie: float, top: int) -> dict:
    size, gaps, refusals = t.depth_max + 1, t.gaps, t.refusals
    ties = sum(g < near_tie for g in gaps)
    gap_hist = Counter(min(int(g * GAP_BINS), GAP_BINS - 1) for g in gaps)
    contexts = [{"context": cls, "refusals": t.refusals_at[cls], "positions": t.positions[cls],
                 "miss_rate": _ratio(t.refusals_at[cls], t.positions[cls]),
                 "share": _ratio(t.refusals_at[cls], refusals)}
                for cls in CONTEXTS if t.positions[cls]]
    contexts.sort(key=lambda c: (-c["refusals"], -(c["miss_rate"] or 0.0)))
    top_missed = [{"token": tok, "context": cls, "refusals": n, "near_ties": t.ties_of[(cls, tok)],
                   "drafted_instead": t.instead[(cls, tok)].most_common(1)[0][0], "before": t.example[(cls, tok)]}
                  for (cls, tok), n in sorted(t.missed.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    steps = sum(t.lengths.values())
    depth_max = t.depth_max
    return {
        "near_tie_threshold": near_tie,
        "steps": steps,
        "accepted_length": _padded(t.lengths, size) if steps else [],
        "accepted_length_by_category": {c: _padded(n, size) for c, n in t.by_cat.items()} if steps else {},
        "mean_accepted": _ratio(sum(k * n for k, n in t.lengths.items()), steps),
        "refusals": refusals,
        "near_ties": ties,
        "disagreements": len(gaps) - ties,
        "gap_unknown": t.unknown_gap,
        "near_tie_share": _ratio(ties, len(gaps)),
        "gap_histogram": [gap_hist.get(i, 0) for i in range(GAP_BINS)] if gaps else [],
        "gap_median": sorted(gaps)[len(gaps) // 2] if gaps else None,
        "contexts": contexts,
        "top_missed": top_missed,
        "position": {
            "drafted": _padded(t.drafted, depth_max), "judged": _padded(t.judged, depth_max),
            "kept": _padded(t.kept, depth_max),
            "conditional": [_ratio(t.kept[i], t.judged[i]) for i in range(depth_max)],
            "unconditional": [_ratio(t.kept[i], t.drafted[i]) for i in range(depth_max)],
        },
    }


def summary_line(a: dict) -> str:
    """One line: the near-tie share of the refusals and the context missed most."""
    if not a["steps"]:
        return "why it misses: no step judged a draft"
    if not a["refusals"]:
        return f"why it misses: no refusal in {a['steps']} steps"
    share = a["near_tie_share"]
    ties = ("top-2 gap unknown" if share is None else
            f"{share:.0%} near ties (target's top-1 − top-2 probability < {a['near_tie_threshold']:g}), "
            f"{1 - share:.0%} real disagreements")
    first = a["contexts"][0] if a["contexts"] else None
    most = (f"; missed most {first['context']} ({first['refusals']} of {a['refusals']} refusals, "
            f"{first['miss_rate']:.0%} of its {first['positions']} positions)" if first and first["refusals"] else "")
    return f"why it misses: {a['refusals']} refusals in {a['steps']} steps, {ties}{most}"
