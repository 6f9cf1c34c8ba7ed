"""The "Check a drafter" tab: `specviz check`, interactive. Is a drafter compatible with the target, is decoding with
it exact, does it pay on this machine? The work is done by specviz.check.run / report; this module builds the tab's
components and wiring inside the caller's gr.Blocks and turns the report into cards, plots and files. The drafter
list is the registry's checkable methods (specviz/methods.py), and the draft field follows the method: a draft model
for one that drafts with one, the shipped drafter (or a folder) for a trained kind, nothing for prompt lookup. Its
messages are the app's own: a browser user has no command-line flags to omit.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import gradio as gr

from specviz import hardware, methods, paths, zerogpu
from specviz.check import misses_report
from specviz.check import report as check_report
from specviz.check.options import gamma_words
from specviz.check.run import CHECKED_TRAINED
from specviz.config import DEFAULT_DRAFT, DEFAULT_TARGET
from specviz.errors import ConfigError
from specviz.methods import CHECK_METHODS
from specviz.policy import Policy
from specviz.ui import plots, roofline
from specviz.ui.common import (
    DEVICE_QUEUE,
    DRAFT_CHOICES,
    GAMMAS,
    cards_html,
    choices_with_default,
    method_info,
    num,
    tab_intro,
    verdict_html,
)
from specviz.ui.logic import user_message

SHIPPED = "shipped"  # the draft field's value for the drafter specviz ships for the target (a trained kind)
TARGET_CHOICES = [DEFAULT_TARGET, "HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct"]
CHECK_SAMPLES_MAX = 2000   # the tab's sliders: also what its GPU duration is sized for
CHECK_TOKENS_MAX = 256


def check_figures_html(data: dict) -> str:
    """The check's key figures as cards, from CheckReport.to_dict() (no new computation)."""
    p, g, fid = data["payoff"], data["greedy"], data["fidelity"]
    same = sum(r["identical"] for r in g["prompts"])
    fit = fid["fit"]
    cards = [
        ("greedy identity", f"{same}/{len(g['prompts'])}", "prompts where speculative = plain AR, token for token"
         + (f"; {g['near_ties']} near-tie flips" if g["near_ties"] else "")),
        ("max |Δlogit|", f"{g['verify_logit_max_abs_diff']:.3g}",
         f"verification vs one-token decoding over {g['judged_positions']} positions "
         f"({g['guarantee']}: 0 = bit for bit)"),
        ("exact sampling", "pass" if fid["passed"] else "FAIL",
         f"{fit['n']} seeds at T={fid['temperature']:g}: p = {fit['p_value']:.3g}, TV {fit['tv']:.3f} "
         f"(bound {fit['tv_bound']:.3f})"),
        ("acceptance rate α", num(p["alpha"]), "accepted / judged drafted tokens (greedy runs)"),
        ("τ", num(p["tau"]), "tokens per target forward, the bonus token included"),
        ("cost ratio c", num(p["cost_ratio"], ".3f"), p["cost_ratio_basis"]),
        ("speedup (measured)", num(p["speedup"]) + "×", "median over prompts, on this machine"),
        ("predicted", num(p["predicted_speedup"]) + "×",
         f"Leviathan et al. at the measured α, c and {gamma_words(data['options']['gamma'], p['gamma_mean'])}"),
        ("best γ", f"{p['best_gamma']}" if p["best_gamma"] else "–",
         f"Leviathan {num(p['best_gamma_speedup'])}×; with this device's verify cost: γ={p['best_gamma_hw']} "
         f"{num(p['best_gamma_hw_speedup'])}×"),
    ]
    split = p.get("first_draft")
    if split:  # does the drafter copy? (lookup.RepeatSplit)
        cards.append(("copies? repeats / new", f"{num(split['repeat_rate'], '.0%')} / {num(split['new_rate'], '.0%')}",
                      f"first draft accepted where the answer repeats its context ({split['repeat_steps']} of "
                      f"{split['repeat_steps'] + split['new_steps']} steps) / elsewhere; "
                      "prompt lookup drafts the former"))
    vocab = p.get("draft_vocab")
    if vocab:  # a compressed draft vocabulary caps what can be drafted
        cards.append(("draft vocabulary", f"{vocab['coverage']:.1%}",
                      f"of AR's tokens are among its {vocab['size']}; it can never draft the rest"))
    why = data.get("misses") or {}  # why it misses (check/misses.py): near ties, the contexts and tokens missed most
    if not why.get("steps"):
        return cards_html(cards)
    tables = misses_report.tables(why, check_report.table).replace("<table>", '<table class="sv-table">')
    return cards_html(cards + misses_report.cards(why)) + f'<div id="check-misses">{tables}</div>'


