"""A cancelled or abandoned race stops on the server: the app launched in-process (tests/conftest.py's app_url), a race
submitted through gradio_client and cancelled after its first tokens (or its client process killed), then the app's
own /metrics read: within 2 s no race is counted as running and the token counter, fed by every engine step of the
speculative lane, stops growing. (The next race's time against a solo one: experiments/probes/cancel_probe.py.)"""
from __future__ import annotations

import functools
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from types import SimpleNamespace

import pytest
from test_app_logic import snapshot
from test_render import AR, FULL, NO_DRAFT, PARTIAL

from specviz.config import DecodeConfig
from specviz.core import race
from specviz.ui import logic, race_views
from specviz.ui import replay as replays

gradio_client = pytest.importorskip("gradio_client")

PROMPT = "Write a short, cheerful poem about a lighthouse keeper who loves tea."
N = 400  # far more tokens than the race gets through before it is stopped
CLIENT = """
import sys
from gradio_client import Client
Client(sys.argv[1], verbose=False).predict(prompt=sys.argv[2], max_new_tokens=int(sys.argv[3]), api_name="/race")
"""


def test_a_race_stops_before_its_next_step_once_its_stop_signal_is_set():
    steps = []

    def lane(name):
        for e in (PARTIAL, FULL, NO_DRAFT):
            steps.append(name)
            yield e

    stop = [False]
    token = race.STOP.set(lambda: stop[0])
    try:
        ticks = race.race({"ar": lane("ar"), "spec": lane("spec")})
        next(ticks), next(ticks)
        stop[0] = True
        with pytest.raises(race.Cancelled):
            next(ticks)
    finally:
        race.STOP.reset(token)
    assert len(steps) == 2 and race.steps_run() >= 2  # no step after the signal
    assert len(list(race.race({"ar": lane("ar")}))) == 3  # outside that context the signal is gone


def stopped_midway():
    snap = snapshot(AR, [PARTIAL, FULL])
    snap.phase = "running"
    for lane in snap.lanes.values():
        lane.done = False
    return snap


def test_a_race_stopped_midway_says_where_in_its_status_and_panes():
    snap = stopped_midway()
    ar, spec = snap.lanes["ar"].n_tokens, snap.lanes["spec"].n_tokens
    copy = logic.stopped(snap)
    view = race_views.view_of(copy)
    assert snap.phase == "running" and copy.lanes["spec"].events is not snap.lanes["spec"].events  # a copy
    assert f"■ stopped at {ar} plain / {spec} speculative tokens" in view.status
    assert f"■ stopped at {ar} tokens" in view.pane_ar and f"■ stopped at {spec} tokens" in view.pane_spec
    assert 'data-state="stopped"' in view.pane_ar and "running" not in view.pane_spec
    assert logic.stopped(copy) is None and logic.stopped(snapshot(AR, [PARTIAL])) is None  # ended already


def fake_race(steps: list):
    """race_stream's shape without models: a loading snapshot, then ticks folded in (each counted in `steps`) until
    the lanes run out (30 steps) or Stop ends it."""
    def stream(prompt, cfg, draft, target):
        snap = logic.RaceSnapshot(cfg, draft)
        yield snap
        snap.phase = "running"

        def ticks():
            for i in range(30):
                steps.append(i)
                name = "ar" if i % 2 else "spec"
                yield race.Tick(name, AR[0] if name == "ar" else FULL, 0.01 * (i + 1))
        yield from logic.fold_ticks(snap, ticks(), "fake")
        snap.phase = "done"
        yield snap
    return stream


