"""The check report's "Why does it miss?" part (HTML and Plotly figures) from misses.analyse()'s dict. No torch here;
report.py places it, the app's Check tab shows its cards, tables and figures."""
from __future__ import annotations

from html import escape
from typing import Callable, Optional

import plotly.graph_objects as go

from specviz.check.misses import CONTEXTS, GAP_BINS

BLUE, ORANGE, GREEN, RED, GREY = "#0072B2", "#E69F00", "#009E73", "#D55E00", "#8C8C8C"
CATEGORY_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#8C8C8C")
CONDITIONAL = "α_i = P(position i kept | positions before it kept): conditional"
UNCONDITIONAL = "P(position i kept): unconditional"


def _pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.0%}"


def tok(text: str) -> str:
    """A token's text, escaped and monospaced, its whitespace visible."""
    return f'<span class="tok sv-tok" style="white-space:pre">{escape(repr(text)[1:-1])}</span>'


def accepted_length_figure(a: dict) -> Optional[go.Figure]:
    """Steps by how many drafts they kept, stacked by prompt category."""
    if not a.get("accepted_length"):
        return None
    x = list(range(len(a["accepted_length"])))
    fig = go.Figure([go.Bar(name=str(cat), x=x, y=counts, marker_color=CATEGORY_COLOURS[k % len(CATEGORY_COLOURS)])
                     for k, (cat, counts) in enumerate(a["accepted_length_by_category"].items())])
    fig.update_layout(title="Accepted length: steps that kept k drafts", barmode="stack",
                      xaxis=dict(title="drafts kept in the step (k)", dtick=1), yaxis_title="steps")
    return fig


def position_figure(a: dict) -> Optional[go.Figure]:
    """Acceptance by draft position, conditional and unconditional, with the drafts judged at each."""
    pos = a.get("position") or {}
    if not pos.get("conditional"):
        return None
    x = list(range(1, len(pos["conditional"]) + 1))
    fig = go.Figure([
        go.Scatter(x=x, y=pos["conditional"], name=CONDITIONAL, mode="lines+markers", line=dict(color=GREEN),
                   text=[f"{k} kept of {n} judged" for k, n in zip(pos["kept"], pos["judged"])],
                   hovertemplate="position %{x}: %{y:.2f} (%{text})"),
        go.Scatter(x=x, y=pos["unconditional"], name=UNCONDITIONAL, mode="lines+markers",
                   line=dict(color=BLUE, dash="dash"),
                   text=[f"{k} kept of {n} drafted" for k, n in zip(pos["kept"], pos["drafted"])],
                   hovertemplate="position %{x}: %{y:.2f} (%{text})")])
    fig.update_layout(title="Acceptance by draft position", xaxis=dict(title="draft position i", dtick=1),
                      yaxis=dict(title="share kept", range=[0, 1.05]))
    return fig


def gap_figure(a: dict) -> Optional[go.Figure]:
    """The target's top-1 − top-2 probability gap at each refusal, the near-tie threshold marked."""
    if not a.get("gap_histogram"):
        return None
    width = 1 / GAP_BINS
    x = [(i + 0.5) * width for i in range(GAP_BINS)]
    colours = [ORANGE if (i + 1) * width <= a["near_tie_threshold"] + 1e-9 else BLUE for i in range(GAP_BINS)]
    fig = go.Figure(go.Bar(x=x, y=a["gap_histogram"], width=width * 0.95, marker_color=colours))
    fig.add_vline(x=a["near_tie_threshold"], line=dict(color=RED, dash="dot"))
    fig.update_layout(title=f"Refusals by the target's top-2 gap (near tie < {a['near_tie_threshold']:g})",
                      xaxis=dict(title="target's top-1 − top-2 probability at the refusal", range=[0, 1]),
                      yaxis_title="refusals")
    return fig


def figures(a: dict) -> dict[str, Optional[go.Figure]]:
    return {"accepted_length": accepted_length_figure(a), "position": position_figure(a), "gaps": gap_figure(a)}


