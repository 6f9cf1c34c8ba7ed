"""Events -> coloured token spans, as HTML (app) or ANSI (terminal). No torch here.

A speculative pane shows what the drafter proposed as well as what was kept: accepted drafts,
then the rejected draft and the discarded ones after it (struck through), then the target's own
resampled or bonus token. Colour always comes with a second cue (underline, strike, bold, fade).

The app's panes read as text (`pane_body_html`): each target forward's tokens share a band, and only the one
refused draft on the verified path stays inline; the drafts never on that path (other branches of a tree,
drafts after a refusal) are marked `off_path`, hidden by the stylesheet (style.css) behind a per-step count
unless "show every draft" is on. A special token (`<|im_end|>`, `</s>`, ...) shows as a small labelled chip ("end of
turn"), the raw token in its hover title, never as raw markup in the text. A step whose drafts one drafter forward
drafted over two or more positions (DFlash's block) is bracketed, with a bar where the target cut it (block_html).
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
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
UNCOMMITTED = (Verdict.REJECTED, Verdict.DISCARDED)  # drafted tokens that are not part of the text
_SPACES = re.compile(r" +")
DECORATED = (Verdict.ACCEPTED, Verdict.REJECTED, Verdict.DISCARDED)  # underlined or struck: their spaces are kept out
# special tokens as tokenizers write them: <|name|> (ChatML, GPT, Llama 3), and the SentencePiece / T5 family's
SPECIAL = re.compile(r"<\|[A-Za-z0-9_.:\- ]{1,40}\|>|</s>|<eos>|<bos>|<pad>|<unk>")
SPECIAL_LABELS = {  # the token's name (without <| |> or < >) -> what a reader is told
    "im_end": "end of turn", "eot_id": "end of turn", "end_of_turn": "end of turn", "eom_id": "end of message",
    "im_start": "start of turn", "start_header_id": "start of header", "end_header_id": "end of header",
    "endoftext": "end of text", "end_of_text": "end of text", "/s": "end of text", "eos": "end of text",
    "begin_of_text": "start of text", "bos": "start of text", "pad": "padding", "unk": "unknown token",
}
CHIP_STYLE = ("display:inline-block;font:600 0.72em/1.3 system-ui,sans-serif;padding:0 5px;margin:0 2px;"
              "border:1px solid currentColor;border-radius:8px;vertical-align:0.12em;opacity:0.85;white-space:nowrap")


def special_label(token: str) -> str:
    """What a chip says for a special token: "end of turn" for <|im_end|>, "special: foo" for one not known."""
    name = token[2:-2] if token.startswith("<|") else token[1:-1]
    return SPECIAL_LABELS.get(name.strip().lower(), f"special: {name.strip()}")


def _text_html(text: str, newline: str) -> str:
    """A token's text as HTML: escaped, newlines shown, special tokens as chips."""
    out, at = [], 0
    for m in SPECIAL.finditer(text):
        out.append(html.escape(text[at:m.start()]).replace("\n", newline))
        out.append(f'<span class="sv-special" style="{CHIP_STYLE}" title="special token {html.escape(m.group())}">'
                   f"{html.escape(special_label(m.group()))}</span>")
        at = m.end()
    out.append(html.escape(text[at:]).replace("\n", newline))
    return "".join(out)


@dataclass(frozen=True)
class Span:
    text: str
    verdict: Verdict
    step: int
    q_draft: Optional[float] = None
    p_target: Optional[float] = None
    accept_prob: Optional[float] = None
    off_path: bool = False  # a draft never on the verified path: another branch, or drafted after the refusal

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


def refusal_index(e: StepEvent) -> Optional[int]:
    """The index in `e.drafts` of the one refused draft on the verified path: the draft the target judged and
    refused where it then wrote its own token (a chain has one; on a tree, the first of the refused children of
    the accepted path's end, the drafter's best-ranked guess there; sampling also refuses siblings higher up, before
    the one it accepted: those are off the path). None when nothing was refused there."""
    end = sum(d.verdict is Verdict.ACCEPTED for d in e.drafts)  # the depth of the path's end's children
    return next((i for i, d in enumerate(e.drafts) if d.verdict is Verdict.REJECTED and d.depth == end), None)


