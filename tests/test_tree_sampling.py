"""Exact tree sampling (core/sampling.verify_tree) by Monte-Carlo on synthetic p/q trees.

Statistics (specviz/check/stats.py, fit): Pearson's chi-square over bins with expected count >= 5, and total variation
against a bound derived from the sample size (McDiarmid, false alarm 1e-4). An exact sampler fails either with
probability ~1e-3; every run is seeded, so a pass is reproducible. The planted bugs below skew the output by far more
than these levels: the same test must catch each (a test that cannot fail is no test).

What is sampled: the token emitted at the root of a tree (its children judged one after another against the residual)
and the first two tokens through a two-level tree (when the step ends after one token, the next step's target draw
from p(. | first) supplies the second, as the engine's next step would), against p and against p(a) p(b | a).
"""
import pytest
import torch

from specviz.check import stats
from specviz.config import DecodeConfig
from specviz.core import sampling
from specviz.core.sampling import draw_siblings, verify_tree, warp

V = 10      # tokens in the synthetic vocabulary
N = 10000   # trials per case


def dist(gen: torch.Generator, zeros: int = 0) -> torch.Tensor:
    return stats.random_dist(gen, V, zeros)


def warped(gen: torch.Generator, cfg: DecodeConfig) -> torch.Tensor:
    """A distribution through the engines' own warp (temperature, top-k, top-p): zeros where the warp cuts."""
    return warp(torch.randn(V, generator=gen) * 2.0, cfg)


# candidates at one node: (tokens, the distributions they were drawn from, None for a point mass)
def point_masses(p, q, gen):
    tokens = torch.topk(q, 3).indices.tolist()  # the drafter's top-ranked children, chosen: point masses
    return tokens, [None] * 3


def drawn_with_replacement(p, q, gen):
    tokens = torch.multinomial(q, 3, replacement=True, generator=gen).tolist()
    return tokens, [q] * 3


def drawn_without_replacement(p, q, gen):
    return draw_siblings(q, 3, gen)


def drawn_and_grafted(p, q, gen):
    """Two draws without replacement, then a grafted branch's token (a point mass), skipped when it repeats one."""
    tokens, qs = draw_siblings(q, 2, gen)
    graft = int(torch.argmin(q))  # a token the drafter rarely proposes, as prompt lookup's often is
    if graft not in tokens:
        tokens, qs = tokens + [graft], qs + [None]
    return tokens, qs


def without_replacement_verified_against_q(p, q, gen):
    """A planted bug: siblings drawn without replacement, each verified as if drawn from q itself."""
    tokens, _ = draw_siblings(q, 3, gen)
    return tokens, [q] * len(tokens)


CANDIDATES = {f.__name__: f for f in (point_masses, drawn_with_replacement, drawn_without_replacement,
                                      drawn_and_grafted, without_replacement_verified_against_q)}


