"""The race clock: run two step streams side by side on one device.

Two engines cannot share one device fairly at the same moment, so the race advances whichever
engine has used less compute time so far, one step at a time. Each keeps its own compute clock, so
both streams appear at their true relative speed and neither disturbs the other's measurements.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from specviz.events import StepEvent


@dataclass(frozen=True)
class Tick:
    lane: str            # which stream advanced, e.g. "ar" or "spec"
    event: StepEvent
    clock: float         # that lane's compute seconds after this step


def race(lanes: dict[str, Iterator[StepEvent]]) -> Iterator[Tick]:
    """Interleave the streams by compute time until all are exhausted."""
    clocks = {name: 0.0 for name in lanes}
    live = dict(lanes)
    while live:
        name = min(live, key=lambda n: (clocks[n], list(lanes).index(n)))
        event = next(live[name], None)
        if event is None:
            del live[name]
            continue
        clocks[name] += event.seconds
        yield Tick(name, event, clocks[name])
