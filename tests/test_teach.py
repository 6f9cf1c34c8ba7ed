"""Teaching mode (specviz/ui/teach.py) on the tiny random models: the same tokens as the engine for the same
seed and settings, the bars behind every verdict, and the residual after a refusal."""
from __future__ import annotations

import plotly.graph_objects as go
import pytest
import torch

from specviz.config import DecodeConfig
from specviz.core.sampling import residual, verify_chain
from specviz.engines import SpeculativeEngine, generate
from specviz.engines.draft_model import ModelDrafter
from specviz.engines.pld import PromptLookupDrafter
from specviz.ui import step_plots, teach

PROMPT = "1 2 3 4 5 6 1 2 3"  # repeats, so prompt lookup finds drafts


def engine_ids(target, method, draft, cfg):
    drafter = ModelDrafter(draft) if method == "vanilla" else PromptLookupDrafter()
    return generate(SpeculativeEngine(method, target, drafter), target.encode_prompt(PROMPT), cfg).token_ids


@pytest.mark.parametrize("method", ["vanilla", "pld"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 3])
def test_same_tokens_as_the_engine(tiny_target, tiny_draft, method, temperature, seed):
    """Exact equality, sampling included: teach.advance runs the engine's own cycle on a run state seeded from
    cfg.seed, so every random draw (drafts, u, residual/bonus) happens in the engine's order."""
    cfg = DecodeConfig(method=method, gamma=3, temperature=temperature, max_new_tokens=24, seed=seed)
    session = teach.start(PROMPT, cfg, tiny_target, tiny_draft)
    views = teach.run_to_end(session)
    assert session.token_ids == engine_ids(tiny_target, method, tiny_draft, cfg)
    assert session.finished and len(views) == len(session.events) and teach.advance(session) is None


def test_the_same_seed_replays_and_another_differs(tiny_target, tiny_draft):
    cfg = DecodeConfig(gamma=3, temperature=1.0, max_new_tokens=24, seed=11)
    runs = []
    for seed in (11, 11, 12):
        s = teach.start(PROMPT, cfg.with_(seed=seed), tiny_target, tiny_draft)
        teach.run_to_end(s)
        runs.append(s.token_ids)
    assert runs[0] == runs[1] != runs[2]


def test_sessions_do_not_share_state(tiny_target, tiny_draft):
    """Two sessions over the same shared models, interleaved, each give the engine's tokens."""
    cfg = DecodeConfig(gamma=2, temperature=1.0, max_new_tokens=16)
    a = teach.start(PROMPT, cfg.with_(seed=1), tiny_target, tiny_draft)
    b = teach.start(PROMPT, cfg.with_(seed=2), tiny_target, tiny_draft)
    while not (a.finished and b.finished):
        teach.advance(a)
        teach.advance(b)
    assert a.token_ids == engine_ids(tiny_target, "vanilla", tiny_draft, cfg.with_(seed=1))
    assert b.token_ids == engine_ids(tiny_target, "vanilla", tiny_draft, cfg.with_(seed=2))


def test_bars_and_the_acceptance_test(tiny_target, tiny_draft):
    """Two unrelated random models disagree: refusals happen, and each judged position shows q and p over its
    top tokens (the drafted one included), min(1, p/q) and the u that decided it."""
    session = teach.start(PROMPT, DecodeConfig(gamma=3, temperature=1.0, max_new_tokens=24), tiny_target, tiny_draft)
    views = teach.run_to_end(session)
    judged = [p for v in views for p in v.positions if p.verdict in ("accepted", "rejected")]
    assert judged and any(p.verdict == "rejected" for p in judged)
    for p in judged:
        ids = [b.token_id for b in p.bars]
        assert p.token_id in ids and len(ids) == len(set(ids)) <= teach.TOP
        bar = p.bars[ids.index(p.token_id)]
        assert bar.q_draft == pytest.approx(p.q_draft) and bar.p_target == pytest.approx(p.p_target)
        assert p.accept_prob == pytest.approx(min(1.0, p.p_target / p.q_draft), rel=1e-5)
        assert (p.u < p.accept_prob) == (p.verdict == "accepted")
        ps = [b.p_target for b in p.bars]
        assert ps == sorted(ps, reverse=True)
    for v in views:  # every cycle ends with the target's own token, unless EOS or the cap cut it
        assert v.positions[-1].kind in ("resampled", "bonus", "plain") or v.finish_reason
        assert [p.text for p in v.positions if p.verdict in ("accepted", "resampled", "bonus", "plain")] == v.emitted


