"""The app's handler logic without Gradio: form values -> DecodeConfig, the race as a stream of snapshots, and the
one line a user sees for an error. What the UI shows of a snapshot is ui/race_views.py's (throttled) and its HTML
ui/race_html.py's.

The streaming UI handler and the non-streaming /race endpoint share `race_stream`; the latter is a fold.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Optional

from specviz import methods, whatif
from specviz.config import DEFAULT_DRAFT, DEFAULT_TARGET, DecodeConfig
from specviz.core.race import Cancelled
from specviz.errors import ConfigError
from specviz.events import StepEvent
from specviz.metrics import Comparison, compare

log = logging.getLogger("specviz.app")

DEFAULTS = DecodeConfig()
SPEC_METHODS = methods.SPECULATIVE  # AR is always the baseline lane

@dataclass(frozen=True)
class Example:
    """One example race: a prompt, the temperature it runs at (0 = greedy) and what it shows beside its pair."""
    category: str
    prompt: str
    temperature: float
    shows: str


# The examples come in labelled pairs, each showing both sides of one lesson (our own prompts, not from any benchmark;
# assets/profiles/app-examples.jsonl holds the same, for `bench --prompts`). Measured with EAGLE's tree and prompt
# lookup's branch (eagle:1+pld:3, 128 tokens): the poem kept 63% copies of earlier text (40% of its answer), the sky
# none; the Fibonacci function kept α 0.45 greedy and 0.31 at 0.7; the seasons 128 tokens at α 0.39, the French
# sentence 43 tokens at α 0.09 (on 2 busy cores; the commit message has the command).
EXAMPLE_PAIRS: tuple[tuple[str, Example, Example], ...] = (
    ("repeats or not",
     Example("writing", "Write a short, cheerful poem about a lighthouse keeper who loves tea.", 0.0,
             "a poem that repeats: copies pay"),
     Example("QA", "Why is the sky blue?", 0.0, "new words: copies rarely pay")),
    ("greedy or sampled",
     Example("coding", "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
             0.0, "code, greedy: top token kept"),
     Example("coding", "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
             0.7, "the same, sampled at 0.7: fewer kept")),
    ("long or short",
     Example("QA", "What causes the seasons on Earth?", 0.0, "a long explanation: room to guess"),
     Example("translation", "Translate into French: The library opens at nine and closes at six on weekdays.", 0.0,
             "one French sentence: little kept")),
)
EXAMPLES: tuple[Example, ...] = tuple(e for _, a, b in EXAMPLE_PAIRS for e in (a, b))
# the first pair's first side: a poem whose answer repeats itself (the summary's first line says how much it copied)
DEFAULT_PROMPT = EXAMPLES[0].prompt
LANE_TITLES = {"ar": "Plain autoregressive", "spec": "Speculative ({method})"}


def method_label(method: str, lookup: int = 0, retrieve: int = 0) -> str:
    """The method as lanes and summaries name it: 'eagle + prompt lookup + datastore' with the branches grafted
    onto its tree."""
    return method + " + prompt lookup" * bool(lookup) + " + datastore" * bool(retrieve)


def short_label(cfg: DecodeConfig) -> str:
    """The method as the bench writes it, for tight spots (a plot legend): 'eagle+pld+ret' with both branches."""
    return cfg.method + "+pld" * bool(cfg.lookup) + "+ret" * bool(cfg.retrieve)


def example_rows() -> tuple[list[list], list[str]]:
    """(examples, labels) for gr.Examples over (prompt, temperature): one row per example, its pair's lesson and
    what this side shows as its label."""
    rows, labels = [], []
    for title, *pair in EXAMPLE_PAIRS:
        for side, e in zip("AB", pair):
            rows.append([e.prompt, e.temperature])
            labels.append(f"{title} · {side}: {e.shows}")  # short: gr.Examples cuts a label at ~50
    return rows, labels


def make_config(method: str = DEFAULTS.method, gamma=DEFAULTS.gamma, temperature=DEFAULTS.temperature,
                top_p=DEFAULTS.top_p, max_new_tokens=DEFAULTS.max_new_tokens, seed=DEFAULTS.seed,
                lookup=DEFAULTS.lookup, retrieve=DEFAULTS.retrieve) -> DecodeConfig:
    """Form values -> a validated DecodeConfig (raises ConfigError with a one-line message)."""
    if method not in SPEC_METHODS:
        raise ConfigError(f"method={method!r} is not a speculative method: use one of {', '.join(SPEC_METHODS)} "
                          "(plain AR always runs as the baseline)")
    if seed is None or seed == "":
        seed = DEFAULTS.seed
    if lookup is None or lookup == "":
        lookup = DEFAULTS.lookup
    if retrieve is None or retrieve == "":
        retrieve = DEFAULTS.retrieve
    return DecodeConfig(method=method, gamma=gamma, temperature=temperature, top_p=top_p,
                        max_new_tokens=max_new_tokens, seed=seed, lookup=lookup, retrieve=retrieve)


@dataclass
class Lane:
    events: list[StepEvent] = field(default_factory=list)
    clock: float = 0.0          # engine compute seconds so far
    done: bool = False

    @property
    def n_tokens(self) -> int:
        return sum(len(e.emitted) for e in self.events)

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for e in self.events for t in e.emitted]

    @property
    def tok_per_s(self) -> float:
        return self.n_tokens / self.clock if self.clock else 0.0


class StopSignal:
    """A run's Stop: `set` by `stopped`, read by the run (fold_ticks) before each step. Its lock makes Stop's copy
    of the run and the fold of a step one at a time: once set, no further step lands in the run, so the stopped copy
    Stop shows and the run's own last word hold the same steps (and Replay replays what both showed)."""

    def __init__(self):
        self._event = threading.Event()
        self.lock = threading.Lock()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


