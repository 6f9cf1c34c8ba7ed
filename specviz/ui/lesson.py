"""The lesson at the end of a race: one line saying whether the two lanes wrote the same text (and, if not,
where and why), then both texts, one above the other. Events in, HTML out; no torch here."""
from __future__ import annotations

import html
from typing import Sequence

from specviz.events import StepEvent
from specviz.metrics import first_divergence


def _tokens(events: Sequence[StepEvent]) -> tuple[list[int], list[str]]:
    return ([t.token_id for e in events for t in e.emitted], [t.text for e in events for t in e.emitted])


def lesson_line(ar_ids: list[int], spec_ids: list[int], greedy: bool) -> str:
    """One sentence: identical, or where the texts part and why (plain text)."""
    div = first_divergence(ar_ids, spec_ids)
    if div is None:
        if greedy:
            return ("The two texts are identical, token for token: with greedy decoding speculation changes how fast "
                    "the target writes, never what it writes.")
        return ("The two texts are identical this time, though both lanes sampled: speculative sampling draws from the "
                "target's own distribution, and here the random draws happened to agree.")
    if greedy:
        return (f"{_where(div)}: greedy speculative decoding "
                "should reproduce plain decoding exactly, so this is a near tie in the target's logits or a bug "
                "(the check tab tells which).")
    return (f"{_where(div)}: both lanes sample from the same "
            "distribution, the target's, but with different random draws (speculative sampling spends its random "
            "numbers on acceptance tests and residual draws), so the words differ by chance while the distribution "
            "they come from is the same.")


def _where(div: int) -> str:
    if div == 0:
        return "The texts differ from the first token on"
    return f"The texts agree on the first {div} token{'s' * (div != 1)} and part at token {div + 1}"


def _text_html(texts: list[str], div) -> str:
    cut = len(texts) if div is None else div
    same, rest = "".join(texts[:cut]), "".join(texts[cut:])
    out = html.escape(same)
    if rest:
        out += f'<mark title="from here on the two texts differ">{html.escape(rest)}</mark>'
    return out or "∅"


def lesson_html(ar_events: Sequence[StepEvent], spec_events: Sequence[StepEvent], greedy: bool,
                ar_title: str = "Plain autoregressive", spec_title: str = "Speculative") -> str:
    """The line, then the two texts one above the other (where they part, the rest is marked)."""
    ar_ids, ar_texts = _tokens(ar_events)
    spec_ids, spec_texts = _tokens(spec_events)
    div = first_divergence(ar_ids, spec_ids)
    kind = "same" if div is None else "differ"
    line = html.escape(lesson_line(ar_ids, spec_ids, greedy))
    return (f'<div class="sv-lesson" id="lesson" data-texts="{kind}">{line}</div><div class="sv-texts" id="texts">'
            f'<div class="sv-texts-k">{html.escape(ar_title)}</div>'
            f'<div class="sv-texts-v" data-lane="ar">{_text_html(ar_texts, div)}</div>'
            f'<div class="sv-texts-k">{html.escape(spec_title)}</div>'
            f'<div class="sv-texts-v" data-lane="spec">{_text_html(spec_texts, div)}</div></div>')