def test_residual_is_shown_after_a_refusal(tiny_target, tiny_draft):
    session = teach.start(PROMPT, DecodeConfig(gamma=3, temperature=1.0, max_new_tokens=24), tiny_target, tiny_draft)
    views = [v for v in teach.run_to_end(session) if v.rejected and v.positions[-1].kind == "resampled"]
    assert views
    for v in views:
        own = v.positions[-1]
        refused = next(p for p in v.positions if p.verdict == "rejected")
        assert own.position == refused.position
        assert all(b.residual is not None for b in own.bars) and own.token_id in [b.token_id for b in own.bars]
        for b in own.bars:  # the residual is max(0, p - q) renormalised: zero where q >= p
            if b.q_draft >= b.p_target:
                assert b.residual == 0.0
        assert own.token_id != refused.token_id  # the residual is zero at the refused token
        rs = [b.residual for b in own.bars]
        assert rs == sorted(rs, reverse=True)


def test_greedy_shows_the_argmax_and_no_draws(tiny_target):
    """The target drafting for itself: greedy keeps every draft (its argmax) and adds a bonus token."""
    session = teach.start(PROMPT, DecodeConfig(gamma=3, temperature=0.0, max_new_tokens=12), tiny_target, tiny_target)
    view = teach.advance(session)
    assert view.n_accepted == 3 and not view.rejected and view.positions[-1].kind == "bonus"
    for p in view.positions:
        assert p.u is None and p.accept_prob is None and p.target_argmax == p.text


def test_verify_chain_reports_its_draws():
    """u and next_probs are what verify_chain decided with: u < min(1, p/q) exactly at the kept prefix, and
    the resampled token comes from the residual."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        p = torch.softmax(torch.randn(4, 8, generator=gen), -1)
        q = torch.softmax(torch.randn(3, 8, generator=gen), -1)
        ids = torch.multinomial(q, 1, generator=gen).flatten()
        r = verify_chain(ids, q, p, greedy=False, generator=gen)
        assert len(r.u) == 3
        kept = [u < a for u, a in zip(r.u, r.accept_prob)]
        assert r.n_accepted == (kept.index(False) if False in kept else 3)
        expected = residual(p[r.n_accepted], q[r.n_accepted]) if r.rejected else p[r.n_accepted]
        assert torch.equal(r.next_probs, expected) and float(r.next_probs[r.next_token]) > 0


def test_figures_validate(tiny_target, tiny_draft):
    session = teach.start(PROMPT, DecodeConfig(gamma=3, temperature=1.0, max_new_tokens=12), tiny_target, tiny_draft)
    teach.run_to_end(session)
    figs = [step_plots.cycle_figure(None), step_plots.theory_figure(0.7, 0.1), step_plots.theory_figure(1.0, 0.0),
            step_plots.theory_figure(0.5, 0.2, session.measured())]
    figs += [step_plots.cycle_figure(v.to_dict()) for v in session.views]
    for fig in figs:
        go.Figure(fig.to_dict())  # plotly's validating constructor
    bars = step_plots.cycle_figure(session.views[0].to_dict())
    assert {t.name for t in bars.data} >= {"q_draft (drafter)", "p_target (target)"}
    theory = step_plots.theory_figure(0.8, 0.1, session.measured())
    assert any(t.name.startswith("measured") for t in theory.data)