def step_spans(e: StepEvent) -> list[Span]:
    """One step's tokens in reading order: its kept drafts, then its refused and discarded drafts (all but the
    refusal on the verified path marked off_path), then the target's own resampled token (or the bonus)."""
    by_depth = {d.depth: d for d in e.drafts if d.verdict is Verdict.ACCEPTED}
    kept = []
    for i, t in enumerate(e.emitted):
        d = by_depth.get(i) if t.verdict is Verdict.ACCEPTED else None
        kept.append(Span(t.text, t.verdict, e.step, d.q_draft if d else None, t.p_target,
                         d.accept_prob if d else None))
    shown = refusal_index(e)
    dropped = [Span(d.text, d.verdict, e.step, d.q_draft, d.p_target, d.accept_prob, off_path=i != shown)
               for i, d in enumerate(e.drafts) if d.verdict in (Verdict.REJECTED, Verdict.DISCARDED)]
    if kept and kept[-1].verdict is Verdict.RESAMPLED:
        return kept[:-1] + dropped + kept[-1:]
    return kept + dropped


def spans(events: Iterable[StepEvent]) -> list[Span]:
    """Every token worth showing, in reading order: a step's kept drafts, then its refused and
    discarded drafts, then the target's own resampled token that replaced them (or the bonus)."""
    return [s for e in events for s in step_spans(e)]


def to_html(items: list[Span]) -> str:
    """Spans as HTML; every token carries data-verdict and a hover title."""
    return "".join(_token_html(s) for s in items)


def _token_html(s: Span, step: Optional[int] = None) -> str:
    """One token; with `step`, the token is that step's band too (a step of one token)."""
    newline = "↵" if s.verdict in UNCOMMITTED else "↵<br>"  # a refused newline breaks no line of the text
    text = _text_html(s.text, newline) if s.text else "∅"
    if s.verdict in DECORATED and not SPECIAL.search(s.text):
        text = _SPACES.sub(r'<span class="sv-sp">\g<0></span>', text)  # no underline or strike through the spaces
    classes = f"sv-tok sv-{s.verdict.value}" + " sv-off" * s.off_path
    step_attr = ""
    if step is not None:
        classes += f" sv-step sv-band-{step % 2}"
        step_attr = f' data-step="{step}"'
    return (f'<span class="{classes}"{step_attr} data-verdict="{s.verdict.value}" '
            f'title="{html.escape(s.tooltip)}">{text}</span>')


def more_html(step: int, n: int) -> str:
    """The small count of a step's drafts that were never on the verified path. Opening it shows them inline in
    their step (style.css); the app also selects the step in the tree panel (data-step is the 0-based step)."""
    note = (f"{n} draft{'s' * (n != 1)} of step {step + 1} never on the verified path (other branches of the tree, "
            "drafts after a refusal): click to show them here and this step in the tree panel")
    return f'<details class="sv-more" data-step="{step}"><summary title="{html.escape(note)}">+{n}</summary></details>'


def one_forward_block(e: StepEvent) -> bool:
    """Whether the step's drafts are a block drafted in ONE drafter forward (DFlash; Medusa's heads too): one forward
    drafted two or more positions, and the verified path holds only the drafter's own nodes (a path that prompt
    lookup or the datastore grafted, LOOKUP_HEAD / RETRIEVAL_HEAD, is theirs, no block). A drafter that drafts token
    by token (EAGLE, a draft model) runs a forward per level, and a one-level tree is siblings, not a block. Prompt
    lookup's one "forward" is a lookup: the pane asks only for a drafter with weights (pane_body_html's blocks=)."""
    own = {d.depth for d in e.drafts if d.head >= 0}
    return (e.draft_forwards == 1 and len(own) >= 2
            and all(d.head >= 0 for d in e.drafts if d.verdict is Verdict.ACCEPTED))


def block_title(drafted: int, depth: int, kept: int) -> str:
    """A block's hover title: what one forward drafted and where the target cut it."""
    shape = f"{drafted} drafts" if drafted == depth else f"{drafted} drafts, {depth} positions deep"
    cut = (f"the target kept {kept} and cut it at position {kept + 1}" if kept < depth
           else "the target kept it whole")
    return f"a block of {shape} from ONE drafter forward; {cut}"


def cut_html(kept: int, depth: int) -> str:
    """The cut mark: where the target stopped accepting a block (after `kept` of its `depth` positions)."""
    return (f'<span class="sv-cut" data-cut="{kept}" title="the target cut the block here: {kept} of its {depth} '
            'positions kept, the rest refused or never judged"></span>')


