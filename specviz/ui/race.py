"""The "Race" tab: plain autoregressive decoding and speculative decoding side by side, live, on one device.

Its handlers (run_race streams a race into the panes and plots, race_api is the /race endpoint, run_replay replays
the last race from its events) and its layout, built as named steps inside the caller's gr.Blocks: the form
(race_form), the panes and plots (race_panels), then the wiring (wire_race). The race itself is specviz.ui.logic's.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from specviz import hardware, whatif, zerogpu
from specviz.config import GAMMA_MAX, TREE_NODES_MAX, TREE_SHAPES
from specviz.core.race import Cancelled
from specviz.policy import Policy
from specviz.serving import export
from specviz.ui import controls, plots, presets, render, replay, startup
from specviz.ui.cancel import cancellable
from specviz.ui.common import DEVICE_QUEUE, DRAFT_CHOICES, GAMMAS, MAX_NEW_TOKENS, choices_with_default
from specviz.ui.logic import (
    DEFAULT_PROMPT,
    DEFAULTS,
    SPEC_METHODS,
    View,
    empty_view,
    example_rows,
    live_views,
    make_config,
    race_stream,
    short_label,
    status_html,
    stopped,
    user_message,
    view_of,
    what_if_html,
)

EXPLAINER = """
**Speculative decoding** makes a large *target* model generate faster without changing what it writes.
A cheap *drafter* guesses the next γ tokens; the target then checks all γ guesses in **one** forward pass
(about the cost of producing a single token) and keeps the longest prefix it agrees with.

