"""The step-through tab's figures: one cycle's q_draft / p_target bars with its verdicts (cycle_figure), and
Leviathan et al.'s expected tokens and speedup against γ (theory_figure). Built as plots.py builds the race's:
plain dicts, large fonts, the verdict colours of render.COLOURS."""
from __future__ import annotations

from typing import Optional

import plotly.graph_objects as go

from specviz.events import Verdict
from specviz.ui.plots import figure, token_label
from specviz.ui.render import COLOURS

Q_DRAFT = "#CC79A7"   # the drafter's colour (its lane's)
P_TARGET = "#0072B2"  # the target's
RESIDUAL = COLOURS[Verdict.RESAMPLED]  # the resampled token comes from the residual: same orange
VERDICT_MARK = {"accepted": "✓ kept", "rejected": "✗ refused", "discarded": "never judged", "plain": "target's token",
                "resampled": "target's own token (resampled)", "bonus": "bonus token (all kept)"}
TARGET_MARK = {"bonus": ("bonus token", "all kept, so "), "resampled": ("resampled", "")}  # its panel's title


def _tick(text: str) -> str:
    return f"‘{token_label(text)}’"


def _position_title(pos: dict, greedy: bool) -> str:
    if pos["kind"] == "draft":
        head = f"<b>draft {pos['position'] + 1}: {_tick(pos['text'])}</b> {VERDICT_MARK[pos['verdict']]}"
        if greedy:
            same = "=" if pos["target_argmax"] == pos["text"] else "≠"
            return f"{head}<br>draft {same} target argmax {_tick(pos['target_argmax'] or '')}"
        u = f"u = {pos['u']:.2f} {'<' if pos['u'] < pos['accept_prob'] else '≥'} " if pos["u"] is not None else ""
        return f"{head}<br>{u}min(1, p/q) = {pos['accept_prob']:.2f}"
    source = ("argmax of p" if greedy else
              "drawn from the residual" if pos["verdict"] == "resampled" else "drawn from p")
    head, why = TARGET_MARK.get(pos["verdict"], ("the target's token", ""))  # two short lines: each fits its panel
    return f"<b>{_tick(pos['text'])}</b> {head}<br>{why}{source}"