@dataclass
class RaceSnapshot:
    """The state of one race, updated in place as ticks arrive (race_stream yields it after each)."""
    cfg: DecodeConfig
    draft: str
    phase: str = "loading"      # loading | running | done | stopped (Stop pressed mid-run: stopped)
    lanes: dict[str, Lane] = field(default_factory=lambda: {"ar": Lane(), "spec": Lane()})
    comparison: Optional[Comparison] = None
    decode: Optional[Callable[[list[int]], str]] = None
    started: float = field(default_factory=time.perf_counter)
    hardware: str = ""          # hardware.describe(): the device and dtype the lanes ran on
    profiled: bool = False      # the prediction used the target's measured verify profile (specviz/core/profile.py)
    what_if: Optional[whatif.RaceClock] = None  # the finished race, ready to be re-timed (the what-if panel)
    stop: StopSignal = field(default_factory=StopSignal, repr=False, compare=False)  # set by `stopped`

    def title(self, lane: str) -> str:
        return LANE_TITLES[lane].format(method=method_label(self.cfg.method, self.cfg.lookup, self.cfg.retrieve))

    def text(self, lane: str) -> str:
        ids = self.lanes[lane].token_ids
        return self.decode(ids) if self.decode else ""

    def result(self) -> dict:
        """JSON-able: the final texts and the comparison (metrics.Comparison.to_dict())."""
        return {
            "ar_text": self.text("ar"),
            "spec_text": self.text("spec"),
            "summary": self.comparison.to_dict() if self.comparison else None,
            "config": self.cfg.to_dict(),
            "draft": self.draft if methods.spec(self.cfg.method).uses_draft_model else None,
            "hardware": self.hardware,
            "what_if": what_if_result(self.what_if),
        }


class RunFailed(RuntimeError):
    """An unexpected error during a run (a bug, a broken model file): a one-line message for the user that
    names only the stage and the exception type; the traceback goes to the server log."""

    def __init__(self, stage: str, cause: BaseException):
        super().__init__(f"the run failed {stage} ({type(cause).__name__}); the app is still serving — try again")
        self.stage = stage