def test_stop_ends_a_running_race_by_itself_and_its_last_word_shows_it_stopped(monkeypatch):
    """Stop's cancels= on a running stream left Gradio's "Error" badge on the status about one Stop in three; so Stop
    tells the race to end (logic.stopped) and the handler ends by itself: no step after it, and its last output says
    where it stopped (the same words stop_run showed at once)."""
    from specviz.ui import race as race_tab

    steps = []
    monkeypatch.setattr(race_tab, "race_stream", fake_race(steps))
    monkeypatch.setattr(race_tab, "live_views", functools.partial(race_views.live_views, interval=0.0,
                                                                 plot_interval=0.0))  # every step shown
    run = race_tab.run_race("a prompt", "pld", "", "2", 0.0, 1.0, 64, 0)
    live = next(run)["live"]
    while len(live.lanes["spec"].events) < 3:
        next(run)
    shown = race_tab.stop_run(live, None)
    assert "■ stopped at" in shown["status"] and shown["live"].phase == "stopped"
    ran = len(steps)
    rest = list(run)  # ends by itself
    assert len(steps) == ran, "a step ran after Stop"
    assert len(rest) == 1 and "■ stopped at" in rest[0]["status"] and rest[0]["live"].phase == "stopped"
    assert rest[0]["recording"].lanes["spec"].n_tokens == live.lanes["spec"].n_tokens
    assert logic.stopped(rest[0]["live"]) is None  # a second Stop finds nothing running


def test_stop_while_a_race_waits_for_the_device_means_it_never_runs(monkeypatch):
    """Run's click leaves a Waiting as the session's live run before the race joins the device's queue; Stop while it
    waits says so at once, and the race, once the queue reaches it, runs no step and says it again."""
    from specviz.ui import race as race_tab

    steps = []
    monkeypatch.setattr(race_tab, "race_stream", fake_race(steps))
    live = logic.waiting(None)
    assert isinstance(live, logic.Waiting)
    shown = race_tab.stop_run(live, None)
    assert "stopped before it started" in shown["status"] and shown["live"].phase == "stopped"
    assert race_tab.stop_run(shown["live"], None) == {}  # a second Stop finds nothing running
    for handed in (live, shown["live"]):  # the state as Run's click left it, or as Stop did
        rest = list(race_tab.run_race("a prompt", "pld", "", "2", 0.0, 1.0, 64, 0, live=handed))
        assert len(rest) == 1 and "stopped before it started" in rest[0]["status"]
    assert steps == []


def test_a_race_that_starts_takes_its_waiting_stop_event(monkeypatch):
    """A Stop in the instant the race starts (Stop still sees the Waiting) ends the race before its next step."""
    from specviz.ui import race as race_tab

    steps = []
    monkeypatch.setattr(race_tab, "race_stream", fake_race(steps))
    monkeypatch.setattr(race_tab, "live_views", functools.partial(race_views.live_views, interval=0.0,
                                                                 plot_interval=0.0))
    live = logic.waiting(None)
    run = race_tab.run_race("a prompt", "pld", "", "2", 0.0, 1.0, 64, 0, live=live)
    snap = next(run)["live"]
    assert snap.stop is live.stop
    assert logic.waiting(snap) is snap  # Run pressed again mid-race: Stop still reaches this race
    race_tab.stop_run(live, None)
    rest = list(run)
    assert len(steps) <= 1 and "■ stopped at" in rest[-1]["status"]
    assert isinstance(logic.waiting(rest[-1]["live"]), logic.Waiting)  # a stopped race: the next Run waits anew


def test_stop_while_a_race_of_several_lanes_waits_means_it_never_runs(monkeypatch):
    from specviz.ui import many

    ran = []
    monkeypatch.setattr(many, "_lanes", lambda *a: ran.append(a))
    live = logic.waiting(None)
    assert "stopped before it started" in many.stop_many(live)["status"]
    rest = list(many.run_many("a prompt", "pld", 0.0, 64, live))
    assert len(rest) == 1 and "stopped before it started" in rest[0]["status"] and ran == []