def cycle_figure(view: Optional[dict]) -> go.Figure:
    """One panel per judged position of a cycle (and one for the target's own token): horizontal bars of
    q_draft and p_target over the top tokens, plus the residual norm(max(0, p − q)) after a refusal. The
    chosen token's label is marked ▶ (a cue beside colour)."""
    axes = {"xaxis": {"visible": False}, "yaxis": {"visible": False}}
    if not view:
        return figure([], "Draft and verify, one cycle at a time", "press Reset, then Next step", height=430, **axes)
    panels = [p for p in view["positions"] if p["bars"]]
    n = max(1, len(panels))
    gap = 0.05
    width = (1.0 - gap * (n - 1)) / n
    data, layout, titles, shown = [], {}, [], set()
    for i, pos in enumerate(panels):
        ax = "" if i == 0 else str(i + 1)
        labels, seen = [], set()
        for b in pos["bars"]:
            label = ("▶ " if b["token_id"] == pos["token_id"] else "") + _tick(b["text"])
            if label in seen:
                label += f" #{b['token_id']}"
            seen.add(label)
            labels.append(label)
        series = [("q_draft (drafter)", Q_DRAFT, [b["q_draft"] for b in pos["bars"]])]
        series.append(("p_target (target)", P_TARGET, [b["p_target"] for b in pos["bars"]]))
        if any(b["residual"] is not None for b in pos["bars"]):
            series.append(("residual norm(max(0, p − q))", RESIDUAL, [b["residual"] for b in pos["bars"]]))
        for name, colour, xs in series:
            if pos["kind"] == "bonus" and name.startswith("q_draft"):
                continue  # nothing was drafted at the bonus position
            data.append({"type": "bar", "orientation": "h", "x": xs, "y": labels, "name": name,
                         "legendgroup": name, "showlegend": name not in shown, "marker": {"color": colour},
                         "xaxis": f"x{ax}", "yaxis": f"y{ax}", "texttemplate": "%{x:.2f}", "textposition": "outside",
                         "textfont": {"size": 13}, "cliponaxis": False,
                         "hovertemplate": "%{y}: " + name.split(" ")[0] + " = %{x:.3f}<extra></extra>"})
            shown.add(name)
        x0 = i * (width + gap)
        layout[f"xaxis{ax}"] = {"domain": [x0, x0 + width], "range": [0, 1.18], "anchor": f"y{ax}",
                                "tickvals": [0, 0.5, 1], "showgrid": True}
        layout[f"yaxis{ax}"] = {"anchor": f"x{ax}", "autorange": "reversed", "automargin": True,
                                "tickfont": {"size": 14, "family": "DejaVu Sans Mono, monospace"}}
        titles.append({"text": _position_title(pos, view["greedy"]), "showarrow": False, "x": x0 + width / 2,
                       "y": 1.0, "xref": "paper", "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                       "font": {"size": 14}, "align": "center"})
    kept = f"kept {view['n_accepted']} of {sum(p['kind'] == 'draft' for p in view['positions'])} drafted"
    title = (f"Step {view['step'] + 1} ({'greedy' if view['greedy'] else 'sampling'}, {view['gamma']} guesses (γ)): "
             f"{kept}")
    return figure(data, title, None if panels else "nothing drafted this step", height=430, barmode="group",
                   bargap=0.25, annotations=titles, margin={"l": 20, "r": 20, "t": 118, "b": 30},
                   legend={"orientation": "h", "yanchor": "top", "y": -0.06, "xanchor": "center", "x": 0.5,
                           "font": {"size": 15}},
                   **(layout or axes))


def theory_figure(alpha: float, c: float, measured: Optional[dict] = None, gamma_max: int = 16,
                  block: bool = False) -> go.Figure:
    """Leviathan et al. (2023) against γ at the sliders' α and c: left E[tokens per target forward], right the
    predicted speedup; the measured point (α, τ and c of the steps so far, at their mean γ) marked ◆. `block`: the
    drafter drafts all γ guesses in ONE forward (DFlash), so a step's drafting costs c, not γc: S = E / (c + 1)."""
    from specviz.metrics import expected_tokens_per_step, predicted_speedup

    gs = list(range(1, gamma_max + 1))
    e = [expected_tokens_per_step(alpha, g) for g in gs]
    s = [predicted_speedup(alpha, g, c, block) for g in gs]  # a block: c once a step
    best = max(gs, key=lambda g: s[g - 1])
    data = [
        {"type": "scatter", "x": gs, "y": e, "mode": "lines+markers", "name": f"α = {alpha:.2f}",
         "line": {"color": P_TARGET, "width": 3}, "marker": {"size": 6}, "xaxis": "x", "yaxis": "y",
         "hovertemplate": "γ = %{x}: %{y:.2f} tokens per forward<extra></extra>"},
        {"type": "scatter", "x": gs, "y": s, "mode": "lines+markers", "name": f"α = {alpha:.2f}, c = {c:.2f}",
         "line": {"color": P_TARGET, "width": 3}, "marker": {"size": 6}, "xaxis": "x2", "yaxis": "y2",
         "showlegend": False, "hovertemplate": "γ = %{x}: %{y:.2f}× predicted<extra></extra>"},
        {"type": "scatter", "x": [1, gamma_max], "y": [1, 1], "mode": "lines", "name": "break-even",
         "line": {"color": "#8C8C8C", "dash": "dash", "width": 1.5}, "xaxis": "x2", "yaxis": "y2",
         "hoverinfo": "skip", "showlegend": False},
        {"type": "scatter", "x": [best], "y": [s[best - 1]], "mode": "markers+text", "name": "best γ", "xaxis": "x2",
         "text": [f"best γ = {best}"], "textposition": "bottom " + ("left" if 4 * best > 3 * gamma_max else "center"),
         "yaxis": "y2", "marker": {"color": P_TARGET, "size": 12, "symbol": "star"}, "showlegend": False,
         "hovertemplate": "best γ = %{x}: %{y:.2f}×<extra></extra>"},
    ]
    m = measured or {}
    if m.get("alpha") is not None and m.get("gamma"):
        g = m["gamma"]
        data.append({"type": "scatter", "x": [g], "y": [m["tau"]], "mode": "markers", "xaxis": "x", "yaxis": "y",
                     "name": f"measured: α = {m['alpha']:.2f}, τ = {m['tau']:.2f}" + (
                         f", c ≈ {m['c']:.2f}" if m.get("c") is not None else ""),
                     "marker": {"color": COLOURS[Verdict.REJECTED], "size": 15, "symbol": "diamond",
                                "line": {"color": "#000000", "width": 1.5}},
                     "hovertemplate": "measured τ = %{y:.2f} at γ ≈ %{x:.1f}<extra></extra>"})
        if m.get("c") is not None:
            k = max(1, round(g))
            data.append({"type": "scatter", "x": [g], "y": [predicted_speedup(m["alpha"], k, m["c"], block)],
                         "mode": "markers", "xaxis": "x2", "yaxis": "y2", "showlegend": False,
                         "name": "prediction at the measured α, c",
                         "marker": {"color": COLOURS[Verdict.REJECTED], "size": 15, "symbol": "diamond",
                                    "line": {"color": "#000000", "width": 1.5}},
                         "hovertemplate": "predicted at the measured α, c: %{y:.2f}×<extra></extra>"})
    titles = [{"text": text, "showarrow": False, "x": 0.0, "y": y, "xref": "paper", "yref": "paper",
               "xanchor": "left", "yanchor": "bottom", "font": {"size": 14}, "align": "left"}
              for text, y in (("tokens a target pass<br>E = (1 − α^(γ+1)) / (1 − α)", 1.0),
                              ("predicted speedup<br>" + ("S = E / (c + 1): the whole block in one drafter forward"
                                                          if block else "S = E / (γc + 1)"), 0.42))]
    return figure(data, "Theory: Leviathan et al. (2023)", height=620, annotations=titles,
                   margin={"l": 56, "r": 16, "t": 100, "b": 40},
                   legend={"orientation": "h", "yanchor": "top", "y": -0.16, "xanchor": "left", "x": 0.0,
                           "font": {"size": 14}},
                   xaxis={"domain": [0.0, 1.0], "dtick": 2, "anchor": "y", "range": [0.5, gamma_max + 0.5]},
                   yaxis={"domain": [0.58, 0.96], "anchor": "x", "rangemode": "tozero", "title": {"text": "tokens"}},
                   xaxis2={"domain": [0.0, 1.0], "title": {"text": "guesses per step (γ)"}, "dtick": 2,
                           "anchor": "y2", "range": [0.5, gamma_max + 0.5]},
                   yaxis2={"domain": [0.0, 0.38], "anchor": "x2", "rangemode": "tozero", "title": {"text": "speedup"}})
