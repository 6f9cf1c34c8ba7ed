"""A served engine's counters, window by window, as Plotly figures: the "Watch a server" tab's panels
(specviz/ui/watch.py; the windows come from specviz/serving/prometheus.py). Same look as specviz/ui/plots.py."""
from __future__ import annotations

from typing import Optional, Sequence

import plotly.graph_objects as go

from specviz.events import Verdict
from specviz.ui.plots import CUMULATIVE, ROLLING, figure
from specviz.ui.render import COLOURS


def _since(series: Sequence, t0: float) -> list[float]:
    return [round(w.t1 - t0, 2) for w in series]


def watch_acceptance_figure(series: Sequence, t0: float) -> go.Figure:
    """Draft acceptance (accepted / drafted tokens) in each window between two scrapes, and over the watch so far;
    a restart of the server (its counters reset) is marked. Three traces."""
    xs = _since(series, t0)
    cumulative, accepted, drafted = [], 0.0, 0.0
    for w in series:
        accepted, drafted = accepted + w.accepted_tokens, drafted + w.draft_tokens
        cumulative.append(accepted / drafted if drafted > 0 else None)
    resets = [(x, w.acceptance_rate if w.acceptance_rate is not None else 0.0) for x, w in zip(xs, series) if w.reset]
    data = [
        {"type": "scatter", "x": xs, "y": [w.acceptance_rate for w in series], "name": "per window",
         "mode": "lines+markers", "line": {"color": ROLLING, "width": 2.5, "dash": "dot"}, "marker": {"size": 7},
         "hovertemplate": "%{x:.0f} s<br>draft acceptance %{y:.2f}<extra>window</extra>"},
        {"type": "scatter", "x": xs, "y": cumulative, "name": "whole watch", "mode": "lines",
         "line": {"color": CUMULATIVE, "width": 4},
         "hovertemplate": "%{x:.0f} s<br>draft acceptance %{y:.2f}<extra>whole watch</extra>"},
        {"type": "scatter", "x": [x for x, _ in resets], "y": [y for _, y in resets], "name": "server restart",
         "mode": "markers", "marker": {"color": COLOURS[Verdict.REJECTED], "size": 14, "symbol": "x"},
         "hovertemplate": "%{x:.0f} s: counters reset<extra></extra>"},
    ]
    return figure(data, "Draft acceptance (accepted / drafted tokens)",
                   None if any(w.acceptance_rate is not None for w in series) else "no drafts seen yet",
                   xaxis={"title": {"text": "seconds since the watch started"}, "rangemode": "tozero"},
                   yaxis={"title": {"text": "draft acceptance"}, "range": [-0.03, 1.03]})


def watch_tau_figure(series: Sequence, t0: float, collapse_tau: float) -> go.Figure:
    """τ = 1 + accepted / drafts in each window (tokens per drafted step, the bonus token included), with plain
    decoding's τ = 1 and the threshold below which speculation counts as collapsed. One trace, two lines."""
    xs = _since(series, t0)
    taus = [w.tau for w in series]
    top = max([t for t in taus if t is not None] + [collapse_tau, 2.0])
    data = [{"type": "scatter", "x": xs, "y": taus, "name": "τ per window", "mode": "lines+markers",
             "line": {"color": COLOURS[Verdict.BONUS], "width": 3}, "marker": {"size": 7, "symbol": "star"},
             "hovertemplate": "%{x:.0f} s<br>τ = %{y:.2f}<extra></extra>"}]
    lines = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": y, "y1": y,
              "line": {"color": colour, "width": 2, "dash": dash}}
             for y, colour, dash in ((1.0, "#000000", "dash"), (collapse_tau, COLOURS[Verdict.REJECTED], "dot"))]
    notes = [{"text": f"collapsed below τ = {collapse_tau:g}", "showarrow": False, "xref": "paper", "x": 0.99,
              "xanchor": "right", "y": collapse_tau, "yanchor": "bottom", "font": {"size": 14,
                                                                                   "color": COLOURS[Verdict.REJECTED]}}]
    return figure(data, "τ: tokens per drafted step", None if any(t is not None for t in taus)
                   else "no drafts seen yet", shapes=lines, annotations=notes, showlegend=False,
                   xaxis={"title": {"text": "seconds since the watch started"}, "rangemode": "tozero"},
                   yaxis={"title": {"text": "τ"}, "range": [0.9, top + 0.1]})