def test_stop_ends_a_race_of_several_lanes_by_itself(monkeypatch):
    from specviz.ui import many

    steps = []
    one = fake_race(steps)

    def lanes_stream(prompt, lanes, target):
        snap = many.LanesSnapshot({"pld": DecodeConfig(method="pld")})
        for s in one(prompt, DecodeConfig(method="pld"), "", target):  # its lanes and phase, mirrored
            snap.phase, snap.lanes = s.phase, {"ar": s.lanes["ar"], "pld": s.lanes["spec"]}
            s.stop = snap.stop
            yield snap

    monkeypatch.setattr(many, "lanes_stream", lanes_stream)
    monkeypatch.setattr(many, "_lanes", lambda *a: ({"pld": (DecodeConfig(method="pld"), "")}, "target"))
    monkeypatch.setattr(many, "throttle", lambda stream, key=None: stream)  # every step shown
    run = many.run_many("a prompt", "pld", 0.0, 64)
    live = next(run)["live"]
    while len(live.lanes["pld"].events) < 3:
        next(run)
    assert "■ stopped at" in many.stop_many(live)["status"]
    ran = len(steps)
    rest = list(run)
    assert len(steps) == ran and len(rest) == 1 and "■ stopped at" in rest[0]["status"]


def test_a_step_that_ends_after_stop_is_dropped_so_stop_and_the_races_last_word_agree():
    """Stop pressed while a step computes: Stop's copy (what stop_run shows and Replay replays) and the race's own
    last word (its Cancelled handler's copy) hold the same steps. (Before, the step landed in the race after Stop's
    copy: the panes said 14 tokens and Replay ended at 12.)"""
    snap = logic.RaceSnapshot(DecodeConfig(method="pld"), "", phase="running")
    shown = []

    def ticks():
        yield SimpleNamespace(lane="spec", event=PARTIAL, clock=0.1)
        shown.append(logic.stopped(snap))  # Stop, while the next step computes
        yield SimpleNamespace(lane="spec", event=FULL, clock=0.2)

    folded = logic.fold_ticks(snap, ticks(), "a test race")
    next(folded)
    with pytest.raises(race.Cancelled):
        next(folded)
    last_word = logic.stopped(snap)
    assert [lane.events for lane in last_word.lanes.values()] == [lane.events for lane in shown[0].lanes.values()]
    assert last_word.lanes["spec"].events == [PARTIAL]


def test_a_replay_of_a_stopped_race_ends_where_it_stopped():
    final = logic.stopped(stopped_midway())
    for lane in final.lanes.values():
        lane.events = [replace(e, draft_s=0.0, verify_s=0.001) for e in lane.events]
    last = list(replays.replay_views(final, 1.0, frame=0.0))[-1]
    assert "Replayed at" in last.status
    assert (last.pane_ar, last.pane_spec) == (race_views.view_of(final).pane_ar, race_views.view_of(final).pane_spec)
    assert f"■ stopped at {final.lanes['spec'].n_tokens} tokens" in last.pane_spec


def metric(url: str, name: str) -> float:
    """The sum of one metric's samples in the app's /metrics text."""
    text = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^specviz:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def wait_for(condition, timeout: float, what: str) -> None:
    end = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > end:
            raise AssertionError(f"{what} within {timeout:g} s")
        time.sleep(0.05)


def tokens(url: str) -> float:
    return metric(url, "generation_tokens_total")


def steps(url: str) -> float:
    return metric(url, "race_steps_total")


def running(url: str) -> float:
    return metric(url, "num_requests_running")


def first_tokens(url: str) -> None:
    """Until a race of this test is running and its speculative lane has emitted its first tokens."""
    before = tokens(url)
    wait_for(lambda: running(url) >= 1 and tokens(url) > before + 4, 300, "the race's first tokens")


def assert_stopped(url: str) -> None:
    """Within 2 s of the cancel: no race counted as running (nothing else runs here, so ≤ 1 is 0), and no engine step
    after that (the app's count of engine steps, both lanes, and its token counter stay put for a second)."""
    wait_for(lambda: running(url) <= 0, 2.0, "num_requests_running back to 0")
    settled = steps(url), tokens(url)
    time.sleep(1.0)
    assert (steps(url), tokens(url)) == settled, "the race kept generating after it was stopped"