def block_html(e: StepEvent, items: list[Span]) -> str:
    """A one-forward block in the pane: the drafter's drafts (kept, then the refusal and the ones never on the
    path) inside one bracket (sv-block: data-forwards, data-drafted, data-depth, data-kept), the cut mark just
    after the kept ones when the path stopped short of the block's depth, then outside it the drafts a graft
    proposed and the target's own token (resampled or bonus): the drafter's forward drafted neither. `items` are
    step_spans(e)."""
    kept = [s for s in items if s.verdict is Verdict.ACCEPTED]
    dropped = [s for s in items if s.verdict in UNCOMMITTED]  # in e.drafts' order (step_spans)
    heads = [d.head for d in e.drafts if d.verdict in UNCOMMITTED]
    inside = [s for s, h in zip(dropped, heads) if h >= 0]
    grafted = [s for s, h in zip(dropped, heads) if h < 0]
    own = [s for s in items if s.verdict not in DECORATED]
    drafted = sum(d.head >= 0 for d in e.drafts)
    depth = 1 + max(d.depth for d in e.drafts if d.head >= 0)
    n = len(kept)
    inner = to_html(kept) + (cut_html(n, depth) if n < depth else "") + to_html(inside)
    return (f'<span class="sv-block" data-forwards="{e.draft_forwards}" data-drafted="{drafted}" '
            f'data-depth="{depth}" data-kept="{n}" title="{html.escape(block_title(drafted, depth, n))}">{inner}'
            f'</span>' + to_html(grafted) + to_html(own))


def pane_body_html(events: Iterable[StepEvent], blocks: bool = False) -> str:
    """A lane as text: one band per target forward (alternating sv-band-0 / sv-band-1, data-step 0-based), its
    committed tokens with their verdicts, the refusal on the verified path, the off-path drafts (hidden unless
    "show every draft") and their count. `blocks`: a drafter with weights raced this lane, so a step whose drafts
    came from one forward (one_forward_block) is drawn as a bracketed block with its cut mark (block_html)."""
    out = []
    for e in events:
        items = step_spans(e)
        hidden = sum(s.off_path for s in items)
        if len(items) == 1:  # one token (every AR step): the token is the band, one node fewer per token
            out.append(_token_html(items[0], e.step))
            continue
        more = more_html(e.step, hidden) if hidden else ""
        body = block_html(e, items) if blocks and one_forward_block(e) else to_html(items)
        out.append(f'<span class="sv-step sv-band-{e.step % 2}" data-step="{e.step}">{body}{more}</span>')
    return "".join(out)


def block_key_html() -> str:
    """The one-line key a pane with blocks shows above its text: the bracket and the cut mark, in words."""
    return ('<div class="sv-block-key"><span class="sv-block sv-block-demo">1 forward</span> a block the drafter '
            'drafted at once · <span class="sv-cut"></span> where the target cut it</div>')


def legend_html() -> str:
    items = []
    for v in (Verdict.ACCEPTED, Verdict.REJECTED, Verdict.DISCARDED, Verdict.RESAMPLED, Verdict.BONUS):
        items.append(f'<span class="sv-legend-item"><span class="sv-tok sv-{v.value}" data-verdict="{v.value}">'
                     f'{v.value}</span> {html.escape(MEANINGS[v])}</span>')
    items.append('<span class="sv-legend-item"><span class="sv-legend-band sv-step sv-band-1">shaded run</span> '
                 'the tokens of one target forward</span>')
    items.append('<span class="sv-legend-item"><span class="sv-more-key">+3</span> drafts never on the verified path '
                 '(click: show them)</span>')
    return '<div class="sv-legend" id="legend">' + "".join(items) + "</div>"


CSS = (Path(__file__).parent / "style.css").read_text(encoding="utf-8")  # the one stylesheet: panes and app

ANSI = {
    Verdict.ACCEPTED: "\x1b[32;4m",   # green, underlined
    Verdict.REJECTED: "\x1b[31;9m",   # red, struck through
    Verdict.DISCARDED: "\x1b[90;9;2m",  # grey, struck, faint
    Verdict.RESAMPLED: "\x1b[33;1m",  # orange/yellow, bold
    Verdict.BONUS: "\x1b[34;1m",      # blue, bold
    Verdict.PLAIN: "",
}
RESET = "\x1b[0m"


def _ansi_text(text: str) -> str:
    return SPECIAL.sub(lambda m: f"[{special_label(m.group())}]", text)


def to_ansi(items: list[Span], colour: bool = True) -> str:
    """A terminal's view (special tokens as [end of turn]); without colour, the text as generated, for a pipe."""
    if not colour:
        return "".join(s.text for s in items if s.verdict not in (Verdict.REJECTED, Verdict.DISCARDED))  # raw: piped
    return "".join(f"{ANSI[s.verdict]}{_ansi_text(s.text)}{RESET}" if ANSI[s.verdict] else _ansi_text(s.text)
                   for s in items)


def legend_ansi() -> str:
    return "  ".join(f"{ANSI[v]}{v.value}{RESET}" for v in
                     (Verdict.ACCEPTED, Verdict.REJECTED, Verdict.DISCARDED, Verdict.RESAMPLED, Verdict.BONUS))
