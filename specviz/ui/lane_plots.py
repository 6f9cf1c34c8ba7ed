"""Figures that set several lanes of one prompt side by side (the "Several drafters" tab): each lane's per-position
acceptance, e.g. DFlash's block against EAGLE-3's guesses. Pure functions, no torch; the shared look is plots.py's."""
from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from specviz.events import StepEvent
from specviz.metrics import summarize
from specviz.ui.plots import figure

LANE_PALETTE = ("#CC79A7", "#0072B2", "#E69F00", "#009E73")  # Okabe-Ito, one per lane, in the lanes' order
LANE_PATTERNS = ("", "/", ".", "x")                              # the second cue: each lane's bar fill pattern


def positions_figure(lanes: Mapping[str, Sequence[StepEvent]]) -> go.Figure:
    """Per-position acceptance α_i of several lanes on one prompt, side by side (grouped bars, one trace per lane,
    each its colour and fill pattern): how far into its guesses each drafter stays right, e.g. DFlash's block
    against EAGLE-3's chain or tree. The legend gives each lane's τ."""
    data = []
    for n, (name, events) in enumerate(lanes.items()):
        summary = summarize(name, events)  # α_i as the race tab's plot and check count it (by step)
        alpha_i, reached, tau = summary.alpha_by_position, summary.reached_by_position, summary.tau if events else None
        data.append({"type": "bar", "name": f"{name}" + (f" (τ {tau:.2f})" if tau else ""),
                     "x": list(range(1, len(alpha_i) + 1)), "y": alpha_i, "customdata": reached,
                     "text": ["" if a is None else f"{a:.2f}" for a in alpha_i], "textposition": "outside",
                     "cliponaxis": False, "textfont": {"size": 13},
                     "marker": {"color": LANE_PALETTE[n % len(LANE_PALETTE)],
                                "pattern": {"shape": LANE_PATTERNS[n % len(LANE_PATTERNS)]}},
                     "hovertemplate": f"{name}<br>position %{{x}}: α_i = %{{y:.2f}} of %{{customdata}} steps that "
                                      "reached it<extra></extra>"})
    drafted = any(d for t in data for d in t["y"])
    return figure(data, "Per-position acceptance α_i by lane<br><sup>of the steps that kept every guess before "
                  "position i, the share that kept i</sup>", None if any(t["x"] for t in data) or drafted
                  else "appears when the lanes have drafted", barmode="group", bargap=0.2, height=420,
                  margin={"l": 64, "r": 20, "t": 96, "b": 120},
                  legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "center", "x": 0.5,
                          "font": {"size": 15}},
                  xaxis={"title": {"text": "position i in the step's guesses"}, "dtick": 1},
                  yaxis={"title": {"text": "α_i"}, "range": [0, 1.12]})
