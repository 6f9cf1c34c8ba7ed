"""Events / summaries -> Plotly figures. Pure functions, no torch.

Every figure keeps a fixed set of traces (possibly empty) so a live view can redraw it in place, uses the
Okabe-Ito palette of render.COLOURS (with a marker shape as a second cue), and large fonts for a projector.
Figures are built from plain dicts and wrapped without plotly's per-property validation, which is ten times
faster and matters at four updates a second on a CPU that is also decoding; tests/test_plots.py validates
every figure's dict with plotly's checking constructor instead.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Mapping, Optional, Sequence

import plotly.graph_objects as go

from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD, DraftToken, EmittedToken, StepEvent, Verdict
from specviz.metrics import summarize
from specviz.ui.render import COLOURS

# Okabe-Ito for lanes and lines (verdict colours come from render.COLOURS)
LANE_COLOURS = {"ar": "#000000", "spec": "#CC79A7"}
CUMULATIVE = "#009E73"
ROLLING = "#0072B2"
EDGE = "#B0B0B0"
ROOT = "#666666"
FONT = {"family": "DejaVu Sans, Arial, sans-serif", "size": 16, "color": "#222222"}
ROLLING_WINDOW = 8
HEIGHT = 360

# second cue beside colour: marker shape per verdict
SYMBOLS = {
    Verdict.ACCEPTED: "circle",
    Verdict.REJECTED: "x",
    Verdict.DISCARDED: "circle-open",
    Verdict.RESAMPLED: "diamond",
    Verdict.BONUS: "star",
    Verdict.PLAIN: "square",
}


@lru_cache(maxsize=1)
def _template() -> dict:
    import plotly.io as pio

    return pio.templates["plotly_white"].to_plotly_json()


def figure(data: list[dict], title: str, note: Optional[str] = None, **layout) -> go.Figure:
    """Wrap trace and layout dicts in a Figure with the shared look (unvalidated: see the module note)."""
    base = {
        "template": _template(),
        "title": {"text": title, "font": {"size": 19}, "x": 0.01, "xanchor": "left"},
        "font": FONT, "height": HEIGHT,
        "margin": {"l": 64, "r": 20, "t": 60, "b": 56},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0,
                   "font": {"size": 15}},
        "hoverlabel": {"font": {"size": 15}},
    }
    base.update(layout)
    if note:
        base["annotations"] = list(base.get("annotations", [])) + [{
            "text": note, "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper",
            "font": {"size": 17, "color": "#777777"}}]
    return go.Figure({"data": data, "layout": base}, _validate=False)


def alpha_figure(events: Sequence[StepEvent], window: int = ROLLING_WINDOW) -> go.Figure:
    """Acceptance rate α after each step: cumulative, and over the last `window` steps. Two traces."""
    steps, cumulative, rolling = [], [], []
    acc_total = judged_total = 0
    recent: list[tuple[int, int]] = []
    for e in events:
        acc, judged = e.n_accepted, e.n_judged
        acc_total += acc
        judged_total += judged
        recent = (recent + [(acc, judged)])[-window:]
        r_acc, r_judged = sum(a for a, _ in recent), sum(j for _, j in recent)
        steps.append(e.step + 1)
        cumulative.append(acc_total / judged_total if judged_total else None)
        rolling.append(r_acc / r_judged if r_judged else None)
    data = [
        {"type": "scatter", "x": steps, "y": cumulative, "name": "cumulative α", "mode": "lines",
         "line": {"color": CUMULATIVE, "width": 4},
         "hovertemplate": "step %{x}<br>cumulative α = %{y:.2f}<extra></extra>"},
        {"type": "scatter", "x": steps, "y": rolling, "name": f"last {window} steps", "mode": "lines",
         "line": {"color": ROLLING, "width": 2.5, "dash": "dot"},
         "hovertemplate": "step %{x}<br>rolling α = %{y:.2f}<extra></extra>"},
    ]
    return figure(
        data, "Acceptance rate (α) per step", None if judged_total else "no drafted tokens judged yet",
        # the legend under the axis title: beside the title, the two collide on a phone's width
        legend={"orientation": "h", "yanchor": "top", "y": -0.24, "xanchor": "left", "x": 0.0, "font": {"size": 15}},
        margin={"l": 64, "r": 20, "t": 60, "b": 92},
        xaxis={"title": {"text": "step (target forward)"}, "rangemode": "tozero"},
        yaxis={"title": {"text": "acceptance rate (α)"}, "range": [-0.03, 1.03]})


def speed_figure(lanes: Mapping[str, Sequence[StepEvent]], labels: Optional[Mapping[str, str]] = None) -> go.Figure:
    """Tokens emitted against engine compute seconds, one line per lane: the slope is tok/s."""
    labels = labels or {}
    data = []
    for i, (lane, events) in enumerate(lanes.items()):
        label = labels.get(lane, lane)
        xs, ys = [0.0], [0]
        for e in events:
            xs.append(xs[-1] + e.seconds)
            ys.append(ys[-1] + len(e.emitted))
        rate = ys[-1] / xs[-1] if xs[-1] else 0.0
        data.append({
            "type": "scatter", "x": xs, "y": ys, "mode": "lines",
            "name": f"{label} · {rate:.1f} tok/s" if events else label,
            "line": {"color": LANE_COLOURS.get(lane, ROLLING), "width": 4 if i else 3,
                     "dash": "solid" if i else "dash"},
            "hovertemplate": "%{y} tokens after %{x:.2f} s<extra>" + label + "</extra>"})
    return figure(data, "Tokens over compute time<br><sup>the slope is tokens per second</sup>",
                   # under the axis title: above the plot two long lane names wrap into the title, and inside it
                   # they cover the lines on a phone's width
                   legend={"orientation": "v", "yanchor": "top", "y": -0.24, "xanchor": "left", "x": 0.0,
                           "font": {"size": 15}}, margin={"l": 64, "r": 20, "t": 60, "b": 110},
                   xaxis={"title": {"text": "engine compute seconds"}, "rangemode": "tozero"},
                   yaxis={"title": {"text": "tokens emitted"}, "rangemode": "tozero"})


def accepted_length_counts(events: Sequence[StepEvent]) -> list[int]:
    """counts[k] = how many drafting steps kept exactly k drafted tokens (k = 0 .. the longest chain's γ or tree's
    depth: a tree engine's event carries its node count as γ, but a step keeps one path, at most its depth)."""
    def longest_kept(e: StepEvent) -> int:
        chain = all(d.parent == i - 1 for i, d in enumerate(e.drafts))
        return max(e.gamma if chain else 0, 1 + max(d.depth for d in e.drafts))

    drafting = [e for e in events if e.drafts]
    longest = max((longest_kept(e) for e in drafting), default=-1)
    counts = [0] * (longest + 1)
    for e in drafting:
        counts[e.n_accepted] += 1
    return counts


def accept_figure(events: Sequence[StepEvent]) -> go.Figure:
    """Left: how many drafts each step kept (a histogram). Right: per-position acceptance α_i."""
    summary = summarize("spec", events)
    counts = accepted_length_counts(events)
    alpha_i = summary.alpha_by_position
    data = [
        {"type": "bar", "x": list(range(len(counts))), "y": counts, "name": "steps", "xaxis": "x", "yaxis": "y",
         "marker": {"color": COLOURS[Verdict.BONUS]}, "hovertemplate": "%{y} steps kept %{x} drafts<extra></extra>"},
        {"type": "bar", "x": list(range(1, len(alpha_i) + 1)), "y": alpha_i, "name": "α_i", "xaxis": "x2",
         "yaxis": "y2", "marker": {"color": COLOURS[Verdict.ACCEPTED]},
         "hovertemplate": "position %{x}: α_i = %{y:.2f}<extra></extra>"},
    ]
    titles = [{"text": text, "showarrow": False, "x": x, "y": 1.0, "xref": "paper", "yref": "paper",
               "xanchor": "center", "yanchor": "bottom", "font": {"size": 13}}
              for text, x in (("steps that kept k", 0.215), ("share kept at i", 0.785))]
    tau = f"<br><sup>tokens per target pass (τ) {summary.tau:.2f}</sup>" if events else ""
    return figure(
        data, "Drafts kept" + tau, None if counts else "no drafts yet", showlegend=False,
        annotations=titles, margin={"l": 64, "r": 20, "t": 100, "b": 56},
        xaxis={"domain": [0.0, 0.43], "title": {"text": "k drafts kept"}, "dtick": 1, "anchor": "y"},
        yaxis={"title": {"text": "steps"}, "anchor": "x", "rangemode": "tozero"},
        xaxis2={"domain": [0.57, 1.0], "title": {"text": "position i"}, "dtick": 1, "anchor": "y2"},
        yaxis2={"range": [0, 1.03], "anchor": "x2"})


def token_label(text: str) -> str:
    """A token as a chart shows it: a newline ↵, a space ␣, the empty token ∅."""
    shown = text.replace("\n", "↵").replace(" ", "␣")
    return shown if shown else "∅"


def tree_layout(drafts: Sequence[DraftToken]) -> list[float]:
    """A y position per draft node: leaves take consecutive slots in depth-first order, a parent sits at
    the mean of its children. A chain is a straight line at y = 0."""
    children: dict[int, list[int]] = {}
    for i, d in enumerate(drafts):
        children.setdefault(d.parent, []).append(i)
    ys = [0.0] * len(drafts)
    next_slot = [0]

    def place(i: int) -> float:
        kids = children.get(i, [])
        if not kids:
            y = float(next_slot[0])
            next_slot[0] += 1
        else:
            y = sum(place(k) for k in kids) / len(kids)
        if i >= 0:
            ys[i] = y
        return y

    place(-1)
    return ys


def accepted_path(drafts: Sequence[DraftToken]) -> list[int]:
    """Indices of the accepted nodes from the root down: the deepest accepted node and its ancestors."""
    accepted = [i for i, d in enumerate(drafts) if d.verdict is Verdict.ACCEPTED]
    if not accepted:
        return []
    path, node = [], max(accepted, key=lambda i: drafts[i].depth)
    while node >= 0:
        path.append(node)
        node = drafts[node].parent
    return path[::-1]


def _segments(pairs: list[tuple[tuple[float, float], tuple[float, float]]]) -> tuple[list, list]:
    xs: list = []
    ys: list = []
    for (x0, y0), (x1, y1) in pairs:
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    return xs, ys


# DraftToken.head of a grafted node -> (its hover note, its edges' legend name, their dash)
GRAFT_SOURCES = {LOOKUP_HEAD: (", from prompt lookup", "prompt lookup", "dash"),
                 RETRIEVAL_HEAD: (", from the datastore", "datastore", "dot")}


def path_probabilities(drafts: Sequence[DraftToken]) -> list[Optional[float]]:
    """Each node's path probability: the product of q_draft from the root down to it (how a dynamic tree ranks its
    nodes, and a static tree's too); None where the path runs through a grafted node (prompt lookup's, the
    datastore's: its q = 1 is no probability)."""
    out: list[Optional[float]] = []
    for d in drafts:  # parents come before their children
        above = 1.0 if d.parent < 0 else out[d.parent]
        out.append(None if above is None or d.head in GRAFT_SOURCES else above * d.q_draft)
    return out


def _hover(d: DraftToken, path_p: Optional[float] = None) -> str:
    parts = [f"{d.verdict.value}, position {d.depth + 1}" + GRAFT_SOURCES.get(d.head, ("", ""))[0],
             f"q_draft={d.q_draft:.3f}"]
    if path_p is not None and d.depth > 0:  # at depth 1 it is q_draft itself
        parts.append(f"path probability={path_p:.3f}")
    if d.p_target is not None:
        parts.append(f"p_target={d.p_target:.3f}")
    if d.accept_prob is not None:
        parts.append(f"accept prob={d.accept_prob:.3f}")
    return "<br>".join(parts)


@dataclass(frozen=True)
class TreeGeometry:
    """Where tree_figure draws one step: the context (root) at x = 0, each drafted node at x = depth + 1 and its
    tree_layout y, the accepted path, and the target's own token (`final`) hanging off the path's end at `final_xy`
    (None when the step ends on an accepted draft)."""
    drafts: list[DraftToken]
    ys: list[float]
    root_y: float
    path: list[int]
    final: Optional[EmittedToken]
    final_xy: Optional[tuple[float, float]]

    @classmethod
    def of(cls, event: StepEvent) -> TreeGeometry:
        drafts = list(event.drafts)
        ys = tree_layout(drafts)
        tops = [ys[i] for i, d in enumerate(drafts) if d.parent == -1]
        geometry = cls(drafts, ys, sum(tops) / len(tops) if tops else 0.0, accepted_path(drafts), None, None)
        last = event.emitted[-1] if event.emitted else None
        if last is None or last.verdict is Verdict.ACCEPTED:
            return geometry
        tail = geometry.tail
        x, y = geometry.pos(tail)
        blocked = any(d.parent == tail and abs(geometry.pos(i)[1] - y) < 0.6 for i, d in enumerate(drafts)
                      if i not in geometry.path)  # a refused sibling sits there: hang the target's token below the tree
        return replace(geometry, final=last, final_xy=(x + 1.0, (max(ys) + 1.0) if blocked else y))

    @property
    def tail(self) -> int:
        """The accepted path's last node (-1: the root)."""
        return self.path[-1] if self.path else -1

    def pos(self, i: int) -> tuple[float, float]:
        return (0.0, self.root_y) if i < 0 else (float(self.drafts[i].depth + 1), self.ys[i])


def _tree_edges(g: TreeGeometry) -> list[dict]:
    """The edges: those not taken (thin grey), those of branches grafted from prompt lookup / the datastore (thin,
    dashed or dotted), then the accepted path down to the target's own token (thick green)."""
    on_path = set(g.path)
    other = [(g.pos(d.parent), g.pos(i)) for i, d in enumerate(g.drafts)
             if i not in on_path and d.head not in GRAFT_SOURCES]
    grafted = {head: _segments([(g.pos(d.parent), g.pos(i)) for i, d in enumerate(g.drafts)
                                if i not in on_path and d.head == head]) for head in GRAFT_SOURCES}
    chain = [-1] + g.path
    taken = [(g.pos(a), g.pos(b)) for a, b in zip(chain, chain[1:])]
    if g.final_xy is not None:
        taken.append((g.pos(g.tail), g.final_xy))
    ox, oy = _segments(other)
    px, py = _segments(taken)
    return [
        {"type": "scatter", "x": ox, "y": oy, "mode": "lines", "name": "not taken", "hoverinfo": "skip",
         "showlegend": False, "line": {"color": EDGE, "width": 2}},
        *({"type": "scatter", "x": x, "y": y, "mode": "lines", "name": GRAFT_SOURCES[head][1], "hoverinfo": "skip",
           "line": {"color": EDGE, "width": 2, "dash": GRAFT_SOURCES[head][2]}}
          for head, (x, y) in grafted.items() if x),  # branches grafted from prompt lookup / the datastore
        {"type": "scatter", "x": px, "y": py, "mode": "lines", "name": "accepted path", "hoverinfo": "skip",
         "line": {"color": COLOURS[Verdict.ACCEPTED], "width": 7}},
    ]


def _tree_nodes(g: TreeGeometry) -> list[dict]:
    """One marker trace per verdict present, in Verdict's order: the drafted nodes and the target's own token."""
    nodes: dict[Verdict, list[tuple[float, float, str, str]]] = {}
    for i, (d, path_p) in enumerate(zip(g.drafts, path_probabilities(g.drafts))):
        nodes.setdefault(d.verdict, []).append((*g.pos(i), token_label(d.text), _hover(d, path_p)))
    if g.final is not None:
        hover = f"{g.final.verdict.value}: the target's own token"
        if g.final.p_target is not None:
            hover += f"<br>p_target={g.final.p_target:.3f}"
        nodes.setdefault(g.final.verdict, []).append((*g.final_xy, token_label(g.final.text), hover))
    crowded = len(set(g.ys)) > 4  # many siblings: smaller nodes, labels beside them instead of stacked above
    traces = []
    for verdict in Verdict:
        if verdict not in nodes:
            continue
        nx, ny, text, hover = (list(v) for v in zip(*nodes[verdict]))
        colour = COLOURS[verdict] if verdict is not Verdict.PLAIN else "#000000"
        traces.append({"type": "scatter", "x": nx, "y": ny, "mode": "markers+text", "text": text,
                       "textposition": "middle right" if crowded else "top center",
                       "textfont": {"size": 12 if crowded else 16, "color": colour},
                       "name": verdict.value, "hovertext": hover, "hoverinfo": "text",
                       "marker": {"size": 11 if crowded else 18, "color": colour, "symbol": SYMBOLS[verdict],
                                  "line": {"width": 2, "color": colour}}})
    return traces


def longest_path_step(events: list[StepEvent]) -> int:
    """The index of the step the tree panel opens on after a race: the longest accepted path (then the most drafts,
    then the earliest), not the race's last step, which often drafted nothing. 0 without events."""
    return max(range(len(events)), key=lambda i: (events[i].n_accepted, len(events[i].drafts), -i), default=0)


def tree_figure(event: Optional[StepEvent]) -> go.Figure:
    """The candidate tree of one step: the context as the root at x = 0, each drafted node at x = depth + 1
    (a chain is a one-branch tree), and the target's own token (resampled / bonus / plain) hanging off the
    end of the accepted path. Traces, in order: edges not taken, the accepted path (thick), the root, then
    one marker trace per verdict present."""
    root = {"type": "scatter", "x": [0], "y": [0.0], "mode": "markers+text", "text": ["context"],
            "textposition": "top center", "name": "context", "hoverinfo": "skip", "showlegend": False,
            "marker": {"size": 18, "color": ROOT, "symbol": "square"}}
    axes = {"xaxis": {"title": {"text": "draft position (0 = the context so far)"}, "dtick": 1, "zeroline": False,
                      "range": [-0.5, 2.5]},
            "yaxis": {"visible": False, "range": [0.6, -0.8]}}
    if event is None:
        return figure([root], "Candidate tree of the latest step", "no step yet", **axes)
    g = TreeGeometry.of(event)
    root["y"] = [g.root_y]
    data = [*_tree_edges(g), root, *_tree_nodes(g)]
    all_x = [0.0] + [g.pos(i)[0] for i in range(len(g.drafts))] + ([g.final_xy[0]] if g.final_xy else [])
    all_y = [g.root_y] + g.ys + ([g.final_xy[1]] if g.final_xy else [])
    axes["xaxis"]["range"] = [-0.5, max(all_x) + 0.6]
    axes["yaxis"]["range"] = [max(all_y) + 0.6, min(all_y) - 0.8]  # reversed: the first branch on top
    title = f"Candidate tree of step {event.step + 1}: kept {event.n_accepted} of {len(g.drafts)} drafts"
    # the legend goes under the axis title: a tree with every verdict and a lookup branch has too many entries to
    # share the title's line
    return figure(data, title, legend={"orientation": "h", "yanchor": "top", "y": -0.3, "xanchor": "left", "x": 0.0,
                                       "font": {"size": 15}},
                  margin={"l": 64, "r": 20, "t": 60, "b": 110}, height=HEIGHT + 50, **axes)


# --- teaching mode (specviz/ui/teach.py's CycleView as a dict) ---------------------------------------------
