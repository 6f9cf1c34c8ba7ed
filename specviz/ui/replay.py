"""Replay a finished race for a room: the recorded events again, at a chosen pace, both lanes on one clock.

Each event appears when its lane's compute clock reaches the end of it (the race clock's order: a lane's tokens
show up when they were computed), so at pace 1× the replay takes as long as the slower lane's recorded compute,
at 0.5× twice that. Nothing runs a model here: a teacher can slow a race down and narrate a step. The final
state is the recorded race's: the same panes and the same summary.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Mapping, Sequence

from specviz.events import StepEvent
from specviz.ui.common import status_html
from specviz.ui.logic import Lane, RaceSnapshot
from specviz.ui.race_views import View, view_of

PACES = {"0.25×": 0.25, "0.5×": 0.5, "1×": 1.0}  # the replay's choices: a step narrated, then the real speed
DEFAULT_PACE = "0.5×"
FRAME_S = 0.1          # the panes update at most ~10 times a second
PLOT_INTERVAL_S = 1.0  # the plots about once a second (and at the end)


@dataclass(frozen=True)
class Tick:
    at: float          # seconds on the shared compute clock when this event's tokens appear
    lane: str          # "ar" | "spec"
    event: StepEvent


def timeline(lanes: Mapping[str, Sequence[StepEvent]]) -> list[Tick]:
    """Every event of both lanes at the compute time its lane had used when it was done, in time order (a tie
    keeps the lanes' order)."""
    ticks = []
    for lane, events in lanes.items():
        clock = 0.0
        for event in events:
            clock += event.seconds
            ticks.append(Tick(clock, lane, event))
    return sorted(ticks, key=lambda t: t.at)


def duration(final: RaceSnapshot) -> float:
    """Seconds of recorded compute a replay at 1× takes: the slower lane's."""
    return max((t.at for t in timeline({k: v.events for k, v in final.lanes.items()})), default=0.0)


def pace_of(choice) -> float:
    """A pace choice ("0.5×", "0.5", 0.5) -> a positive factor (ValueError otherwise)."""
    value = PACES.get(choice) if isinstance(choice, str) and choice in PACES else float(str(choice).rstrip("×x"))
    if not value > 0:
        raise ValueError(f"pace={choice!r}: use a positive factor such as {', '.join(PACES)}")
    return value


def replay_stream(final: RaceSnapshot, pace: float, frame: float = FRAME_S, sleep: Callable[[float], None] = time.sleep,
                  now: Callable[[], float] = time.perf_counter) -> Iterator[RaceSnapshot]:
    """Snapshots of the recorded race `final` as its compute clock runs at `pace`× real time: one at the start,
    then at most one a `frame` while events arrive, and the finished race (comparison included) at the end."""
    snap = RaceSnapshot(final.cfg, final.draft, phase="running", lanes={"ar": Lane(), "spec": Lane()},
                        decode=final.decode, hardware=final.hardware, profiled=final.profiled)
    ticks = timeline({k: v.events for k, v in final.lanes.items()})
    start = last = now()
    yield snap
    i, pending = 0, False
    while i < len(ticks):
        t = now() - start
        while i < len(ticks) and ticks[i].at / pace <= t + 1e-9:  # (a sleep can end a rounding error early)
            lane = snap.lanes[ticks[i].lane]
            lane.events.append(ticks[i].event)
            lane.clock = ticks[i].at
            lane.done = ticks[i].event.finish_reason is not None
            i += 1
            pending = True
        if i == len(ticks):
            break
        if pending and now() - last >= frame:
            last, pending = now(), False
            yield snap
            continue
        wake = ticks[i].at / pace
        if pending:
            wake = min(wake, last - start + frame)
        sleep(max(0.0, wake - (now() - start)))
    for name, lane in snap.lanes.items():  # the recorded end state, exactly
        lane.clock, lane.done = final.lanes[name].clock, final.lanes[name].done
    snap.comparison, snap.phase = final.comparison, final.phase  # "stopped" for a race stopped mid-run
    yield snap


def replay_views(final: RaceSnapshot, pace: float, frame: float = FRAME_S, plot_interval: float = PLOT_INTERVAL_S,
                 sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = time.perf_counter
                 ) -> Iterator[View]:
    """The UI's stream for a replay: what the live race showed (race_views.view_of), with a status that says it is a
    replay and, at the end, how long it took against the recorded compute."""
    total = duration(final)
    start, last_plot = now(), None
    for snap in replay_stream(final, pace, frame, sleep, now):
        t = now()
        end = snap.phase != "running"
        full = end or last_plot is None or t - last_plot >= plot_interval
        if full:
            last_plot = t
        view = view_of(snap, with_plots=full)
        if end:
            status = status_html(f"Replayed at {pace:g}× in {t - start:.2f} s: {total:.2f} s of recorded compute "
                                 "(the slower lane's), the same events and the same end state as the race.", "ok")
        else:
            shown = max((lane.clock for lane in snap.lanes.values()), default=0.0)
            status = status_html(f"Replaying at {pace:g}×… compute clock {shown:.2f} s of {total:.2f} s "
                                 f"(both lanes on one clock)")
        yield replace(view, status=status)
