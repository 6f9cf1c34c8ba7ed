"""The app's "Watch a server" tab: scrape a serving engine's /metrics (vLLM, llama.cpp, SGLang, TensorRT-LLM, or
specviz itself) every few seconds and draw its draft acceptance, τ and acceptance by position live, the verdict on
top, and an alarm above it when τ stays near 1 or acceptance halves (serving/alarm.py). The scraping, parsing and
windows are specviz/serving/prometheus.py's (the `watch` command's); which URLs may be fetched, serving/access.py's.
Errors are one line in the tab, and a watch in progress keeps its series.
"""
from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from typing import Optional

import gradio as gr

from specviz import methods
from specviz.errors import ConfigError
from specviz.policy import Policy
from specviz.serving import access
from specviz.serving.alarm import alarm
from specviz.serving.prometheus import ServerError, Watch, metrics_url, no_speculation, scrape
from specviz.ui import watch_plots
from specviz.ui.common import cards_html, num, status_html, tab_intro, verdict_html
from specviz.ui.logic import user_message

WATCH_QUEUE = "watch"  # scrapes never wait for a race on the device queue (a watch of this app runs beside one)
INTERVAL_DEFAULT = 2.0    # seconds between two scrapes
INTERVAL_MIN, INTERVAL_MAX = 1.0, 60.0
JSON_WINDOWS = 120        # the data view shows the last this many windows (the plots show them all)
PORT_ENV, PORT_DEFAULT = "GRADIO_SERVER_PORT", 7860  # where app.py serves unless told otherwise


def drafter_choices() -> list[tuple[str, str]]:
    """The drafter-kind field: (label, value) for every speculative method in the registry; a lookup method drafts
    n-gram copies, which serving engines call "ngram" (the value the verdict judges)."""
    out = [("not given", "")]  # the verdict then describes the curves' shape only (the field's info says so)
    for name in methods.SPECULATIVE:
        s = methods.spec(name)
        value = "ngram" if s.family == "lookup" else name
        out.append((f"{s.label} ({value})", value))
    return out


@dataclass
class WatchState:
    """One browser session's watch: the URL, the scrape interval, the windows so far and the last error."""
    url: str
    interval: float
    watch: Watch = field(default_factory=Watch)
    running: bool = True
    error: Optional[str] = None


def interval_of(value) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"interval={value!r} is not a number: use {INTERVAL_MIN:g}..{INTERVAL_MAX:g} seconds") \
            from None
    if not INTERVAL_MIN <= seconds <= INTERVAL_MAX:
        raise ConfigError(f"interval={seconds:g} s is out of range: use {INTERVAL_MIN:g}..{INTERVAL_MAX:g} seconds")
    return seconds


def read(url: str):
    """One scrape of a URL this deployment may fetch (checked before every scrape); ServerError for a page without
    speculative counters."""
    snap = scrape(access.check(url))
    if not snap.speculative:
        raise ServerError(no_speculation(url, snap))
    return snap


def verdict_kind(verdict: str) -> str:
    return "idle" if verdict.startswith(("idle", "few drafts")) else "bad" if verdict.startswith("collapsed") else "ok"


def watch_cards_html(s: dict) -> str:
    """The watch's key figures as cards, from Watch.summary()."""
    gamma = f"γ = {s['gamma']} ({s['gamma_from']})" if s["gamma"] else "γ unknown"
    cards = [
        ("engine", s["engine"], f"{gamma}; {s['windows']} windows over {s['seconds']:.0f} s"),
        ("τ", num(s["tau"]), "1 + accepted / drafts: tokens per drafted step, the bonus token included"),
        ("draft acceptance", num(s["acceptance_rate"]), f"{s['accepted_tokens']:.0f} of {s['draft_tokens']:.0f} "
                                                        f"drafted tokens kept, {s['drafts']:.0f} drafts: of every "
                                                        "drafted token (a tree's every node), as vLLM counts; a "
                                                        "race's α counts only the drafts the target judged"),
        ("drafted tok/s", num(s["draft_tokens_per_s"], ".1f"), "over the watch"),
        ("accepted tok/s", num(s["accepted_tokens_per_s"], ".1f"), "over the watch"),
        ("requests running", num(s["requests_running"], ".1f"), "mean over the watch"),
        ("predicted speedup", num(s["predicted_speedup"]) + "×" if s["predicted_speedup"] else "–",
         f"Leviathan et al. at α = {num(s['alpha_per_token'])} per token (the α whose chain of γ gives this τ), "
         f"with the draft's cost c = {s['cost_ratio']:g}" + (" (an upper bound)" if not s["cost_ratio"] else "")),
    ]
    if s["resets"] or s["failed_scrapes"]:
        cards.append(("restarts / failed scrapes", f"{s['resets']} / {len(s['failed_scrapes'])}",
                      "counters reset (a window then counts from zero) / scrapes that failed; the watch went on"))
    return cards_html(cards)