def draft_field(method: str, pair: hardware.Pair = hardware.EMBEDDED_PAIR, public: bool = False) -> dict:
    """The draft field for `method`: visible or not, its label, choices, value and info (a gr.update's keywords)."""
    s = methods.spec(method)
    if s.uses_draft_model:
        return dict(visible=True, label="Draft model", choices=choices_with_default(pair.draft, DRAFT_CHOICES),
                    value=pair.draft, allow_custom_value=not public,
                    info="an int8 copy of the target, or a model sharing its vocabulary")
    if s.trained:
        return dict(visible=True, label=f"{s.label} drafter", choices=[SHIPPED], value=SHIPPED,
                    allow_custom_value=not public,
                    info=f"“{SHIPPED}”: the {s.label} drafter specviz ships for the target" + (
                        "" if public else f"; or the folder of one trained here (python -m specviz train {s.name})"))
    return dict(visible=False, value=None, choices=[], label="Draft model",
                info=f"{s.label} drafts without a model of its own")


def _hub_id(value: str) -> bool:
    return value.count("/") == 1 and not value.startswith((".", "/", "~"))


def trained_draft(method: str, target_name: str, draft) -> "str | None":
    """The trained drafter's folder for the app (None: the shipped one), checked with the app's wording (the CLI's
    names its flags)."""
    value = str(draft or "").strip()
    if value in ("", SHIPPED, DEFAULT_DRAFT, hardware.default_pair().draft):
        if not paths.shipped_drafter(target_name, method).is_dir():
            raise ConfigError(f"no {method} drafter is shipped for target {target_name!r}: train one on this machine "
                              f"(python -m specviz train {method}) and give its folder in the drafter field, or pick "
                              "another drafter")
        return None
    if not Path(value).is_dir() and not _hub_id(value):
        raise ConfigError(f"drafter folder {value!r} does not exist on this machine: give a folder written by "
                          f"python -m specviz train {method}, or pick “{SHIPPED}” for the drafter specviz ships")
    return value


def check_options(gamma, temperature, samples, max_new_tokens):
    """Form values -> CheckOptions, lighter than the CLI's in the parts a user does not choose here
    (a CPU Space should answer in about a minute)."""
    from specviz.check.options import CheckOptions

    return CheckOptions(gamma=gamma, temperature=temperature, samples=samples, max_new_tokens=max_new_tokens,
                        synthetic_samples=2000, profile_reps=3)


