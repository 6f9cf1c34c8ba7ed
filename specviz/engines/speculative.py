"""Chain speculative decoding: Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding"
(ICML 2023), and Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling".

One loop for every chain drafter: a draft model or an int8 copy of the target (draft_model.py), prompt lookup
(pld.py), LayerSkip's early exit (layerskip.py), and EAGLE and Medusa when they draft a chain (eagle.py, medusa.py).
A drafter only proposes tokens with the distributions it drew them from; this loop verifies, commits and reports.
Each step (`SpeculativeEngine.cycle`), as in the papers' algorithm:
1. draft: the drafter proposes up to γ tokens x_1..x_k, each drawn from its distribution q_i;
2. score: one target forward over the context and the drafts gives p_1..p_{k+1}, the target's distributions at each
   draft position and after the last (warped by temperature, top-k, top-p exactly as q is);
3. judge, left to right (core.sampling.verify_chain): x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i))
   (greedy: iff it is the target's argmax); the first one refused is rejected and the target's own token there is
   resampled from norm(max(0, p_i − q_i)) (greedy: the argmax); when all k are accepted the target adds a bonus
   token drawn from p_{k+1};
4. commit the accepted prefix and the resampled or bonus token (stopping at EOS or the length cap), and crop the
   target's and the drafter's caches back to it.
Sampled this way the output follows exactly the target's distribution; greedy, it is AR's output token for token.

Terms, as the events name them (events.Verdict):
- γ (gamma): tokens drafted per step (DecodeConfig.gamma; "auto" adapts it step by step: `next_gamma`);
- accepted: a drafted token the target kept; rejected: the first drafted token it refused;
- discarded: a drafted token after the rejected one, never judged;
- resampled: the target's own token at the rejected position; bonus: its extra token when every draft was accepted;
- α: accepted / drafted tokens; τ: tokens committed per target forward, the resampled or bonus token included (AR
  has τ = 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch

from specviz.config import DecodeConfig
from specviz.core.cache import CachedLM, clock
from specviz.core.sampling import ChainResult, top_two, verify_chain, warp
from specviz.engines.base import commit
from specviz.engines.features import FeatureReader
from specviz.events import DraftToken, StepEvent, Verdict
from specviz.models.loader import LoadedModel


@dataclass(frozen=True)
class Proposal:
    token_ids: list[int]          # (k,) with k <= γ: a drafter may stop early
    q_draft: torch.Tensor         # (k, V) the distributions the tokens were drawn from
    forwards: int                 # drafter forward passes spent (a model-free drafter: 1, its lookup)

    @classmethod
    def empty(cls, vocab_size: int) -> "Proposal":
        """No drafts (no room left, or a feature-reading drafter before the target's first forward)."""
        return cls([], torch.empty(0, vocab_size), 0)


class DraftSession(Protocol):
    """A drafter's per-run state (its own cache); made fresh for each run by ChainDrafter.session(). One that drafts
    from the target's features also implements features.FeatureReader."""

    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal: ...

    def rollback(self, n_valid: int) -> None: ...


class ChainDrafter(Protocol):
    """What the chain loop drafts with (a draft model, prompt lookup, a trained drafter's chain view); not
    drafters.trained.Drafter, the trained weights such a view wraps."""
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


def committed(proposal: Proposal, result: ChainResult) -> list[tuple[int, Verdict, float | None]]:
    """What a step commits, in order, with each token's p_target: the accepted drafts, then the target's own token,
    resampled after a rejection, a bonus when every draft was accepted, plain when nothing was drafted."""
    if not proposal.token_ids:
        last = Verdict.PLAIN
    else:
        last = Verdict.RESAMPLED if result.rejected else Verdict.BONUS
    accepted = [(t, Verdict.ACCEPTED, p) for t, p in zip(proposal.token_ids[:result.n_accepted], result.p_draft)]
    return accepted + [(result.next_token, last, result.p_next)]


def chain_verdicts(proposal: Proposal, result: ChainResult, n_used: int,
                   text_of: Callable[[int], str], p_target: torch.Tensor | None = None) -> tuple[DraftToken, ...]:
    """Every drafted token with its verdict, left to right: the first n_used accepted (an accepted draft past an EOS
    the step stopped at is never used), the one at result.n_accepted rejected when the target refused it, every
    other one discarded. A judged token carries the target's probability of it and, sampling, min(1, p/q); the
    refused one, given the target's rows p_target (k+1, V), the target's top-2 probabilities there."""
    k = len(proposal.token_ids)
    draft_ids = torch.tensor(proposal.token_ids, dtype=torch.long)  # (k,)
    q_of = proposal.q_draft[torch.arange(k), draft_ids].tolist() if k else []
    out = []
    for i, token_id in enumerate(proposal.token_ids):
        if i < n_used:
            verdict = Verdict.ACCEPTED
        elif i == result.n_accepted and result.rejected:
            verdict = Verdict.REJECTED
        else:
            verdict = Verdict.DISCARDED
        judged = verdict is not Verdict.DISCARDED
        top = top_two(p_target[i]) if verdict is Verdict.REJECTED and p_target is not None else (None, None)
        out.append(DraftToken(
            token_id, text_of(token_id), verdict, q_of[i],
            p_target=result.p_draft[i] if judged else None,
            accept_prob=result.accept_prob[i] if judged and result.accept_prob else None,
            parent=i - 1, depth=i, p_top1=top[0], p_top2=top[1],
        ))
    return tuple(out)


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
    def __init__(self, method: str, target: LoadedModel, drafter: ChainDrafter):
        self.method = method
        self.target = target
        self.drafter = drafter

    def steps(self, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[StepEvent]:
        run = self.start(prompt_ids, cfg)
        while run.finish_reason is None:
            yield self.cycle(run).event

    def start(self, prompt_ids: list[int], cfg: DecodeConfig) -> RunState:
        """A fresh run: new caches, the generator seeded from cfg.seed."""
        return RunState(cfg=cfg, target=CachedLM.of(self.target),
                        drafts=self.drafter.session(self.target.vocab_size, self.target.eos_ids),
                        generator=torch.Generator().manual_seed(cfg.seed), prompt_len=len(prompt_ids),
                        tokens=list(prompt_ids), gamma=cfg.initial_gamma())

    def cycle(self, run: RunState) -> Cycle:
        """Draft, score in one target forward, judge, commit: the module's steps 1-4; advances `run` by one step."""
        cfg, device = run.cfg, self.target.device
        n_new = len(run.tokens) - run.prompt_len
        gamma = min(run.gamma, cfg.max_new_tokens - n_new - 1)  # never draft past the length cap
        t0 = clock(device)
        proposal = self.draft(run, gamma)  # 1. x_1..x_k with q (k, V)
        t1 = clock(device)
        p_target = self.score(run, proposal)  # 2. (k+1, V)
        draft_ids = torch.tensor(proposal.token_ids, dtype=torch.long)  # (k,)
        result = verify_chain(draft_ids, proposal.q_draft, p_target, cfg.greedy, run.generator)  # 3. judge
        run.target.rollback(len(run.tokens) + result.n_accepted)  # 4. keep the context and the accepted drafts
        run.drafts.rollback(len(run.tokens) + result.n_accepted)
        t2 = clock(device)
        emitted, finish = commit(committed(proposal, result), n_new, cfg, self.target.eos_ids, self.target.text_of)
        drafts = chain_verdicts(proposal, result, min(result.n_accepted, len(emitted)), self.target.text_of, p_target)
        run.tokens.extend(t.token_id for t in emitted)
        event = StepEvent(step=run.step, drafts=drafts, emitted=tuple(emitted), draft_s=t1 - t0, verify_s=t2 - t1,
                          draft_forwards=proposal.forwards, target_forwards=1, gamma=gamma, finish_reason=finish)
        run.finish_reason = finish
        if not finish:
            run.gamma = next_gamma(run.gamma, len(proposal.token_ids), result.n_accepted, cfg)
            run.step += 1
        return Cycle(event, proposal, p_target, result)

    def draft(self, run: RunState, gamma: int) -> Proposal:
        """Up to γ drafted tokens from the run's drafter (none when there is no room)."""
        if gamma <= 0:
            return Proposal.empty(self.target.vocab_size)
        return run.drafts.propose(run.tokens, gamma, run.cfg, run.generator)

    def score(self, run: RunState, proposal: Proposal) -> torch.Tensor:
        """One target forward over the tokens its cache has not seen and the k drafts: the warped distributions at each
        draft position and after the last, (k+1, V). A drafter reading features (FeatureReader) gets those of every
        position the forward fed."""
        k = len(proposal.token_ids)
        if isinstance(run.drafts, FeatureReader):
            logits, hidden = run.target.logits(run.tokens, proposal.token_ids, keep=k + 1, features=run.drafts.features)
            run.drafts.observe(hidden)
        else:
            logits = run.target.logits(run.tokens, proposal.token_ids, keep=k + 1)  # (k+1, V)
        return warp(logits[:, :self.target.vocab_size], run.cfg)
