"""Sampler exactness by Monte-Carlo on synthetic p/q, with tolerances derived from the sample size.

Statistic: total-variation distance between the empirical distribution of the first emitted token
and p. For n samples over k outcomes, E[TV] <= 0.5 * sum_i sqrt(p_i (1 - p_i) / n), and TV changes by
at most 1/n per sample, so by McDiarmid P(TV > E[TV] + t) <= exp(-2 n t^2). We take t for a false
alarm probability of 1e-4.
"""
import pytest
import torch

from specviz.check.stats import first_tokens as first_token_counts
from specviz.check.stats import random_dist, synthetic_pq, tv_bound
from specviz.check.stats import tv_distance as tv
from specviz.config import DecodeConfig
from specviz.core.sampling import residual, verify_chain, warp

N = 20000


def first_tokens(p, q, n=N, **kwargs):
    """Empirical distribution of the first emitted token (see specviz.check.stats.first_tokens)."""
    return first_token_counts(p, q, n, **kwargs) / n


@pytest.mark.parametrize("case", ["generic", "q_has_zeros", "p_equals_q", "one_hot_p"])
def test_first_emitted_token_follows_p(case):
    p, q = synthetic_pq(case)
    emp = first_tokens(p, q, n=N if case != "one_hot_p" else 2000)
    assert tv(emp, p) < tv_bound(p, N), f"{case}: TV {tv(emp, p):.4f}"
    if case == "one_hot_p":
        assert emp[3] == 1.0


def test_chain_of_three_keeps_p():
    gen = torch.Generator().manual_seed(2)
    p, q = random_dist(gen), random_dist(gen)
    emp = first_tokens(p, q, n=N, gamma=3, seed=5)
    assert tv(emp, p) < tv_bound(p, N)


def test_planted_bug_is_caught():
    """Drafting greedily but reporting the softmax as q (a bug transformers once had) skews the output."""
    gen = torch.Generator().manual_seed(1)
    p, q = random_dist(gen), random_dist(gen)
    emp = first_tokens(p, q, n=N, greedy_draft_bug=True)
    assert tv(emp, p) > tv_bound(p, N)


def test_residual_guard_and_support():
    p = torch.tensor([0.5, 0.5, 0.0])
    assert torch.equal(residual(p, p.clone()), p)  # zero residual mass -> falls back to p
    q = torch.tensor([0.9, 0.1, 0.0])
    r = residual(p, q)
    assert r[0] == 0.0 and abs(float(r.sum()) - 1) < 1e-6


def test_greedy_verification_accepts_matching_prefix():
    p = torch.eye(5)[[1, 2, 3, 4]]  # argmax at positions: 1, 2, 3, 4
    r = verify_chain(torch.tensor([1, 2, 0]), torch.eye(5)[[1, 2, 0]], p, greedy=True, generator=None)
    assert (r.n_accepted, r.rejected, r.next_token) == (2, True, 3)
    r = verify_chain(torch.tensor([1, 2, 3]), torch.eye(5)[[1, 2, 3]], p, greedy=True, generator=None)
    assert (r.n_accepted, r.rejected, r.next_token) == (3, False, 4)


def test_warp_top_k_top_p_temperature():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert torch.count_nonzero(warp(logits, DecodeConfig(temperature=1.0, top_k=2))) == 2
    probs = torch.softmax(logits, -1)  # [0.64, 0.24, 0.09, 0.03]
    kept = warp(logits, DecodeConfig(temperature=1.0, top_p=0.7))
    assert torch.count_nonzero(kept) == 2 and abs(float(kept.sum()) - 1) < 1e-6
    assert torch.count_nonzero(warp(logits, DecodeConfig(temperature=1.0, top_p=0.5))) == 1
    hot = warp(logits, DecodeConfig(temperature=0.5))
    assert hot[0] > probs[0]


