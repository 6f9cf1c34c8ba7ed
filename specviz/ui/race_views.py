"""What the race tab shows of a race, as it runs: a View (each output's value, by name) of each snapshot, throttled
to a few updates a second with the plots redrawn about once a second. No Gradio here: ui/race.py wires a View's
names to its components."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Optional, TypeVar

from specviz.config import DEFAULT_DRAFT
from specviz.events import StepEvent
from specviz.ui import plots
from specviz.ui.common import status_html
from specviz.ui.logic import DEFAULTS, RaceSnapshot, short_label
from specviz.ui.race_html import empty_panes, pane_html, status_of, summary_html

UPDATE_INTERVAL_S = 0.25                                # ~4 pane updates per second
PLOT_INTERVAL_S = 1.0                                   # plots redraw about once a second (and at the end)

T = TypeVar("T")


def throttle(stream: Iterable[T], interval: float = UPDATE_INTERVAL_S, key: Callable[[T], object] = lambda x: None,
             now: Callable[[], float] = time.perf_counter) -> Iterator[T]:
    """Pass at most one item per `interval` seconds, plus every item whose key differs from the last one
    passed (a phase change), and always the final item."""
    last_t = None
    last_key = object()
    pending = False
    item = None
    for item in stream:
        k = key(item)
        t = now()
        if last_t is None or k != last_key or t - last_t >= interval:
            last_t, last_key, pending = t, k, False
            yield item
        else:
            pending = True
    if pending:
        yield item


@dataclass(frozen=True)
class View:
    """Everything the UI shows for one snapshot: OUTPUTS name the shown fields, which the race tab wires to its
    components by these names (None: unchanged)."""
    status: str
    pane_ar: str
    pane_spec: str
    summary: str
    alpha: object = None
    speed: object = None
    accept: object = None
    tree: object = None
    final_events: Optional[list[StepEvent]] = None  # the speculative lane's events, once the race is done
    final: Optional[RaceSnapshot] = None             # the finished race itself, for a replay (ui/replay.py)
    snapshot: Optional[RaceSnapshot] = None          # the race shown, live (Stop renders it: stopped)

    OUTPUTS = ("status", "pane_ar", "pane_spec", "summary", "alpha", "speed", "accept", "tree")

    def shown(self) -> dict[str, object]:
        """{output name: value} for each shown field that changes (a None is left out: unchanged)."""
        return {name: value for name in self.OUTPUTS if (value := getattr(self, name)) is not None}


def view_of(snap: RaceSnapshot, with_plots: bool = True) -> View:
    running, stopped = snap.phase == "running", snap.phase == "stopped"
    ar, spec = snap.lanes["ar"], snap.lanes["spec"]
    view = View(
        status=status_of(snap),
        pane_ar=pane_html(snap.title("ar"), ar, running, stopped),
        pane_spec=pane_html(snap.title("spec"), spec, running, stopped, snap.cfg.method),
        summary=summary_html(snap),
        final_events=list(spec.events) if snap.phase == "done" else None,
        final=snap if snap.phase == "done" else None,
        snapshot=snap,
    )
    if not with_plots:
        return view
    return replace(
        view,
        alpha=plots.alpha_figure(spec.events),
        speed=plots.speed_figure({"ar": ar.events, "spec": spec.events},
                                 {"ar": "plain AR", "spec": f"speculative ({short_label(snap.cfg)})"}),
        accept=plots.accept_figure(spec.events),
        tree=plots.tree_figure(tree_event(spec.events, snap.phase == "done")),
    )


def tree_event(events: list[StepEvent], done: bool) -> Optional[StepEvent]:
    """The step the tree panel draws: the latest while the race runs, the longest accepted path once it is done."""
    if not events:
        return None
    return events[plots.longest_path_step(events)] if done else events[-1]


def live_views(stream: Iterable[RaceSnapshot], interval: float = UPDATE_INTERVAL_S,
               plot_interval: float = PLOT_INTERVAL_S, now: Callable[[], float] = time.perf_counter) -> Iterator[View]:
    """The UI's stream: panes at most every `interval` s, plots at most every `plot_interval` s, and every
    phase change (loading, first tokens, done) and the final state in full."""
    last_plot = None
    for snap in throttle(stream, interval, key=lambda s: s.phase, now=now):
        t = now()
        full = snap.phase != "running" or last_plot is None or t - last_plot >= plot_interval
        if full:
            last_plot = t
        yield view_of(snap, with_plots=full)


def empty_view(method: str = DEFAULTS.method, message: str = "", lookup: int = 0, retrieve: int = 0) -> View:
    ar, spec = empty_panes(method, lookup, retrieve)
    return View(status_html(message) if message else "", ar, spec,
                summary_html(RaceSnapshot(DEFAULTS, DEFAULT_DRAFT)), plots.alpha_figure([]),
                plots.speed_figure({"ar": [], "spec": []}, {"ar": "plain AR", "spec": "speculative"}),
                plots.accept_figure([]), plots.tree_figure(None))