def figures(state: Optional[WatchState]) -> tuple:
    """(acceptance, τ, by position, tokens/s) for a watch (empty panels without one)."""
    w = state.watch if state else Watch()
    s = w.summary()
    t0 = w.first.t if w.first is not None else 0.0
    return (watch_plots.watch_acceptance_figure(w.series, t0),
            watch_plots.watch_tau_figure(w.series, t0, w.collapse_tau),
            watch_plots.watch_position_figure(s["per_position"], s["per_position_conditional"]),
            watch_plots.watch_rate_figure(w.series, t0))


def data_of(state: WatchState) -> dict:
    w = state.watch
    now = alarm(w.series, collapse_tau=w.collapse_tau)
    return {"url": state.url, "metrics_url": metrics_url(state.url), "running": state.running,
            "interval": state.interval, "error": state.error, "summary": w.summary(),
            "alarm": now.line if now else None,
            "series": [x.to_dict() for x in w.series[-JSON_WINDOWS:]]}


def watch_verdict_html(state: WatchState) -> str:
    """The verdict box, with the alarm above it (a red, bold line) while one stands."""
    s = state.watch.summary()
    now = alarm(state.watch.series, collapse_tau=state.watch.collapse_tau)
    box = verdict_html(s["verdict"], "bad" if now else verdict_kind(s["verdict"]))
    if now is None:
        return box
    return (f'<div class="sv-alarm" id="watch-alarm" role="alert" style="background:#b00020;color:#fff;'
            f'font-weight:700;padding:8px 12px;border-radius:6px;margin-bottom:6px">⚠ {html.escape(now.line)}</div>'
            + box)


def view(state: WatchState, message: str, kind: str = "info") -> tuple:
    """(status, verdict, figures, 4 plots, data) for the watch as it stands."""
    s = state.watch.summary()
    return (status_html(message, kind), watch_verdict_html(state), watch_cards_html(s), *figures(state),
            data_of(state))


def _message(exc: BaseException) -> str:
    if isinstance(exc, (access.AccessError, ServerError, ConfigError)):
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return user_message(exc, Policy.from_env().public)  # unexpected: logged with its traceback, one line here


def _sentence(line: str) -> str:
    return line if line.endswith((".", "!", "?")) else line + "."


def drafter_of(value) -> Optional[str]:
    """The drafter-kind field's value -> Watch.drafter (None: not given); ConfigError for a value not offered."""
    kinds = [v for _, v in drafter_choices() if v]
    value = str(value or "").strip()
    if value and value not in kinds:
        raise ConfigError(f"drafter kind {value!r} is unknown: pick one of {', '.join(kinds)}, or leave it empty")
    return value or None


