"""The "Race" tab: plain autoregressive decoding and speculative decoding side by side, live, on one device.

Its handlers (run_race streams a race into the panes and plots, race_api is the /race endpoint, run_replay replays
the last race from its events, stop_run renders a stopped one) and their wiring (wire_race), each handler's outputs
named (wiring.by_name), never positional. The layout is ui/race_layout.py's; the race itself ui/logic.py's.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from specviz import hardware, whatif, zerogpu
from specviz.core.race import Cancelled
from specviz.policy import Policy
from specviz.serving import export
from specviz.ui import controls, plots, presets, replay, startup
from specviz.ui.cancel import cancellable
from specviz.ui.common import DEVICE_QUEUE, into_view_js, never_ran, queued, status_html
from specviz.ui.logic import (
    DEFAULT_PROMPT,
    DEFAULTS,
    Waiting,
    adopt,
    make_config,
    race_stream,
    short_label,
    stopped,
    user_message,
    waited_out,
)
from specviz.ui.race_html import empty_panes, what_if_html
from specviz.ui.race_layout import EXPLAINER, GAMMA_LABEL, RaceForm, RacePanels, gamma_info, race_form, race_panels
from specviz.ui.race_views import empty_view, live_views, view_of
from specviz.ui.wiring import by_name


def run_race(prompt, method, draft, gamma, temperature, top_p, max_new_tokens, seed, lookup=DEFAULTS.lookup,
             retrieve=DEFAULTS.retrieve, tree=DEFAULTS.tree, tree_nodes=DEFAULTS.tree_nodes, live=None):
    """The streaming handler: yields the outputs that change, by name ({"status": …}: wire_race wires the names), at
    most ~4 times a second, and always the final state.
    Any error ends the run with a one-line message in the status bar (no traceback, no server path); the
    app keeps serving. Stop ends it before the race's next step (stop_run); a client's cancel closes it (GeneratorExit
    is not caught); `live` is the Waiting that Run's click left (logic.waiting): Stop pressed while the race waited
    for the device, it runs nothing."""
    if waited_out(live):
        yield never_ran(live)
        return
    snap = None
    try:
        cfg = make_config(method, gamma, temperature, top_p, max_new_tokens, seed, lookup, retrieve)
        cfg = cfg.with_(**controls.tree_settings(method, tree, tree_nodes))  # the tree drafters' shape
        target, draft = hardware.default_pair().run_args(method, draft)
        first = True
        note = startup.default_note(cfg)  # the shipped default, while this machine is measured: said so
        for view in startup.noted(live_views(metered(race_stream(prompt, cfg, draft, target))), note):
            snap = view.snapshot
            out = view.shown()
            if first:  # a new race: forget the last one (the tree slider's steps, the replay); keep it live for Stop
                first = False
                adopt(snap, live)
                out.update(spec_events=[], recording=None, replay=gr.Button(interactive=False), live=view.snapshot)
            if view.final_events is not None:  # done: its steps in the tree panel
                out.update(spec_events=view.final_events, tree_step=tree_slider(view.final_events))
            if view.final is not None:  # the race Replay replays
                out.update(recording=view.final, replay=gr.Button(interactive=True))
            yield out  # later snapshots update the live one in place
    except Cancelled:  # Stop (stop_run) told the race to end before its next step: its last word shows it stopped
        yield stopped_race(stopped(snap))
    except Exception as exc:
        message = user_message(exc, Policy.from_env().public)
        gr.Warning(message)
        yield {"status": status_html(f"⚠ {message}", "error"), "live": None}  # nothing runs now


def tree_slider(events) -> gr.Slider:
    """The tree panel's step slider over a race's steps, at its longest accepted path."""
    return gr.Slider(minimum=1, maximum=max(2, len(events)), value=plots.longest_path_step(events) + 1, step=1,
                     interactive=True)


def stop_run(live, recording):
    """Stop was pressed. A race ends before its next step (logic.stopped) and shows itself stopped as its last word
    (run_race); a replay is ended by Stop's cancels= (it has no progress badge to leave in error). This renders the
    last snapshot (`live`, kept by run_race and run_replay) as stopped at once: the status and each unfinished pane
    say where; a race stopped mid-run becomes the one Replay replays (a replay is running when this session has a
    recording, which a race clears when it starts), its steps in the tree panel. The stopped copy becomes `live`: a
    second Stop finds nothing running."""
    snap = stopped(live)
    if snap is None:  # nothing was running
        return {}
    if isinstance(snap, Waiting):  # it never started
        return never_ran(snap)
    if recording is not None and live is not recording:  # a replay: the recording stays as it was
        out = view_of(snap, with_plots=False).shown()
        out.update(status=status_html(f"■ replay stopped at {snap.lanes['ar'].n_tokens} plain / "
                                      f"{snap.lanes['spec'].n_tokens} speculative tokens"),
                   replay=gr.Button(interactive=True), live=snap)
        return out
    return stopped_race(snap)


def stopped_race(snap) -> dict:
    """A race stopped mid-run (logic.stopped's copy) as shown: where each lane stopped (the plots stay as last
    drawn), the part raced the one Replay replays, its steps in the tree panel; `live` now this copy."""
    if snap is None:
        return {}
    out = view_of(snap, with_plots=False).shown()
    events = snap.lanes["spec"].events
    out.update(spec_events=events, recording=snap, replay=gr.Button(interactive=bool(events)), live=snap)
    if events:
        out["tree_step"] = tree_slider(events)
    return out


def run_replay(final, pace):
    """Replay the session's last race from its recorded events at `pace` (replay.py): both lanes on one clock,
    no model runs. Stop ends it."""
    try:
        if final is None:
            raise ValueError("there is no finished race to replay yet: press Run first")
        for i, view in enumerate(replay.replay_views(final, replay.pace_of(pace))):
            # the replay's snapshot, kept live for Stop (updated in place after the first)
            yield view.shown() if i else {**view.shown(), "live": view.snapshot}
    except Exception as exc:
        message = str(exc) if isinstance(exc, ValueError) else user_message(exc, Policy.from_env().public)
        yield {"status": status_html(f"⚠ {message}", "error")}


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
    the others are hidden. Updates are gr.update's: a component built with a value but no choices warns that the
    value is not among them, four lines in the server's log a pick."""
    gamma, lookup, retrieve = method_defaults(method)
    tree, nodes = hardware.default_pair().tree_for(str(method))
    fields = controls.race_fields(str(method))
    return {"draft": gr.update(visible=fields.draft),
            "gamma": gr.update(value=gamma, visible=fields.gamma, label=GAMMA_LABEL, info=gamma_info(fields)),
            "lookup": gr.update(value=lookup, visible=fields.lookup),
            "retrieve": gr.update(value=retrieve, visible=fields.retrieve),
            "method_note": fields.note_html(why=default_why(method)),
            "tree": gr.update(value=tree, visible=fields.tree),
            "tree_nodes": gr.update(value=str(nodes), visible=fields.tree)}


