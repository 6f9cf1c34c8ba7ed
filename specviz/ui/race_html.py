"""The race's HTML: its panes (the coloured tokens are render.py's), the end-of-run summary with its why-line, the
what-if table and the status line, from a race's snapshot (logic.RaceSnapshot). No Gradio here."""
from __future__ import annotations

import html
import time
from typing import Iterable, Optional

from specviz import methods, whatif
from specviz.errors import ConfigError
from specviz.events import StepEvent
from specviz.metrics import CHAIN_FORMULA, TREE_FORMULA, Comparison, RunSummary, why_line
from specviz.ui import lesson, render
from specviz.ui.common import TABS_CSS, card, finish_words, num, status_html
from specviz.ui.logic import DEFAULTS, LANE_TITLES, Lane, RaceSnapshot, method_label


def pane_html(title: str, lane: Lane, running: bool, stopped: bool = False, method: str = "") -> str:
    """A pane: a header with live counters, then the coloured tokens (each with data-verdict), one band per target
    forward (render.pane_body_html). `stopped`: the run was stopped, and an unfinished lane says where. `method`: the
    lane's; a drafter with weights that drafts a block in one forward (DFlash) has its blocks bracketed, with a key."""
    state = "done" if lane.done else ("stopped" if stopped else "running" if running else "idle")
    blocks = drafts_blocks(method)
    stats = (f'<span class="sv-stat"><b>{lane.n_tokens}</b> tokens</span>'
             f'<span class="sv-stat"><b>{lane.clock:.2f}</b> s compute</span>'
             f'<span class="sv-stat"><b>{lane.tok_per_s:.1f}</b> tok/s</span>')
    body = render.pane_body_html(lane.events, blocks) if lane.events else '<span class="sv-placeholder">…</span>'
    if blocks and any(render.one_forward_block(e) for e in lane.events):
        body = render.block_key_html() + body
    badge = {"done": "✓ done", "running": "● running", "stopped": f"■ stopped at {lane.n_tokens} tokens",
             "idle": ""}[state]
    return (f'<div class="sv-pane-box" data-state="{state}">'
            f'<div class="sv-pane-head"><span class="sv-pane-title">{html.escape(title)}</span>'
            f'<span class="sv-state sv-state-{state}">{badge}</span></div>'
            f'<div class="sv-stats">{stats}</div>'
            f'<div class="sv-pane">{body}</div></div>')


def drafts_blocks(method: str) -> bool:
    """Whether a lane of `method` may draft a block in one forward of a drafter with weights (the registry's
    has_weights: prompt lookup's one draft step is a lookup, no forward). Unknown or empty: no."""
    try:
        return bool(method) and methods.spec(method).has_weights
    except ConfigError:
        return False


def empty_panes(method: str = DEFAULTS.method, lookup: int = 0, retrieve: int = 0) -> tuple[str, str]:
    return (pane_html(LANE_TITLES["ar"], Lane(), False),
            pane_html(LANE_TITLES["spec"].format(method=method_label(method, lookup, retrieve)), Lane(), False))


TAU_LABEL = ("mean accepted length τ, tokens per target forward incl. the bonus token, "
             "as Spec-Bench/EAGLE count it")