def watch_start(url: str = "", interval: float = INTERVAL_DEFAULT, state: Optional[WatchState] = None,
                drafter: str = ""):
    """Start watching a server's /metrics (the first scrape now, then one every `interval` seconds), judging its
    acceptance by position against the drafter kind. A refused or unreadable URL is a one-line message, and a watch
    already running goes on."""
    try:
        seconds = interval_of(interval)
        kind = drafter_of(drafter)
        snap = read(url)
        new = WatchState(url=str(url).strip(), interval=seconds, watch=Watch(drafter=kind))
        new.watch.add(snap)
        return (new, gr.Timer(value=seconds, active=True),
                *view(new, f"Watching {metrics_url(new.url)} every {seconds:g} s ({snap.engine}); the first window "
                           f"appears after the next scrape.", "ok"))
    except Exception as exc:
        message = _message(exc)
        going_on = " The watch in progress goes on." if state is not None and state.running else ""
        return (gr.skip(), gr.skip(), status_html(f"⚠ {_sentence(message)}{going_on}", "error"),
                *([gr.skip()] * 7))


def watch_tick(state: Optional[WatchState] = None):
    """One scrape of the watch in progress: a new window, or a one-line message while the series is kept."""
    if state is None or not state.running:
        return (gr.skip(),) * 9
    try:
        window = state.watch.add(read(state.url))
        state.error = None
        note = (" The server restarted: its counters reset, this window counts from zero." if window and window.reset
                else "")
        return (state, *view(state, f"Watching {metrics_url(state.url)} every {state.interval:g} s: "
                                    f"{len(state.watch.series)} windows.{note}", "ok"))
    except Exception as exc:
        state.error = _message(exc)
        state.watch.failures.append(state.error)
        return (state, status_html(f"⚠ {_sentence(state.error)} The watch goes on; its series is kept "
                                   f"({len(state.watch.series)} windows).", "error"),
                *([gr.skip()] * 6), data_of(state))


def watch_drafter(drafter: str = "", state: Optional[WatchState] = None):
    """The drafter kind changed: the verdict of the watch in progress judges against the new kind."""
    if state is None:
        return gr.skip(), gr.skip()
    try:
        state.watch.drafter = drafter_of(drafter)
    except ConfigError as exc:
        return gr.skip(), verdict_html(f"⚠ {_sentence(str(exc))}", "bad")
    return state, watch_verdict_html(state)


def watch_stop(state: Optional[WatchState] = None):
    """Stop scraping; the series stays on screen."""
    if state is None:
        return gr.skip(), gr.Timer(active=False), status_html("No watch is running.")
    state.running = False
    return (state, gr.Timer(active=False),
            status_html(f"Stopped watching {metrics_url(state.url)} after {len(state.watch.series)} windows.", "ok"))


def served_port(request: Optional[gr.Request] = None) -> int:
    """The port this app is served on: the socket a browser's request came in on (the real one), else
    GRADIO_SERVER_PORT (what app.py passes to launch), else Gradio's default."""
    try:
        server = request.request.scope.get("server") if request is not None else None
        if server and server[1]:
            return int(server[1])
    except (AttributeError, TypeError, ValueError):
        pass
    try:
        return int(os.environ.get(PORT_ENV, PORT_DEFAULT))
    except ValueError:
        return PORT_DEFAULT


def intro_html(port: Optional[int] = None) -> str:
    rules = access.Access.from_env()
    own = f"http://127.0.0.1:{served_port() if port is None else port}"
    if rules.public:
        where = ("This is a public deployment: it watches only the hosts its operator allows ("
                 + (html.escape(", ".join(rules.hosts)) if rules.hosts else f"none yet: set {access.HOSTS_ENV}")
                 + "), and never loopback or private addresses.")
    elif rules.exposed:
        where = (f"This app listens beyond this machine ({access.LISTEN_ENV}={html.escape(rules.listen)}), so it "
                 "watches public addresses only: loopback, private and link-local ones (this app's own "
                 f"<code>{own}</code>, a <code>serve</code> engine on 127.0.0.1) only when <code>{access.HOSTS_ENV}"
                 "</code> names them" + (f" (it names {html.escape(', '.join(rules.hosts))})" if rules.hosts else "")
                 + ".")
    else:
        where = (f"Any http(s) URL but a link-local one (169.254.x.x, fe80::, where cloud metadata answers; "
                 f"<code>{access.HOSTS_ENV}</code> allows one) works here: this app's own <code>{own}</code> while "
                 "a race runs, or a <code>python -m specviz serve</code> engine on 127.0.0.1.")
    return tab_intro("Watch a drafter that a <b>server</b> runs (vLLM, llama.cpp's <code>llama-server --metrics"
                     "</code>, SGLang <code>--enable-metrics</code>, TensorRT-LLM, or specviz's own): specviz reads "
                     "its Prometheus <code>/metrics</code> every few seconds and draws how often drafts are kept, the "
                     "tokens each target pass gives (τ = 1 + accepted / drafts) and how often each draft position is "
                     "kept. The verdict: idle, few drafts (too few to judge), healthy, or collapsed (τ near 1: the "
                     "answers stay correct and only the speedup is gone, so nothing else would tell you), with an "
                     "<b>alarm</b> when τ stays near 1 or "
                     "acceptance halves. Name the drafter kind to judge each position against what that kind usually "
                     f"keeps. The same as <code>python -m specviz watch URL --drafter KIND</code>.<br>{where}")