def default_why(method) -> str:
    """How the default race was chosen on this machine, under the form while its method is picked."""
    pair = hardware.default_pair()
    return pair.why if str(method) == pair.method else ""




def preset_chosen(name):
    """A preset was picked (presets.py): its settings fill the form, every field still editable, and the fields
    follow its method as when the method is picked (method_changed)."""
    if str(name) == presets.CUSTOM:  # picked by hand: the form stays as it is
        return {}
    try:
        s = presets.settings(str(name), hardware.default_pair())
    except ValueError as exc:  # a tampered value: keep serving
        raise gr.Error(str(exc), print_exception=False) from None
    fields = controls.race_fields(s["method"])
    return {"method": gr.update(value=s["method"]), "draft": gr.update(value=s["draft"], visible=fields.draft),
            "gamma": gr.update(value=str(s["gamma"]), visible=fields.gamma, label=GAMMA_LABEL,
                                 info=gamma_info(fields)),
            "lookup": gr.update(value=str(s["lookup"]), visible=fields.lookup),
            "retrieve": gr.update(value=str(s["retrieve"]), visible=fields.retrieve),
            "method_note": fields.note_html(why=default_why(s["method"])),
            "tree": gr.update(value=s["tree"], visible=fields.tree),
            "tree_nodes": gr.update(value=str(s["tree_nodes"]), visible=fields.tree),
            "temperature": s["temperature"], "top_p": s["top_p"]}


