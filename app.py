"""specviz web app: plain autoregressive decoding and speculative decoding, side by side, live.

`python app.py` serves on 127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override). Layout and
event wiring only: the handler logic lives in specviz/app_logic.py, figures in specviz/plots.py, the default
pair for this machine in specviz/hardware.py, and ZeroGPU's spaces.GPU wrapping in specviz/zerogpu.py.
"""
from __future__ import annotations

import logging
import os

import gradio as gr

from specviz.ui import tabs as app_tabs, render

from specviz import hardware, zerogpu
from specviz.ui.logic import (DEFAULT_PROMPT, DEFAULTS, SPEC_METHODS, empty_view, example_rows,
                               live_views, make_config, race_result, race_stream, status_html, user_message)
from specviz.config import DEFAULT_DRAFT, DEFAULT_TARGET, GAMMA_MAX
from specviz.policy import Policy
from specviz.ui import plots

CONCURRENCY_ID = "cpu"  # one queue worker for the one device: runs never disturb each other's timing
DRAFT_CHOICES = [DEFAULT_DRAFT, DEFAULT_TARGET]

APP_CSS = """
.gradio-container { max-width: 1500px !important; font-size: 16px; }
#title h1 { font-size: 30px; margin-bottom: 2px; }
#title p { font-size: 17px; color: #444; margin-top: 0; }
.sv-pane-box { border: 1px solid #d0d0d0; border-radius: 10px; padding: 12px 16px; background: #fff;
  min-height: 260px; }
.sv-pane-head { display: flex; justify-content: space-between; align-items: baseline; gap: 8px; }
.sv-pane-title { font-size: 21px; font-weight: 700; color: #222; }
.sv-state { font-size: 15px; font-weight: 600; }
.sv-state-running { color: #0072B2; }
.sv-state-done { color: #007A5A; }
.sv-stats { display: flex; gap: 20px; font-size: 16px; color: #333; margin: 4px 0 8px 0;
  border-bottom: 1px solid #eee; padding-bottom: 6px; font-variant-numeric: tabular-nums; }
.sv-stats b { font-size: 19px; }
.sv-pane { font-size: 18px; line-height: 1.75; color: #111; max-height: 460px; overflow-y: auto; }
.sv-placeholder { color: #aaa; }
.sv-legend { font-size: 16px; padding: 6px 2px; color: #222; }
.sv-legend .sv-tok { font-family: ui-monospace, 'DejaVu Sans Mono', monospace; font-size: 16px; }
.sv-status { font-size: 16px; padding: 6px 12px; border-radius: 8px; background: #f2f6fa; color: #123; }
.sv-status-error { background: #fdeee6; color: #8a3300; font-weight: 600; }
.sv-status-ok { background: #e8f5ef; color: #00573f; }
.sv-summary { border: 1px solid #d0d0d0; border-radius: 10px; padding: 12px 16px; background: #fafafa; }
.sv-summary-empty { color: #777; font-size: 16px; }
.sv-badges { margin-bottom: 10px; }
.sv-badge { display: inline-block; font-size: 18px; font-weight: 700; padding: 4px 12px; border-radius: 16px; }
.sv-badge-ok { background: #e0f3ec; color: #00573f; border: 2px solid #009E73; }
.sv-badge-warn { background: #fdeee6; color: #8a3300; border: 2px solid #D55E00; }
.sv-badge-info { background: #e6f0f8; color: #004a75; border: 2px solid #0072B2; font-weight: 600; font-size: 16px; }
.sv-cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(165px, 1fr)); gap: 10px; }
.sv-card { background: #fff; border: 1px solid #e2e2e2; border-radius: 8px; padding: 8px 12px; }
.sv-card-k { font-size: 15px; color: #555; }
.sv-card-v { font-size: 28px; font-weight: 700; color: #111; font-variant-numeric: tabular-nums; }
.sv-card-n { font-size: 13.5px; color: #666; line-height: 1.3; }
.sv-settings { font-size: 14px; color: #555; margin-top: 8px; }
#explainer p, #explainer li { font-size: 16px; }
@media (max-width: 640px) {
  .sv-legend-item { white-space: normal; }
  .sv-pane { font-size: 16px; }
  #title h1 { font-size: 24px; }
}
"""

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
  retrieval drafter, as REST does). EAGLE with both branches is the default on a CPU, where it measured fastest.
  Every drafted token is
  coloured by what the target did with it: kept (green, underlined), refused (red, struck through), never
  judged because an earlier one was refused (grey, struck through), and the target's own token at the refused
  position (orange, bold) or its free extra token when every draft was kept (blue, bold). Hover over a
  token to see the draft probability q, the target probability p and the acceptance probability min(1, p/q).
