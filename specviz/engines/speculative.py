"""Chain speculative decoding: a drafter proposes up to γ tokens, the target verifies them in one forward.

One loop for every chain drafter (a draft model, an int8 copy, prompt lookup): the drafter only
proposes tokens with the distributions they were drawn from; the loop verifies, commits and reports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from specviz.config import DecodeConfig
from specviz.core.cache import CachedLM, clock
from specviz.core.sampling import ChainResult, verify_chain, warp
from specviz.engines.base import commit
from specviz.events import DraftToken, StepEvent, Verdict
from specviz.models.loader import LoadedModel


@dataclass(frozen=True)
class Proposal:
    token_ids: list[int]          # (γ',) with γ' <= γ: a drafter may stop early
    q_draft: torch.Tensor         # (γ', V) the distributions the tokens were drawn from
    forwards: int                 # drafter forward passes spent (a model-free drafter: 1, its lookup)


class DraftSession(Protocol):
    """A drafter's per-run state (its own cache); made fresh for each run by Drafter.session()."""

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal: ...

    def rollback(self, n_valid: int) -> None: ...


class Drafter(Protocol):
    name: str

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> DraftSession: ...


def stop_drafting(token: int, confidence: float, eos_ids: frozenset[int], cfg: DecodeConfig) -> bool:
    """A chain drafter stops at EOS, and (auto γ) when it is unsure of the token it just drew: verifying
    further guesses would likely waste them."""
    return token in eos_ids or (cfg.adaptive and confidence < cfg.draft_confidence)


def next_gamma(gamma: int, proposed: int, accepted: int, cfg: DecodeConfig) -> int:
    """Adaptive γ: grow by one after a fully accepted draft, shrink by one after a rejection."""
    if not cfg.adaptive:
        return gamma
    if proposed and accepted == proposed == gamma:
        gamma += 1
    elif accepted < proposed:
        gamma -= 1
    return max(cfg.gamma_auto_min, min(cfg.gamma_auto_max, gamma))


@dataclass
class RunState:
    """One run's mutable state. The models stay shared and read-only; everything a run changes lives here."""
    cfg: DecodeConfig
    target: CachedLM              # the target's KV cache for this run
    drafts: DraftSession          # the drafter's per-run state
    generator: torch.Generator    # every random draw of the run, in a fixed order
    prompt_len: int
    tokens: list[int]             # prompt + committed tokens
    gamma: int                    # draft length for the next cycle
    step: int = 0
    finish_reason: str | None = None


@dataclass(frozen=True)
class Cycle:
    """One draft/verify cycle: its event, plus the distributions behind it (for the teaching view)."""
    event: StepEvent
    proposal: Proposal
    p_target: torch.Tensor        # (k+1, V) warped target distributions at each draft position + the next
    result: ChainResult


class SpeculativeEngine:
    def __init__(self, method: str, target: LoadedModel, drafter: Drafter):
        self.method = method
        self.target = target
        self.drafter = drafter

    def steps(self, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[StepEvent]:
        run = self.start(prompt_ids, cfg)
        while run.finish_reason is None:
            yield self.cycle(run).event

    def start(self, prompt_ids: list[int], cfg: DecodeConfig) -> RunState:
        """A fresh run: new caches, the generator seeded from cfg.seed."""
        return RunState(cfg, CachedLM.of(self.target),
                        self.drafter.session(self.target.vocab_size, self.target.eos_ids),
                        torch.Generator().manual_seed(cfg.seed), len(prompt_ids), list(prompt_ids),
                        cfg.initial_gamma())

    def cycle(self, run: RunState) -> Cycle:
        """Draft, verify in one target forward, commit; advances `run` by one step."""
        cfg, device, vocab, text_of = run.cfg, self.target.device, self.target.vocab_size, self.target.text_of
        tokens, generator = run.tokens, run.generator
        n_new = len(tokens) - run.prompt_len
        g = min(run.gamma, cfg.max_new_tokens - n_new - 1)  # never draft past the length cap
        t0 = clock(device)
        proposal = run.drafts.propose(tokens, g, cfg, generator) if g > 0 else Proposal([], torch.empty(0, vocab), 0)
        t1 = clock(device)
        k = len(proposal.token_ids)
        if getattr(run.drafts, "needs_features", False):  # EAGLE-style drafters read the target's features
            logits, hidden = run.target.logits(tokens, proposal.token_ids, keep=k + 1, features=run.drafts.features)
            run.drafts.observe(hidden)
        else:
            logits = run.target.logits(tokens, proposal.token_ids, keep=k + 1)  # (k+1, V)
        p_target = warp(logits[:, :vocab], cfg)  # (k+1, V)
        draft_ids = torch.tensor(proposal.token_ids, dtype=torch.long)  # (k,)
        result = verify_chain(draft_ids, proposal.q_draft, p_target, cfg.greedy, generator)
        run.target.rollback(len(tokens) + result.n_accepted)
        run.drafts.rollback(len(tokens) + result.n_accepted)
        t2 = clock(device)

        last_kind = Verdict.PLAIN if k == 0 else (Verdict.RESAMPLED if result.rejected else Verdict.BONUS)
        candidates = [(t, Verdict.ACCEPTED, p) for t, p in zip(proposal.token_ids[:result.n_accepted], result.p_draft)]
        candidates.append((result.next_token, last_kind, result.p_next))
        emitted, finish = commit(candidates, n_new, cfg, self.target.eos_ids, text_of)
        n_used = min(result.n_accepted, len(emitted))  # accepted drafts after an EOS are never used
        q_of = proposal.q_draft[torch.arange(k), draft_ids].tolist() if k else []
        nodes = []
        for i, token_id in enumerate(proposal.token_ids):
            if i < n_used:
                verdict = Verdict.ACCEPTED
            elif i == result.n_accepted and result.rejected:
                verdict = Verdict.REJECTED
            else:
                verdict = Verdict.DISCARDED
            judged = verdict is not Verdict.DISCARDED
            nodes.append(DraftToken(
                token_id, text_of(token_id), verdict, q_of[i],
                p_target=result.p_draft[i] if judged else None,
                accept_prob=result.accept_prob[i] if judged and result.accept_prob else None,
                parent=i - 1, depth=i,
            ))
        tokens.extend(t.token_id for t in emitted)
        event = StepEvent(run.step, tuple(nodes), tuple(emitted), t1 - t0, t2 - t1, proposal.forwards, 1, g, finish)
        run.finish_reason = finish
        if not finish:
            run.gamma = next_gamma(run.gamma, k, result.n_accepted, cfg)
            run.step += 1
        return Cycle(event, proposal, p_target, result)