def edited_by_hand():
    """A field a preset fills was edited by hand: the selector says Custom (picking a preset again refills them)."""
    return gr.update(value=presets.CUSTOM)


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


def wire_race(form: RaceForm, panels: RacePanels, concurrency_id: str) -> None:
    """Run, Replay and Stop; the fields that follow the method; a click in the speculative pane and the step slider
    choose the tree panel's step; the /race endpoint. The handlers that run models share the device's queue."""
    run_seconds = zerogpu.run_duration()  # one capped run: SPECVIZ_MAX_RUN_SECONDS plus the set-up
    live = gr.State(None)  # the race or replay running now, its snapshot updated in place (stop_run renders it)
    race, race_outputs = by_name(zerogpu.gpu(run_race, run_seconds), panels.race_outputs(form.replay, live))
    form.run.click(None, js=into_view_js("status", "race-panes"))  # the race in view as it starts
    armed = form.run.click(queued, inputs=[live], outputs=[live, panels.status], queue=False,
                           api_visibility="private", show_progress="hidden")  # at once: Stop reaches a waiting race
    run_event = armed.then(
        race, inputs=[*form.settings(), live], outputs=race_outputs,
        concurrency_limit=1, concurrency_id=concurrency_id, api_name="race_stream",
        show_progress="full", show_progress_on=[panels.status])  # a waiting visitor sees their place in the queue
    run_event.then(what_if_panel, inputs=[panels.recording, panels.what_if_profiles], outputs=[panels.what_if],
                   api_visibility="private", show_progress="hidden")
    panels.what_if_file.upload(add_profile, inputs=[panels.recording, panels.what_if_file, panels.what_if_profiles],
                               outputs=[panels.what_if, panels.what_if_profiles], api_visibility="private",
                               show_progress="hidden")
    replay_handler, replay_outputs = by_name(run_replay, {**panels.shown(), "live": live})
    replay_event = form.replay.click(
        replay_handler, inputs=[panels.recording, form.pace],  # no model runs: its own queue, beside the device's
        outputs=replay_outputs, concurrency_limit=4, concurrency_id="replay", api_visibility="private",
        show_progress="hidden")
    form.stop.click(None, cancels=[replay_event])  # a race ends itself (stop_run)
    stop, stop_outputs = by_name(stop_run, panels.race_outputs(form.replay, live))
    form.stop.click(stop, inputs=[live, panels.recording],  # what the cancelled run can no longer yield
                    outputs=stop_outputs, concurrency_limit=None, concurrency_id="stop", api_visibility="private",
                    show_progress="hidden")
    follow, follow_outputs = by_name(method_changed, form.named(*startup.FOLLOWS))
    form.method.input(follow, inputs=[form.method], outputs=follow_outputs, api_visibility="private",
                      show_progress="hidden")
    chosen, chosen_outputs = by_name(preset_chosen, form.named("method", *startup.FOLLOWS, "temperature", "top_p"))
    form.preset.input(chosen, inputs=[form.preset], outputs=chosen_outputs, api_visibility="private",
                      show_progress="hidden")
    # a field a preset fills, edited by hand (.input: never when a preset or the start-up sets it): no preset now
    gr.on([getattr(form, name).input for name in presets.FIELDS], edited_by_hand, outputs=[form.preset],
          queue=False, api_visibility="private", show_progress="hidden")
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
        line = startup.progress_line()  # the start-up's progress; then this machine's race
        panels = race_panels(initial)
        startup.follow_ready(line, form, pair, method_changed, panels.status, panels.pane_spec, empty_spec_pane)
        wire_race(form, panels, concurrency_id)


def empty_spec_pane(method: str) -> str:
    """The speculative pane before any race, titled with `method`'s race on this machine."""
    pair = hardware.default_pair()
    return empty_panes(method, lookup=pair.lookup_for(method), retrieve=pair.retrieve_for(method))[1]


def counter_label(pair: hardware.Pair) -> str:
    """The label the app's /metrics counters carry for this machine's default race (export.APP.declare)."""
    return short_label(make_config(pair.method, pair.gamma, lookup=pair.lookup_for(pair.method),
                                   retrieve=pair.retrieve_for(pair.method)))
