"""Prompt lookup's rule, torch-free: the tokens that followed the most recent earlier occurrence of the context's
longest suffix n-gram. Prompt lookup drafts with it (engines/pld.py), the tree engines graft it as a branch, and
RepeatSplit uses it to ask of any drafter's run whether the drafter copies where the answer repeats its context."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Optional

from specviz.events import StepEvent, Verdict


def lookup(tokens: list[int], gamma: int, n_max: int, n_min: int, stop: frozenset[int] = frozenset()) -> list[int]:
    """The up-to-γ tokens after the most recent earlier match of the longest suffix n-gram, up to and including the
    first `stop` token (an EOS: what follows it in the context, such as the chat template's next turn, is never
    generated, and would only cost verification rows)."""
    return match(tokens, gamma, n_max, n_min, stop)[0]


def match(tokens: list[int], gamma: int, n_max: int, n_min: int,
          stop: frozenset[int] = frozenset()) -> tuple[list[int], int]:
    """lookup's tokens and the length n of the suffix n-gram they follow (0: no match). Every earlier place the last
    token occurs (list.index: a C scan) is an n-gram match for each n up to the length of the suffix it shares with
    the context's end; the longest n wins, and for it the most recent place. The same result as trying each n from
    n_max down with a Python scan of the whole context, about ten times faster on a few hundred tokens (a race step
    runs it every step: tests/test_engines.py checks the two rules agree)."""
    size, longest = len(tokens), min(n_max, len(tokens) - 1)
    if gamma <= 0 or longest < max(n_min, 1):
        return [], 0
    shared: dict[int, int] = {}  # n -> the most recent place (its last token's index) whose suffix shares n tokens
    end = -1
    while True:
        try:
            end = tokens.index(tokens[-1], end + 1, size - 1)
        except ValueError:
            break
        n = 1
        while n < longest and n <= end and tokens[end - n] == tokens[size - 1 - n]:
            n += 1
        shared[n] = end  # later places come later: the most recent wins
    for n in range(longest, n_min - 1, -1):
        at = max((e for m, e in shared.items() if m >= n), default=-1)
        if at >= 0:
            follow = tokens[at + 1:at + 1 + gamma]
            ends = [i for i, t in enumerate(follow) if t in stop]
            return follow[:ends[0] + 1] if ends else follow, n
    return [], 0


REPEAT_NGRAM = (3, 6)  # a position "repeats its context" when the longest earlier match of a 3..6-token suffix
# predicts its token (prompt lookup's rule, with a 3-token floor: shorter matches are often chance)


@dataclass(frozen=True)
class RepeatSplit:
    """Does a drafter copy? Its first draft of each step (its own top guess at depth 0; grafted branches aside),
    judged where the target's token there repeats the context (REPEAT_NGRAM: text copied from the prompt, or a
    loop) and where it does not. The split depends on the target's output only, so every drafter of one run is
    cut the same way (docs/drafters.md, "Does EAGLE copy?", measures the shipped EAGLE with it)."""
    repeat_steps: int = 0
    repeat_accepted: int = 0
    new_steps: int = 0
    new_accepted: int = 0

    def __add__(self, other: "RepeatSplit") -> "RepeatSplit":
        return RepeatSplit(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    @property
    def repeat_share(self) -> Optional[float]:
        n = self.repeat_steps + self.new_steps
        return self.repeat_steps / n if n else None

    @property
    def repeat_rate(self) -> Optional[float]:
        return self.repeat_accepted / self.repeat_steps if self.repeat_steps else None

    @property
    def new_rate(self) -> Optional[float]:
        return self.new_accepted / self.new_steps if self.new_steps else None

    def to_dict(self) -> dict:
        return {**asdict(self), "repeat_share": self.repeat_share, "repeat_rate": self.repeat_rate,
                "new_rate": self.new_rate}

    @classmethod
    def from_dict(cls, d: dict) -> "RepeatSplit":
        """Back from to_dict() (the rates are derived, so they are dropped)."""
        return cls(d["repeat_steps"], d["repeat_accepted"], d["new_steps"], d["new_accepted"])

    @classmethod
    def of(cls, prompt_ids: list[int], events: Iterable[StepEvent]) -> "RepeatSplit":
        tokens, counts = list(prompt_ids), [0, 0, 0, 0]
        for e in events:
            first = next((d for d in e.drafts if d.depth == 0 and d.rank == 0 and d.head >= 0), None)
            if first is not None and e.emitted:
                follow = lookup(tokens, 1, REPEAT_NGRAM[1], REPEAT_NGRAM[0])
                at = 0 if follow and follow[0] == e.emitted[0].token_id else 2
                counts[at] += 1
                counts[at + 1] += first.verdict is Verdict.ACCEPTED
            tokens.extend(t.token_id for t in e.emitted)
        return cls(*counts)


def first_draft_sentence(split: dict) -> str:
    """RepeatSplit.to_dict() in words, for the check's text and HTML reports."""
    pct = lambda v: "–" if v is None else f"{v:.0%}"  # noqa: E731
    if not split["repeat_steps"]:  # nothing to split by: said so, not "– of 0 steps"
        return (f"first draft accepted {pct(split['new_rate'])} of {split['new_steps']} steps; the answer never "
                "repeated its context")
    return (f"first draft accepted {pct(split['repeat_rate'])} of {split['repeat_steps']} steps where the answer "
            f"repeats its context ({pct(split['repeat_share'])} of steps), {pct(split['new_rate'])} of "
            f"{split['new_steps']} elsewhere")
