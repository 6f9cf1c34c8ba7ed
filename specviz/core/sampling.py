"""Warp logits into probabilities, and verify drafted tokens exactly: a chain (greedy or sampling), and a tree
when sampling (sibling candidates judged one after another against the residual: docs/exactness.md).

Names follow the paper (Leviathan et al. 2023): p is the target's distribution, q the draft's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

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
        probs = nucleus(probs, cfg.top_p)
    return probs


class WarpedRows:
    """Rows of logits (r, V), each warped (warp) when it is first read: rows[i] (V,) and rows[i, token]. A sampled
    tree step reads the root's row and those of the nodes its walk reaches, about 2 of 6, and top-p over a row cost
    about 0.2 ms there (experiments/LOG.md); a row warped alone has the bits it has warped among the others
    (tests/test_sampling.py)."""

    def __init__(self, logits: torch.Tensor, cfg: DecodeConfig):
        self.logits, self.cfg = logits, cfg
        self._rows: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.logits.shape[0]

    def row(self, i: int) -> torch.Tensor:
        i = int(i) % len(self)
        if i not in self._rows:
            self._rows[i] = warp(self.logits[i], self.cfg)
        return self._rows[i]

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, tuple):
            return self.row(key[0])[key[1:]]
        return self.row(key)

    def dense(self) -> torch.Tensor:
        """Every row warped, (r, V)."""
        return torch.stack([self.row(i) for i in range(len(self))])


NUCLEUS_FIRST_K = 256  # the most likely tokens nucleus() ranks first; it widens 8× while they hold too little mass


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p of probs (..., V): keep each token whose strictly more likely tokens hold less than top_p of the mass (so
    the top token always stays), renormalised. Tied tokens share that mass (the sum over the strictly larger values,
    whose order cannot change it), so the result does not depend on how ties are ordered (the target's bf16 logits tie
    often), nor, bit for bit, on the order of the vocabulary. It ranks only the first NUCLEUS_FIRST_K tokens (a
    partial top-k, ~0.3 ms a row over SmolLM2's 49,152 against ~3 ms for a full sort:
    experiments/probes/nucleus_cost.py) and widens while their mass falls short; a token left out of the ranking is
    one a full ranking would also cut, so the result is bitwise the full ranking's (tests/test_sampling.py)."""
    size = probs.shape[-1]
    k = min(size, NUCLEUS_FIRST_K)
    while True:
        ranked, order = torch.topk(probs, k, dim=-1)  # (..., k) descending
        mass_before = _mass_above(ranked)
        if k == size or bool((mass_before[..., -1] >= top_p).all()):  # the k-th is cut, so is all behind it
            break
        k = min(size, 8 * k)
    kept = ranked.masked_fill(mass_before >= top_p, 0.0)
    kept = kept / kept.sum(dim=-1, keepdim=True)  # summed in rank order: the same bits however the ties lay
    return torch.zeros_like(probs).scatter(-1, order, kept)


def _mass_above(ranked: torch.Tensor) -> torch.Tensor:
    """For values sorted descending (..., k): the sum of the values strictly above each one (ties share their first
    one's), accumulated largest first."""
    before = torch.cumsum(ranked, dim=-1).roll(1, dims=-1)
    before[..., 0] = 0.0  # exclusive: the sum of the values ranked before each one
    first = torch.ones_like(ranked, dtype=torch.bool)
    first[..., 1:] = ranked[..., 1:] != ranked[..., :-1]  # where a run of equal values starts
    return torch.where(first, before, torch.full_like(before, float("-inf"))).cummax(dim=-1).values


