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


def _label(text: str) -> str:
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
        nodes.setdefault(d.verdict, []).append((*g.pos(i), _label(d.text), _hover(d, path_p)))
    if g.final is not None:
        hover = f"{g.final.verdict.value}: the target's own token"
        if g.final.p_target is not None:
            hover += f"<br>p_target={g.final.p_target:.3f}"
        nodes.setdefault(g.final.verdict, []).append((*g.final_xy, _label(g.final.text), hover))
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

Q_DRAFT = "#CC79A7"   # the drafter's colour (its lane's)
P_TARGET = "#0072B2"  # the target's
RESIDUAL = COLOURS[Verdict.RESAMPLED]  # the resampled token comes from the residual: same orange
VERDICT_MARK = {"accepted": "✓ kept", "rejected": "✗ refused", "discarded": "never judged", "plain": "target's token",
                "resampled": "target's own token (resampled)", "bonus": "bonus token (all kept)"}
TARGET_MARK = {"bonus": ("bonus token", "all kept, so "), "resampled": ("resampled", "")}  # its panel's title


def _tick(text: str) -> str:
    return f"‘{_label(text)}’"


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
