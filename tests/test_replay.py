"""The replay of a finished race (specviz/ui/replay.py): its order, its pace and its end state, from golden events
(no model). One test runs on the real clock, briefly, with generous bounds."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest
from test_app_logic import snapshot
from test_render import AR, FULL, NO_DRAFT, PARTIAL

from specviz.ui import race_views, replay


def timed(events, seconds):
    """The events with each step's compute time set (draft_s 0, verify_s `seconds`)."""
    return [replace(e, draft_s=0.0, verify_s=seconds) for e in events]


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.t += s


def race():
    """AR: 2 steps of 0.3 s (0.6 s); speculative: 3 steps of 0.1 s (0.3 s)."""
    return snapshot(timed(AR, 0.3), timed([PARTIAL, FULL, NO_DRAFT], 0.1))


def test_the_timeline_puts_each_event_when_its_lane_had_computed_it():
    ticks = replay.timeline({k: v.events for k, v in race().lanes.items()})
    assert [(t.lane, round(t.at, 3)) for t in ticks] == [("spec", 0.1), ("spec", 0.2), ("ar", 0.3), ("spec", 0.3),
                                                         ("ar", 0.6)]
    assert replay.duration(race()) == pytest.approx(0.6)  # the slower lane's compute


@pytest.mark.parametrize("pace", [0.25, 0.5, 1.0])
def test_a_replay_takes_the_recorded_compute_over_the_pace_and_ends_as_the_race_did(pace):
    final, clock = race(), FakeClock()
    views = list(replay.replay_views(final, pace, frame=0.05, sleep=clock.sleep, now=clock.now))
    assert clock.t == pytest.approx(0.6 / pace)
    last, live = views[-1], race_views.view_of(final)
    assert (last.pane_ar, last.pane_spec, last.summary) == (live.pane_ar, live.pane_spec, live.summary)
    assert "Replayed at" in last.status and all("Replaying at" in v.status for v in views[:-1])
    assert 'data-state="done"' not in views[0].pane_ar and "…" in views[0].pane_spec  # it starts from nothing


def test_a_replay_shows_events_in_clock_order_at_most_once_a_frame():
    final, clock = race(), FakeClock()
    seen = []
    for snap in replay.replay_stream(final, 0.5, frame=0.05, sleep=clock.sleep, now=clock.now):
        seen.append((round(clock.t, 3), len(snap.lanes["ar"].events), len(snap.lanes["spec"].events)))
    # at 0.5x: spec's steps at 0.2, 0.4, 0.6 s; AR's at 0.6, 1.2 s
    assert seen == [(0.0, 0, 0), (0.2, 0, 1), (0.4, 0, 2), (0.6, 1, 3), (1.2, 2, 3)]


def test_a_replay_on_the_real_clock_takes_about_twice_the_compute_at_half_speed():
    final = snapshot(timed(AR, 0.15), timed([PARTIAL, FULL, NO_DRAFT], 0.05))  # 0.3 s of compute
    t0 = time.perf_counter()
    views = list(replay.replay_views(final, replay.pace_of("0.5×")))
    ratio = (time.perf_counter() - t0) / replay.duration(final)
    assert 1.5 <= ratio <= 3.0, ratio
    assert views[-1].pane_spec == race_views.view_of(final).pane_spec


def test_pace_choices():
    assert [replay.pace_of(c) for c in replay.PACES] == [0.25, 0.5, 1.0]
    assert replay.pace_of("2") == 2.0 and replay.pace_of(0.5) == 0.5
    with pytest.raises(ValueError):
        replay.pace_of("0")
