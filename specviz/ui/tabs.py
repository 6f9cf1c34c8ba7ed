"""The app's second and third tabs: "Check a drafter" (specviz check, interactive) and "Step through"
(teaching mode, one draft/verify cycle per click). Each function builds its components and wiring inside
the caller's gr.Blocks; the work is done by specviz.check.run / report and specviz.ui.teach / plots.
"""
from __future__ import annotations

import html
import json
import tempfile
import time
from pathlib import Path
from typing import Optional

import gradio as gr

from specviz import hardware, methods, zerogpu
from specviz.check.run import CHECKED_TRAINED
from specviz.config import DEFAULT_DRAFT, DEFAULT_TARGET, GAMMA_MAX
from specviz.errors import ConfigError
from specviz.methods import CHAIN_METHODS, CHECK_METHODS
from specviz.policy import Policy
from specviz.ui import controls, plots, render, roofline
from specviz.ui.logic import make_config, status_html, user_message

CONCURRENCY_ID = "cpu"  # the app's one device queue: checks and steps never overlap a race's timing
TARGET_CHOICES = [DEFAULT_TARGET, "HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct"]
DRAFT_CHOICES = [DEFAULT_DRAFT, DEFAULT_TARGET]
GAMMAS = ["auto"] + [str(g) for g in range(1, GAMMA_MAX + 1)]
CHECK_SAMPLES_MAX = 2000   # the check tab's sliders: also what its GPU duration is sized for
CHECK_TOKENS_MAX = 256


def choices_with_default(first: str, rest: list[str]) -> list[str]:
    """A dropdown's choices with this machine's default first."""
    return [first] + [c for c in rest if c != first]

TABS_CSS = """
.sv-intro { font-size: 16px; color: #333; margin: 0; }
.sv-verdict { font-size: 21px; font-weight: 700; padding: 12px 16px; border-radius: 10px; }
.sv-verdict-ok { background: #e0f3ec; color: #00573f; border: 2px solid #009E73; }
.sv-verdict-bad { background: #fdeee6; color: #8a3300; border: 2px solid #D55E00; }
.sv-verdict-idle { background: #f2f6fa; color: #123; border: 1px solid #d0d0d0; font-weight: 500; font-size: 17px; }
.sv-table { border-collapse: collapse; font-size: 17px; margin: 4px 0; font-variant-numeric: tabular-nums; }
.sv-table th, .sv-table td { border-bottom: 1px solid #e2e2e2; padding: 5px 12px; text-align: left; }
.sv-table th { color: #444; font-weight: 600; background: #fafafa; }
.sv-table td.num { text-align: right; font-family: ui-monospace, 'DejaVu Sans Mono', monospace; }
.sv-table .sv-tok { font-family: ui-monospace, 'DejaVu Sans Mono', monospace; font-size: 17px; }
.sv-rule { font-size: 16px; color: #333; margin: 6px 0 2px 0; }
.sv-steptext { font-family: ui-monospace, 'DejaVu Sans Mono', monospace; font-size: 18px; line-height: 1.75;
  white-space: pre-wrap; word-break: break-word; border: 1px solid #d0d0d0; border-radius: 10px; padding: 10px 14px;
  background: #fff; min-height: 60px; max-height: 220px; overflow-y: auto; }
"""


# ── Check a drafter ─────────────────────────────────────────────────────────────────────────────────

def _card(key: str, value: str, note: str = "") -> str:
    return (f'<div class="sv-card" data-metric="{html.escape(key)}"><div class="sv-card-k">{html.escape(key)}</div>'
            f'<div class="sv-card-v">{html.escape(value)}</div><div class="sv-card-n">{html.escape(note)}</div></div>')


