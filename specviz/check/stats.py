"""Goodness of fit for sampler exactness: does an empirical token distribution follow p?

Two statistics, each with a threshold derived from the sample size:
- total-variation distance TV = ½ Σ|p̂ − p|. For n samples over k outcomes E[TV] ≤ ½ Σ_i sqrt(p_i(1 − p_i)/n),
  and TV moves by at most 1/n per sample, so by McDiarmid P(TV > E[TV] + t) ≤ exp(−2 n t²). The bound
  takes t for a false-alarm probability `false_alarm`.
- Pearson's chi-square over bins with expected count ≥ 5 (the rarer outcomes pooled into one bin);
  p-value = chi2.sf(x, k) = Q(k/2, x/2), the regularised upper incomplete gamma function.

Also the synthetic p/q Monte-Carlo of sampling.verify_chain, shared by tests/test_sampling.py and check.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from specviz.core.sampling import verify_chain

MIN_EXPECTED = 5.0


def tv_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


def tv_bound(p: torch.Tensor, n: int, false_alarm: float = 1e-4) -> float:
    """A TV level an exact sampler exceeds with probability ≤ false_alarm after n samples from p."""
    p = p.double()
    expected = 0.5 * float(torch.sqrt((p * (1 - p)).clamp_min(0.0) / n).sum())  # p may exceed 1 by rounding
    return expected + math.sqrt(math.log(1 / false_alarm) / (2 * n))


def chi2_sf(x: float, dof: int) -> float:
    """P(chi-square with dof degrees of freedom > x)."""
    if dof < 1:
        return 1.0
    if math.isinf(x):
        return 0.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


@dataclass(frozen=True)
class Fit:
    """How well counts over a vocabulary follow p."""
    n: int                   # samples
    bins: int                # chi-square bins after pooling
    chi2: float
    dof: int
    p_value: float
    tv: float                # TV distance over the same bins (a lower bound on the full-vocabulary TV)
    tv_bound: float          # the level TV stays under with probability ≥ 1 − false_alarm when exact
    impossible: int          # samples of tokens with p = 0 (a bug whatever the statistics say)
    bin_tokens: list[list[int]]     # token ids per bin (the pooled bin last, may be long: truncated to 20)
    expected: list[float]           # expected probability per bin
    observed: list[float]           # observed frequency per bin

    def passed(self, alpha: float = 1e-3) -> bool:
        return self.impossible == 0 and self.p_value >= alpha and self.tv <= self.tv_bound

    def to_dict(self) -> dict:
        return asdict(self)


def fit(counts: torch.Tensor, p: torch.Tensor, false_alarm: float = 1e-4) -> Fit:
    """Counts (V,) of sampled tokens against the exact distribution p (V,)."""
    counts, p = counts.double(), p.double()
    n = int(counts.sum())
    impossible = int(counts[p <= 0].sum())
    expected = p * n  # (V,)
    big = (expected >= MIN_EXPECTED).nonzero().flatten()
    big = big[torch.argsort(expected[big], descending=True)]
    rest = (expected < MIN_EXPECTED) & (p > 0)
    groups = [big[i:i + 1] for i in range(len(big))]
    if expected[rest].sum() > 0:
        pooled = rest.nonzero().flatten()
        if expected[rest].sum() < MIN_EXPECTED and groups:
            groups[-1] = torch.cat([groups[-1], pooled])  # too small alone: merge into the rarest bin
        else:
            groups.append(pooled)
    exp_b = torch.stack([p[g].sum() for g in groups]) if groups else torch.ones(1)  # (bins,)
    obs_b = torch.stack([counts[g].sum() for g in groups]) / n if groups else torch.ones(1)
    chi2 = float(((obs_b * n - exp_b * n) ** 2 / (exp_b * n)).sum()) if impossible == 0 else math.inf
    dof = len(groups) - 1
    return Fit(n, len(groups), chi2, dof, chi2_sf(chi2, dof) if impossible == 0 else 0.0,
               tv_distance(obs_b, exp_b) + impossible / n, tv_bound(exp_b, n, false_alarm), impossible,
               [g.tolist()[:20] for g in groups], exp_b.tolist(), obs_b.tolist())


# ── the synthetic p/q suite ─────────────────────────────────────────────────────────────────────────

K_SYNTH = 12


def random_dist(gen: torch.Generator, k: int = K_SYNTH, zeros: int = 0) -> torch.Tensor:
    x = torch.rand(k, generator=gen) ** 2
    if zeros:
        x[torch.randperm(k, generator=gen)[:zeros]] = 0.0
    return x / x.sum()


def first_tokens(p: torch.Tensor, q: torch.Tensor, n: int, gamma: int = 1, greedy_draft_bug: bool = False,
                 seed: int = 0) -> torch.Tensor:
    """Counts (V,) of the first emitted token over n verifications of a chain drawn from q against p.
    With the planted bug the draft takes argmax q while still reporting q as its distribution."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[0])
    q_rows = q.expand(gamma, -1)      # (γ, V)
    p_rows = p.expand(gamma + 1, -1)  # (γ+1, V)
    for _ in range(n):
        if greedy_draft_bug:
            draft = torch.full((gamma,), int(q.argmax()))
        else:
            draft = torch.multinomial(q_rows, 1, replacement=True, generator=gen)[:, 0]  # (γ,)
        r = verify_chain(draft, q_rows, p_rows, greedy=False, generator=gen)
        first = int(draft[0]) if r.n_accepted > 0 else r.next_token
        counts[first] += 1
        if r.rejected and r.next_token == int(draft[r.n_accepted]):
            raise AssertionError("a resampled token equals the rejected draft")
    return counts


@dataclass(frozen=True)
class SyntheticCase:
    name: str
    gamma: int
    planted_bug: bool        # a control: the test must flag it, or it has no power
    fit: Fit

    @property
    def ok(self) -> bool:
        return self.fit.passed() != self.planted_bug

    def to_dict(self) -> dict:
        return {"name": self.name, "gamma": self.gamma, "planted_bug": self.planted_bug, "ok": self.ok,
                "passed_fit": self.fit.passed(), "fit": self.fit.to_dict()}


SYNTHETIC_CASES = ("generic", "q_has_zeros", "p_equals_q", "one_hot_p", "chain_of_three", "control_greedy_draft_bug")


def synthetic_pq(case: str, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p, q = random_dist(gen), random_dist(gen)
    if case == "q_has_zeros":
        q = random_dist(gen, zeros=5)
    elif case == "p_equals_q":
        q = p.clone()
    elif case == "one_hot_p":
        p = torch.zeros(K_SYNTH)
        p[3] = 1.0
    return p, q


def synthetic_case(case: str, n: int) -> SyntheticCase:
    p, q = synthetic_pq(case)
    gamma = 3 if case == "chain_of_three" else 1
    bug = case.startswith("control")
    counts = first_tokens(p, q, n, gamma=gamma, greedy_draft_bug=bug, seed=5 if gamma == 3 else 0)
    return SyntheticCase(case, gamma, bug, fit(counts, p))