def pick(probs: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> int:
    """One token from probs (V,): argmax when greedy, else a draw. The draw is over the tokens of nonzero probability
    only (after top-p, a few hundred of 49,152): torch's multinomial takes one exponential variate per entry it is
    given, so the full vocabulary cost about 1 ms a token and the support 0.08 ms, the same distribution
    (tests/test_sampling.py)."""
    if greedy:
        return argmax_rows(probs[None])[0]
    support = probs.nonzero()[:, 0]
    return int(support[torch.multinomial(probs[support], 1, generator=generator)])


def argmax_rows(probs: torch.Tensor) -> list[int]:
    """Each row's argmax over probs (r, V) on CPU, the first of equal maxima (torch's rule too): numpy's, about 7x
    faster than torch's for 7 x 49,152 rows here (0.024 against 0.169 ms), a step's verification in greedy races."""
    return probs.detach().cpu().numpy().argmax(-1).tolist()


def top_two(row: torch.Tensor) -> tuple[float, float]:
    """The two largest values of a row (V,): the target's top-1 and top-2 probabilities where it refused a draft (a
    small gap is a near-tie: the target hardly cared which). numpy's maxima either side of the argmax, read only:
    0.04 ms against torch.topk(row, 2)'s 0.28 over 49,152 float32 entries on this CPU (one thread, shared)."""
    if row.device.type != "cpu":  # on an accelerator: two numbers come back, not the row
        first, second = torch.topk(row.float(), 2).values.tolist()
        return first, second
    a = row.detach().numpy()
    i = int(a.argmax())
    rest = [float(part.max()) for part in (a[:i], a[i + 1:]) if part.size]
    return float(a[i]), max(rest, default=0.0)


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
        target_choice = argmax_rows(p_target)  # (γ+1,)
        ok = [d == t for d, t in zip(draft_ids.tolist(), target_choice)]
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


def drop_token(r: torch.Tensor, token: int) -> torch.Tensor:
    """The residual after refusing a point-mass candidate: r with `token` zeroed, renormalised (V,); r itself when
    nothing else is left (the refusal then had probability 0)."""
    out = r.clone()
    out[token] = 0.0
    total = float(out.sum())
    if total <= 1e-12:
        return r
    return out / total


def without(q: torch.Tensor, drawn: Sequence[int]) -> torch.Tensor:
    """q (V,) renormalised without the tokens already drawn: the distribution of the next draw without
    replacement (torch.multinomial(q, k, replacement=False) draws in exactly this way)."""
    if not drawn:
        return q
    out = q.clone()
    out[list(drawn)] = 0.0
    return out / out.sum()


def draw_siblings(q: torch.Tensor, k: int, generator: torch.Generator) -> tuple[list[int], list[torch.Tensor]]:
    """k candidates drawn from q (V,) without replacement, with the distribution each was drawn from (q for the
    first, q without the earlier draws for the later ones): what verify_tree needs for drawn siblings."""
    k = min(k, int((q > 0).sum()))
    tokens = torch.multinomial(q, k, replacement=False, generator=generator).tolist() if k else []
    return tokens, [without(q, tokens[:j]) for j in range(k)]


@dataclass(frozen=True)
class Trial:
    """One candidate judged against the current residual r at its parent (sampling)."""
    node: int                          # the candidate's tree node
    token: int
    q: float                           # its probability under the distribution it was drawn from (1: a point mass)
    r: float                           # r(token): the residual before this candidate (p for the first child)
    accept_prob: float                 # min(1, r/q)
    u: float                           # the uniform draw: accepted iff u < accept_prob
    accepted: bool
    before: torch.Tensor               # (V,) r before this candidate
    after: Optional[torch.Tensor]      # (V,) r after its refusal; None when accepted


@dataclass(frozen=True)
class TreeResult:
    path: list[int]                    # accepted nodes, root to end
    next_token: int                    # the residual draw after refusals, or the bonus draw from p at a leaf
    rejected: bool                     # every child of the path's end was refused (False: it has none, a bonus)
    trials: list[Trial]                # every candidate judged, in order
    next_probs: torch.Tensor           # (V,) the distribution next_token was drawn from


def verify_tree(
    parents: Sequence[int],            # (n,) parent node of each node, -1 = the root; children in judging order
    node_tokens: Sequence[int],        # (n,)
    q_drawn: Optional[Sequence[Optional[torch.Tensor]]],  # (n,) the (V,) distribution each node was drawn from,
                                       # None for a point mass (a chosen candidate: top-ranked, grafted); None: all
    p_rows,                            # (1 + n, V) warped target rows (a tensor or WarpedRows): row 0 after the root
    generator: Optional[torch.Generator],
) -> TreeResult:
    """Exact multi-draft verification of a tree (SpecInfer's sequential rule). At each node, starting at the root
    with r = p, its children are judged in order: a drawn candidate x ~ q is accepted with probability
    min(1, r(x)/q(x)) and on refusal r <- norm(max(0, r - q)); a point-mass candidate is accepted with probability
    r(x) and on refusal r <- r with x zeroed, renormalised. An accepted child becomes the node and the walk repeats
    with the target's p there; when every child is refused the target draws from the final r (a leaf: from p, the
    bonus). The token emitted at each node is distributed exactly as p there (docs/exactness.md)."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    path: list[int] = []
    trials: list[Trial] = []
    node = -1
    while True:
        r = p_rows[node + 1]  # (V,)
        kids = children.get(node, [])
        accepted = None
        for i in kids:
            x = int(node_tokens[i])
            q = q_drawn[i] if q_drawn is not None else None
            q_x = 1.0 if q is None else float(q[x])
            ratio = min(1.0, float(r[x]) / q_x) if q_x > 0 else 0.0
            u = float(torch.rand(1, generator=generator))
            if u < ratio:
                trials.append(Trial(i, x, q_x, float(r[x]), ratio, u, True, r, None))
                accepted = i
                break
            after = drop_token(r, x) if q is None else residual(r, q)
            trials.append(Trial(i, x, q_x, float(r[x]), ratio, u, False, r, after))
            r = after
        if accepted is None:
            return TreeResult(path, pick(r, False, generator), bool(kids), trials, r)
        path.append(accepted)
        node = accepted