def _nucleus_by_full_sort(probs, top_p):
    """The reference top-p, every token ranked: keep a token while the mass of the strictly more likely ones (summed
    largest first; a run of ties takes the sum where it begins, found by binary search) is below top_p."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cat([torch.zeros_like(sorted_p[..., :1]), torch.cumsum(sorted_p, dim=-1)[..., :-1]], dim=-1)
    first = torch.searchsorted(-sorted_p.contiguous(), -sorted_p.contiguous(), side="left")  # each run's first index
    mass_above = torch.gather(before, -1, first)
    sorted_p = sorted_p.masked_fill(mass_above >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_p / sorted_p.sum(dim=-1, keepdim=True))


@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0, 12.0])  # flat (the widening and the whole-vocabulary path) to peaked
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95, 0.999])
def test_nucleus_is_bitwise_the_full_sort(scale, top_p):
    from specviz.core.sampling import nucleus

    g = torch.Generator().manual_seed(int(scale * 100 + top_p * 1000))
    for shape in [(49152,), (7, 49152), (3, 8192), (5, 40)]:
        probs = torch.softmax(torch.randn(shape, generator=g) * scale, -1)
        got, want = nucleus(probs, top_p), _nucleus_by_full_sort(probs, top_p)
        assert torch.equal(got, want), (shape, scale, top_p)
    kept = int(torch.count_nonzero(nucleus(probs, top_p)[0]))
    assert 1 <= kept <= probs.shape[-1]


@pytest.mark.parametrize("top_p", [0.3, 0.5, 0.9])
def test_nucleus_keeps_or_cuts_tied_tokens_together_whatever_their_order(top_p):
    """bf16 logits tie often: tokens of equal probability share the mass above them, so a run of ties at the cut is
    kept or cut whole, and shuffling the vocabulary shuffles the result."""
    from specviz.core.sampling import nucleus

    g = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 49152, generator=g).mul(4).to(torch.bfloat16).float()  # bf16 values: many ties
    probs = torch.softmax(logits, -1)
    got = nucleus(probs, top_p)
    assert torch.equal(got, _nucleus_by_full_sort(probs, top_p))
    perm = torch.randperm(probs.shape[-1], generator=g)
    assert torch.equal(nucleus(probs[:, perm], top_p), got[:, perm])
    for row in range(probs.shape[0]):  # every value is all kept or all cut
        kept_values = set(probs[row][got[row] > 0].tolist())
        assert not kept_values & set(probs[row][got[row] == 0].tolist())
    probs = torch.tensor([0.4, 0.2, 0.2, 0.2])  # the cut falls inside a run of three ties: all three stay
    assert torch.count_nonzero(nucleus(probs, 0.5)) == 4
    assert torch.count_nonzero(nucleus(probs, 0.4)) == 1


def test_nucleus_widens_past_its_first_ranking():
    from specviz.core.sampling import NUCLEUS_FIRST_K, nucleus

    probs = torch.full((4 * NUCLEUS_FIRST_K,), 1.0 / (4 * NUCLEUS_FIRST_K))  # the nucleus needs 90% of them
    assert int(torch.count_nonzero(nucleus(probs, 0.9))) == int(torch.count_nonzero(_nucleus_by_full_sort(probs, 0.9)))
    assert int(torch.count_nonzero(nucleus(probs, 0.9))) > NUCLEUS_FIRST_K


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (0.7, 0, 0.95), (1.0, 50, 1.0), (0.3, 0, 0.5)])
def test_a_row_warped_alone_has_the_bits_plain_decoding_gives_it(temperature, top_k, top_p):
    """WarpedRows warps a sampled tree step's rows one at a time, as the walk reads them: each row has the bits
    warp gives that row alone, as plain decoding warps its one row, whichever rows were read before; and the bits of
    warp over all the rows where top-p ranks them alike (over a flat row it widens its ranking for every row
    at once, and a longer sum of the same kept values can round differently)."""
    from specviz.core.sampling import WarpedRows

    cfg = DecodeConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    gen = torch.Generator().manual_seed(1)
    for scale in (0.5, 3.0, 12.0):  # flat to peaked: top-p keeps most of the vocabulary, or a few tokens
        logits = (torch.randn(7, 49152, generator=gen) * scale).to(torch.bfloat16).float()
        logits[3, 100:140] = logits[3].max()  # ties at the top
        rows = WarpedRows(logits, cfg)
        for i in (4, 0, 6, 3, -1):
            assert torch.equal(rows[i], warp(logits[i].clone(), cfg)) and float(rows[i, 120]) == float(rows[i][120])
        if scale > 1:
            assert torch.equal(rows.dense(), warp(logits, cfg))


def test_pick_draws_from_the_support_as_from_the_whole_distribution():
    """pick draws over the tokens of nonzero probability only: its draws follow probs (TV within the bound an exact
    sampler stays under), never land on a zero, and a seeded generator repeats them."""
    from specviz.core.sampling import pick

    gen = torch.Generator().manual_seed(0)
    probs = torch.zeros(49152)
    support = torch.randperm(49152, generator=gen)[:40]
    probs[support] = torch.rand(40, generator=gen) ** 3
    probs /= probs.sum()
    draws = [pick(probs, False, gen) for _ in range(20000)]
    assert set(draws) <= set(support.tolist())
    seen = torch.bincount(torch.tensor(draws), minlength=49152).double() / len(draws)
    assert tv(seen, probs) < tv_bound(probs, len(draws))
    again = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert [pick(probs, False, again[0]) for _ in range(50)] == [pick(probs, False, again[1]) for _ in range(50)]