def run_check_ui(target: str = DEFAULT_TARGET, method: str = "vanilla", draft: str = DEFAULT_DRAFT, gamma: str = "4",
                 temperature: float = 1.0, samples: int = 200, prompts: int = 3, max_new_tokens: int = 32,
                 progress=gr.Progress()):
    """Run `specviz check` on a target and drafter; returns the verdict, the key figures, the report's plots
    and the JSON and HTML reports as files. A bad value or model is a one-line message in the verdict box."""
    from specviz.check import report
    from specviz.check import run as check
    from specviz.config import DecodeConfig, number
    from specviz.models import loader as models

    empty = (None,) * 4 + (None, None, None, None)
    try:
        policy = Policy.from_env()
        target = str(target or DEFAULT_TARGET).strip()
        draft = str(draft or DEFAULT_DRAFT).strip()
        if method not in CHECK_METHODS:
            raise ConfigError(f"method={method!r} cannot be checked: use {', '.join(CHECK_METHODS)}")
        options = check_options(gamma, temperature, samples, max_new_tokens)
        policy.check_config(DecodeConfig(gamma=options.gamma, max_new_tokens=options.max_new_tokens))
        n = number("prompts", prompts, int)
        if not 1 <= n <= len(check.DEFAULT_PROMPTS):
            raise ConfigError(f"prompts={n} is out of range: use 1..{len(check.DEFAULT_PROMPTS)}")
        policy.check_model(target, "target")
        if methods.spec(method).uses_draft_model:
            policy.check_model(draft, "draft")
        elif method in CHECKED_TRAINED:  # the shipped drafter; a local folder or Hub id only in private mode
            draft = trained_draft(method, target, None if policy.public else draft)
        progress(0, desc="loading the models")
        target_model = models.get(target)
        drafter, draft_model = check.drafter_for(method, target_model, draft)

        def tick(stage: str, done: int, total: int) -> None:
            progress((done, max(total, 1)), desc=stage)

        result = check.run_check(target_model, drafter, draft=draft_model, prompts=check.DEFAULT_PROMPTS[:n],
                                 options=options, progress=tick, method=method)
        data = result.to_dict()
        folder = Path(tempfile.mkdtemp(prefix="specviz-check-"))
        stem = f"check-{method}-{time.strftime('%Y%m%d-%H%M%S')}"
        json_path, html_path = folder / f"{stem}.json", folder / f"{stem}.html"
        json_path.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
        html_path.write_text(report.to_html(data), encoding="utf-8")
        figs = report.figures(data)
        for fig in figs.values():
            if fig is not None:
                fig.update_layout(template="plotly_white", height=360, font=plots.FONT,
                                  margin=dict(l=60, r=20, t=60, b=50),
                                  legend=dict(orientation="h", y=-0.25, font=dict(size=14)))
        return (verdict_html(result.verdict, "ok" if result.correct else "bad"), check_figures_html(data),
                figs["fidelity"], figs["alpha_position"], figs["gamma"], figs["batch"], figs["accepted_length"],
                figs["gaps"], str(json_path), str(html_path))
    except Exception as exc:
        message = user_message(exc, Policy.from_env().public)
        gr.Warning(message)
        return (verdict_html(f"⚠ {message}", "bad"), "", *empty)


def check_gpu_seconds(target: str = DEFAULT_TARGET, method: str = "vanilla", draft: str = DEFAULT_DRAFT,
                      gamma: str = "4", temperature: float = 1.0, samples: int = 200, prompts: int = 3,
                      max_new_tokens: int = 32, progress=None) -> int:
    """ZeroGPU's duration for run_check_ui, called with its arguments: sized for these settings (values
    outside the tab's sliders count at the slider's end)."""
    from specviz.check.run import DEFAULT_PROMPTS

    def count(value, largest: int) -> int:
        try:
            return min(max(int(float(value)), 1), largest)
        except (TypeError, ValueError, OverflowError):
            return largest

    return zerogpu.check_duration(count(prompts, len(DEFAULT_PROMPTS)), count(samples, CHECK_SAMPLES_MAX),
                                  count(max_new_tokens, CHECK_TOKENS_MAX), Policy.from_env())