def summary_html(snap: RaceSnapshot) -> str:
    """The end-of-run summary: the identity badge, the lesson (both texts, one above the other: lesson.py), then
    speedup beside the prediction (a tree's per-node formula, or Leviathan's for a chain: prediction_note), α, τ, c."""
    c = snap.comparison
    if c is None:
        return '<div class="sv-summary sv-summary-empty">The summary appears when both lanes have finished.</div>'
    ar_ev, spec_ev = snap.lanes["ar"].events, snap.lanes["spec"].events
    gamma = snap.cfg.gamma if snap.cfg.adaptive else int(snap.cfg.gamma)
    cards = [
        ("speedup (measured)", num(c.speedup, prefix="×"),
         "over the plain lane beside it (specviz's AR, the same target, the same clock): its seconds per token / "
         "speculative seconds per token"),
        ("predicted speedup", num(c.predicted_speedup, prefix="×"), prediction_note(c, snap.profiled)),
        ("acceptance rate α", num(c.spec.alpha), alpha_note(c.spec)),
        ("τ", num(c.spec.tau), TAU_LABEL),
        ("cost ratio c", num(c.cost_ratio, ".3f"), "seconds of one draft forward / one AR target forward"),
        ("tok/s", f"{c.ar.tok_per_s:.1f} → {c.spec.tok_per_s:.1f}", "plain AR → speculative, engine compute only"),
    ]
    items = "".join(card(*c) for c in cards)
    if c.identical is None:
        badge = ('<span class="sv-badge sv-badge-info">sampling (temperature > 0): the texts differ by chance; '
                 'speculative sampling keeps the target\'s distribution</span>')
    elif c.identical:
        badge = '<span class="sv-badge sv-badge-ok">✓ identical to plain decoding</span>'
    else:
        i = c.first_divergence
        ar_tok = _token_at(ar_ev, i)
        spec_tok = _token_at(spec_ev, i)
        badge = (f'<span class="sv-badge sv-badge-warn">✗ differs from plain decoding at token {i}: '
                 f'AR {html.escape(repr(ar_tok))} vs speculative {html.escape(repr(spec_tok))}</span>')
    lookup = f", prompt lookup branch of up to {snap.cfg.lookup} tokens" if snap.cfg.lookup else ""
    lookup += f", datastore branch of up to {snap.cfg.retrieve} nodes" if snap.cfg.retrieve else ""
    settings = (f"{snap.cfg.method}, γ = {gamma}{lookup}, temperature {snap.cfg.temperature:g}, "
                f"top-p {snap.cfg.top_p:g}, "
                f"{c.spec.new_tokens} tokens, {c.spec.steps} target forwards vs {c.ar.steps}"
                + (f" · on {snap.hardware}" if snap.hardware else ""))
    texts = lesson.lesson_html(ar_ev, spec_ev, snap.cfg.greedy, snap.title("ar"), snap.title("spec"))
    why = f'<div class="sv-why" id="why-line" style="font-weight:600">{html.escape(why_line(c))}</div>'
    return (f'<div class="sv-summary">{why}<div class="sv-badges">{badge}</div>{texts}'
            f'<div class="sv-cards">{items}</div><div class="sv-settings">{html.escape(settings)}</div></div>')


def alpha_note(spec: RunSummary) -> str:
    """The α card's note: its definition (metrics.ACCEPTANCE) with its counts, and the figure /metrics and Watch show
    for the same run (metrics.PROPOSED_ACCEPTANCE), so that the two are never read as one."""
    if not spec.proposed:
        return "nothing was drafted"
    return (f"{spec.accepted} of the {spec.drafted} guesses the target judged were kept (drafts on the verified path); "
            f"of every guess, as /metrics and vLLM count: {spec.accepted} of {spec.proposed} = "
            f"{num(spec.proposed_acceptance)}")


def prediction_note(c: Comparison, profiled: bool) -> str:
    """Which formula the predicted speedup used: a tree's per-node acceptance, or Leviathan's for a chain."""
    if c.prediction_formula == TREE_FORMULA:
        return ("formula: tree, per-node acceptance: E[tokens a step] from how often each kind of node was kept "
                "given its parent, over the step's cost: its rows" + (" at this machine's verify cost T(rows)/T(1)"
                                                                      if profiled else "")
                + ", drafting at c and the step's bookkeeping measured here")
    if c.prediction_formula == CHAIN_FORMULA:
        return (f"formula: Leviathan et al. (2023), chain, at the measured α, γ = {num(c.mean_gamma, '.1f')}, c"
                + (", and this machine's verify cost T(γ+1)/T(1)" if profiled else ""))
    return "no prediction: nothing was drafted"


ROOFLINE_NOTE = "roofline bound, not measured; small models on GPUs are launch-bound"
WHATIF_EMPTY = "The what-if table appears when a race has finished."


