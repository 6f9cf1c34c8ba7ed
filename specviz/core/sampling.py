"""Warp logits into probabilities, and verify a drafted chain exactly (greedy or sampling).

Names follow the paper (Leviathan et al. 2023): p is the target's distribution, q the draft's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.config import DecodeConfig


def warp(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """logits (..., V) -> probabilities (..., V) in float32, with temperature, top-k and top-p applied.

    Greedy (temperature 0) returns the plain softmax: selection is by argmax, the probabilities are
    only shown. Target and draft go through this same function, so they are warped identically.
    """
    logits = logits.float()
    if cfg.greedy:
        return torch.softmax(logits, dim=-1)
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of strictly more likely tokens
        sorted_p = sorted_p.masked_fill(mass_before >= cfg.top_p, 0.0)  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def pick(probs: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> int:
    """One token from probs (V,): argmax when greedy, else a draw."""
    if greedy:
        return int(torch.argmax(probs))
    return int(torch.multinomial(probs, 1, generator=generator))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over (V,); falls back to p when the residual has no mass (p == q)."""
    r = torch.clamp(p - q, min=0.0)
    total = float(r.sum())
    if total <= 1e-12:
        return p
    return r / total


@dataclass(frozen=True)
class ChainResult:
    n_accepted: int                # drafted tokens kept, a prefix of the chain
    next_token: int                # the resampled token (if a rejection) or the bonus token
    rejected: bool                 # True when draft n_accepted was refused
    p_draft: list[float]           # p_target of each drafted token (γ,)
    accept_prob: list[float] | None  # min(1, p/q) per drafted token; None for greedy
    p_next: float                  # p_target of next_token at its position
    u: list[float] | None = None   # the uniform draws compared with accept_prob (γ,); None for greedy
    next_probs: torch.Tensor | None = None  # (V,) what next_token came from: the residual after a refusal, else p


def verify_chain(
    draft_ids: torch.Tensor,      # (γ,) long
    q_draft: torch.Tensor,        # (γ, V) the distributions the drafts were drawn from
    p_target: torch.Tensor,       # (γ+1, V) warped target distributions at each draft position + bonus
    greedy: bool,
    generator: torch.Generator | None,
) -> ChainResult:
    """Exact verification of a chain. Greedy: keep while draft == argmax p. Sampling: keep draft i with
    probability min(1, p_i/q_i); on the first refusal draw from norm(max(0, p - q)); if all are kept,
    draw a bonus token from the last target distribution."""
    gamma = draft_ids.shape[0]
    idx = torch.arange(gamma)
    p_of_draft = p_target[idx, draft_ids]  # (γ,)
    if greedy:
        target_choice = torch.argmax(p_target, dim=-1)  # (γ+1,)
        ok = (draft_ids == target_choice[:gamma]).tolist()
        accept_prob = u = None
    else:
        q_of_draft = q_draft[idx, draft_ids]  # (γ,)
        ratio = torch.clamp(p_of_draft / q_of_draft.clamp_min(1e-20), max=1.0)  # (γ,)
        u = torch.rand(gamma, generator=generator)  # (γ,)
        ok = (u < ratio).tolist()
        accept_prob = ratio.tolist()
        u = u.tolist()
    n = 0
    while n < gamma and ok[n]:
        n += 1
    rejected = n < gamma
    next_probs = residual(p_target[n], q_draft[n]) if rejected and not greedy else p_target[n]  # (V,)
    nxt = int(target_choice[n]) if greedy else pick(next_probs, False, generator)
    return ChainResult(n, nxt, rejected, p_of_draft.tolist(), accept_prob, float(p_target[n, nxt]), u, next_probs)