- **Left pane, plain autoregressive:** one target forward pass per token — the baseline.
- **Right pane, speculative:** the drafter is a lookup of n-grams already in the prompt and the answer (`pld`,
  prompt lookup decoding), a separate draft model such as an
  *int8 copy* of the target (`vanilla`), an *EAGLE* drafter — one small layer
  trained to continue the target's own hidden features (`eagle`), *Medusa* heads that propose a whole tree
  of candidates, which the target verifies in one pass (`medusa`; the tree panel draws it), or the target's own
  first layers with a trained early exit (`layerskip`), or a small *distilled draft model* of four layers
  sharing the target's embeddings (`draft`). On the tree drafters (eagle, medusa) the *prompt lookup branch* hangs
  prompt lookup's guess on the same tree, so one target pass checks both the trained drafter's and the lookup's
  continuation (nodes from the lookup say so when you hover over them). The *datastore branch* does the same with
  what most often followed the last few tokens in the target's own answers to thousands of training prompts (a
  retrieval drafter, as REST does). The race that runs by default is the one chosen on this machine at start-up
  from its own measured speeds; the note under the settings names it and its predicted speedup.
  Every drafted token is
  coloured by what the target did with it: kept (green, underlined), refused (red, struck through), never
  judged because an earlier one was refused (grey, struck through), and the target's own token at the refused
  position (orange, bold) or its free extra token when every draft was kept (blue, bold). Hover over a
  token to see the draft probability q, the target probability p and the acceptance probability min(1, p/q).
  The pane reads as the text the target committed: the tokens of one target forward share a shaded band, a refused
  draft stays as a small struck-through token before the target's own, and the drafts never on the verified path
  (the tree's other branches, drafts after a refusal) hide behind a small **+n** after their step: click it to show
  them in place and that step in the tree panel, or tick *show every draft* to see them all inline.
- **Replay:** after a run, *Replay* shows it again from its recorded events at 0.25×, 0.5× or 1× of its compute
  time, both lanes on one clock, so that a step can be narrated.
- **The race:** both lanes run on the same CPU, one step at a time, always advancing the one that has used less
  compute so far. Each pane therefore grows at its true relative speed; the counters show engine compute
  seconds only.
- **Acceptance rate α:** the share of drafted tokens the target kept. **τ:** tokens produced per target forward,
  counting the target's own extra token (plain decoding has τ = 1). **Cost ratio c:** the time of one draft
  forward relative to one target forward.
- **Prediction:** for a chain, Leviathan et al. (2023) predict the speedup (1 − α^(γ+1)) / ((1 − α)(γc + 1)); for a
  tree, the expected tokens a step follow from how often each kind of node (its depth, rank and branch) was kept given
  its parent, over the step's rows at this machine's verify cost T(rows)/T(1), its drafting and bookkeeping. The
  summary shows it beside the measured one and says which formula it used.
- **What if:** the panel under the summary re-times this race's exact drafts on other hardware: this machine's
  measured verify profile (it reproduces the measured speedup), a profile measured elsewhere that you load
  (`python -m specviz profile --json FILE`), and the roofline bound of named devices from their spec sheets, with
  the k up to which verifying k rows costs about one step on each.
- **Identity:** with temperature 0 (greedy) the speculative text must be *identical* to plain decoding — the badge
  checks that, token by token. With sampling, the texts differ by chance but the speculative output follows exactly
  the target's distribution.
"""


def run_race(prompt, method, draft, gamma, temperature, top_p, max_new_tokens, seed, lookup=DEFAULTS.lookup,
             retrieve=DEFAULTS.retrieve, tree=DEFAULTS.tree, tree_nodes=DEFAULTS.tree_nodes):
    """The streaming handler: yields every output at most ~4 times a second, and always the final state.
    Any error ends the run with a one-line message in the status bar (no traceback, no server path); the
    app keeps serving. A Stop closes this generator (GeneratorExit is not caught)."""
    try:
        cfg = make_config(method, gamma, temperature, top_p, max_new_tokens, seed, lookup, retrieve)
        cfg = cfg.with_(**controls.tree_settings(method, tree, tree_nodes))  # the tree drafters' shape
        target, draft = hardware.default_pair().run_args(method, draft)
        first = True
        note = startup.default_note(cfg)  # the shipped default, while this machine is measured: said so
        for view in startup.noted(live_views(metered(race_stream(prompt, cfg, draft, target))), note):
            events = view.final_events
            if first:  # a new race: forget the last one (the tree slider's steps, the replay); keep it live for Stop
                first, start = False, ([], None, gr.Button(interactive=False), view.snapshot)
            else:
                start = (gr.skip(),) * 4  # the live snapshot is updated in place
            yield (*(gr.skip() if v is None else v for v in view.as_tuple()),
                   start[0] if events is None else events,
                   gr.skip() if events is None else tree_slider(events),
                   start[1] if view.final is None else view.final,
                   start[2] if view.final is None else gr.Button(interactive=True), start[3])
    except Exception as exc:
        message = user_message(exc, Policy.from_env().public)
        gr.Warning(message)
        yield (status_html(f"⚠ {message}", "error"), *([gr.skip()] * 12))


def tree_slider(events) -> gr.Slider:
    """The tree panel's step slider over a race's steps, at its longest accepted path."""
    return gr.Slider(minimum=1, maximum=max(2, len(events)), value=plots.longest_path_step(events) + 1, step=1,
                     interactive=True)


def stop_run(live, recording):
    """Stop was pressed. Its cancels= end the race or the replay, whose generator can no longer yield, so this
    renders their last snapshot (`live`, kept by run_race and run_replay) as stopped: the status and each unfinished
    pane say where; a race stopped mid-run becomes the one Replay replays (a replay is running when this session has
    a recording, which a race clears when it starts), its steps in the tree panel. The stopped copy becomes `live`:
    a second Stop finds nothing running."""
    snap = stopped(live)
    if snap is None:  # nothing was running
        return (gr.skip(),) * 13
    view, events = view_of(snap, with_plots=False), snap.lanes["spec"].events  # the plots stay as last drawn
    if recording is not None and live is not recording:  # a replay: the recording stays as it was
        status = status_html(f"■ replay stopped at {snap.lanes['ar'].n_tokens} plain / "
                             f"{snap.lanes['spec'].n_tokens} speculative tokens")
        return (status, *(gr.skip() if v is None else v for v in view.as_tuple()[1:]), gr.skip(), gr.skip(),
                gr.skip(), gr.Button(interactive=True), snap)
    return (*(gr.skip() if v is None else v for v in view.as_tuple()), events,
            tree_slider(events) if events else gr.skip(), snap, gr.Button(interactive=bool(events)), snap)


def run_replay(final, pace):
    """Replay the session's last race from its recorded events at `pace` (replay.py): both lanes on one clock,
    no model runs. Stop ends it."""
    try:
        if final is None:
            raise ValueError("there is no finished race to replay yet: press Run first")
        for i, view in enumerate(replay.replay_views(final, replay.pace_of(pace))):
            # the replay's snapshot, kept live for Stop (updated in place after the first)
            yield (*(gr.skip() if v is None else v for v in view.as_tuple()), gr.skip() if i else view.snapshot)
    except Exception as exc:
        message = str(exc) if isinstance(exc, ValueError) else user_message(exc, Policy.from_env().public)
        yield (status_html(f"⚠ {message}", "error"), *([gr.skip()] * 8))


def race_api(prompt: str = DEFAULT_PROMPT, method: str = "", draft: str = "",
             gamma: str = "", temperature: float = DEFAULTS.temperature,
             top_p: float = DEFAULTS.top_p, max_new_tokens: int = DEFAULTS.max_new_tokens,
             seed: int = DEFAULTS.seed, lookup: str = "", retrieve: str = "", tree: str = DEFAULTS.tree,
             tree_nodes: int = DEFAULTS.tree_nodes) -> dict:
    """Race plain AR against a speculative method on one prompt; returns both texts, the summary
    (metrics.Comparison.to_dict(): speedup, α, τ, cost ratio c, the prediction and its formula, identity), the
    hardware and what_if (the race re-timed on this machine and each device's roofline bound: logic.what_if_result). An empty method is this machine's default race (the app's), an empty γ the method's fastest γ measured
    on this machine (hardware.Pair.gamma_for), an empty draft its default draft (int8 on CPU, SmolLM2-135M beside the 1.7B on a GPU),
    an empty lookup (retrieve) the length of prompt lookup's (the datastore's) branch on a tree drafter's tree measured
    fastest here (0 for the others). tree: a tree drafter's static tree or a dynamic one of tree_nodes nodes."""  # noqa: E501
    try:
        pair = hardware.default_pair()
        method = method or pair.method
        gamma = str(gamma).strip() or str(pair.gamma_for(method))
        lookup = str(lookup).strip() or str(pair.lookup_for(method))
        retrieve = str(retrieve).strip() or str(pair.retrieve_for(method))
        cfg = make_config(method, gamma, temperature, top_p, max_new_tokens, seed, lookup, retrieve)
        cfg = cfg.with_(**controls.tree_settings(method, tree, tree_nodes))
        target, draft = pair.run_args(method, draft)
        snap = None
        note = startup.default_note(cfg)
        for snap in startup.noted(metered(race_stream(prompt, cfg, draft, target)), note):  # race_result's fold
            pass
        return {**snap.result(), "note": note}
    except Cancelled:  # a cancelled request or a lost client (cancel.cancellable answers it)
        raise
    except Exception as exc:
        raise gr.Error(user_message(exc, Policy.from_env().public), print_exception=False) from None


def metered(stream):
    """A race's snapshots, passed through while its speculative lane's new events feed the app's counters (the
    /metrics route, specviz/serving/export.py), the race counted as a running request."""
    seen = 0
    with export.APP.running():
        for snap in stream:
            events = snap.lanes["spec"].events
            for event in events[seen:]:
                export.APP.observe(event, short_label(snap.cfg))
            seen = len(events)
            yield snap


def method_defaults(method) -> tuple[str, str, str]:
    """The γ and branch fields follow the chosen method: its fastest γ measured on this machine, and the prompt lookup
    and datastore branches measured fastest on its tree (hardware.Pair.gamma_for, lookup_for, retrieve_for)."""
    pair, method = hardware.default_pair(), str(method)
    return str(pair.gamma_for(method)), str(pair.lookup_for(method)), str(pair.retrieve_for(method))


def method_changed(method):
    """The race form follows the method: its γ and branches (method_defaults), and only the fields it takes
    (controls.race_fields: the draft model for a draft-model method, the branches for a tree), with a line saying why
    the others are hidden."""
    gamma, lookup, retrieve = method_defaults(method)
    fields = controls.race_fields(str(method))
    return (gr.Dropdown(visible=fields.draft),
            gr.Dropdown(value=gamma, visible=fields.gamma, label=GAMMA_LABEL, info=gamma_info(fields)),
            gr.Dropdown(value=lookup, visible=fields.lookup), gr.Dropdown(value=retrieve, visible=fields.retrieve),
            fields.note_html(why=default_why(method)), gr.Radio(visible=fields.tree), gr.Dropdown(visible=fields.tree))


def default_why(method) -> str:
    """How the default race was chosen on this machine, under the form while its method is picked."""
    pair = hardware.default_pair()
    return pair.why if str(method) == pair.method else ""


GAMMA_LABEL = "Guesses per step (γ)"


def gamma_info(fields: controls.Fields) -> str:
    """γ's info line says what γ means for the method (the registry's words, less the step-through's aside)."""
    return f"{fields.gamma_info.split(' (')[0]}; follows the method: its fastest γ measured here"


def preset_chosen(name):
    """A preset was picked (presets.py): its settings fill the form, every field still editable, and the fields
    follow its method as when the method is picked (method_changed)."""
    try:
        s = presets.settings(str(name), hardware.default_pair())
    except ValueError as exc:  # a tampered value: keep serving
        raise gr.Error(str(exc), print_exception=False) from None
    fields = controls.race_fields(s["method"])
    return (gr.Dropdown(value=s["method"]), gr.Dropdown(value=s["draft"], visible=fields.draft),
            gr.Dropdown(value=str(s["gamma"]), visible=fields.gamma, label=GAMMA_LABEL, info=gamma_info(fields)),
            gr.Dropdown(value=str(s["lookup"]), visible=fields.lookup),
            gr.Dropdown(value=str(s["retrieve"]), visible=fields.retrieve),
            fields.note_html(why=default_why(s["method"])), gr.Radio(value=s["tree"], visible=fields.tree),
            gr.Dropdown(value=str(s["tree_nodes"]), visible=fields.tree), s["temperature"], s["top_p"])


def pick_step(events, evt: gr.EventData):
    """A step's count of off-path drafts was clicked in the speculative pane: show that step in the tree panel."""
    try:
        step = int((getattr(evt, "_data", None) or {}).get("step", -1))
        i = next((k for k, e in enumerate(events or []) if e.step == step), None)
        if i is None:  # the race is still running, or the step is not this session's
            return gr.skip(), gr.skip()
        return plots.tree_figure(events[i]), gr.Slider(value=i + 1)
    except Exception as exc:  # a tampered event: keep serving
        raise gr.Error(user_message(exc, Policy.from_env().public), print_exception=False) from None


# the speculative pane: a click on a step's count of off-path drafts selects that step in the tree panel
PICK_STEP_JS = """element.addEventListener('click', (ev) => {
  const more = ev.target.closest('.sv-more');
  if (more && ev.target.closest('summary')) trigger('select', {step: Number(more.dataset.step)});
});"""


def show_tree(events, step):
    try:
        if not events:
            return gr.skip()
        i = min(max(int(step or 1), 1), len(events)) - 1
        return plots.tree_figure(events[i])
    except Exception as exc:  # a tampered state or step value: keep serving
        raise gr.Error(user_message(exc, Policy.from_env().public), print_exception=False) from None


def what_if_panel(final, profiles, error: str = ""):
    """The what-if panel after a race: the finished race re-timed on each clock, `error` above it."""
    try:
        return what_if_html(final, profiles or [], error)
    except Exception as exc:  # a tampered state: keep serving
        return what_if_html(None, error=user_message(exc, Policy.from_env().public))


def add_profile(final, file, profiles):
    """A verify profile file was loaded: a row for it (kept for the next races), or a one-line error naming the file
    while the table stays as it was."""
    profiles = list(profiles or [])
    if not file:
        return gr.skip(), gr.skip()
    path = Path(str(file))
    try:
        whatif.profile_clock(path, final.cfg.method if final is not None else "")
    except whatif.WhatIfError as exc:
        message = str(exc).splitlines()[0].replace(repr(str(path)), repr(path.name))
        return what_if_panel(final, profiles, message), profiles
    profiles.append(str(path))
    return what_if_panel(final, profiles), profiles


# ── the layout ──────────────────────────────────────────────────────────────────────────────────────

@dataclass
class RaceForm:
    """The race's form: its settings, the line on the fields the method hides, and the buttons."""
    prompt: gr.Textbox
    method: gr.Dropdown
    draft: gr.Dropdown
    gamma: gr.Dropdown
    lookup: gr.Dropdown
    retrieve: gr.Dropdown
    tree: gr.Radio
    tree_nodes: gr.Dropdown
    method_note: gr.HTML
    preset: gr.Dropdown
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Slider
    seed: gr.Number
    run: gr.Button
    stop: gr.Button
    pace: gr.Radio
    replay: gr.Button

    def settings(self) -> list:
        """run_race's inputs, in its order."""
        return [self.prompt, self.method, self.draft, self.gamma, self.temperature, self.top_p, self.max_new_tokens,
                self.seed, self.lookup, self.retrieve, self.tree, self.tree_nodes]


@dataclass
class RacePanels:
    """What a race shows, the tree panel's step slider, and this session's last finished race."""
    status: gr.HTML
    pane_ar: gr.HTML
    pane_spec: gr.HTML
    summary: gr.HTML
    plot_speed: gr.Plot
    plot_alpha: gr.Plot
    plot_accept: gr.Plot
    plot_tree: gr.Plot
    tree_step: gr.Slider
    what_if: gr.HTML        # the what-if panel: this race re-timed on other hardware
    what_if_file: gr.File   # a verify profile to add a row for
    what_if_profiles: gr.State  # the profile files loaded this session
    spec_events: gr.State  # the last finished speculative run's events, for the tree slider
    recording: gr.State    # the last finished race (logic.RaceSnapshot), for the replay

    def views(self) -> list:
        """A View's components, in View.as_tuple()'s order."""
        return [self.status, self.pane_ar, self.pane_spec, self.summary, self.plot_alpha, self.plot_speed,
                self.plot_accept, self.plot_tree]


def method_fields(pair: hardware.Pair, fields: controls.Fields) -> dict:
    """The method and the fields that follow it (method_changed): the draft model, γ, the branches, the tree."""
    with gr.Row():
        method = gr.Dropdown(list(SPEC_METHODS), value=pair.method, label="Method",
                             info="vanilla: draft model · pld: prompt lookup · eagle, medusa, "
                                  "layerskip, draft: trained drafters",
                             elem_id="method")
        draft = gr.Dropdown(choices_with_default(pair.draft, DRAFT_CHOICES), value=pair.draft,
                            label="Draft model (vanilla)",
                            allow_custom_value=True,
                            info="int8 copy, or a model sharing the vocabulary",
                            visible=fields.draft, elem_id="draft")
        gamma = gr.Dropdown(GAMMAS, value=str(pair.gamma), label=GAMMA_LABEL,
                            info=gamma_info(fields), visible=fields.gamma, elem_id="gamma")
        lookup = gr.Dropdown([str(n) for n in range(0, GAMMA_MAX + 1)],
                             value=str(pair.lookup_for(pair.method)), label="Prompt lookup branch (tokens)",
                             info="eagle, medusa: also verify prompt lookup's next tokens (up to this "
                                  "many) on the tree; 0 = off",
                             visible=fields.lookup, elem_id="lookup")
        retrieve = gr.Dropdown([str(n) for n in range(0, GAMMA_MAX + 1)],
                               value=str(pair.retrieve_for(pair.method)), label="Datastore branch (nodes)",
                               info="eagle, medusa: also verify what most often followed in the "
                                    "target's own answers (up to this many nodes); 0 = off",
                               visible=fields.retrieve, elem_id="retrieve")
    with gr.Row():
        tree = gr.Radio(list(TREE_SHAPES), value=DEFAULTS.tree, label="Tree",
                        info="eagle, medusa: static = the drafter's stored tree; dynamic = grown each "
                             "step from the drafter's confidence (EAGLE-2)",
                        visible=fields.tree, elem_id="tree")
        tree_nodes = gr.Dropdown([str(n) for n in range(1, TREE_NODES_MAX + 1)],
                                 value=str(DEFAULTS.tree_nodes), label="Dynamic tree nodes",
                                 info="the nodes of highest path probability verified",
                                 visible=fields.tree, elem_id="tree-nodes")
    with gr.Row():
        sampling = sampling_fields()
    return dict(method=method, draft=draft, gamma=gamma, lookup=lookup, retrieve=retrieve, tree=tree,
                tree_nodes=tree_nodes, **sampling, method_note=gr.HTML(fields.note_html(why=pair.why)))


def sampling_fields() -> dict:
    """Sampling, length and seed."""
    temperature = gr.Slider(0.0, 2.0, value=DEFAULTS.temperature, step=0.05,
                            label="Temperature (0 = greedy)", elem_id="temperature")
    top_p = gr.Slider(0.05, 1.0, value=DEFAULTS.top_p, step=0.05, label="Top-p (nucleus mass kept)",
                      elem_id="top-p")
    max_new_tokens = gr.Slider(1, MAX_NEW_TOKENS, value=DEFAULTS.max_new_tokens, step=1,
                               label="Max new tokens", elem_id="max-new-tokens")
    seed = gr.Number(value=DEFAULTS.seed, precision=0, label="Seed", elem_id="seed", min_width=100)
    return dict(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)


def race_form(pair: hardware.Pair) -> RaceForm:
    """The race first: the prompt beside Run, Stop and Replay and a preset; the settings folded under "Settings"
    (closed: the panes come on the first screen), the example prompts under theirs, and the replay's pace."""
    fields = controls.race_fields(pair.method)  # the fields the default method takes; the others hidden, with why
    with gr.Row(equal_height=False, elem_id="race-top"):
        prompt = gr.Textbox(value=DEFAULT_PROMPT, label="Prompt", lines=2, max_lines=8, elem_id="prompt", scale=3,
                            min_width=280)
        with gr.Column(scale=2, min_width=280, elem_id="race-go"):
            preset = gr.Dropdown(list(presets.NAMES), value=presets.BEST, label="Preset (fills the settings)",
                                 elem_id="preset")
            with gr.Row(elem_id="race-buttons"):
                run = gr.Button("Run ▶", variant="primary", elem_id="run", size="lg", min_width=80)
                stop = gr.Button("Stop ■", variant="stop", elem_id="stop", size="lg", min_width=80)
                replay_button = gr.Button("Replay ⟲", interactive=False, elem_id="replay", size="lg", min_width=80)
    with gr.Row(equal_height=False, elem_id="race-folds"):
        with gr.Accordion("Settings", open=False, elem_id="settings"):
            gr.HTML(f'<div class="sv-method-note">{html.escape("Presets: " + presets.info())}</div>')
            parts = method_fields(pair, fields)
            pace = gr.Radio(list(replay.PACES), value=replay.DEFAULT_PACE, label="Replay pace",
                            info="the last race again from its events, both lanes on one clock",
                            elem_id="replay-pace")
        with gr.Accordion("Example prompts, in pairs", open=False, elem_id="examples"):
            rows, labels = example_rows()  # each fills the prompt and the temperature
            gr.Examples(rows, inputs=[prompt, parts["temperature"]], example_labels=labels,
                        label="Each pair shows both sides of one lesson", examples_per_page=len(rows))
    return RaceForm(prompt=prompt, preset=preset, run=run, stop=stop, pace=pace, replay=replay_button, **parts)


def race_panels(initial: View) -> RacePanels:
    """The status line and the two panes side by side (narrow columns on a phone: style.css), then the legend, the
    summary, the four plots and the tree's step slider."""
    status = gr.HTML(initial.status, elem_id="status", padding=False)
    with gr.Row(equal_height=True, elem_id="race-panes"):
        with gr.Column(min_width=150):
            pane_ar = gr.HTML(initial.pane_ar, elem_id="pane-ar", padding=False)
        with gr.Column(min_width=150):
            pane_spec = gr.HTML(initial.pane_spec, elem_id="pane-spec", js_on_load=PICK_STEP_JS, padding=False)
    gr.HTML(f"<style>{render.CSS}</style>{render.legend_html()}")
    gr.Checkbox(False, label="show every draft (the tree's other branches and the drafts after a refusal, "
                "struck through)", container=False, elem_id="show-drafts")  # style.css shows them: no handler
    summary = gr.HTML(initial.summary, elem_id="summary")
    with gr.Accordion("What if: the same drafts on other hardware", open=False, elem_id="whatif-panel"):
        what_if = gr.HTML(what_if_html(None), elem_id="whatif")
        what_if_file = gr.File(label="Add a verify profile measured elsewhere (the JSON of `python -m specviz profile "
                               "--json FILE` or `make gpu-check`)", file_types=[".json"], type="filepath",
                               elem_id="whatif-file", height=90)
    with gr.Row():
        plot_speed = gr.Plot(initial.speed, elem_id="plot-speed", show_label=False, min_width=380)
        plot_alpha = gr.Plot(initial.alpha, elem_id="plot-alpha", show_label=False, min_width=380)
    with gr.Row():
        plot_accept = gr.Plot(initial.accept, elem_id="plot-accept", show_label=False, min_width=380)
        with gr.Column(min_width=380):
            plot_tree = gr.Plot(initial.tree, elem_id="plot-tree", show_label=False, min_width=380)
            tree_step = gr.Slider(1, 2, value=1, step=1, label="Step shown in the tree (after a run)",
                                  interactive=False, elem_id="tree-step")
    return RacePanels(status, pane_ar, pane_spec, summary, plot_speed, plot_alpha, plot_accept, plot_tree, tree_step,
                      what_if, what_if_file, gr.State([]), spec_events=gr.State([]), recording=gr.State(None))


def wire_race(form: RaceForm, panels: RacePanels, concurrency_id: str) -> None:
    """Run, Replay and Stop; the fields that follow the method; a click in the speculative pane and the step slider
    choose the tree panel's step; the /race endpoint. The handlers that run models share the device's queue."""
    run_seconds = zerogpu.run_duration()  # one capped run: SPECVIZ_MAX_RUN_SECONDS plus the set-up
    live = gr.State(None)  # the race or replay running now, its snapshot updated in place (stop_run renders it)
    run_event = form.run.click(
        zerogpu.gpu(run_race, run_seconds), inputs=form.settings(),
        outputs=[*panels.views(), panels.spec_events, panels.tree_step, panels.recording, form.replay, live],
        concurrency_limit=1, concurrency_id=concurrency_id, api_name="race_stream",
        show_progress="full", show_progress_on=[panels.status])  # a waiting visitor sees their place in the queue
    run_event.then(what_if_panel, inputs=[panels.recording, panels.what_if_profiles], outputs=[panels.what_if],
                   api_visibility="private", show_progress="hidden")
    panels.what_if_file.upload(add_profile, inputs=[panels.recording, panels.what_if_file, panels.what_if_profiles],
                               outputs=[panels.what_if, panels.what_if_profiles], api_visibility="private",
                               show_progress="hidden")
    replay_event = form.replay.click(
        run_replay, inputs=[panels.recording, form.pace],  # no model runs: its own queue, beside the device's
        outputs=[*panels.views(), live], concurrency_limit=4, concurrency_id="replay", api_visibility="private",
        show_progress="hidden")
    form.stop.click(None, cancels=[run_event, replay_event])
    form.stop.click(stop_run, inputs=[live, panels.recording],  # what the cancelled run can no longer yield
                    outputs=[*panels.views(), panels.spec_events, panels.tree_step, panels.recording, form.replay,
                             live], concurrency_limit=None, concurrency_id="stop", api_visibility="private",
                    show_progress="hidden")
    form.method.input(method_changed, inputs=[form.method],
                      outputs=[form.draft, form.gamma, form.lookup, form.retrieve, form.method_note, form.tree,
                               form.tree_nodes], api_visibility="private", show_progress="hidden")
    form.preset.input(preset_chosen, inputs=[form.preset],
                      outputs=[form.method, form.draft, form.gamma, form.lookup, form.retrieve, form.method_note,
                               form.tree, form.tree_nodes, form.temperature, form.top_p],
                      api_visibility="private", show_progress="hidden")
    panels.pane_spec.select(pick_step, inputs=[panels.spec_events], outputs=[panels.plot_tree, panels.tree_step],
                            api_visibility="private", show_progress="hidden")
    panels.tree_step.input(show_tree, inputs=[panels.spec_events, panels.tree_step], outputs=[panels.plot_tree],
                           api_visibility="private", show_progress="hidden")
    gr.api(cancellable(zerogpu.gpu(race_api, run_seconds)), api_name="race", concurrency_limit=1,
           concurrency_id=concurrency_id)  # a cancel or a lost client stops the race on the server too


def race_tab(concurrency_id: str = DEVICE_QUEUE, pair: hardware.Pair = hardware.EMBEDDED_PAIR) -> None:
    """Build the "Race" tab inside the caller's gr.Blocks; loads nothing (models load in app.main() or on the first
    run). On ZeroGPU the handlers that run models are wrapped in spaces.GPU (specviz/zerogpu.py)."""
    initial = empty_view(pair.method, lookup=pair.lookup_for(pair.method), retrieve=pair.retrieve_for(pair.method))
    with gr.Tab("Race", elem_id="tab-race"):
        with gr.Accordion("What am I looking at?", open=False, elem_id="explainer"):
            gr.Markdown(EXPLAINER)
        form = race_form(pair)
        startup.progress(form, pair, method_changed)  # the start-up's progress; then this machine's race
        wire_race(form, race_panels(initial), concurrency_id)


def counter_label(pair: hardware.Pair) -> str:
    """The label the app's /metrics counters carry for this machine's default race (export.APP.declare)."""
    return short_label(make_config(pair.method, pair.gamma, lookup=pair.lookup_for(pair.method),
                                   retrieve=pair.retrieve_for(pair.method)))