def what_if_html(snap: Optional[RaceSnapshot], profiles: Iterable[str] = (), error: str = "") -> str:
    """The what-if panel: this race's exact drafts re-timed on this machine (its measured verify profile: its row is
    the measured speedup of the decode steps), on each loaded profile, and on each device's roofline bound; `error`
    (one line) above the table, which stays."""
    err = f'<div class="sv-status sv-status-error" id="whatif-error">⚠ {html.escape(error)}</div>' if error else ""
    clock = snap.what_if if snap is not None else None
    if clock is None:
        return f'<div class="sv-whatif">{err}<p class="sv-rule">{WHATIF_EMPTY}</p></div>'
    try:
        rows = clock.rows(profiles)
    except whatif.WhatIfError as exc:  # a loaded file gone since: the table without the profiles
        err += f'<div class="sv-status sv-status-error">⚠ {html.escape(str(exc).splitlines()[0])}</div>'
        rows = clock.rows()
    rec, measured = clock.recorded, snap.comparison.speedup if snap.comparison else None
    sources = {d.name: d.source for d in whatif.load_devices()}
    head = "".join(f"<th>{h}</th>" for h in ("hardware", "clock", "AR tok/s", "race tok/s", "speedup",
                                                 "verification free up to k rows", "drafter c"))
    body = "".join(_what_if_row(r, sources.get(r.name, "")) for r in rows)
    intro = (f"This race's exact drafts re-timed over its {len(rec.steps)} decode steps and "
             f"{sum(s.tokens for s in rec.steps)} tokens (the prompt's prefill and the token it gave left out, as are "
             "they from AR's tok/s here): each step costs T(rows)/T(1) AR steps to verify plus its drafter forwards "
             "at c, on this machine's measured verify profile, a profile you load, or a device's spec sheet. This "
             f"machine's row is what the decode steps measured, {num(rec.measured_speedup, prefix='×')}; the summary's "
             f"{num(measured, prefix='×')} counts the prefill too.")
    return (f'<style>{TABS_CSS}</style><div class="sv-whatif">{err}<p class="sv-rule">{html.escape(intro)}</p>'
            f'<table class="sv-table" id="whatif-table"><tr>{head}</tr>{body}</table>'
            f'<p class="sv-rule">Roofline rows: T(k) = max(weights / bandwidth, k × 2 × multiply-adds / peak), '
            f'the drafter\'s c = its weights / the target\'s; {html.escape(ROOFLINE_NOTE)}, and real decoding reaches '
            "a fraction of either roof. Sources: assets/devices.json (hover over a device).</p></div>")


def _what_if_row(r: whatif.Row, source: str) -> str:
    kind = "here" if r.source == "measured here" else "profile" if r.source.startswith("profile") else "roofline"
    clock = ROOFLINE_NOTE if kind == "roofline" else r.source
    k = f"{r.crossover}" if r.crossover < whatif.K_MAX else f">{whatif.K_MAX}"
    cells = [html.escape(r.name), html.escape(clock), num(r.ar_tok_s, ".0f"), num(r.tok_s, ".0f"),
             num(r.speedup, prefix="×"), k, num(r.c, ".3f")]
    tds = "".join(f'<td{" class=num" if i > 1 else ""}>{c}</td>' for i, c in enumerate(cells))
    return (f'<tr data-kind="{kind}" data-speedup="{r.speedup:.4f}" title="{html.escape(source)}">{tds}</tr>')


def _token_at(events: list[StepEvent], i: Optional[int]) -> Optional[str]:
    tokens = [t.text for e in events for t in e.emitted]
    return tokens[i] if i is not None and i < len(tokens) else None


def status_of(snap: RaceSnapshot) -> str:
    if snap.phase == "loading":
        return status_html("Loading the models and preparing the prompt… (the first run takes ~20 s on CPU)")
    if snap.phase == "running":
        return status_html(f"Racing… {snap.lanes['ar'].n_tokens} plain vs {snap.lanes['spec'].n_tokens} "
                           "speculative tokens so far")
    if snap.phase == "stopped":
        return status_html(f"■ stopped at {snap.lanes['ar'].n_tokens} plain / {snap.lanes['spec'].n_tokens} "
                           "speculative tokens: Replay shows what was recorded")
    finish = snap.comparison.spec.finish_reason if snap.comparison else None
    return status_html(f"Done: {finish_words(finish, snap.lanes['spec'].n_tokens)}, in "
                       f"{time.perf_counter() - snap.started:.1f} s wall time.", "ok")
