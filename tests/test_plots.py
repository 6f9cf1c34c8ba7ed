"""Golden event lists -> Plotly figures: trace counts, values, the tree's accepted path (no model, no torch)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest
from test_render import AR, FULL, NO_DRAFT, PARTIAL

from specviz.events import DraftToken as D
from specviz.events import EmittedToken as E
from specviz.events import StepEvent
from specviz.events import Verdict as V
from specviz.ui import plots

ROOT = Path(__file__).resolve().parents[1]
SPEC = [PARTIAL, FULL, NO_DRAFT]


def segments(trace) -> list[tuple[tuple, tuple]]:
    """A lines trace drawn as [x0, x1, None, ...] -> [((x0, y0), (x1, y1)), ...]."""
    xs, ys = list(trace.x), list(trace.y)
    return [((xs[i], ys[i]), (xs[i + 1], ys[i + 1])) for i in range(0, len(xs), 3)]


def all_figures():
    return [plots.alpha_figure(SPEC), plots.alpha_figure([]), plots.speed_figure({"ar": AR, "spec": SPEC}),
            plots.speed_figure({"ar": [], "spec": []}), plots.accept_figure(SPEC), plots.accept_figure([]),
            plots.tree_figure(PARTIAL), plots.tree_figure(FULL), plots.tree_figure(NO_DRAFT),
            plots.tree_figure(None), plots.tree_figure(TREE)]


@pytest.mark.parametrize("index", range(11))
def test_every_figure_passes_plotlys_validation(index):
    fig = all_figures()[index]  # built unvalidated for speed: check the names and values here
    go.Figure(fig.to_dict())
    assert len(fig.data) >= 1


def test_alpha_cumulative_and_rolling():
    fig = plots.alpha_figure(SPEC, window=1)
    cumulative, rolling = fig.data
    assert list(cumulative.x) == [1, 2, 3]
    assert list(cumulative.y) == pytest.approx([2 / 3, 4 / 5, 4 / 5])  # 2 of 3 judged, then 2 of 2, then none
    assert list(rolling.y)[:2] == pytest.approx([2 / 3, 1.0]) and rolling.y[2] is None


def test_speed_lines_are_tokens_over_compute_seconds():
    fig = plots.speed_figure({"ar": AR, "spec": SPEC}, {"ar": "plain AR", "spec": "speculative"})
    ar, spec = fig.data
    assert list(ar.x) == pytest.approx([0, 0.02, 0.04]) and list(ar.y) == [0, 1, 2]
    assert list(spec.x) == pytest.approx([0, 0.03, 0.055, 0.075]) and list(spec.y) == [0, 3, 6, 7]
    assert ar.name == "plain AR · 50.0 tok/s" and spec.name.startswith("speculative · 93.3")


def test_accept_histogram_and_per_position_alpha():
    fig = plots.accept_figure(SPEC)
    hist, alpha_i = fig.data
    assert list(hist.x) == [0, 1, 2, 3, 4] and list(hist.y) == [0, 0, 2, 0, 0]  # both drafting steps kept 2
    assert list(alpha_i.x) == [1, 2, 3] and list(alpha_i.y) == pytest.approx([1.0, 1.0, 0.0])
    assert "tokens per target pass (τ) 2.33" in fig.layout.title.text  # 7 tokens over 3 target forwards


def test_chain_tree_highlights_the_accepted_path_and_hangs_the_resampled_token_off_it():
    fig = plots.tree_figure(PARTIAL)
    names = [t.name for t in fig.data]
    assert names == ["not taken", "accepted path", "context", "accepted", "rejected", "discarded", "resampled"]
    path = segments(fig.data[1])
    assert path == [((0, 0), (1, 0)), ((1, 0), (2, 0)), ((2, 0), (3, 1))]  # root -> The -> sky -> " looks"
    assert segments(fig.data[0]) == [((2, 0), (3, 0)), ((3, 0), (4, 0))]  # " is" and " red", not taken
    resampled = fig.data[-1]
    assert list(resampled.text) == ["␣looks"] and (resampled.x[0], resampled.y[0]) == (3, 1)
    rejected = fig.data[4]
    assert "p_target=0.100" in rejected.hovertext[0] and "q_draft=0.600" in rejected.hovertext[0]


def test_fully_accepted_chain_ends_in_the_bonus_token_on_the_same_line():
    fig = plots.tree_figure(FULL)
    assert segments(fig.data[1]) == [((0, 0), (1, 0)), ((1, 0), (2, 0)), ((2, 0), (3, 0))]
    assert fig.data[-1].name == "bonus" and list(fig.data[-1].text) == ["<b>"]
    assert list(fig.data[3].text) == ["␣blue", "↵"]


# a real tree (as a Medusa engine would yield it): two roots; the first has two children, one of which is kept
TREE = StepEvent(step=5, drafts=(
    D(1, "A", V.ACCEPTED, 0.6, 0.7, None, -1, 0),
    D(2, "B", V.DISCARDED, 0.3, None, None, -1, 0),
    D(3, "C", V.ACCEPTED, 0.5, 0.6, None, 0, 1),
    D(4, "D", V.DISCARDED, 0.2, None, None, 0, 1),
    D(5, "E", V.REJECTED, 0.4, 0.2, None, 2, 2),
), emitted=(E(1, "A", V.ACCEPTED), E(3, "C", V.ACCEPTED), E(6, "F", V.RESAMPLED)),
    draft_s=0.01, verify_s=0.02, draft_forwards=3, target_forwards=1, gamma=3)


def test_accept_histogram_of_a_tree_runs_to_its_depth_not_its_node_count():
    # as the tree engine writes them: γ is the node count
    wide = StepEvent(step=0, drafts=tuple(D(10 + i, "x", V.DISCARDED, 0.1, None, None, -1, 0) for i in range(12)),
                     emitted=(), gamma=12)
    tree = dataclasses.replace(TREE, gamma=len(TREE.drafts))
    assert plots.accepted_length_counts([tree]) == [0, 0, 1, 0]  # 5 nodes, depth 3: kept A and C
    assert plots.accepted_length_counts([wide]) == [1, 0]  # 12 siblings: a step keeps at most one of them
    assert len(plots.accepted_length_counts([PARTIAL])) == PARTIAL.gamma + 1  # a chain: up to its γ


def test_tree_layout_places_leaves_in_depth_first_order():
    assert plots.tree_layout(TREE.drafts) == [0.5, 2.0, 0.0, 1.0, 0.0]  # E, D, B are the leaves
    assert plots.tree_layout(PARTIAL.drafts) == [0.0, 0.0, 0.0, 0.0]  # a chain is one straight branch
    assert plots.accepted_path(TREE.drafts) == [0, 2]


def test_real_tree_draws_every_branch_and_highlights_one_path():
    fig = plots.tree_figure(TREE)
    path = segments(fig.data[1])
    root_y = fig.data[2].y[0]
    assert root_y == pytest.approx(1.25)  # the mean of its children A (0.5) and B (2.0)
    assert [p[1][0] for p in path] == [1, 2, 3]  # A, C, then the resampled F
    assert path[0] == ((0, root_y), (1, 0.5)) and path[1] == ((1, 0.5), (2, 0.0))
    assert len(segments(fig.data[0])) == 3  # B, D and E are off the path


def test_a_wide_tree_keeps_its_labels_apart():
    """Eight refused siblings (Medusa's depth-1 candidates): labels sit beside smaller nodes, and the target's own
    token hangs below the tree instead of on top of a sibling."""
    wide = StepEvent(step=1, drafts=tuple(D(10 + i, f"t{i}", V.REJECTED if i == 0 else V.DISCARDED, 0.1,
                                            0.0 if i == 0 else None, None, -1, 0, head=0, rank=i) for i in range(8)),
                     emitted=(E(99, "x", V.RESAMPLED),), draft_s=0.01, verify_s=0.02, draft_forwards=1,
                     target_forwards=1, gamma=1)
    fig = plots.tree_figure(wide)
    markers = [t for t in fig.data if t.name in ("rejected", "discarded", "resampled")]
    assert {t.textposition for t in markers} == {"middle right"} and {t.marker.size for t in markers} == {11}
    final = next(t for t in markers if t.name == "resampled")
    siblings = [y for t in markers if t.name != "resampled" for y in t.y]
    assert min(abs(final.y[0] - y) for y in siblings) >= 0.6
    assert plots.tree_figure(TREE).data[-1].textposition == "top center"  # a small tree keeps labels on top


def test_tree_of_a_step_without_drafts_and_the_empty_tree():
    fig = plots.tree_figure(NO_DRAFT)
    assert fig.data[-1].name == "plain" and list(fig.data[-1].text) == ["!"]
    assert list(fig.data[1].x)[:2] == [0, 1]  # root -> the target's own token
    empty = plots.tree_figure(None)
    assert [t.name for t in empty.data] == ["context"]


def test_plots_and_handler_logic_do_not_import_torch():
    code = "import sys, specviz.ui.plots, specviz.ui.logic; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=str(ROOT)).returncode == 0


def test_prompt_lookup_nodes_hang_on_dashed_edges_and_say_so():
    """Nodes grafted by prompt lookup (head LOOKUP_HEAD): their edges off the accepted path are dashed, in a trace of
    their own, and their hover names the lookup; a tree without them draws no such trace."""
    from specviz.events import LOOKUP_HEAD

    grafted = StepEvent(step=2, drafts=(
        D(1, "A", V.REJECTED, 0.6, 0.1, None, -1, 0),
        D(7, "X", V.ACCEPTED, 1.0, 0.9, None, -1, 0, head=LOOKUP_HEAD, rank=1),
        D(8, "Y", V.REJECTED, 1.0, 0.2, None, 1, 1, head=LOOKUP_HEAD),
    ), emitted=(E(7, "X", V.ACCEPTED), E(9, "Z", V.RESAMPLED)),
        draft_s=0.01, verify_s=0.02, draft_forwards=1, target_forwards=1, gamma=3)
    fig = plots.tree_figure(grafted)
    lookup = next(t for t in fig.data if t.name == "prompt lookup")
    assert lookup.line.dash == "dash" and len(segments(lookup)) == 1  # X -> Y; X itself is on the accepted path
    assert len(segments(fig.data[0])) == 1 and fig.data[0].line.dash is None  # A, the drafter's own: solid
    rejected = next(t for t in fig.data if t.name == "rejected")
    assert ["from prompt lookup" in h for h in rejected.hovertext] == [False, True]
    assert "prompt lookup" not in [t.name for t in plots.tree_figure(TREE).data]


def test_datastore_nodes_hang_on_dotted_edges_and_say_so():
    """Nodes grafted from the datastore (RETRIEVAL_HEAD) beside prompt lookup's: a dotted trace of their own, and a
    hover that names the datastore."""
    from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD

    grafted = StepEvent(step=2, drafts=(
        D(1, "A", V.ACCEPTED, 0.6, 0.9, None, -1, 0),
        D(7, "X", V.REJECTED, 1.0, 0.1, None, 0, 1, head=LOOKUP_HEAD),
        D(8, "Y", V.REJECTED, 1.0, 0.2, None, 0, 1, head=RETRIEVAL_HEAD, rank=1),
        D(5, "W", V.DISCARDED, 1.0, None, None, 2, 2, head=RETRIEVAL_HEAD),
    ), emitted=(E(1, "A", V.ACCEPTED), E(9, "Z", V.RESAMPLED)),
        draft_s=0.01, verify_s=0.02, draft_forwards=1, target_forwards=1, gamma=4)
    fig = plots.tree_figure(grafted)
    names = [t.name for t in fig.data]
    datastore = next(t for t in fig.data if t.name == "datastore")
    assert datastore.line.dash == "dot" and len(segments(datastore)) == 2  # A -> Y -> W
    assert len(segments(next(t for t in fig.data if t.name == "prompt lookup"))) == 1 and "datastore" in names
    rejected = next(t for t in fig.data if t.name == "rejected")
    assert ["from the datastore" in h for h in rejected.hovertext] == [False, True]
    assert ["from prompt lookup" in h for h in rejected.hovertext] == [True, False]