# /abs, ./rel, ~/home, a/b/c; not URLs or Hub ids ORG/NAME
_PATH = re.compile(r"""(?<![\w:/.~-])(?:(?:~|\.{1,2})?/[^\s'"`,;)]+|[\w.-]+(?:/[\w.-]+){2,})""")


def redact_paths(message: str) -> str:
    """Replace file-system paths in a message with <path> (Hub ids ORG/NAME and URLs stay)."""
    return _PATH.sub("<path>", message)


def user_message(exc: BaseException, public: bool = False) -> str:
    """The one line a user sees for an error: ours verbatim (paths redacted in public mode), anything else
    as its type only, logged server-side with its traceback. Never a traceback or a server path."""
    from specviz.models.loader import ModelError  # torch is loaded by now: errors come from runs

    if isinstance(exc, (ConfigError, ModelError, RunFailed)):
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    else:
        log.error("unexpected error in the app", exc_info=exc)
        message = f"the app hit an internal error ({type(exc).__name__}); it is still serving — try again"
    return redact_paths(message) if public else message


def race_stream(prompt: str, cfg: DecodeConfig, draft: str = DEFAULT_DRAFT,
                target: str = DEFAULT_TARGET) -> Iterator[RaceSnapshot]:
    """Yield the snapshot once before loading, after every step of either lane, and once when done.
    Raises ConfigError / ModelError for bad input, RunFailed (logged) for anything unexpected (after the
    first, 'loading' snapshot)."""
    from specviz import hardware
    from specviz.core.profile import profile_of
    from specviz.engines.session import prepare  # torch and the engines load on first use, not at import

    snap = RaceSnapshot(cfg, draft)
    yield snap
    prepared = prepared_or_fail(lambda: prepare(prompt, cfg, target, draft), f"target {target!r}, draft {draft!r}")
    snap.decode = prepared.target.decode
    snap.hardware = hardware.describe(prepared.target.device, prepared.target.dtype)
    snap.phase = "running"
    yield from fold_ticks(snap, prepared.race(), f"{cfg.method}, draft {draft!r}")
    snap.comparison = compare(snap.lanes["ar"].events, snap.lanes["spec"].events, cfg.method, cfg.greedy,
                              profile_of(prepared.target, measure=False))
    snap.profiled = profile_of(prepared.target, measure=False) is not None
    snap.what_if = race_clock(prepared, snap)
    snap.phase = "done"
    yield snap


def prepared_or_fail(prepare: Callable, what: str):
    """prepare() (loading the models, building the engines): ConfigError / ModelError pass with their one line, anything
    else is logged (naming `what`) and raised as RunFailed."""
    from specviz.models.loader import ModelError

    try:
        return prepare()
    except (ConfigError, ModelError):
        raise
    except Exception as exc:
        log.error("loading the models failed (%s)", what, exc_info=exc)
        raise RunFailed("while loading the models", exc) from exc


def fold_ticks(snap, ticks: Iterator, what: str) -> Iterator:
    """Each race tick into its lane of `snap` (its events, clock and whether it is done), yielding `snap` after each.
    Stop pressed (`snap.stop`, set by `stopped`) raises Cancelled before the next step. ConfigError (the deployment's
    run-time cap) passes; any other engine failure is logged (naming `what`) and raised as RunFailed."""
    while True:
        if snap.stop.is_set():
            raise Cancelled("the race was stopped: Stop was pressed")
        try:
            tick = next(ticks, None)
        except (ConfigError, Cancelled):
            raise
        except Exception as exc:
            log.error("engine failure (%s)", what, exc_info=exc)
            raise RunFailed("inside the engine", exc) from exc
        if tick is None:
            return
        with snap.stop.lock:  # a step that ends after Stop is not folded in: Stop's copy already showed the run
            if snap.stop.is_set():
                raise Cancelled("the race was stopped: Stop was pressed")
            lane = snap.lanes[tick.lane]
            lane.events.append(tick.event)
            lane.clock = tick.clock
            lane.done = tick.event.finish_reason is not None
        yield snap


