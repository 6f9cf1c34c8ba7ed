"""The "Step through" tab (teaching mode): one draft/verify cycle per click, with what the drafter proposed (q), what
the target thinks (p), the acceptance test and its verdict, as bars (step_plots.cycle_figure) and a table. The run
itself is specviz.ui.teach's; this module builds the tab's components and wiring inside the caller's gr.Blocks.
"""
from __future__ import annotations

import html
import time
from typing import Optional

import gradio as gr

from specviz import hardware, methods, zerogpu
from specviz.config import DEFAULT_DRAFT
from specviz.events import StepEvent
from specviz.methods import CHAIN_METHODS
from specviz.policy import Policy
from specviz.ui import controls, render, step_plots
from specviz.ui.common import (
    DEVICE_QUEUE,
    DRAFT_CHOICES,
    GAMMAS,
    at_hand,
    choices_with_default,
    counted,
    finish_words,
    num,
    status_html,
    tab_intro,
)
from specviz.ui.logic import make_config, user_message
from specviz.ui.race_html import drafts_blocks

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
        cells = [label, _tok(pos["text"], pos["verdict"]), num(pos["q_draft"], ".3f"), num(pos["p_target"], ".3f")]
        if greedy:
            cells.append(html.escape(pos["target_argmax"] or "–") if pos["target_argmax"] is not None else "–")
        else:
            cells += [num(pos["accept_prob"], ".3f"), num(pos["u"], ".3f")]
        cells.append(html.escape(step_plots.VERDICT_MARK[pos["verdict"]]))
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
                 num(pos["q_draft"], ".3f"), num(pos["p_target"] if greedy else pos["r"], ".3f")]
        if greedy:
            cells.append(html.escape(pos["target_argmax"] or "–"))
        else:
            cells += [num(pos["accept_prob"], ".3f"), num(pos["u"], ".3f")]
        cells.append(html.escape(step_plots.VERDICT_MARK[pos["verdict"]]))
        if not greedy:
            cells.append(_residual_top(pos["bars"]) if pos["verdict"] == "rejected" else "")
        numeric = {3, 4} if greedy else {3, 4, 5, 6}
        rows.append(f'<tr data-verdict="{pos["verdict"]}" data-sibling="{pos["sibling"]}">' + "".join(
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    rule = RULE_TREE_GREEDY if greedy else RULE_TREE_SAMPLING
    return (f'<div class="sv-rule">{rule}</div><table class="sv-table" id="step-table-rows"><tr>'
            + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


def block_note_html(event: Optional[StepEvent], method: str) -> str:
    """Above the table of a cycle whose guesses were one block drafted in ONE drafter forward (DFlash): that it was
    (a chain, or a tree of several candidates a position), and where the target's check, position by position, cut
    it. Empty for any other cycle."""
    if event is None or not (drafts_blocks(method) and render.one_forward_block(event)):
        return ""
    own = [d for d in event.drafts if d.head >= 0]  # not a graft's (prompt lookup, the datastore)
    depth, kept = 1 + max(d.depth for d in own), event.n_accepted
    what = (f"these {depth} tokens" if len(own) == depth else
            f"these {len(own)} candidates for {depth} positions")
    cut = ("it kept every position and added its own token" if kept == depth else
           f"it kept {kept} and cut the block at position {kept + 1}"
           + ("; the positions after it were never judged" if kept + 1 < depth else ""))
    return (f'<div class="sv-rule" id="step-block-note"><b>One forward, a whole block.</b> '
            f"{html.escape(methods.spec(method).label)}'s drafter guessed {what} in a single forward, all at once: "
            "no guess waited for the one before it. The target checks them in one forward too, position by position "
            f"as the rows below show: {html.escape(cut)}.</div>")


def step_text_html(events: list[StepEvent], method: str) -> str:
    """The run so far as text with every draft shown; a block drafted in one forward is bracketed, with its cut."""
    blocks = drafts_blocks(method)
    return "".join(render.block_html(e, items) if blocks and render.one_forward_block(e) else render.to_html(items)
                   for e in events for items in [render.step_spans(e)])


def step_status(session) -> str:
    cfg = session.cfg
    m = session.measured()
    entry = methods.spec(cfg.method)
    who = (f"{cfg.method}, draft {session.draft}" if entry.uses_draft_model else
           f"{cfg.method} (trained drafter, drafting a {'tree' if entry.tree else 'chain'})" if entry.trained
           else f"{cfg.method} ({entry.label})")
    where = (f"done: {finish_words(session.run.finish_reason, m['tokens'])} after {counted(m['steps'], 'step')} "
             "(Reset starts a new run)" if session.finished else
             f"{counted(m['steps'], 'step')} so far" if m["steps"] else "ready: press Next step")
    alpha = (f" · acceptance so far (α) {num(m['alpha'])} ({m['accepted']}/{m['drafted']}) · tokens per target "
             f"pass (τ) {num(m['tau'])}"
             if m["steps"] else "")
    text = (f"Seed {cfg.seed} · {who} · guesses per step (γ) {cfg.gamma} · temperature {cfg.temperature:g} · "
            f"{m['tokens']}/{cfg.max_new_tokens} tokens · {where}{alpha}")
    return status_html(text, "ok" if session.finished else "info")


def step_outputs(session, alpha: float, c: float) -> tuple:
    """(state, status, text, bars, table, theory, data) for one session."""
    view = session.views[-1].to_dict() if session.views else None
    method = session.cfg.method
    text = step_text_html(session.events, method) if session.events else '<span class="sv-placeholder">…</span>'
    measured = session.measured()
    data = {"step": len(session.views), "finished": session.finished, "finish_reason": session.run.finish_reason,
            "seed": session.cfg.seed, "config": session.cfg.to_dict(), "measured": measured,
            "text": session.engine.target.decode(session.token_ids), "cycle": view}
    return (session, step_status(session), f'<div class="sv-steptext">{text}</div>', step_plots.cycle_figure(view),
            block_note_html(session.events[-1] if session.events else None, method) + cycle_table_html(view),
            step_plots.theory_figure(float(alpha), float(c), measured, block=drafts_a_block(session)), data)


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


def _open(session, prompt, method, draft, gamma, temperature, seed, max_new_tokens):
    """The run to continue: `session` (resumed from its recipe when it crossed a process) or, with none, a fresh one."""
    from specviz.ui import teach

    return teach.resume(session) if session else _start(prompt, method, draft, gamma, temperature, seed,
                                                        max_new_tokens)


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
        session = _open(session, prompt, method, draft, gamma, temperature, seed, max_new_tokens)
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
        session = _open(session, prompt, method, draft, gamma, temperature, seed, max_new_tokens)
        last = 0.0
        while teach.advance(session) is not None:
            if time.perf_counter() - last >= 0.25 and not session.finished:
                last = time.perf_counter()
                yield step_outputs(session, alpha, c)
        yield step_outputs(session, alpha, c)
    except Exception as exc:
        yield _error_outputs(exc, session)


def drafts_a_block(session) -> bool:
    """Whether this run's drafter drafted its guesses as one block in one forward (DFlash), as its steps so far
    show: the theory's drafting cost is then c a step, not γc."""
    return bool(session) and drafts_blocks(session.cfg.method) and any(
        render.one_forward_block(e) for e in session.events)


def step_theory(session, alpha: float, c: float):
    return step_plots.theory_figure(float(alpha), float(c), session.measured() if session else None,
                               block=drafts_a_block(session))


def step_method_changed(method):
    """The step-through form follows the drafter (controls.step_fields): the draft model only for a draft-model method,
    with a line saying why it is hidden otherwise."""
    fields = controls.step_fields(str(method))
    return (gr.Dropdown(visible=fields.draft), gr.Dropdown(visible=fields.gamma),
            fields.note_html("step-method-note"))


def step_tab(concurrency_id: str = DEVICE_QUEUE, pair: hardware.Pair = hardware.EMBEDDED_PAIR) -> None:
    """Build the "Step through" tab (teaching mode) inside the caller's gr.Blocks (default draft: `pair`'s)."""
    with gr.Tab("Step through", elem_id="tab-step"):
        gr.HTML(tab_intro("<b>Teaching mode.</b> One draft/verify cycle per click: what the drafter proposed (q), "
                          "what the target thinks (p), the acceptance test and its verdict. The same seed gives the "
                          "same run, token for token, as the Race tab's speculative lane with these settings. "
                          "Medusa and EAGLE verify their tree: each candidate the target judged is a row, in order, "
                          "and when sampling a refused sibling shows the residual the next one is judged against."))
        with gr.Row(equal_height=False):
            prompt = gr.Textbox(value=STEP_PROMPT, label="Prompt", lines=2, max_lines=4, scale=3, elem_id="step-prompt")
            method = gr.Dropdown(at_hand(CHAIN_METHODS), value="vanilla", label="Drafter", min_width=120,
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
        bars = gr.Plot(step_plots.cycle_figure(None), elem_id="step-bars", show_label=False)
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                table = gr.HTML("", elem_id="step-table")
            with gr.Column(scale=2, min_width=360):
                with gr.Row():
                    alpha = gr.Slider(0.0, 0.99, value=0.7, step=0.01, label="α (acceptance rate)",
                                      elem_id="step-alpha")
                    c = gr.Slider(0.0, 1.0, value=0.1, step=0.01, label="c (draft cost / target cost)",
                                  elem_id="step-c")
                theory = gr.Plot(step_plots.theory_figure(0.7, 0.1), elem_id="step-theory", show_label=False)
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
