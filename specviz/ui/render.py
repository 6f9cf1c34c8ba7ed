"""Events -> coloured token spans, as HTML (app) or ANSI (terminal). No torch here.

A speculative pane shows what the drafter proposed as well as what was kept: accepted drafts,
then the rejected draft and the discarded ones after it (struck through), then the target's own
resampled or bonus token. Colour always comes with a second cue (underline, strike, bold, fade).
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Iterable, Optional

from specviz.events import StepEvent, Verdict

# Okabe-Ito, a colour-blind-safe palette
COLOURS = {
    Verdict.ACCEPTED: "#009E73",   # bluish green, underlined
    Verdict.REJECTED: "#D55E00",   # vermillion, struck through
    Verdict.DISCARDED: "#8C8C8C",  # grey, struck through, faded
    Verdict.RESAMPLED: "#E69F00",  # orange, bold
    Verdict.BONUS: "#0072B2",      # blue, bold
    Verdict.PLAIN: "inherit",
}
MEANINGS = {
    Verdict.ACCEPTED: "drafted, kept by the target",
    Verdict.REJECTED: "drafted, refused by the target",
    Verdict.DISCARDED: "drafted after a refusal, never judged",
    Verdict.RESAMPLED: "the target's own token at the refused position",
    Verdict.BONUS: "the target's extra token when all drafts were kept",
    Verdict.PLAIN: "plain autoregressive token",
}


@dataclass(frozen=True)
class Span:
    text: str
    verdict: Verdict
    step: int
    q_draft: Optional[float] = None
    p_target: Optional[float] = None
    accept_prob: Optional[float] = None

    @property
    def tooltip(self) -> str:
        parts = [f"{self.verdict.value} (step {self.step + 1})"]
        if self.q_draft is not None:
            parts.append(f"q_draft={self.q_draft:.3f}")
        if self.p_target is not None:
            parts.append(f"p_target={self.p_target:.3f}")
        if self.accept_prob is not None:
            parts.append(f"accept prob min(1, p/q)={self.accept_prob:.3f}")
        return " · ".join(parts)


def spans(events: Iterable[StepEvent]) -> list[Span]:
    """Every token worth showing, in reading order: a step's kept drafts, then its refused and
    discarded drafts, then the target's own resampled token that replaced them (or the bonus)."""
    out: list[Span] = []
    for e in events:
        by_depth = {d.depth: d for d in e.drafts if d.verdict is Verdict.ACCEPTED}
        kept = []
        for i, t in enumerate(e.emitted):
            d = by_depth.get(i) if t.verdict is Verdict.ACCEPTED else None
            kept.append(Span(t.text, t.verdict, e.step, d.q_draft if d else None, t.p_target,
                             d.accept_prob if d else None))
        dropped = [Span(d.text, d.verdict, e.step, d.q_draft, d.p_target, d.accept_prob)
                   for d in e.drafts if d.verdict in (Verdict.REJECTED, Verdict.DISCARDED)]
        if kept and kept[-1].verdict is Verdict.RESAMPLED:
            out += kept[:-1] + dropped + kept[-1:]
        else:
            out += kept + dropped
    return out


def to_html(items: list[Span]) -> str:
    """Spans as HTML; every token carries data-verdict and a hover title."""
    parts = []
    for s in items:
        text = html.escape(s.text).replace("\n", "↵<br>") if s.text else "∅"
        parts.append(f'<span class="sv-tok sv-{s.verdict.value}" data-verdict="{s.verdict.value}" '
                     f'title="{html.escape(s.tooltip)}">{text}</span>')
    return "".join(parts)


def legend_html() -> str:
    items = []
    for v in (Verdict.ACCEPTED, Verdict.REJECTED, Verdict.DISCARDED, Verdict.RESAMPLED, Verdict.BONUS):
        items.append(f'<span class="sv-legend-item"><span class="sv-tok sv-{v.value}" data-verdict="{v.value}">'
                     f'{v.value}</span> {html.escape(MEANINGS[v])}</span>')
    return '<div class="sv-legend" id="legend">' + "".join(items) + "</div>"


CSS = """
.sv-pane { font-family: ui-monospace, 'DejaVu Sans Mono', Menlo, monospace; font-size: 17px; line-height: 1.7;
  white-space: pre-wrap; word-break: break-word; }
.sv-tok { border-radius: 3px; padding: 0 1px; }
.sv-accepted { color: #007A5A; background: rgba(0,158,115,0.12); text-decoration: underline; text-decoration-thickness: 2px; }
.sv-rejected { color: #D55E00; background: rgba(213,94,0,0.10); text-decoration: line-through; text-decoration-thickness: 2px; }
.sv-discarded { color: #8C8C8C; text-decoration: line-through; opacity: 0.6; }
.sv-resampled { color: #B77A00; background: rgba(230,159,0,0.15); font-weight: 700; }
.sv-bonus { color: #0072B2; background: rgba(0,114,178,0.12); font-weight: 700; }
.sv-plain { color: inherit; }
.sv-legend { display: flex; flex-wrap: wrap; gap: 6px 18px; font-size: 15px; }
.sv-legend-item { white-space: nowrap; }
"""

ANSI = {
    Verdict.ACCEPTED: "\x1b[32;4m",   # green, underlined
    Verdict.REJECTED: "\x1b[31;9m",   # red, struck through
    Verdict.DISCARDED: "\x1b[90;9;2m",  # grey, struck, faint
    Verdict.RESAMPLED: "\x1b[33;1m",  # orange/yellow, bold
    Verdict.BONUS: "\x1b[34;1m",      # blue, bold
    Verdict.PLAIN: "",
}
RESET = "\x1b[0m"


def to_ansi(items: list[Span], colour: bool = True) -> str:
    if not colour:
        return "".join(s.text for s in items if s.verdict not in (Verdict.REJECTED, Verdict.DISCARDED))
    return "".join(f"{ANSI[s.verdict]}{s.text}{RESET}" if ANSI[s.verdict] else s.text for s in items)


def legend_ansi() -> str:
    return "  ".join(f"{ANSI[v]}{v.value}{RESET}" for v in
                     (Verdict.ACCEPTED, Verdict.REJECTED, Verdict.DISCARDED, Verdict.RESAMPLED, Verdict.BONUS))
