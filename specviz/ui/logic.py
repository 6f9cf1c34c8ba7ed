"""The app's handler logic without Gradio: form values -> DecodeConfig, the race as a stream of snapshots,
a throttle for the UI, and the HTML of the panes and the summary.

The streaming UI handler and the non-streaming /race endpoint share `race_stream`; the latter is a fold.
"""
from __future__ import annotations

import html
import logging
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Optional, TypeVar

from specviz import methods, whatif
from specviz.config import DEFAULT_DRAFT, DEFAULT_TARGET, DecodeConfig
from specviz.core.race import Cancelled
from specviz.errors import ConfigError
from specviz.events import StepEvent
from specviz.metrics import CHAIN_FORMULA, TREE_FORMULA, Comparison, RunSummary, compare, why_line
from specviz.ui import lesson, plots, render
from specviz.ui.common import TABS_CSS, card, finish_words, num

log = logging.getLogger("specviz.app")

DEFAULTS = DecodeConfig()
SPEC_METHODS = methods.SPECULATIVE  # AR is always the baseline lane
UPDATE_INTERVAL_S = 0.25                                # ~4 pane updates per second
PLOT_INTERVAL_S = 1.0                                   # plots redraw about once a second (and at the end)

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
     Example("QA", "Why is the sky blue?", 0.0, "new words each line: drafter only")),
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
    ConfigError (the deployment's run-time cap) passes; any other engine failure is logged (naming `what`) and
    raised as RunFailed."""
    while True:
        try:
            tick = next(ticks, None)
        except (ConfigError, Cancelled):
            raise
        except Exception as exc:
            log.error("engine failure (%s)", what, exc_info=exc)
            raise RunFailed("inside the engine", exc) from exc
        if tick is None:
            return
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


# --- HTML -------------------------------------------------------------------------------------------------

def pane_html(title: str, lane: Lane, running: bool, stopped: bool = False) -> str:
    """A pane: a header with live counters, then the coloured tokens (each with data-verdict), one band per target
    forward (render.pane_body_html). `stopped`: the run was stopped, and an unfinished lane says where."""
    state = "done" if lane.done else ("stopped" if stopped else "running" if running else "idle")
    stats = (f'<span class="sv-stat"><b>{lane.n_tokens}</b> tokens</span>'
             f'<span class="sv-stat"><b>{lane.clock:.2f}</b> s compute</span>'
             f'<span class="sv-stat"><b>{lane.tok_per_s:.1f}</b> tok/s</span>')
    body = render.pane_body_html(lane.events) if lane.events else '<span class="sv-placeholder">…</span>'
    badge = {"done": "✓ done", "running": "● running", "stopped": f"■ stopped at {lane.n_tokens} tokens",
             "idle": ""}[state]
    return (f'<div class="sv-pane-box" data-state="{state}">'
            f'<div class="sv-pane-head"><span class="sv-pane-title">{html.escape(title)}</span>'
            f'<span class="sv-state sv-state-{state}">{badge}</span></div>'
            f'<div class="sv-stats">{stats}</div>'
            f'<div class="sv-pane">{body}</div></div>')


def empty_panes(method: str = DEFAULTS.method, lookup: int = 0, retrieve: int = 0) -> tuple[str, str]:
    return (pane_html(LANE_TITLES["ar"], Lane(), False),
            pane_html(LANE_TITLES["spec"].format(method=method_label(method, lookup, retrieve)), Lane(), False))


TAU_LABEL = ("mean accepted length τ, tokens per target forward incl. the bonus token, "
             "as Spec-Bench/EAGLE count it")


def summary_html(snap: RaceSnapshot) -> str:
    """The end-of-run summary: the identity badge, the lesson (both texts, one above the other: lesson.py), then
    speedup beside the prediction (a tree's per-node formula, or Leviathan's for a chain: prediction_note), α, τ, c."""
    c = snap.comparison
    if c is None:
        return '<div class="sv-summary sv-summary-empty">The summary appears when both lanes have finished.</div>'
    ar_ev, spec_ev = snap.lanes["ar"].events, snap.lanes["spec"].events
    gamma = snap.cfg.gamma if snap.cfg.adaptive else int(snap.cfg.gamma)
    cards = [
        ("speedup (measured)", num(c.speedup, prefix="×"),
         "over the plain lane beside it (specviz's AR, the same target, the same clock): its seconds per token / "
         "speculative seconds per token"),
        ("predicted speedup", num(c.predicted_speedup, prefix="×"), prediction_note(c, snap.profiled)),
        ("acceptance rate α", num(c.spec.alpha), alpha_note(c.spec)),
        ("τ", num(c.spec.tau), TAU_LABEL),
        ("cost ratio c", num(c.cost_ratio, ".3f"), "seconds of one draft forward / one AR target forward"),
        ("tok/s", f"{c.ar.tok_per_s:.1f} → {c.spec.tok_per_s:.1f}", "plain AR → speculative, engine compute only"),
    ]
    items = "".join(card(*c) for c in cards)
    if c.identical is None:
        badge = ('<span class="sv-badge sv-badge-info">sampling (temperature > 0): the texts differ by chance; '
                 'speculative sampling keeps the target\'s distribution</span>')
    elif c.identical:
        badge = '<span class="sv-badge sv-badge-ok">✓ identical to plain decoding</span>'
    else:
        i = c.first_divergence
        ar_tok = _token_at(ar_ev, i)
        spec_tok = _token_at(spec_ev, i)
        badge = (f'<span class="sv-badge sv-badge-warn">✗ differs from plain decoding at token {i}: '
                 f'AR {html.escape(repr(ar_tok))} vs speculative {html.escape(repr(spec_tok))}</span>')
    lookup = f", prompt lookup branch of up to {snap.cfg.lookup} tokens" if snap.cfg.lookup else ""
    lookup += f", datastore branch of up to {snap.cfg.retrieve} nodes" if snap.cfg.retrieve else ""
    settings = (f"{snap.cfg.method}, γ = {gamma}{lookup}, temperature {snap.cfg.temperature:g}, "
                f"top-p {snap.cfg.top_p:g}, "
                f"{c.spec.new_tokens} tokens, {c.spec.steps} target forwards vs {c.ar.steps}"
                + (f" · on {snap.hardware}" if snap.hardware else ""))
    texts = lesson.lesson_html(ar_ev, spec_ev, snap.cfg.greedy, snap.title("ar"), snap.title("spec"))
    why = f'<div class="sv-why" id="why-line" style="font-weight:600">{html.escape(why_line(c))}</div>'
    return (f'<div class="sv-summary">{why}<div class="sv-badges">{badge}</div>{texts}'
            f'<div class="sv-cards">{items}</div><div class="sv-settings">{html.escape(settings)}</div></div>')


def alpha_note(spec: RunSummary) -> str:
    """The α card's note: its definition (metrics.ACCEPTANCE) with its counts, and the figure /metrics and Watch show
    for the same run (metrics.PROPOSED_ACCEPTANCE), so that the two are never read as one."""
    if not spec.proposed:
        return "nothing was drafted"
    return (f"{spec.accepted} of the {spec.drafted} guesses the target judged were kept (drafts on the verified path); "
            f"of every guess, as /metrics and vLLM count: {spec.accepted} of {spec.proposed} = "
            f"{num(spec.proposed_acceptance)}")


def prediction_note(c: Comparison, profiled: bool) -> str:
    """Which formula the predicted speedup used: a tree's per-node acceptance, or Leviathan's for a chain."""
    if c.prediction_formula == TREE_FORMULA:
        return ("formula: tree, per-node acceptance: E[tokens a step] from how often each kind of node was kept "
                "given its parent, over the step's cost: its rows" + (" at this machine's verify cost T(rows)/T(1)"
                                                                      if profiled else "")
                + ", drafting at c and the step's bookkeeping measured here")
    if c.prediction_formula == CHAIN_FORMULA:
        return (f"formula: Leviathan et al. (2023), chain, at the measured α, γ = {num(c.mean_gamma, '.1f')}, c"
                + (", and this machine's verify cost T(γ+1)/T(1)" if profiled else ""))
    return "no prediction: nothing was drafted"


ROOFLINE_NOTE = "roofline bound, not measured; small models on GPUs are launch-bound"
WHATIF_EMPTY = "The what-if table appears when a race has finished."


def what_if_html(snap: Optional[RaceSnapshot], profiles: Iterable[str] = (), error: str = "") -> str:
    """The what-if panel: this race's exact drafts re-timed on this machine (its measured verify profile: it
    reproduces the measured speedup), on each loaded profile, and on each device's roofline bound; `error` (one line)
    above the table, which stays."""
    err = f'<div class="sv-status sv-status-error" id="whatif-error">⚠ {html.escape(error)}</div>' if error else ""
    clock = snap.what_if if snap is not None else None
    if clock is None:
        return f'<div class="sv-whatif">{err}<p class="sv-rule">{WHATIF_EMPTY}</p></div>'
    try:
        rows = clock.rows(profiles)
    except whatif.WhatIfError as exc:  # a loaded file gone since: the table without the profiles
        err += f'<div class="sv-status sv-status-error">⚠ {html.escape(str(exc).splitlines()[0])}</div>'
        rows = clock.rows()
    rec, measured = clock.recorded, snap.comparison.speedup if snap.comparison else None
    sources = {d.name: d.source for d in whatif.load_devices()}
    head = "".join(f"<th>{h}</th>" for h in ("hardware", "clock", "AR tok/s", "race tok/s", "speedup",
                                                 "verification free up to k rows", "drafter c"))
    body = "".join(_what_if_row(r, sources.get(r.name, "")) for r in rows)
    intro = (f"This race's exact drafts ({len(rec.steps)} steps, {sum(s.tokens for s in rec.steps)} tokens) re-timed: "
             "each step costs T(rows)/T(1) AR steps to verify plus its drafter forwards at c, on this machine's "
             f"measured verify profile, a profile you load, or a device's spec sheet. Measured here: "
             f"{num(measured, prefix='×')} (the summary; decode steps alone {num(rec.measured_speedup, prefix='×')}).")
    return (f'<style>{TABS_CSS}</style><div class="sv-whatif">{err}<p class="sv-rule">{html.escape(intro)}</p>'
            f'<table class="sv-table" id="whatif-table"><tr>{head}</tr>{body}</table>'
            f'<p class="sv-rule">Roofline rows: T(k) = max(weights / bandwidth, k × 2 × multiply-adds / peak), '
            f'the drafter\'s c = its weights / the target\'s; {html.escape(ROOFLINE_NOTE)}, and real decoding reaches '
            "a fraction of either roof. Sources: assets/devices.json (hover over a device).</p></div>")


def _what_if_row(r: whatif.Row, source: str) -> str:
    kind = "here" if r.source == "measured here" else "profile" if r.source.startswith("profile") else "roofline"
    clock = ROOFLINE_NOTE if kind == "roofline" else r.source
    k = f"{r.crossover}" if r.crossover < whatif.K_MAX else f">{whatif.K_MAX}"
    cells = [html.escape(r.name), html.escape(clock), num(r.ar_tok_s, ".0f"), num(r.tok_s, ".0f"),
             num(r.speedup, prefix="×"), k, num(r.c, ".3f")]
    tds = "".join(f'<td{" class=num" if i > 1 else ""}>{c}</td>' for i, c in enumerate(cells))
    return (f'<tr data-kind="{kind}" data-speedup="{r.speedup:.4f}" title="{html.escape(source)}">{tds}</tr>')


def _token_at(events: list[StepEvent], i: Optional[int]) -> Optional[str]:
    tokens = [t.text for e in events for t in e.emitted]
    return tokens[i] if i is not None and i < len(tokens) else None


def status_html(message: str, kind: str = "info") -> str:
    return f'<div class="sv-status sv-status-{kind}">{html.escape(message)}</div>'


def status_of(snap: RaceSnapshot) -> str:
    if snap.phase == "loading":
        return status_html("Loading the models and preparing the prompt… (the first run takes ~20 s on CPU)")
    if snap.phase == "running":
        return status_html(f"Racing… {snap.lanes['ar'].n_tokens} plain vs {snap.lanes['spec'].n_tokens} "
                           "speculative tokens so far")
    if snap.phase == "stopped":
        return status_html(f"■ stopped at {snap.lanes['ar'].n_tokens} plain / {snap.lanes['spec'].n_tokens} "
                           "speculative tokens: Replay shows what was recorded")
    finish = snap.comparison.spec.finish_reason if snap.comparison else None
    return status_html(f"Done: {finish_words(finish, snap.lanes['spec'].n_tokens)}, in "
                       f"{time.perf_counter() - snap.started:.1f} s wall time.", "ok")


@dataclass(frozen=True)
class View:
    """Everything the UI shows for one snapshot, in the order of the handler's outputs (None: unchanged)."""
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

    def as_tuple(self) -> tuple:
        return (self.status, self.pane_ar, self.pane_spec, self.summary, self.alpha, self.speed, self.accept,
                self.tree)


def view_of(snap: RaceSnapshot, with_plots: bool = True) -> View:
    running, stopped = snap.phase == "running", snap.phase == "stopped"
    ar, spec = snap.lanes["ar"], snap.lanes["spec"]
    view = View(
        status=status_of(snap),
        pane_ar=pane_html(snap.title("ar"), ar, running, stopped),
        pane_spec=pane_html(snap.title("spec"), spec, running, stopped),
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


def stopped(snap):
    """Stop was pressed: a copy of the run's last snapshot (a race's or a race of several lanes'), its phase
    "stopped", its lanes as they are now (the run's thread may still fold one step into the original); None when the
    run had already ended."""
    if snap is None or snap.phase not in ("loading", "running"):
        return None
    lanes = {name: replace(lane, events=list(lane.events)) for name, lane in snap.lanes.items()}
    copy = replace(snap, phase="stopped")
    copy.lanes = lanes
    return copy


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