def check_tab(concurrency_id: str = DEVICE_QUEUE, pair: hardware.Pair = hardware.EMBEDDED_PAIR) -> None:
    """Build the "Check a drafter" tab's components and wiring inside the caller's gr.Blocks (defaults: `pair`)."""
    from specviz.check.run import DEFAULT_PROMPTS

    with gr.Tab("Check a drafter", elem_id="tab-check"):
        gr.HTML(tab_intro("Is a drafter <b>compatible</b> with the target (same vocabulary), is decoding with it "
                          "<b>exact</b> (greedy output identical to plain decoding; sampled first tokens follow the "
                          "target's distribution) and does it <b>pay</b> on this machine (α, τ, cost ratio c, "
                          "speedup against the prediction)? The same check as <code>python -m specviz check</code>."))
        with gr.Row():
            target = gr.Dropdown(choices_with_default(pair.target, TARGET_CHOICES), value=pair.target,
                                 label="Target model", allow_custom_value=True, elem_id="check-target")
            method = gr.Dropdown(list(CHECK_METHODS), value="vanilla", label="Drafter",
                                 info=method_info(CHECK_METHODS), elem_id="check-method")
            draft = gr.Dropdown(**draft_field("vanilla", pair, Policy.from_env().public), elem_id="check-draft")
            gamma = gr.Dropdown(GAMMAS, value="4", label="γ (drafted tokens per step)", elem_id="check-gamma")
        with gr.Row():
            temperature = gr.Slider(0.05, 2.0, value=1.0, step=0.05, label="Temperature for the sampling test",
                                    elem_id="check-temperature")
            samples = gr.Slider(20, CHECK_SAMPLES_MAX, value=200, step=10,
                                label="Samples (seeds) for the sampling test", elem_id="check-samples")
            prompts = gr.Slider(1, len(DEFAULT_PROMPTS), value=3, step=1, label="Prompts (built-in, by category)",
                                elem_id="check-prompts")
            max_new_tokens = gr.Slider(4, CHECK_TOKENS_MAX, value=32, step=1, label="New tokens per prompt",
                                       elem_id="check-max-new-tokens")
        run = gr.Button("Run the check ▶", variant="primary", size="lg", elem_id="check-run")
        verdict = gr.HTML(verdict_html("Press “Run the check”: about a minute on a CPU with the defaults.", "idle"),
                          elem_id="check-verdict")
        figures = gr.HTML("", elem_id="check-figures")
        with gr.Row():
            plot_fidelity = gr.Plot(elem_id="check-plot-fidelity", show_label=False, min_width=380)
            plot_alpha = gr.Plot(elem_id="check-plot-alpha", show_label=False, min_width=380)
        with gr.Row():
            plot_gamma = gr.Plot(elem_id="check-plot-gamma", show_label=False, min_width=380)
            plot_batch = gr.Plot(elem_id="check-plot-batch", show_label=False, min_width=380)
        with gr.Row():  # why it misses: accepted lengths, the target's top-2 gap at each refusal
            plot_accepted = gr.Plot(elem_id="check-plot-accepted", show_label=False, min_width=380)
            plot_gaps = gr.Plot(elem_id="check-plot-gaps", show_label=False, min_width=380)
        with gr.Row():
            json_file = gr.File(label="JSON report", elem_id="check-json", interactive=False)
            html_file = gr.File(label="HTML report (self-contained, opens offline)", elem_id="check-html",
                                interactive=False)
        method.change(lambda m: gr.update(**draft_field(m, pair, Policy.from_env().public)), inputs=[method],
                      outputs=[draft], api_visibility="private", queue=False, show_progress="hidden")
        run.click(zerogpu.gpu(run_check_ui, check_gpu_seconds),
                  inputs=[target, method, draft, gamma, temperature, samples, prompts, max_new_tokens],
                  outputs=[verdict, figures, plot_fidelity, plot_alpha, plot_gamma, plot_batch, plot_accepted,
                           plot_gaps, json_file, html_file],
                  api_name="check", concurrency_limit=1, concurrency_id=concurrency_id, show_progress="full",
                  show_progress_on=[verdict])  # one progress bar, where the verdict will be
        roofline.roofline_panel(target, concurrency_id)