@pytest.fixture(scope="module")
def client(app_url):
    c = gradio_client.Client(app_url, verbose=False)
    c.predict(prompt=PROMPT, max_new_tokens=8, api_name="/race")  # warm: the drafter loaded, the kernels picked
    return c


def test_cancelled_race_endpoint_stops_generating(app_url, client):
    job = client.submit(prompt=PROMPT, max_new_tokens=N, api_name="/race")
    first_tokens(app_url)
    job.cancel()
    assert_stopped(app_url)


def test_cancelled_streaming_race_stops_generating(app_url, client):
    job = client.submit(PROMPT, "pld", "int8", "4", 0.0, 1.0, N, 0, "0", "0", api_name="/race_stream")
    first_tokens(app_url)
    assert job.status().code.name in ("PROCESSING", "ITERATING")
    job.cancel()
    assert_stopped(app_url)


def test_race_of_a_killed_client_stops_generating(app_url, client):
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, app_url, PROMPT, str(N)])
    try:
        first_tokens(app_url)
    finally:
        proc.kill()
        proc.wait()
    assert_stopped(app_url)
    out = client.predict(prompt=PROMPT, max_new_tokens=8, api_name="/race")  # the app serves the next visitor
    assert out["spec_text"] == out["ar_text"]


STOPPED = re.compile(r"■ stopped at (\d+) plain / (\d+) speculative tokens")
BADGE = "() => [...document.querySelectorAll('#pane-ar .sv-state, #pane-spec .sv-state')].map(b => b.textContent)"


def test_stop_mid_race_says_stopped_and_replay_replays_it(app_url, browser):
    """Stop in the middle of a race: the status and both panes say where it stopped (the time it takes printed),
    nothing overwrites that afterwards, and Replay, enabled, replays the recorded part and ends at the same counts."""
    from tests.browser_kit import ASSETS, set_number

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(app_url)
    page.wait_for_selector("#run")
    folded = not page.locator("#max-new-tokens input[type=number]").is_visible()  # the settings fold away
    if folded:
        page.locator("#settings button").first.click()
    set_number(page, "max-new-tokens", N)
    if folded:
        page.locator("#settings button").first.click()
    page.locator("#run").click()
    page.wait_for_function("() => document.querySelectorAll('#pane-spec .sv-pane .sv-tok').length > 12",
                           timeout=300_000)
    assert page.locator("#pane-spec .sv-pane-box[data-state=running]").count() == 1
    start = time.perf_counter()
    page.locator("#stop").dispatch_event("click")  # now: the growing panes never let the button sit still
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('■ stopped at')",
                           timeout=10_000)
    for pane in ("#pane-ar", "#pane-spec"):
        page.wait_for_selector(f"{pane} .sv-pane-box[data-state=stopped]", timeout=10_000)
    print(f"stopped shown {time.perf_counter() - start:.2f} s after Stop")
    page.wait_for_timeout(1500)  # a late update of the cancelled race would land by now
    status = page.locator("#status").inner_text()
    assert "Error" not in status  # Gradio's badge on a cancelled stream (about one Stop in three before the race
    ar, spec = (int(n) for n in STOPPED.search(status).groups())  # ended itself)
    assert 0 < spec < N
    assert page.evaluate(BADGE) == [f"■ stopped at {ar} tokens", f"■ stopped at {spec} tokens"]
    assert page.locator("#replay").is_enabled()
    page.locator("#status").scroll_into_view_if_needed()
    page.screenshot(path=str(ASSETS / "screenshot-stopped.png"))

    page.locator("#replay").click()
    page.wait_for_function("() => /Replayed at/.test(document.querySelector('#status').innerText)", timeout=120_000)
    assert page.evaluate(BADGE) == [f"■ stopped at {ar} tokens", f"■ stopped at {spec} tokens"]