def check_figures_html(data: dict) -> str:
    """The check's key figures as cards, from CheckReport.to_dict() (no new computation)."""
    f = lambda v, spec=".2f": "–" if v is None else format(v, spec)  # noqa: E731
    p, g, fid = data["payoff"], data["greedy"], data["fidelity"]
    same = sum(r["identical"] for r in g["prompts"])
    fit = fid["fit"]
    gamma = round(p["gamma_mean"]) if p["gamma_mean"] else None
    cards = [
        ("greedy identity", f"{same}/{len(g['prompts'])}", "prompts where speculative = plain AR, token for token"
         + (f"; {g['near_ties']} near-tie flips" if g["near_ties"] else "")),
        ("max |Δlogit|", f"{g['verify_logit_max_abs_diff']:.3g}",
         f"verification vs one-token decoding over {g['judged_positions']} positions "
         f"({g['guarantee']}: 0 = bit for bit)"),
        ("exact sampling", "pass" if fid["passed"] else "FAIL",
         f"{fit['n']} seeds at T={fid['temperature']:g}: p = {fit['p_value']:.3g}, TV {fit['tv']:.3f} "
         f"(bound {fit['tv_bound']:.3f})"),
        ("acceptance rate α", f(p["alpha"]), "accepted / judged drafted tokens (greedy runs)"),
        ("τ", f(p["tau"]), "tokens per target forward, the bonus token included"),
        ("cost ratio c", f(p["cost_ratio"], ".3f"), p["cost_ratio_basis"]),
        ("speedup (measured)", f(p["speedup"]) + "×", "median over prompts, on this machine"),
        (f"predicted (γ={gamma})", f(p["predicted_speedup"]) + "×", "Leviathan et al. at the measured α, c"),
        ("best γ", f"{p['best_gamma']}" if p["best_gamma"] else "–",
         f"Leviathan {f(p['best_gamma_speedup'])}×; with this device's verify cost: γ={p['best_gamma_hw']} "
         f"{f(p['best_gamma_hw_speedup'])}×"),
    ]
    split = p.get("first_draft")
    if split:  # does the drafter copy? (lookup.RepeatSplit)
        pct = lambda v: "–" if v is None else f"{v:.0%}"  # noqa: E731
        cards.append(("copies? repeats / new", f"{pct(split['repeat_rate'])} / {pct(split['new_rate'])}",
                      f"first draft accepted where the answer repeats its context ({split['repeat_steps']} of "
                      f"{split['repeat_steps'] + split['new_steps']} steps) / elsewhere; "
                      "prompt lookup drafts the former"))
    vocab = p.get("draft_vocab")
    if vocab:  # a compressed draft vocabulary caps what can be drafted
        cards.append(("draft vocabulary", f"{vocab['coverage']:.1%}",
                      f"of AR's tokens are among its {vocab['size']}; it can never draft the rest"))
    return '<div class="sv-summary"><div class="sv-cards">' + "".join(_card(*c) for c in cards) + "</div></div>"


def verdict_html(message: str, kind: str) -> str:
    return f'<div class="sv-verdict sv-verdict-{kind}">{html.escape(message)}</div>'


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

    empty = (None,) * 4 + (None, None)
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
            draft = None if policy.public or draft in (DEFAULT_DRAFT, hardware.default_pair().draft) else draft
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
                figs["fidelity"], figs["alpha_position"], figs["gamma"], figs["batch"], str(json_path), str(html_path))
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


def check_tab(concurrency_id: str = CONCURRENCY_ID, pair: hardware.Pair = hardware.EMBEDDED_PAIR) -> None:
    """Build the "Check a drafter" tab's components and wiring inside the caller's gr.Blocks (defaults: `pair`)."""
    from specviz.check.run import DEFAULT_PROMPTS

    with gr.Tab("Check a drafter", elem_id="tab-check"):
        gr.HTML(f"<style>{TABS_CSS}</style><p class='sv-intro'>Is a drafter <b>compatible</b> with the target (same "
                "vocabulary), is decoding with it <b>exact</b> (greedy output identical to plain decoding; "
                "sampled first "
                "tokens follow the target's distribution) and does it <b>pay</b> on this machine (α, τ, cost ratio c, "
                "speedup against the prediction)? The same check as <code>python -m specviz check</code>.</p>")
        with gr.Row():
            target = gr.Dropdown(choices_with_default(pair.target, TARGET_CHOICES), value=pair.target,
                                 label="Target model", allow_custom_value=True, elem_id="check-target")
            method = gr.Dropdown(list(CHECK_METHODS), value="vanilla", label="Drafter",
                                 info="vanilla: a draft model · pld: prompt lookup · eagle, draft: trained drafters",
                                 elem_id="check-method")
            draft = gr.Dropdown(choices_with_default(pair.draft, DRAFT_CHOICES), value=pair.draft,
                                label="Draft model (vanilla) or drafter folder", allow_custom_value=True,
                                info="int8 copy, or a model sharing the vocabulary; eagle/draft: the shipped one",
                                elem_id="check-draft")
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
        with gr.Row():
            json_file = gr.File(label="JSON report", elem_id="check-json", interactive=False)
            html_file = gr.File(label="HTML report (self-contained, opens offline)", elem_id="check-html",
                                interactive=False)
        run.click(zerogpu.gpu(run_check_ui, check_gpu_seconds),
                  inputs=[target, method, draft, gamma, temperature, samples, prompts, max_new_tokens],
                  outputs=[verdict, figures, plot_fidelity, plot_alpha, plot_gamma, plot_batch, json_file, html_file],
                  api_name="check", concurrency_limit=1, concurrency_id=concurrency_id, show_progress="full")
        roofline.roofline_panel(target, concurrency_id)


