"""The "Race" tab's layout, built as named steps inside the caller's gr.Blocks: the explainer, the form (race_form: the
prompt beside Run, Stop, Replay and the preset; the settings folded under "Settings") and the panes and plots
(race_panels). Its handlers and their wiring are ui/race.py's."""
from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from specviz import hardware
from specviz.config import GAMMA_MAX, TREE_NODES_MAX, TREE_SHAPES
from specviz.ui import controls, presets, render, replay
from specviz.ui.common import DRAFT_CHOICES, GAMMAS, MAX_NEW_TOKENS, at_hand, choices_with_default, method_info
from specviz.ui.logic import DEFAULT_PROMPT, DEFAULTS, SPEC_METHODS, example_rows
from specviz.ui.race_html import what_if_html
from specviz.ui.race_views import View

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
  measured verify profile (its row is the speedup the decode steps measured), a profile measured elsewhere that you load
  (`python -m specviz profile --json FILE`), and the roofline bound of named devices from their spec sheets, with
  the k up to which verifying k rows costs about one step on each.
- **Identity:** with temperature 0 (greedy) the speculative text must be *identical* to plain decoding — the badge
  checks that, token by token. With sampling, the texts differ by chance but the speculative output follows exactly
  the target's distribution.
"""


GAMMA_LABEL = "Guesses per step (γ)"


def gamma_info(fields: controls.Fields) -> str:
    """γ's info line says what γ means for the method (the registry's words, less the step-through's aside)."""
    return f"{fields.gamma_info.split(' (')[0]}; follows the method: its fastest γ measured here"


# the speculative pane: a click on a step's count of off-path drafts selects that step in the tree panel
PICK_STEP_JS = """element.addEventListener('click', (ev) => {
  const more = ev.target.closest('.sv-more');
  if (more && ev.target.closest('summary')) trigger('select', {step: Number(more.dataset.step)});
});"""


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

    def named(self, *names: str) -> dict:
        """{name: field} for the fields a handler's outputs name (wiring.by_name)."""
        return {name: getattr(self, name) for name in names}


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

    def shown(self) -> dict:
        """A View's outputs by name (View.OUTPUTS) -> their components."""
        return {"status": self.status, "pane_ar": self.pane_ar, "pane_spec": self.pane_spec, "summary": self.summary,
                "alpha": self.plot_alpha, "speed": self.plot_speed, "accept": self.plot_accept, "tree": self.plot_tree}

    def race_outputs(self, replay: gr.Button, live: gr.State) -> dict:
        """A race's outputs by name: its View's, the tree panel's steps and slider, the recording, Replay, the live
        snapshot (run_race, stop_run)."""
        return {**self.shown(), "spec_events": self.spec_events, "tree_step": self.tree_step,
                "recording": self.recording, "replay": replay, "live": live}


def method_fields(pair: hardware.Pair, fields: controls.Fields) -> dict:
    """The method and the fields that follow it (method_changed): the draft model, γ, the branches, the tree."""
    with gr.Row():
        method = gr.Dropdown(at_hand(SPEC_METHODS), value=pair.method, label="Method",
                             info=method_info(at_hand(SPEC_METHODS)),
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
    shape, nodes = pair.tree_for(pair.method)
    with gr.Row():
        tree = gr.Radio(list(TREE_SHAPES), value=shape, label="Tree",
                        info="eagle, medusa: static = the drafter's stored tree; dynamic = grown each "
                             "step from the drafter's confidence (EAGLE-2)",
                        visible=fields.tree, elem_id="tree")
        tree_nodes = gr.Dropdown([str(n) for n in range(1, TREE_NODES_MAX + 1)],
                                 value=str(nodes), label="Dynamic tree nodes",
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
            preset = gr.Dropdown([*presets.NAMES, presets.CUSTOM], value=presets.BEST,
                                 label="Preset (fills the settings)", elem_id="preset")
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