def watch_position_figure(per_position: Sequence[float], conditional: Sequence[Optional[float]]) -> go.Figure:
    """Acceptance by draft position over the watch: the share of drafts that kept position i (bars, the engine's
    counters) and α_i = P(position i kept | the positions before it kept) (diamonds). Two traces."""
    xs = list(range(1, len(per_position) + 1))
    data = [
        {"type": "bar", "x": xs, "y": list(per_position), "name": "share of drafts keeping position i",
         "marker": {"color": COLOURS[Verdict.ACCEPTED]},
         "hovertemplate": "position %{x}: %{y:.2f} of drafts kept it<extra></extra>"},
        {"type": "scatter", "x": xs, "y": list(conditional), "name": "α_i (given the positions before)",
         "mode": "markers", "marker": {"color": COLOURS[Verdict.RESAMPLED], "size": 14, "symbol": "diamond"},
         "hovertemplate": "position %{x}: α_i = %{y:.2f}<extra></extra>"},
    ]
    return figure(data, "Acceptance by draft position", None if xs else "the server exports no per-position counter",
                   xaxis={"title": {"text": "draft position i"}, "dtick": 1},
                   yaxis={"title": {"text": "acceptance"}, "range": [0, 1.03]})


def watch_rate_figure(series: Sequence, t0: float) -> go.Figure:
    """Drafted and accepted tokens per second in each window, and the requests running (right axis). Three traces."""
    xs = _since(series, t0)

    def per_s(key: str) -> list[Optional[float]]:
        return [getattr(w, key) / w.seconds if w.seconds > 0 else None for w in series]

    data = [
        {"type": "scatter", "x": xs, "y": per_s("draft_tokens"), "name": "drafted tok/s", "mode": "lines",
         "line": {"color": COLOURS[Verdict.DISCARDED], "width": 3, "dash": "dash"},
         "hovertemplate": "%{x:.0f} s: %{y:.1f} drafted tok/s<extra></extra>"},
        {"type": "scatter", "x": xs, "y": per_s("accepted_tokens"), "name": "accepted tok/s", "mode": "lines",
         "line": {"color": COLOURS[Verdict.ACCEPTED], "width": 4},
         "hovertemplate": "%{x:.0f} s: %{y:.1f} accepted tok/s<extra></extra>"},
        {"type": "scatter", "x": xs, "y": [w.requests_running for w in series], "name": "requests running",
         "mode": "lines", "yaxis": "y2", "line": {"color": "#000000", "width": 1.5, "shape": "hv"},
         "hovertemplate": "%{x:.0f} s: %{y:.1f} requests running<extra></extra>"},
    ]
    return figure(data, "Drafted and accepted tokens per second", None if series else "waiting for a second scrape",
                   # the legend under the axis title: at the top right, beside the second axis, it wrapped onto the
                   # title (headless Chromium at 1400 px, a half-width panel)
                   legend={"orientation": "h", "yanchor": "top", "y": -0.24, "xanchor": "left", "x": 0.0,
                           "font": {"size": 15}},
                   margin={"l": 64, "r": 64, "t": 60, "b": 110},
                   xaxis={"title": {"text": "seconds since the watch started"}, "rangemode": "tozero"},
                   yaxis={"title": {"text": "tokens / s"}, "rangemode": "tozero"},
                   yaxis2={"title": {"text": "running"}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                           "showgrid": False})