# ── Step through ────────────────────────────────────────────────────────────────────────────────────

STEP_PROMPT = "Write one sentence about the moon."
STEP_DEFAULTS = dict(method="vanilla", draft=DEFAULT_DRAFT, gamma="4", temperature=1.0, seed=0, max_new_tokens=32)
RULE_SAMPLING = ("Each drafted token is kept when the uniform draw <b>u &lt; min(1, p/q)</b>. At the first refusal "
                 "the target draws its own token from the residual <b>norm(max(0, p − q))</b> and the later drafts are "
                 "discarded unjudged; if every draft is kept the target adds a bonus token drawn from p.")
RULE_GREEDY = ("Greedy (temperature 0): a drafted token is kept when it equals the target's argmax. At the first "
               "mismatch the target's argmax replaces it; if every draft is kept the target adds its argmax "
               "as a bonus.")
RULE_TREE_SAMPLING = ("A tree: the children of a node are judged one after another against the target's residual r, "
                      "which starts as p. A drawn candidate is kept when <b>u &lt; min(1, r/q)</b>; a top-ranked or "
                      "grafted one is a certain guess (q = 1), kept when <b>u &lt; r(x)</b>. A refusal turns r into "
                      "<b>norm(max(0, r − q))</b>: the refused token's share is taken out and the rest renormalised, "
                      "and the next sibling is judged against that. A kept child becomes the node, with r = the "
                      "target's p there; when every child is refused the target draws its own token from the last "
                      "r. Bars: q, r at the candidate's turn, and r after its refusal.")
RULE_TREE_GREEDY = ("A tree, greedy: the path follows the children equal to the target's argmax; the children of the "
                    "path's end are refused and the target's argmax is its own token.")