- **The race:** both lanes run on the same CPU, one step at a time, always advancing the one that has used less
  compute so far. Each pane therefore grows at its true relative speed; the counters show engine compute
  seconds only.
- **Acceptance rate α:** the share of drafted tokens the target kept. **τ:** tokens produced per target forward,
  counting the target's own extra token (plain decoding has τ = 1). **Cost ratio c:** the time of one draft
  forward relative to one target forward.
- **Prediction:** Leviathan et al. (2023) predict the speedup (1 − α^(γ+1)) / ((1 − α)(γc + 1)); the summary shows
  it beside the measured one. With temperature 0 (greedy) the speculative text must be *identical* to plain
  decoding — the badge checks that, token by token. With sampling, the texts differ by chance but the
  speculative output follows exactly the target's distribution.
"""


def run_race(prompt, method, draft, gamma, temperature, top_p, max_new_tokens, seed, lookup=DEFAULTS.lookup,
             retrieve=DEFAULTS.retrieve):
    """The streaming handler: yields every output at most ~4 times a second, and always the final state.
    Any error ends the run with a one-line message in the status bar (no traceback, no server path); the
    app keeps serving. A Stop closes this generator (GeneratorExit is not caught)."""
    try:
        cfg = make_config(method, gamma, temperature, top_p, max_new_tokens, seed, lookup, retrieve)
        target, draft = hardware.default_pair().run_args(method, draft)
        for view in live_views(race_stream(prompt, cfg, draft, target)):
            events = view.final_events
            yield (*(gr.skip() if v is None else v for v in view.as_tuple()),
                   gr.skip() if events is None else events,
                   gr.skip() if events is None else gr.Slider(minimum=1, maximum=max(2, len(events)),
                                                              value=max(1, len(events)), step=1, interactive=True))
    except Exception as exc:
        message = user_message(exc, Policy.from_env().public)
        gr.Warning(message)
        yield (status_html(f"⚠ {message}", "error"), *([gr.skip()] * 9))


def race_api(prompt: str = DEFAULT_PROMPT, method: str = "", draft: str = "",
             gamma: str = "", temperature: float = DEFAULTS.temperature,
             top_p: float = DEFAULTS.top_p, max_new_tokens: int = DEFAULTS.max_new_tokens,
             seed: int = DEFAULTS.seed, lookup: str = "", retrieve: str = "") -> dict:
    """Race plain AR against a speculative method on one prompt; returns both texts, the summary
    (metrics.Comparison.to_dict(): speedup, α, τ, cost ratio c, the Leviathan prediction, identity) and the
    hardware. An empty method is this machine's default race (the app's), an empty γ the method's fastest γ measured
    on this machine (hardware.Pair.gamma_for), an empty draft its default draft (int8 on CPU, SmolLM2-135M beside the 1.7B on a GPU),
    an empty lookup (retrieve) the length of prompt lookup's (the datastore's) branch on a tree drafter's tree measured
    fastest here (0 for the others)."""
    try:
        pair = hardware.default_pair()
        method = method or pair.method
        gamma = str(gamma).strip() or str(pair.gamma_for(method))
        lookup = str(lookup).strip() or str(pair.lookup_for(method))
        retrieve = str(retrieve).strip() or str(pair.retrieve_for(method))
        cfg = make_config(method, gamma, temperature, top_p, max_new_tokens, seed, lookup, retrieve)
        target, draft = pair.run_args(method, draft)
        return race_result(prompt, cfg, draft, target)
    except Exception as exc:
        raise gr.Error(user_message(exc, Policy.from_env().public), print_exception=False) from None


def method_defaults(method) -> tuple[str, str, str]:
    """The γ and branch fields follow the chosen method: its fastest γ measured on this machine, and the prompt lookup
    and datastore branches measured fastest on its tree (hardware.Pair.gamma_for, lookup_for, retrieve_for)."""
    pair, method = hardware.default_pair(), str(method)
    return str(pair.gamma_for(method)), str(pair.lookup_for(method)), str(pair.retrieve_for(method))


def show_tree(events, step):
    try:
        if not events:
            return gr.skip()
        i = min(max(int(step or 1), 1), len(events)) - 1
        return plots.tree_figure(events[i])
    except Exception as exc:  # a tampered state or step value: keep serving
        raise gr.Error(user_message(exc, Policy.from_env().public), print_exception=False) from None


def build_ui() -> gr.Blocks:
    """The layout and its wiring; loads nothing (models load in main() or on the first run). On ZeroGPU the
    handlers that run models (race, check, step-through) are wrapped in spaces.GPU (specviz/zerogpu.py)."""
    pair = hardware.default_pair()
    initial = empty_view(pair.method, lookup=pair.lookup_for(pair.method), retrieve=pair.retrieve_for(pair.method))
    run_seconds = zerogpu.run_duration()  # one capped run: SPECVIZ_MAX_RUN_SECONDS plus the set-up
    with gr.Blocks(title="specviz: speculative decoding, live", analytics_enabled=False) as demo:
        gr.Markdown("# specviz — speculative decoding, live\n"
                    "A small drafter guesses ahead, the target model checks several guesses in one pass. "
                    "Same model, same CPU: plain decoding on the left, speculative on the right.",
                    elem_id="title")
        with gr.Tab("Race", elem_id="tab-race"):
            with gr.Accordion("What am I looking at?", open=False, elem_id="explainer"):
                gr.Markdown(EXPLAINER)
            with gr.Row(equal_height=False):
                with gr.Column(scale=3):
                    prompt = gr.Textbox(value=DEFAULT_PROMPT, label="Prompt", lines=3, max_lines=8, elem_id="prompt")
                    rows, labels = example_rows()
                    gr.Examples(rows, inputs=[prompt], example_labels=labels, label="Example prompts by category",
                                examples_per_page=len(rows))
                with gr.Column(scale=2):
                    with gr.Row():
                        method = gr.Dropdown(list(SPEC_METHODS), value=pair.method, label="Method",
                                             info="vanilla: draft model · pld: prompt lookup · eagle, medusa, layerskip, draft: trained drafters",
                                             elem_id="method")
                        draft = gr.Dropdown(app_tabs.choices_with_default(pair.draft, DRAFT_CHOICES), value=pair.draft,
                                            label="Draft model (vanilla)",
                                            allow_custom_value=True, info="int8 copy, or a model sharing the vocabulary",
                                            elem_id="draft")
                        gamma = gr.Dropdown(["auto"] + [str(g) for g in range(1, GAMMA_MAX + 1)],
                                            value=str(pair.gamma), label="γ (drafted tokens per step)",
                                            info="follows the method: its fastest γ measured here",
                                            elem_id="gamma")
                        lookup = gr.Dropdown([str(n) for n in range(0, GAMMA_MAX + 1)],
                                             value=str(pair.lookup_for(pair.method)), label="Prompt lookup branch",
                                             info="eagle, medusa: also verify prompt lookup's next tokens (up to this "
                                                  "many) on the tree; 0 = off",
                                             elem_id="lookup")
                        retrieve = gr.Dropdown([str(n) for n in range(0, GAMMA_MAX + 1)],
                                               value=str(pair.retrieve_for(pair.method)), label="Datastore branch",
                                               info="eagle, medusa: also verify what most often followed in the "
                                                    "target's own answers (up to this many nodes); 0 = off",
                                               elem_id="retrieve")
                    with gr.Row():
                        temperature = gr.Slider(0.0, 2.0, value=DEFAULTS.temperature, step=0.05,
                                                label="Temperature (0 = greedy)", elem_id="temperature")
                        top_p = gr.Slider(0.05, 1.0, value=DEFAULTS.top_p, step=0.05, label="Top-p", elem_id="top-p")
                    with gr.Row():
                        max_new_tokens = gr.Slider(1, 1024, value=DEFAULTS.max_new_tokens, step=1,
                                                   label="Max new tokens", elem_id="max-new-tokens")
                        seed = gr.Number(value=DEFAULTS.seed, precision=0, label="Seed", elem_id="seed")
                    with gr.Row():
                        run = gr.Button("Run ▶", variant="primary", elem_id="run", size="lg")
                        stop = gr.Button("Stop ■", variant="stop", elem_id="stop", size="lg")
            status = gr.HTML(initial.status, elem_id="status")
            gr.HTML(f"<style>{render.CSS}{APP_CSS}</style>{render.legend_html()}")
            with gr.Row(equal_height=True):
                with gr.Column(min_width=340):
                    pane_ar = gr.HTML(initial.pane_ar, elem_id="pane-ar")
                with gr.Column(min_width=340):
                    pane_spec = gr.HTML(initial.pane_spec, elem_id="pane-spec")
            summary = gr.HTML(initial.summary, elem_id="summary")
            with gr.Row():
                plot_speed = gr.Plot(initial.speed, elem_id="plot-speed", show_label=False, min_width=380)
                plot_alpha = gr.Plot(initial.alpha, elem_id="plot-alpha", show_label=False, min_width=380)
            with gr.Row():
                plot_accept = gr.Plot(initial.accept, elem_id="plot-accept", show_label=False, min_width=380)
                with gr.Column(min_width=380):
                    plot_tree = gr.Plot(initial.tree, elem_id="plot-tree", show_label=False, min_width=380)
                    tree_step = gr.Slider(1, 2, value=1, step=1, label="Step shown in the tree (after a run)",
                                          interactive=False, elem_id="tree-step")
            spec_events = gr.State([])  # this session's last finished speculative run, for the tree slider

            run_event = run.click(
                zerogpu.gpu(run_race, run_seconds), inputs=[prompt, method, draft, gamma, temperature, top_p, max_new_tokens, seed,
                                                          lookup, retrieve],
                outputs=[status, pane_ar, pane_spec, summary, plot_alpha, plot_speed, plot_accept, plot_tree,
                         spec_events, tree_step],
                concurrency_limit=1, concurrency_id=CONCURRENCY_ID, api_name="race_stream", show_progress="hidden")
            stop.click(None, cancels=[run_event])
            method.input(method_defaults, inputs=[method], outputs=[gamma, lookup, retrieve], api_visibility="private",
                         show_progress="hidden")
            tree_step.input(show_tree, inputs=[spec_events, tree_step], outputs=[plot_tree], api_visibility="private",
                            show_progress="hidden")
            gr.api(zerogpu.gpu(race_api, run_seconds), api_name="race", concurrency_limit=1,
                   concurrency_id=CONCURRENCY_ID)
        app_tabs.check_tab(CONCURRENCY_ID, pair)
        app_tabs.step_tab(CONCURRENCY_ID, pair)
    return demo


def warm_up(on_zero_gpu: bool = False) -> None:
    """Load this machine's default pair once (and the embedded target the trained drafters are tied to), then
    run a few tokens so the first click answers at once. On ZeroGPU no GPU is attached outside the wrapped
    handlers: the models load (each worker inherits them) and nothing runs."""
    from specviz.models import loader as models
    from specviz.core import profile, retrieval

    pair = hardware.default_pair()
    if pair.note:
        print(f"specviz: {pair.note}", flush=True)
    print(f"specviz: loading {pair.target} and the {pair.draft} draft…", flush=True)
    target = models.get(pair.target)
    models.load_draft(pair.draft, target)
    if pair.retrieve_for(pair.method):
        retrieval.datastore_for(pair.target)  # the default race's datastore branch: built once, here
    if pair.target != DEFAULT_TARGET:
        models.get(DEFAULT_TARGET)
    if not on_zero_gpu:
        race_result(DEFAULT_PROMPT, make_config(max_new_tokens=16), pair.draft, pair.target)  # kernels picked
        prof = profile.profile_of(target)  # the verify profile the summary's prediction reads
        print("specviz: verify cost T(k)/T(1): " + ", ".join(f"k={k} {prof.ratio(k):.2f}" for k in (2, 5, 8, 17)), flush=True)
    print(f"specviz: models ready on {hardware.describe(target.device, target.dtype)} ({target.guarantee} verification)",
          flush=True)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("specviz").setLevel(logging.INFO)  # our errors, with tracebacks, go to the server log
    on_zero_gpu = zerogpu.activate()  # imports spaces before any model touches CUDA
    warm_up(on_zero_gpu)
    demo = build_ui()
    demo.queue(default_concurrency_limit=1).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        show_error=False,  # handlers turn every error into a one-line gr.Error; nothing else reaches a user
    )


if __name__ == "__main__":
    main()
