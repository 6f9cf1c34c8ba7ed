"""Chain speculative decoding: a drafter proposes up to γ tokens, the target verifies them in one forward.

One loop for every chain drafter (a draft model, an int8 copy, prompt lookup): the drafter only
proposes tokens with the distributions they were drawn from; the loop verifies, commits and reports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from specviz.cache import CachedLM, clock
from specviz.config import DecodeConfig
from specviz.engines.base import commit
from specviz.events import DraftToken, StepEvent, Verdict
from specviz.models import LoadedModel
from specviz.sampling import verify_chain, warp


@dataclass(frozen=True)
class Proposal:
    token_ids: list[int]          # (γ',) with γ' <= γ: a drafter may stop early
    q_draft: torch.Tensor         # (γ', V) the distributions the tokens were drawn from
    forwards: int                 # drafter forward passes spent


class DraftSession(Protocol):
    """A drafter's per-run state (its own cache); made fresh for each run by Drafter.session()."""

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal: ...

    def rollback(self, n_valid: int) -> None: ...


class Drafter(Protocol):
    name: str

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> DraftSession: ...


def next_gamma(gamma: int, proposed: int, accepted: int, cfg: DecodeConfig) -> int:
    """Adaptive γ: grow by one after a fully accepted draft, shrink by one after a rejection."""
    if not cfg.adaptive:
        return gamma
    if proposed and accepted == proposed == gamma:
        gamma += 1
    elif accepted < proposed:
        gamma -= 1
    return max(cfg.gamma_auto_min, min(cfg.gamma_auto_max, gamma))


class SpeculativeEngine:
    def __init__(self, method: str, target: LoadedModel, drafter: Drafter):
        self.method = method
        self.target = target
        self.drafter = drafter

    def steps(self, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[StepEvent]:
        device = self.target.device
        generator = torch.Generator().manual_seed(cfg.seed)
        target = CachedLM(self.target.model, device)
        vocab = self.target.vocab_size
        drafts = self.drafter.session(vocab, self.target.eos_ids)
        text_of = self.target.text_of
        tokens = list(prompt_ids)
        gamma = cfg.initial_gamma()
        step = 0
        while True:
            n_new = len(tokens) - len(prompt_ids)
            g = min(gamma, cfg.max_new_tokens - n_new - 1)  # never draft past the length cap
            t0 = clock(device)
            proposal = drafts.propose(tokens, g, cfg, generator) if g > 0 else Proposal([], torch.empty(0, vocab), 0)
            t1 = clock(device)
            k = len(proposal.token_ids)
            logits = target.logits(tokens, proposal.token_ids, keep=k + 1)  # (k+1, V)
            p_target = warp(logits[:, :vocab], cfg)  # (k+1, V)
            draft_ids = torch.tensor(proposal.token_ids, dtype=torch.long)  # (k,)
            result = verify_chain(draft_ids, proposal.q_draft, p_target, cfg.greedy, generator)
            target.rollback(len(tokens) + result.n_accepted)
            drafts.rollback(len(tokens) + result.n_accepted)
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
            yield StepEvent(step, tuple(nodes), tuple(emitted), t1 - t0, t2 - t1, proposal.forwards, 1, g, finish)
            if finish:
                return
            gamma = next_gamma(gamma, k, result.n_accepted, cfg)
            step += 1