def race_clock(prepared, snap: RaceSnapshot) -> Optional[whatif.RaceClock]:
    """The finished race as the what-if clock needs it: its steps, this machine's verify profile (measured once, as
    app.warm_up does), the target's and drafter's weights. None (logged) if any of it fails: the race stands."""
    from specviz.core.profile import profile_of

    try:
        recorded = whatif.Recorded.of(snap.lanes["spec"].events, snap.lanes["ar"].events)
        target = whatif.target_of(prepared.target.model, prepared.engine)
        return whatif.RaceClock(recorded, profile_of(prepared.target), target, snap.cfg.method)
    except Exception as exc:
        log.error("the what-if clock failed (%s)", snap.cfg.method, exc_info=exc)
        return None


def what_if_result(clock: Optional[whatif.RaceClock]) -> Optional[dict]:
    """The /race result's what_if: the decode steps' measured speedup and the re-timed rows (this machine, then each
    device's roofline bound)."""
    if clock is None:
        return None
    return {"measured_speedup": clock.recorded.measured_speedup, "rows": [r.to_dict() for r in clock.rows()]}


def race_result(prompt: str, cfg: DecodeConfig, draft: str = DEFAULT_DRAFT, target: str = DEFAULT_TARGET) -> dict:
    """The non-streaming API: a fold over race_stream."""
    snap = None
    for snap in race_stream(prompt, cfg, draft, target):
        pass
    return snap.result()


@dataclass
class Waiting:
    """A run clicked and still waiting for the device (its place in the queue), kept as the session's live run by
    `waiting` (Run's first handler, which skips the queue): Stop sets `stop`, and the run, once the queue reaches it,
    runs nothing (`waited_out`). A run that starts takes this signal as its own (`adopt`): a Stop then still lands."""
    stop: StopSignal = field(default_factory=StopSignal, repr=False, compare=False)
    phase: str = "waiting"      # waiting | stopped


def waiting(live):
    """Run was clicked: a new Waiting becomes the session's live run, unless one is still going (Run pressed again
    mid-race starts nothing: the race's trigger_mode, so Stop must keep reaching the race that runs)."""
    return live if live is not None and live.phase in ("waiting", "loading", "running") else Waiting()


def waited_out(live) -> bool:
    """Stop was pressed while this run waited for the device (`live` the Waiting Run's click left): it runs nothing."""
    return isinstance(live, Waiting) and live.stop.is_set()


def adopt(snap, live):
    """A run that starts takes its Waiting's stop signal as its own (a Stop in that instant still reaches it)."""
    if isinstance(live, Waiting):
        snap.stop = live.stop
    return snap


def stopped(snap):
    """Stop was pressed: the run (a race or a race of several lanes) is told to end before its next step (its
    snapshot's `stop`: fold_ticks raises Cancelled, and its handler ends by showing it stopped), and a copy of its
    last snapshot is returned, its phase "stopped", its lanes as they are now and stay (a step that ends after the
    signal is dropped: StopSignal); None when the run had already ended. The handler ends by itself, so Gradio sees
    a run that completed: a cancels= on a running stream left an "Error" badge on the status about one Stop in
    three."""
    if snap is None or snap.phase not in ("waiting", "loading", "running"):
        return None
    with snap.stop.lock:  # no step lands between the signal and the copy, nor after them (fold_ticks)
        snap.stop.set()
        if isinstance(snap, Waiting):  # it had not started: it never will
            return replace(snap, phase="stopped")
        lanes = {name: replace(lane, events=list(lane.events)) for name, lane in snap.lanes.items()}
    copy = replace(snap, phase="stopped")
    copy.lanes = lanes
    return copy
