"""The race clock: run two step streams side by side on one device.

Two engines cannot share one device fairly at the same moment, so the race advances whichever
engine has used less compute time so far, one step at a time. Each keeps its own compute clock, so
both streams appear at their true relative speed and neither disturbs the other's measurements.

A race stops between two steps when the stop signal of its context (STOP) says so: a server sets it for a run whose
request was cancelled or whose client went away, so the engines do not keep computing for nobody.
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from specviz.events import StepEvent

# the running race's stop signal: a callable that turns True once the run should end (None: never stopped)
STOP: ContextVar[Optional[Callable[[], bool]]] = ContextVar("specviz_race_stop", default=None)


_steps = [0]  # the engine steps every race of this process has run, both lanes (steps_run)


def steps_run() -> int:
    """The engine steps every race of this process has run so far (the app's /metrics: specviz:race_steps_total); it
    grows only while a race computes."""
    return _steps[0]


class Cancelled(Exception):
    """The race was stopped from outside between two steps (its request cancelled, its client gone)."""


@dataclass(frozen=True)
class Tick:
    lane: str            # which stream advanced, e.g. "ar" or "spec"
    event: StepEvent
    clock: float         # that lane's compute seconds after this step


def race(lanes: dict[str, Iterator[StepEvent]]) -> Iterator[Tick]:
    """Interleave the streams by compute time until all are exhausted; raise Cancelled before a step once the
    context's STOP signal is set."""
    clocks = {name: 0.0 for name in lanes}
    live = dict(lanes)
    while live:
        stop = STOP.get()
        if stop is not None and stop():
            raise Cancelled("the race was stopped: its request was cancelled or its client went away")
        name = min(live, key=lambda n: (clocks[n], list(lanes).index(n)))
        event = next(live[name], None)
        if event is None:
            del live[name]
            continue
        _steps[0] += 1
        clocks[name] += event.seconds
        yield Tick(name, event, clocks[name])