def intro_for(request: gr.Request = None) -> str:
    """The intro on each page load, naming the port this app really answers on."""
    return intro_html(served_port(request))


def watch_tab() -> None:
    """Build the "Watch a server" tab inside the caller's gr.Blocks."""
    with gr.Tab("Watch a server", elem_id="tab-watch"):
        gr.HTML(intro_for, elem_id="watch-intro")
        with gr.Row(equal_height=True):
            url = gr.Textbox(label="Server URL", placeholder="http://HOST:8000 (its /metrics is scraped)", scale=4,
                             elem_id="watch-url")
            drafter = gr.Dropdown(drafter_choices(), value="", label="Drafter kind on the server", scale=2,
                                  info="what drafts there, to judge each position against; not given: the shape only",
                                  elem_id="watch-drafter")
            interval = gr.Slider(INTERVAL_MIN, INTERVAL_MAX, value=INTERVAL_DEFAULT, step=0.5,
                                 label="Scrape every (seconds)", scale=2, elem_id="watch-interval")
            with gr.Column(scale=1, min_width=160):
                start = gr.Button("Watch ▶", variant="primary", elem_id="watch-start")
                stop = gr.Button("Stop ■", variant="stop", elem_id="watch-stop")
        status = gr.HTML(status_html("Give a server's URL and press Watch."), elem_id="watch-status")
        verdict = gr.HTML(verdict_html("No watch yet.", "idle"), elem_id="watch-verdict")
        cards = gr.HTML("", elem_id="watch-figures")
        empty = figures(None)
        with gr.Row():
            plot_acceptance = gr.Plot(empty[0], elem_id="watch-plot-acceptance", show_label=False, min_width=380)
            plot_tau = gr.Plot(empty[1], elem_id="watch-plot-tau", show_label=False, min_width=380)
        with gr.Row():
            plot_position = gr.Plot(empty[2], elem_id="watch-plot-position", show_label=False, min_width=380)
            plot_rate = gr.Plot(empty[3], elem_id="watch-plot-rate", show_label=False, min_width=380)
        with gr.Accordion("The watch as data (JSON)", open=False):
            data = gr.JSON(elem_id="watch-data")
        state = gr.State(None, time_to_live=6 * 3600)  # this browser session's watch
        timer = gr.Timer(INTERVAL_DEFAULT, active=False)

        shown = [status, verdict, cards, plot_acceptance, plot_tau, plot_position, plot_rate, data]
        common = dict(concurrency_limit=8, concurrency_id=WATCH_QUEUE, show_progress="hidden")
        start.click(watch_start, inputs=[url, interval, state, drafter], outputs=[state, timer, *shown],
                    api_name="watch_start", **common)
        url.submit(watch_start, inputs=[url, interval, state, drafter], outputs=[state, timer, *shown],
                   api_visibility="private", **common)
        drafter.change(watch_drafter, inputs=[drafter, state], outputs=[state, verdict], api_visibility="private",
                       **common)
        timer.tick(watch_tick, inputs=[state], outputs=[state, *shown], api_name="watch_tick", **common)
        stop.click(watch_stop, inputs=[state], outputs=[state, timer, status], api_name="watch_stop", **common)