def root_tokens(p: torch.Tensor, q: torch.Tensor, how: str, n: int = N, seed: int = 0,
                invariant: bool = True) -> torch.Tensor:
    """Counts (V,) of the token emitted at the root over n verifications of fresh candidates; with `invariant`,
    also that the residual draw never repeats a refused candidate (its residual is zero)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    for _ in range(n):
        tokens, qs = CANDIDATES[how](p, q, gen)
        result = verify_tree([-1] * len(tokens), tokens, qs, p.expand(1 + len(tokens), -1), gen)  # rows: any
        emitted = tokens[result.path[0]] if result.path else result.next_token
        refused = [t.token for t in result.trials if not t.accepted]
        assert not invariant or result.path or result.next_token not in refused
        counts[emitted] += 1
    return counts


def pq(case: str, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if case == "top_p":
        cfg = DecodeConfig(temperature=0.7, top_p=0.8)
        return warped(gen, cfg), warped(gen, cfg)
    if case == "top_k":
        cfg = DecodeConfig(temperature=1.0, top_k=4)
        return warped(gen, cfg), warped(gen, cfg)
    if case == "q_has_zeros":
        return dist(gen), dist(gen, zeros=4)
    if case == "peaked":  # a confident drafter: most of q on one token, which p likes less
        p, q = dist(gen), dist(gen)
        return p, 0.4 * q + 0.6 * torch.nn.functional.one_hot(torch.argmin(p), V)
    return dist(gen), dist(gen)


EXACT = [(how, case) for how in ("point_masses", "drawn_with_replacement", "drawn_without_replacement",
                                 "drawn_and_grafted")
         for case in ("generic", "q_has_zeros", "peaked", "top_p", "top_k")]


@pytest.mark.parametrize("how,case", EXACT)
def test_the_token_emitted_at_a_node_follows_p(how, case):
    p, q = pq(case)
    fit = stats.fit(root_tokens(p, q, how), p)
    assert fit.passed(), (how, case, fit.p_value, fit.tv, fit.tv_bound)


def test_point_masses_accept_with_the_mass_of_the_set():
    """Chosen candidates S are accepted with probability p(S): the most any scheme can for a fixed set."""
    p, q = pq("generic")
    gen = torch.Generator().manual_seed(1)
    tokens = torch.topk(q, 3).indices.tolist()
    hits = sum(bool(verify_tree([-1] * 3, tokens, None, p.expand(4, -1), gen).path) for _ in range(N))
    mass = float(p[tokens].sum())
    assert abs(hits / N - mass) < 4 * (mass * (1 - mass) / N) ** 0.5


# ── planted bugs: the same statistics must catch each ─────────────────────────────────────────────────

def _not_renormalised(r, token):
    out = r.clone()
    out[token] = 0.0
    return out


def _not_removed(r, token):
    return r


def _residual_not_renormalised(p, q):
    return torch.clamp(p - q, min=0.0)


@pytest.mark.parametrize("how,patch", [
    ("point_masses", ("drop_token", _not_renormalised)),       # the residual left unnormalised after a refusal
    ("point_masses", ("drop_token", _not_removed)),            # a refused point mass left in the residual
    ("drawn_without_replacement", ("residual", _residual_not_renormalised)),
    ("without_replacement_verified_against_q", None),          # the k-th draw judged against q, not q without the rest
])
def test_planted_bugs_are_caught(monkeypatch, how, patch):
    if patch:
        monkeypatch.setattr(sampling, *patch)
    p, q = pq("peaked")
    fit = stats.fit(root_tokens(p, q, how, invariant=False), p)
    assert not fit.passed() and fit.p_value < 1e-6, (how, fit.p_value, fit.tv, fit.tv_bound)


# ── two tokens through a two-level tree ─────────────────────────────────────────────────────────────

def two_level(p1, p2, q1, q2, how: str, gen: torch.Generator):
    """A tree: candidates at the root by `how`, under each of them candidates from q2[its token] by `how`,
    and (drawn cases) a grafted two-token branch [argmin q1, argmin q2[argmin q1]] of point masses."""
    parents, tokens, qs = [], [], []
    roots, root_qs = CANDIDATES[how](p1, q1, gen)
    for t, qd in zip(roots, root_qs):
        parents.append(-1), tokens.append(t), qs.append(qd)
    for node, t in enumerate(list(tokens)):
        kids, kid_qs = CANDIDATES[how](p2[t], q2[t], gen)
        for k, qd in zip(kids, kid_qs):
            parents.append(node), tokens.append(k), qs.append(qd)
    if how != "point_masses":  # a grafted chain from the root: follows a same-token node, else grows a branch
        a = int(torch.argmin(q1))
        b = int(torch.argmin(q2[a]))
        if a in roots:
            parents.append(roots.index(a)), tokens.append(b), qs.append(None)
        else:
            parents += [-1, len(tokens)]
            tokens += [a, b]
            qs += [None, None]
    order = sorted(range(len(tokens)), key=lambda i: (parents[i] >= 0, i))  # parents before children
    index = {old: new for new, old in enumerate(order)}
    return ([index[parents[i]] if parents[i] >= 0 else -1 for i in order], [tokens[i] for i in order],
            [qs[i] for i in order])


@pytest.mark.parametrize("how", ["point_masses", "drawn_without_replacement", "drawn_with_replacement"])
def test_two_tokens_through_a_tree_follow_the_target(how):
    gen = torch.Generator().manual_seed(7)
    p1, q1 = dist(gen), dist(gen)
    p2 = torch.stack([dist(gen) for _ in range(V)])  # (V, V): p(b | a)
    q2 = torch.stack([dist(gen, zeros=2) for _ in range(V)])
    joint = (p1[:, None] * p2).flatten()  # (V * V,) p(a) p(b | a)
    counts = torch.zeros(V * V)
    for _ in range(N):
        parents, tokens, qs = two_level(p1, p2, q1, q2, how, gen)
        p_rows = torch.stack([p1] + [p2[t] for t in tokens])  # row 0 after the root, row i + 1 after node i
        result = verify_tree(parents, tokens, qs, p_rows, gen)
        out = [tokens[i] for i in result.path] + [result.next_token]
        if len(out) == 1:  # the step ended at the root: the next step's target draw gives the second token
            out.append(int(torch.multinomial(p2[out[0]], 1, generator=gen)))
        counts[out[0] * V + out[1]] += 1
    fit = stats.fit(counts, joint)
    assert fit.passed(), (how, fit.p_value, fit.tv, fit.tv_bound)


def test_two_token_control_is_caught(monkeypatch):
    """The same two-token test with a refused point mass left in the residual: caught."""
    monkeypatch.setattr(sampling, "drop_token", _not_removed)
    with pytest.raises(AssertionError):
        test_two_tokens_through_a_tree_follow_the_target("point_masses")


# ── the tree engine, on the tiny random models ──────────────────────────────────────────────────────

def tree_engine(target, kind: str):
    from tiny import random_drafter

    from specviz.engines.eagle import eagle_tree_engine
    from specviz.engines.medusa import medusa_engine

    extra = {"medusa_heads": 3} if kind == "medusa" else {}
    d = random_drafter(target, kind, torch.arange(0, 64, 2), **extra)
    return eagle_tree_engine(target, d) if kind == "eagle" else medusa_engine(target, d)


PROMPT = [5, 9, 11, 13, 5, 9, 11, 13, 5, 9]  # repeats: prompt lookup grafts a branch


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_tree_engine_verdicts_follow_the_trials(tiny_target, kind):
    """Sampling verifies the whole tree, the lookup branch included: the accepted nodes form one path from the root,
    every refused candidate is rejected with its min(1, r/q), the candidates never reached are discarded, the
    residual is zero at each refused token, and the target's own token is none of the refused children of the
    path's end. The run's generator makes it reproducible."""
    engine = tree_engine(tiny_target, kind)
    cfg = DecodeConfig(method=kind, temperature=1.0, top_p=0.95, lookup=4, max_new_tokens=40, seed=4)
    run = engine.start(PROMPT, cfg)
    cycles = []
    while run.finish_reason is None:
        cycles.append(engine.cycle(run))
    grafts_judged = 0
    for c in cycles[1:]:  # the first step is the target's prefill
        e, result = c.event, c.result
        if result is None:
            continue
        accepted = [i for i, d in enumerate(e.drafts) if d.verdict.value == "accepted"]
        assert accepted == result.path[:len(accepted)]
        assert all(e.drafts[b].parent == a for a, b in zip([-1] + accepted, accepted))
        refused = {t.node for t in result.trials if not t.accepted}
        assert {i for i, d in enumerate(e.drafts) if d.verdict.value == "rejected"} == refused
        assert all(e.drafts[i].accept_prob is not None for i in refused)
        assert all(float(t.after[t.token]) == 0.0 for t in result.trials if not t.accepted)
        end = result.path[-1] if result.path else -1
        if result.rejected and len(e.emitted) > len(result.path):
            assert e.emitted[-1].verdict.value == "resampled"
            last = {t.token for t in result.trials if c.proposal.tree.parents[t.node] == end}
            assert e.emitted[-1].token_id not in last
        grafts_judged += sum(e.drafts[t.node].head < 0 for t in result.trials)
    assert grafts_judged > 0  # the lookup branch is verified when sampling
    again = engine.start(PROMPT, cfg)
    while again.finish_reason is None:
        engine.cycle(again)
    assert again.tokens == run.tokens


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_tree_engine_samples_the_target(tiny_target, kind):
    """The check's fidelity test on a tree engine: the first token of its first tree step over seeds, against
    the target's distribution (after the prefill's most likely token)."""
    from specviz.check.measure import sampling_fidelity
    from specviz.check.options import CheckOptions

    options = CheckOptions(samples=100, temperature=1.0, max_new_tokens=8, synthetic_samples=0)
    fid = sampling_fidelity(tree_engine(tiny_target, kind), tiny_target, [(1, PROMPT)], options, lambda done: None,
                            DecodeConfig(method=kind, lookup=4))
    assert fid.passed and fid.given is not None and fid.with_drafts == fid.samples, fid.fit


def test_step_through_shows_a_refused_sibling_and_the_residual(tiny_target):
    """The step-through of a tree at temperature > 0: one position per judged candidate in the order judged; a
    refused sibling's bars hold r at its turn and the residual after it, and the next sibling at the same node was
    judged against exactly that residual. Its table and bar chart build."""
    from specviz.ui import step, step_plots, teach

    engine = tree_engine(tiny_target, "eagle")
    cfg = DecodeConfig(method="eagle", temperature=1.0, lookup=4, max_new_tokens=40, seed=1)
    session = teach.TeachSession(engine, engine.start(PROMPT, cfg), "prompt", "", tiny_target.name)
    shown = 0
    while (view := teach.advance(session)) is not None:
        assert view.tree or view.step == 0 or not view.positions[:-1]
        drafts = [p for p in view.positions if p.kind == "draft"]
        for a, b in zip(drafts, drafts[1:]):
            if a.verdict == "rejected" and b.parent == a.parent:  # b was judged against the residual after a
                after = {bar.token_id: bar.residual for bar in a.bars}
                before = {bar.token_id: bar.p_target for bar in b.bars}
                assert all(abs(after[t] - before[t]) < 1e-6 for t in after.keys() & before.keys())
                assert b.sibling == a.sibling + 1 and b.r == pytest.approx(before[b.token_id])
                shown += 1
        for p in drafts:
            if p.verdict == "rejected":
                assert p.bars and all(bar.residual is not None for bar in p.bars)
                assert next(bar.residual for bar in p.bars if bar.token_id == p.token_id) == 0.0
        if view.tree:
            table = step.cycle_table_html(view.to_dict())
            assert "r(x) at its turn" in table and table.count("<tr") == len(view.positions) + 1
            assert isinstance(step_plots.cycle_figure(view.to_dict()), step_plots.go.Figure)
    assert shown > 0 and session.token_ids == list(session.run.tokens[len(PROMPT):])