def near_tie_text(a: dict) -> str:
    """The near-tie share as a figure with its basis, e.g. '31% (11 of 35 refusals)'."""
    judged = a["near_ties"] + a["disagreements"]
    return f"{_pct(a['near_tie_share'])} ({a['near_ties']} of {judged} refusals)" if judged else "–"


def cards(a: dict) -> list[tuple[str, str, str]]:
    """(title, figure, note) cards for the app: the near-tie share and the context missed most."""
    if not a or not a.get("steps"):
        return []
    first = a["contexts"][0] if a["contexts"] and a["contexts"][0]["refusals"] else None
    return [("refusals at near ties", _pct(a["near_tie_share"]),
             f"{a['near_ties']} of {a['near_ties'] + a['disagreements']} refusals where the target's top-1 − top-2 "
             f"probability < {a['near_tie_threshold']:g} (it did not care); the rest are real disagreements"),
            ("missed most", first["context"] if first else "–",
             f"{first['refusals']} of {a['refusals']} refusals, {_pct(first['miss_rate'])} of its "
             f"{first['positions']} positions" if first else "no refusal")]


def tables(a: dict, table: Callable) -> str:
    """The contexts missed most and the tokens missed most (top 10), as HTML tables."""
    ctx = [[escape(c["context"]), str(c["refusals"]), str(c["positions"]), _pct(c["miss_rate"]), _pct(c["share"]),
            escape(CONTEXTS[c["context"]])] for c in a["contexts"]]
    out = ["<h3>Contexts it misses most</h3>" + table(
        ["context of the target's token", "refusals", "judged positions", "missed there", "share of refusals",
         "meaning"], ctx, {1, 2, 3, 4})]
    if a["top_missed"]:
        rows = [[str(k + 1), tok(t["token"]), escape(t["context"]), str(t["refusals"]), str(t["near_ties"]),
                 tok(t["drafted_instead"]), tok(t["before"])] for k, t in enumerate(a["top_missed"])]
        out.append(f"<h3>Tokens it misses most (top {len(rows)})</h3>" + table(
            ["#", "target's token", "context", "refusals", "of them near ties", "drafted instead (most often)",
             "text before (first refusal)"], rows, {0, 3, 4}))
    return "".join(out)


def section(a: Optional[dict], fig: Callable, table: Callable) -> str:
    """The report's part 4 (HTML); `fig` renders a Plotly figure, `table` an HTML table (report.py's)."""
    if not a or not a.get("steps"):
        return "<p class='note'>No step judged a draft: nothing to tell about misses.</p>"
    kpis = [("steps that judged a draft", str(a["steps"])), ("mean drafts kept per step", f"{a['mean_accepted']:.2f}"),
            ("refusals", str(a["refusals"])), ("refusals at near ties", near_tie_text(a)),
            ("median top-2 gap at a refusal", "–" if a["gap_median"] is None else f"{a['gap_median']:.2f}")]
    out = ['<div class="kpis">' + "".join(f'<div class="kpi"><b>{v}</b><span>{escape(k)}</span></div>'
                                          for k, v in kpis) + "</div>",
           f"<p class='note'>Over the greedy runs above. A <b>refusal</b> is a step's first drafted token the target "
           f"did not keep. At each, the target's top-1 − top-2 probability gap (its distribution as verification read "
           f"it) tells a <b>near tie</b> (gap &lt; {a['near_tie_threshold']:g}: the target hardly cared which token "
           "came, and a better drafter can do little there) from a <b>real disagreement</b> (the target was sure of "
           "another token). Each judged position is classed by its context (the first class that fits, in the "
           "order of the table's meanings); a context's <i>missed there</i> is refusals / judged positions. "
           "Acceptance by position: the conditional α_i counts the steps whose earlier drafts were all kept, the "
           "unconditional P(position i kept) every step that drafted position i.</p>"]
    if a["gap_unknown"]:
        out.append(f"<p class='note'>{a['gap_unknown']} refusals carry no top-2 (events recorded before it was "
                   "kept): left out of the near-tie share.</p>")
    out.append(tables(a, table))
    out.append('<div class="grid">' + "".join(fig(f) for f in figures(a).values() if f) + "</div>")
    return "".join(out)