def _num(v: Optional[float], spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


def _tok(text: str, verdict: str) -> str:
    shown = html.escape(text).replace("\n", "↵") if text else "∅"
    return f'<span class="sv-tok sv-{verdict}" data-verdict="{verdict}">{shown}</span>'


def cycle_table_html(view: Optional[dict]) -> str:
    """The current cycle as a table: one row per drafted position and one for the target's own token."""
    if not view:
        return ""
    greedy = view["greedy"]
    if view.get("tree"):
        return tree_table_html(view)
    if greedy:
        head = ["#", "drafted token", "q_draft", "p_target", "target's argmax", "verdict"]
    else:
        head = ["#", "drafted token", "q_draft", "p_target", "min(1, p/q)", "u", "verdict"]
    rows = []
    for pos in view["positions"]:
        own = pos["kind"] != "draft"
        label = "target" if own else str(pos["position"] + 1)
        cells = [label, _tok(pos["text"], pos["verdict"]), _num(pos["q_draft"], ".3f"), _num(pos["p_target"], ".3f")]
        if greedy:
            cells.append(html.escape(pos["target_argmax"] or "–") if pos["target_argmax"] is not None else "–")
        else:
            cells += [_num(pos["accept_prob"], ".3f"), _num(pos["u"], ".3f")]
        cells.append(html.escape(plots.VERDICT_MARK[pos["verdict"]]))
        numeric = {2, 3} if greedy else {2, 3, 4, 5}
        rows.append(f'<tr data-verdict="{pos["verdict"]}">' + "".join(
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    rule = RULE_GREEDY if greedy else RULE_SAMPLING
    return (f'<div class="sv-rule">{rule}</div><table class="sv-table" id="step-table-rows"><tr>'
            + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


def _residual_top(bars: list[dict], n: int = 3) -> str:
    """The residual after a refusal, as its n most likely tokens: ‘the’ .41 · ‘a’ .22 · ..."""
    ranked = sorted((b for b in bars if b["residual"]), key=lambda b: -b["residual"])[:n]
    return " · ".join(f"{_tok(b['text'], 'resampled')} {b['residual']:.2f}" for b in ranked) or "–"


def tree_table_html(view: dict) -> str:
    """A tree step as a table: one row per candidate in the order the target judged it (depth, which sibling, where
    it came from, q, r at its turn, the test, the verdict and, sampling, the residual after a refusal), then the
    target's own token."""
    greedy = view["greedy"]
    head = ["depth", "candidate", "from", "q", "p_target" if greedy else "r(x) at its turn",
            "target's argmax" if greedy else "min(1, r/q)", "u", "verdict", "residual r after it (top 3)"]
    if greedy:
        head = head[:6] + ["verdict"]
    rows = []
    for pos in view["positions"]:
        own = pos["kind"] != "draft"
        depth = "target" if own else f"{pos['position'] + 1}" + (f" · sibling {pos['sibling'] + 1}"
                                                                  if pos["sibling"] else "")
        cells = [depth, _tok(pos["text"], pos["verdict"]), html.escape(pos["source"] or ("residual" if pos["verdict"]
                                                                                          == "resampled" else "p")),
                 _num(pos["q_draft"], ".3f"), _num(pos["p_target"] if greedy else pos["r"], ".3f")]
        if greedy:
            cells.append(html.escape(pos["target_argmax"] or "–"))
        else:
            cells += [_num(pos["accept_prob"], ".3f"), _num(pos["u"], ".3f")]
        cells.append(html.escape(plots.VERDICT_MARK[pos["verdict"]]))
        if not greedy:
            cells.append(_residual_top(pos["bars"]) if pos["verdict"] == "rejected" else "")
        numeric = {3, 4} if greedy else {3, 4, 5, 6}
        rows.append(f'<tr data-verdict="{pos["verdict"]}" data-sibling="{pos["sibling"]}">' + "".join(
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    rule = RULE_TREE_GREEDY if greedy else RULE_TREE_SAMPLING
    return (f'<div class="sv-rule">{rule}</div><table class="sv-table" id="step-table-rows"><tr>'
            + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


def step_status(session) -> str:
    cfg = session.cfg
    m = session.measured()
    entry = methods.spec(cfg.method)
    who = (f"{cfg.method}, draft {session.draft}" if entry.uses_draft_model else
           f"{cfg.method} (trained drafter, drafting a {'tree' if entry.tree else 'chain'})" if entry.trained
           else f"{cfg.method} ({entry.label})")
    where = (f"finished ({session.run.finish_reason}) after {m['steps']} steps" if session.finished else
             f"{m['steps']} steps so far" if m["steps"] else "ready: press Next step")
    alpha = (f" · α so far {_num(m['alpha'])} ({m['accepted']}/{m['drafted']}) · τ {_num(m['tau'])}"
             if m["steps"] else "")
    text = (f"Seed {cfg.seed} · {who} · γ = {cfg.gamma} · temperature {cfg.temperature:g} · "
            f"{m['tokens']}/{cfg.max_new_tokens} tokens · {where}{alpha}")
    return status_html(text, "ok" if session.finished else "info")


def step_outputs(session, alpha: float, c: float) -> tuple:
    """(state, status, text, bars, table, theory, data) for one session."""
    view = session.views[-1].to_dict() if session.views else None
    text = render.to_html(render.spans(session.events)) if session.events else '<span class="sv-placeholder">…</span>'
    measured = session.measured()
    data = {"step": len(session.views), "finished": session.finished, "finish_reason": session.run.finish_reason,
            "seed": session.cfg.seed, "config": session.cfg.to_dict(), "measured": measured,
            "text": session.engine.target.decode(session.token_ids), "cycle": view}
    return (session, step_status(session), f'<div class="sv-steptext">{text}</div>', plots.cycle_figure(view),
            cycle_table_html(view), plots.theory_figure(float(alpha), float(c), measured), data)


def _error_outputs(exc: BaseException, session=None) -> tuple:
    message = user_message(exc, Policy.from_env().public)
    gr.Warning(message)
    return (session, status_html(f"⚠ {message}", "error"), *([gr.skip()] * 5))


def _start(prompt, method, draft, gamma, temperature, seed, max_new_tokens):
    from specviz.ui import teach

    if seed is None or seed == "":
        seed = STEP_DEFAULTS["seed"]
    cfg = make_config(method, gamma, temperature, 1.0, max_new_tokens, seed)
    return teach.start(prompt, cfg, *hardware.default_pair().run_args(method, draft))


def step_reset(prompt: str = STEP_PROMPT, method: str = "vanilla", draft: str = "", gamma: str = "4",
               temperature: float = 1.0, seed: int = 0, max_new_tokens: int = 32, alpha: float = 0.7, c: float = 0.1,
               session=None):
    """Start a fresh run with these settings (nothing decoded yet; an empty draft: this machine's default)."""
    try:
        return step_outputs(_start(prompt, method, draft, gamma, temperature, seed, max_new_tokens), alpha, c)
    except Exception as exc:
        return _error_outputs(exc, None)


def step_next(prompt: str = STEP_PROMPT, method: str = "vanilla", draft: str = "", gamma: str = "4",
              temperature: float = 1.0, seed: int = 0, max_new_tokens: int = 32, alpha: float = 0.7, c: float = 0.1,
              session=None):
    """One draft/verify cycle (starting a run with these settings if none is open)."""
    from specviz.ui import teach

    try:
        session = teach.resume(session) if session else _start(prompt, method, draft, gamma, temperature, seed,
                                                               max_new_tokens)
        teach.advance(session)
        return step_outputs(session, alpha, c)
    except Exception as exc:
        return _error_outputs(exc, session)


def step_run(prompt: str = STEP_PROMPT, method: str = "vanilla", draft: str = "", gamma: str = "4",
             temperature: float = 1.0, seed: int = 0, max_new_tokens: int = 32, alpha: float = 0.7, c: float = 0.1,
             session=None):
    """Run the remaining cycles, showing each (at most ~4 updates a second, and always the last)."""
    from specviz.ui import teach

    try:
        session = teach.resume(session) if session else _start(prompt, method, draft, gamma, temperature, seed,
                                                               max_new_tokens)
        last = 0.0
        while teach.advance(session) is not None:
            if time.perf_counter() - last >= 0.25 and not session.finished:
                last = time.perf_counter()
                yield step_outputs(session, alpha, c)
        yield step_outputs(session, alpha, c)
    except Exception as exc:
        yield _error_outputs(exc, session)


def step_theory(session, alpha: float, c: float):
    return plots.theory_figure(float(alpha), float(c), session.measured() if session else None)


def step_method_changed(method):
    """The step-through form follows the drafter (controls.step_fields): the draft model only for a draft-model method,
    with a line saying why it is hidden otherwise."""
    fields = controls.step_fields(str(method))
    return (gr.Dropdown(visible=fields.draft), gr.Dropdown(visible=fields.gamma),
            fields.note_html("step-method-note"))


def step_tab(concurrency_id: str = CONCURRENCY_ID, pair: hardware.Pair = hardware.EMBEDDED_PAIR) -> None:
    """Build the "Step through" tab (teaching mode) inside the caller's gr.Blocks (default draft: `pair`'s)."""
    with gr.Tab("Step through", elem_id="tab-step"):
        gr.HTML(f"<style>{TABS_CSS}</style><p class='sv-intro'><b>Teaching mode.</b> One draft/verify cycle per "
                "click: what the drafter proposed (q), what the target thinks (p), the acceptance test and "
                "its verdict. "
                "The same seed gives the same run, token for token, as the Race tab's speculative lane with these "
                "settings. Medusa and EAGLE verify their tree: each candidate the target judged is a row, in "
                "order, and when sampling a refused sibling shows the residual the next one is judged against.</p>")
        with gr.Row(equal_height=False):
            prompt = gr.Textbox(value=STEP_PROMPT, label="Prompt", lines=2, max_lines=4, scale=3, elem_id="step-prompt")
            method = gr.Dropdown(list(CHAIN_METHODS), value="vanilla", label="Drafter", min_width=120,
                                 elem_id="step-method")
            draft = gr.Dropdown(choices_with_default(pair.draft, DRAFT_CHOICES), value=pair.draft, label="Draft model",
                                allow_custom_value=True, min_width=140, elem_id="step-draft")
            gamma = gr.Dropdown(GAMMAS, value="4", label="γ", min_width=90, elem_id="step-gamma")
            temperature = gr.Slider(0.0, 2.0, value=1.0, step=0.05, label="Temperature (0 = greedy)", min_width=180,
                                    elem_id="step-temperature")
            seed = gr.Number(value=0, precision=0, label="Seed", min_width=90, elem_id="step-seed")
            max_new_tokens = gr.Number(value=32, precision=0, label="Max tokens", min_width=90,
                                       elem_id="step-max-new-tokens")
        note = gr.HTML(controls.step_fields(STEP_DEFAULTS["method"]).note_html("step-method-note"))
        with gr.Row():
            reset = gr.Button("Reset ↺", size="lg", elem_id="step-reset")
            nxt = gr.Button("Next step ▶", variant="primary", size="lg", elem_id="step-next")
            run = gr.Button("Run to end ▶▶", size="lg", elem_id="step-run")
        status = gr.HTML(status_html("Press Reset (or Next step) to start; the seed makes the run reproducible."),
                         elem_id="step-status")
        text = gr.HTML('<div class="sv-steptext"><span class="sv-placeholder">…</span></div>', elem_id="step-text")
        bars = gr.Plot(plots.cycle_figure(None), elem_id="step-bars", show_label=False)
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                table = gr.HTML("", elem_id="step-table")
            with gr.Column(scale=2, min_width=360):
                with gr.Row():
                    alpha = gr.Slider(0.0, 0.99, value=0.7, step=0.01, label="α (acceptance rate)",
                                      elem_id="step-alpha")
                    c = gr.Slider(0.0, 1.0, value=0.1, step=0.01, label="c (draft cost / target cost)",
                                  elem_id="step-c")
                theory = gr.Plot(plots.theory_figure(0.7, 0.1), elem_id="step-theory", show_label=False)
                gr.Markdown("Curves: the sliders' α and c. ◆: the steps so far — measured τ at their mean γ, and "
                            "the speedup predicted from their α and c (c here is a draft forward over "
                            "a verify forward, "
                            "as this tab runs no plain lane). The Race tab measures the real speedup.")
        with gr.Accordion("This cycle as data (JSON)", open=False):
            data = gr.JSON(elem_id="step-data")
        session = gr.State(None, time_to_live=3600)  # this browser session's run: caches and generator

        settings = [prompt, method, draft, gamma, temperature, seed, max_new_tokens, alpha, c]
        outputs = [session, status, text, bars, table, theory, data]
        common = dict(concurrency_limit=1, concurrency_id=concurrency_id, show_progress="hidden")
        seconds = zerogpu.run_duration()  # at most one capped run, replayed from its seed after a worker change
        reset.click(zerogpu.gpu(step_reset, seconds), inputs=settings, outputs=outputs, api_name="step_reset", **common)
        nxt.click(zerogpu.gpu(step_next, seconds), inputs=settings + [session], outputs=outputs, api_name="step_next",
                  **common)
        run.click(zerogpu.gpu(step_run, seconds), inputs=settings + [session], outputs=outputs, api_name="step_run",
                  **common)
        for slider in (alpha, c):
            slider.input(step_theory, inputs=[session, alpha, c], outputs=[theory], api_visibility="private",
                         show_progress="hidden")
        method.input(step_method_changed, inputs=[method], outputs=[draft, gamma, note], api_visibility="private",
                     show_progress="hidden")
