"""The "Several drafters" tab: plain decoding against up to three speculative races on one prompt and one compute
clock (core/race.py advances whichever lane has used the least compute), each lane drawn as the single race's
speculative pane is, and a one-line leaderboard at the end. `/race_many` serves the same race to scripts.

A lane is named as `bench --method` names a race (methods.method_spec): `pld:2`, `eagle:1+pld:4+ret:4`, `draft`, or
`default` for this machine's default race; a lane is exactly what it names (no branches unless it says +pld or +ret).
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import gradio as gr

from specviz import hardware, zerogpu
from specviz.config import DecodeConfig
from specviz.core.race import Cancelled
from specviz.errors import ConfigError
from specviz.hardware import DEFAULT_RACE, method_spec
from specviz.metrics import Comparison, compare
from specviz.policy import Policy
from specviz.ui import lane_plots, render
from specviz.ui.cancel import cancellable
from specviz.ui.common import (
    DEVICE_QUEUE,
    MAX_NEW_TOKENS,
    at_hand,
    into_view_js,
    never_ran,
    num,
    queued,
    status_html,
    tab_intro,
)
from specviz.ui.logic import (
    DEFAULT_PROMPT,
    DEFAULTS,
    SPEC_METHODS,
    Lane,
    StopSignal,
    Waiting,
    adopt,
    fold_ticks,
    make_config,
    prepared_or_fail,
    stopped,
    user_message,
    waited_out,
)
from specviz.ui.race_html import pane_html
from specviz.ui.race_views import throttle
from specviz.ui.wiring import by_name

MAX_LANES = 3
DEFAULT_LANES = f"{DEFAULT_RACE}, pld:2, draft"  # this machine's default race, prompt lookup and the draft model
AR_TITLE = "Plain autoregressive"


def parse_lanes(text: str, cfg: DecodeConfig, pair: hardware.Pair) -> dict[str, tuple[DecodeConfig, str]]:
    """The lanes a form or a script names, comma-separated (empty: DEFAULT_LANES) → {lane name (`default` says which
    race it is here): (its settings, its draft)}, each with `cfg`'s temperature, top-p, length and seed. Raises
    ConfigError with one line naming the value and what is accepted."""
    if text is not None and not isinstance(text, str):
        raise ConfigError(f"lanes={text!r} is not text: name up to {MAX_LANES} races, comma-separated, e.g. "
                          f"{DEFAULT_LANES!r}")
    names = [n.strip() for n in (text or DEFAULT_LANES).split(",") if n.strip()] or DEFAULT_LANES.split(", ")
    if len(names) > MAX_LANES:
        raise ConfigError(f"lanes={text!r} names {len(names)} races: give 1 to {MAX_LANES}, comma-separated")
    lanes: dict[str, tuple[DecodeConfig, str]] = {}
    targets = set()
    for name in names:
        if name in lanes:
            raise ConfigError(f"lanes={text!r} names {name!r} twice: give each race once")
        method, gamma, grafts, at, _ = method_spec(name)
        if at:
            raise ConfigError(f"lane {name!r}: a lane races the drafters shipped with the app; drop the @ part "
                              "(python -m specviz bench --method takes @drafter)")
        if method not in SPEC_METHODS:
            raise ConfigError(f"lane {name!r}: {method!r} is not a speculative method: use {', '.join(SPEC_METHODS)}, "
                              f"optionally with :gamma, +pld and +ret, or {DEFAULT_RACE!r}")
        tree = {k: grafts[k] for k in ("tree", "tree_nodes") if k in grafts}
        shape, nodes = pair.tree_for(method)
        if not tree and not gamma and shape == "dynamic":  # a bare name: the method's tree here, as bench races it
            tree = {"tree": shape, "tree_nodes": nodes}
        lane_cfg = make_config(method, gamma or str(pair.gamma_for(method)), cfg.temperature, cfg.top_p,
                               cfg.max_new_tokens, cfg.seed, grafts.get("lookup", 0), grafts.get("retrieve", 0))
        target, draft = pair.run_args(method, "")
        if not at_hand([method], target):
            raise ConfigError(f"lane {name!r}: no {method} drafter is shipped for {target} yet: race one of "
                              f"{', '.join(at_hand(SPEC_METHODS, target))}, or train it (python -m specviz train "
                              f"{method}) and race it with bench --method {method}@FOLDER")
        targets.add(target)
        label = f"{name} ({pair.race()})" if name == DEFAULT_RACE else name  # what the default is here
        lanes[label] = (lane_cfg.with_(**tree) if tree else lane_cfg, draft)
    if len(targets) > 1:
        raise ConfigError(f"lanes={text!r} run on different targets ({', '.join(sorted(targets))}): race drafters of "
                          "one target")
    return lanes


@dataclass
class LanesSnapshot:
    """One race of several lanes, updated in place as ticks arrive (lanes_stream yields it after each)."""
    cfgs: dict[str, DecodeConfig]  # each speculative lane's settings, by lane name
    phase: str = "loading"         # loading | running | done | stopped (Stop pressed mid-run: stop_many)
    lanes: dict[str, Lane] = field(init=False)  # "ar", then each lane of cfgs
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    decode: Optional[Callable[[list[int]], str]] = None
    hardware: str = ""
    started: float = field(default_factory=time.perf_counter)
    stop: StopSignal = field(default_factory=StopSignal, repr=False, compare=False)  # logic.stopped sets it

    def __post_init__(self):
        self.lanes = {"ar": Lane(), **{name: Lane() for name in self.cfgs}}

    def text(self, lane: str) -> str:
        return self.decode(self.lanes[lane].token_ids) if self.decode else ""

    def leaderboard(self) -> list[dict]:
        """Each speculative lane against AR, fastest first: tok/s, τ, α, speedup, identical (None when sampling)."""
        rows = [{"lane": name, "tok_per_s": c.spec.tok_per_s, "tau": c.spec.tau, "alpha": c.spec.alpha,
                 "speedup": c.speedup, "identical": c.identical} for name, c in self.comparisons.items()]
        return sorted(rows, key=lambda r: -(r["speedup"] or 0.0))

    def result(self) -> dict:
        """JSON-able: AR's text, each lane's text and comparison (metrics.Comparison.to_dict()), the leaderboard."""
        return {"ar_text": self.text("ar"),
                "lanes": [{"lane": name, "text": self.text(name), "config": cfg.to_dict(),
                           "summary": self.comparisons[name].to_dict() if name in self.comparisons else None}
                          for name, cfg in self.cfgs.items()],
                "leaderboard": self.leaderboard(), "hardware": self.hardware}


def lanes_stream(prompt: str, lanes: dict[str, tuple[DecodeConfig, str]], target: str) -> Iterator[LanesSnapshot]:
    """Yield the snapshot once before loading, after every step of any lane, and once when done (with each lane's
    comparison against AR). Raises ConfigError / ModelError for bad input, RunFailed (logged) for anything else."""
    from specviz.core.profile import profile_of
    from specviz.engines.session import prepare_lanes

    snap = LanesSnapshot({name: cfg for name, (cfg, _) in lanes.items()})
    yield snap
    prepared = prepared_or_fail(lambda: prepare_lanes(prompt, lanes, target), f"lanes {list(lanes)}")
    snap.decode = prepared.target.decode
    snap.hardware = hardware.describe(prepared.target.device, prepared.target.dtype)
    snap.phase = "running"
    yield from fold_ticks(snap, prepared.race(), f"lanes {list(lanes)}")
    profile = profile_of(prepared.target, measure=False)
    ar = snap.lanes["ar"].events
    snap.comparisons = {name: compare(ar, snap.lanes[name].events, cfg.method, cfg.greedy, profile)
                        for name, cfg in snap.cfgs.items()}
    snap.phase = "done"
    yield snap


# --- HTML --------------------------------------------------------------------------------------------------------

BOARD_CSS = """
.sv-board { font-size: 20px; font-variant-numeric: tabular-nums; border-collapse: collapse; margin: 6px 0; }
.sv-board th, .sv-board td { padding: 6px 14px; border-bottom: 1px solid #e2e2e2; text-align: right; }
.sv-board th:first-child, .sv-board td:first-child { text-align: left; font-family: ui-monospace, monospace; }
.sv-board tr.sv-first td { font-weight: 700; background: #e0f3ec; }
"""


def board_html(snap: Optional[LanesSnapshot]) -> str:
    """The leaderboard: one line per lane, fastest first (AR is the 1.00× baseline); empty until the race ends."""
    if snap is None or snap.phase != "done":
        return ('<div class="sv-summary sv-summary-empty">The leaderboard appears when every lane has finished.'
                '</div>')
    ar = snap.lanes["ar"]
    head = "<tr><th>lane</th><th>tok/s</th><th>τ</th><th>α</th><th>speedup</th><th>identical to AR</th></tr>"
    rows = []
    for i, r in enumerate(snap.leaderboard()):
        same = "sampling" if r["identical"] is None else ("✓" if r["identical"] else "✗ differs")
        rows.append(f'<tr class="{"sv-first" if i == 0 else ""}" data-lane="{html.escape(r["lane"])}">'
                    f'<td>{html.escape(r["lane"])}</td><td>{r["tok_per_s"]:.1f}</td><td>{num(r["tau"])}</td>'
                    f'<td>{num(r["alpha"])}</td><td>{num(r["speedup"], prefix="×")}</td><td>{same}</td></tr>')
    rows.append(f'<tr data-lane="ar"><td>{AR_TITLE} (AR)</td><td>{ar.tok_per_s:.1f}</td><td>1.00</td><td>–</td>'
                f'<td>×1.00</td><td>–</td></tr>')
    note = (f"{snap.hardware} · one compute clock: each lane's engine seconds only, the lanes advanced in turn"
            if snap.hardware else "")
    return (f'<style>{BOARD_CSS}</style><table class="sv-board" id="sv-board">{head}{"".join(rows)}</table>'
            f'<div class="sv-settings">{html.escape(note)}</div>')


def panes(snap: Optional[LanesSnapshot], names: list[str]) -> list[str]:
    """AR's pane and one per lane (MAX_LANES of them; a lane not raced shows nothing)."""
    running, stopped = bool(snap and snap.phase == "running"), bool(snap and snap.phase == "stopped")
    out = [pane_html(AR_TITLE, snap.lanes["ar"] if snap else Lane(), running, stopped)]
    for i in range(MAX_LANES):
        if i >= len(names):
            out.append("")
            continue
        lane = snap.lanes[names[i]] if snap else Lane()
        method = snap.cfgs[names[i]].method if snap else ""
        out.append(pane_html(f"Speculative ({names[i]})", lane, running, stopped, method))
    return out


def shown(snap: LanesSnapshot, names: list[str]) -> dict:
    """What the tab shows of a snapshot, by output name (wiring.by_name): the status, the leaderboard and each pane
    (pane_0 is AR's)."""
    out = {"status": status_of(snap), "board": board_html(snap),
           **{f"pane_{i}": pane for i, pane in enumerate(panes(snap, names))}}
    if snap.phase in ("loading", "done"):  # drawn once a race ends (and emptied when the next one starts)
        out["positions"] = positions_of(snap if snap.phase == "done" else None)
    return out


def positions_of(snap: Optional[LanesSnapshot]):
    """The lanes' per-position acceptance side by side (lane_plots.positions_figure); empty before a race ends."""
    return lane_plots.positions_figure({name: snap.lanes[name].events for name in snap.cfgs} if snap else {})


def status_of(snap: LanesSnapshot) -> str:
    if snap.phase == "loading":
        return status_html("Loading the drafters and preparing the prompt…")
    if snap.phase == "running":
        counts = ", ".join(f"{name} {lane.n_tokens}" for name, lane in snap.lanes.items())
        return status_html(f"Racing on one clock… tokens so far: {counts}")
    if snap.phase == "stopped":
        counts = ", ".join(f"{'plain' if name == 'ar' else name} {lane.n_tokens}" for name, lane in snap.lanes.items())
        return status_html(f"■ stopped at {counts} tokens")
    return status_html(f"Done in {time.perf_counter() - snap.started:.1f} s wall time.", "ok")


# --- handlers -------------------------------------------------------------------------------------------------

def _lanes(lanes_text, temperature, max_new_tokens, seed=DEFAULTS.seed, top_p=DEFAULTS.top_p):
    pair = hardware.default_pair()
    cfg = make_config(pair.method, pair.gamma, temperature, top_p, max_new_tokens, seed)
    lanes = parse_lanes(lanes_text, cfg, pair)
    return lanes, pair.run_args(next(iter(lanes.values()))[0].method, "")[0]


def run_many(prompt, lanes_text, temperature, max_new_tokens, live=None):
    """The streaming handler: status, leaderboard and the panes at most ~4 times a second, and the final state. Any
    error ends the run with a one-line message in the status line; the app keeps serving. `live` is the Waiting
    that Run's click left (logic.waiting): Stop pressed while the race waited for the device, it runs nothing."""
    if waited_out(live):
        yield never_ran(live)
        return
    snap = None
    try:
        lanes, target = _lanes(lanes_text, temperature, max_new_tokens)
        names = list(lanes)
        for i, snap in enumerate(throttle(lanes_stream(prompt, lanes, target), key=lambda s: s.phase)):
            # the snapshot, kept live for Stop (updated in place after the first)
            yield shown(snap, names) if i else {**shown(adopt(snap, live), names), "live": snap}
    except Cancelled:  # Stop (stop_many) told it to end before its next step: its last word shows it stopped
        yield stop_many(snap)
    except Exception as exc:
        message = user_message(exc, Policy.from_env().public)
        gr.Warning(message)
        yield {"status": status_html(f"⚠ {message}", "error"), "live": None}  # nothing runs now


def stop_many(live: Optional[LanesSnapshot]):
    """Stop was pressed: the run ends before its next step (logic.stopped) and yields this too as its last word;
    this renders its last snapshot (`live`, kept by run_many) as stopped at once: the status and each unfinished
    pane say where. The stopped copy becomes `live`: a second Stop finds nothing running."""
    snap = stopped(live)
    if snap is None:  # nothing was running
        return {}
    if isinstance(snap, Waiting):  # it never started
        return never_ran(snap)
    return {**shown(snap, list(snap.cfgs)), "live": snap}


def many_api(prompt: str = DEFAULT_PROMPT, lanes: str = DEFAULT_LANES, temperature: float = DEFAULTS.temperature,
             top_p: float = DEFAULTS.top_p, max_new_tokens: int = DEFAULTS.max_new_tokens,
             seed: int = DEFAULTS.seed) -> dict:
    """Race plain AR against up to three speculative races (comma-separated, as `bench --method` names them, or
    `default`) on one prompt and one compute clock; returns AR's text, each lane's text and summary, the leaderboard
    (fastest first) and the hardware."""
    try:
        lane_cfgs, target = _lanes(lanes, temperature, max_new_tokens, seed, top_p)
        snap = None
        for snap in lanes_stream(prompt, lane_cfgs, target):
            pass
        return snap.result()
    except Cancelled:  # a cancelled request or a lost client (cancel.cancellable answers it)
        raise
    except Exception as exc:
        raise gr.Error(user_message(exc, Policy.from_env().public), print_exception=False) from None


def many_tab(concurrency_id: str = DEVICE_QUEUE) -> None:
    """Build the "Several drafters" tab inside the caller's gr.Blocks; loads nothing."""
    with gr.Tab("Several drafters", elem_id="tab-many"):
        gr.HTML(tab_intro("Plain decoding against up to three speculative races on one prompt, on one compute clock: "
                          "the lane that has used the least compute runs next, so each pane grows at its true "
                          "relative speed. Name a lane as <code>bench --method</code> does: <code>pld:2</code>, "
                          "<code>eagle:1+pld:4+ret:4</code>, <code>draft</code>, or <code>default</code> for this "
                          "machine's default race. Drafters here: "
                          + ", ".join(f"<code>{m}</code>" for m in at_hand(SPEC_METHODS)) + ". Below the panes, "
                          "each lane's acceptance by position: how far into its guesses it stays right."))
        with gr.Row(equal_height=False):
            prompt = gr.Textbox(value=DEFAULT_PROMPT, label="Prompt", lines=3, max_lines=8, scale=3,
                                elem_id="many-prompt")
            with gr.Column(scale=2):
                lanes = gr.Textbox(value=DEFAULT_LANES, label=f"Lanes (up to {MAX_LANES}, comma-separated)",
                                   elem_id="many-lanes")
                with gr.Row():
                    temperature = gr.Slider(0.0, 2.0, value=DEFAULTS.temperature, step=0.05,
                                            label="Temperature (0 = greedy)", elem_id="many-temperature")
                    max_new_tokens = gr.Slider(1, MAX_NEW_TOKENS, value=DEFAULTS.max_new_tokens, step=1,
                                               label="Max new tokens", elem_id="many-max-new-tokens")
                with gr.Row():
                    run = gr.Button("Run ▶", variant="primary", elem_id="many-run", size="lg")
                    stop = gr.Button("Stop ■", variant="stop", elem_id="many-stop", size="lg")
        status = gr.HTML(status_html("Press Run to race the lanes."), elem_id="many-status")
        board = gr.HTML(board_html(None), elem_id="many-board")
        gr.HTML(f"<style>{render.CSS}</style>{render.legend_html()}")
        first = panes(None, [n.strip() for n in DEFAULT_LANES.split(",")])
        outs = []
        for row in range(2):
            with gr.Row(equal_height=True):
                for col in range(2):
                    i = 2 * row + col
                    with gr.Column(min_width=300):
                        outs.append(gr.HTML(first[i], elem_id=f"many-pane-{i}"))
        run_seconds = zerogpu.run_duration()
        live = gr.State(None)  # the race running now, its snapshot updated in place (stop_many renders it)
        positions = gr.Plot(positions_of(None), elem_id="many-positions", show_label=False)
        named = {"status": status, "board": board, "positions": positions,
                 **{f"pane_{i}": out for i, out in enumerate(outs)}, "live": live}
        race, outputs = by_name(zerogpu.gpu(run_many, run_seconds), named)
        run.click(None, js=into_view_js("many-status", "many-pane-0"))  # the race in view as it starts
        armed = run.click(queued, inputs=[live], outputs=[live, status], queue=False, api_visibility="private",
                          show_progress="hidden")  # at once, before the queue: Stop reaches a race still waiting
        armed.then(race, inputs=[prompt, lanes, temperature, max_new_tokens, live], outputs=outputs,
                          concurrency_limit=1, concurrency_id=concurrency_id, api_visibility="private",
                          show_progress="full", show_progress_on=[status])
        stop_handler, stop_outputs = by_name(stop_many, named)
        stop.click(stop_handler, inputs=[live], outputs=stop_outputs, concurrency_limit=None, concurrency_id="stop",
                   api_visibility="private", show_progress="hidden")
        gr.api(cancellable(zerogpu.gpu(many_api, run_seconds)), api_name="race_many", concurrency_limit=1,
               concurrency_id=concurrency_id)  # a cancel or a lost client stops the race on the server too
