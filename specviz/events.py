"""The event model: plain values that every reader (render, metrics, plots, reports) consumes.

An engine yields one StepEvent per target forward pass. No torch here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Optional

LOOKUP_HEAD = -1  # DraftToken.head of a node that prompt lookup grafted onto a tree (DecodeConfig.lookup)
RETRIEVAL_HEAD = -2  # ... that the datastore of the target's own answers grafted (DecodeConfig.retrieve)


class Verdict(str, Enum):
    ACCEPTED = "accepted"    # a drafted token the target kept
    REJECTED = "rejected"    # the first drafted token the target refused
    DISCARDED = "discarded"  # drafted after a rejection, never judged
    RESAMPLED = "resampled"  # the target's own token at the rejected position
    BONUS = "bonus"          # the target's extra token when every draft was accepted
    PLAIN = "plain"          # a token of the AR baseline


@dataclass(frozen=True)
class DraftToken:
    token_id: int
    text: str
    verdict: Verdict
    q_draft: float                        # probability under the distribution it was drawn from
    p_target: Optional[float] = None      # target probability (None when never judged)
    accept_prob: Optional[float] = None   # min(1, p/q) when sampling; None for greedy or unjudged
    parent: int = -1                      # index of the parent node in `drafts`; -1 = the step's root
    depth: int = 0                        # 0-based draft position
    head: int = 0                         # which drafter head proposed it (Medusa); 0 for chains;
                                          # LOOKUP_HEAD, RETRIEVAL_HEAD: grafted
    rank: int = 0                         # rank among the head's top-k candidates (trees)
    p_top1: Optional[float] = None        # the target's two largest probabilities where it refused this token
    p_top2: Optional[float] = None        # (REJECTED only, else None): a small gap is a near-tie (check/misses.py)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DraftToken":
        return cls(**{**d, "verdict": Verdict(d["verdict"])})


@dataclass(frozen=True)
class EmittedToken:
    token_id: int
    text: str
    verdict: Verdict                      # accepted | resampled | bonus | plain
    p_target: Optional[float] = None      # the target's probability of this token

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EmittedToken":
        return cls(**{**d, "verdict": Verdict(d["verdict"])})


@dataclass(frozen=True, kw_only=True)
class StepEvent:
    """One target forward of an engine: what was drafted, with each token's verdict, and what was committed. Built
    with keyword arguments only (nine fields, most of them numbers: a positional list would be read wrong)."""
    step: int                             # 0-based target forward index
    drafts: tuple[DraftToken, ...]        # chain: in order; tree: every node with parent/depth
    emitted: tuple[EmittedToken, ...]     # committed this step, in order
    draft_s: float = 0.0                  # seconds spent drafting (synchronised on GPU)
    verify_s: float = 0.0                 # seconds in the target forward + verification
    draft_forwards: int = 0               # drafter forward passes this step
    target_forwards: int = 1              # target forward passes this step (1 by construction)
    gamma: int = 0                        # γ this step: a chain's drafted tokens asked; a tree's depth (levels)
    tree_size: int = 0                    # a tree's candidate nodes verified this step (0 for a chain)
    finish_reason: Optional[str] = None   # "eos" | "length" on the last event, else None

    @property
    def seconds(self) -> float:
        return self.draft_s + self.verify_s

    @property
    def n_accepted(self) -> int:
        return sum(d.verdict is Verdict.ACCEPTED for d in self.drafts)

    @property
    def n_judged(self) -> int:
        """Drafted tokens the target actually judged (accepted or rejected)."""
        return sum(d.verdict in (Verdict.ACCEPTED, Verdict.REJECTED) for d in self.drafts)

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "drafts": [d.to_dict() for d in self.drafts],
            "emitted": [e.to_dict() for e in self.emitted],
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "draft_forwards": self.draft_forwards,
            "target_forwards": self.target_forwards,
            "gamma": self.gamma,
            "tree_size": self.tree_size,
            "finish_reason": self.finish_reason,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "StepEvent":
        return cls(**{
            **d,
            "drafts": tuple(DraftToken.from_dict(x) for x in d["drafts"]),
            "emitted": tuple(EmittedToken.from_dict(x) for x in d["emitted"]),
        })


@dataclass
class Run:
    """A finished (or in-progress) stream of one engine, with its labels."""
    method: str
    events: list[StepEvent] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for e in self.events for t in e.emitted]

    @property
    def text(self) -> str:
        return "".join(t.text for e in self.events for t in e.emitted)

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.events)
