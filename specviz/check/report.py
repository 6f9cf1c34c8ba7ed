"""CheckReport -> one self-contained HTML page (Plotly inlined once, opens offline). No torch here."""
from __future__ import annotations

from html import escape
from typing import Optional

import plotly.graph_objects as go

from specviz.check import misses_report
from specviz.check.options import gamma_words
from specviz.core.lookup import first_draft_sentence
from specviz.metrics import vocab_sentence

# figure colours: Okabe-Ito (colour-blind safe), as render.COLOURS
GREEN, RED, BLUE, ORANGE, GREY = "#009E73", "#D55E00", "#0072B2", "#E69F00", "#8C8C8C"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1180px;margin:24px auto;padding:0 20px;
color:#1f2328;line-height:1.45}
h1{font-size:1.5em;margin:0 0 4px} h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:34px}
h3{margin:20px 0 6px;font-size:1.05em}
.verdict{font-size:1.35em;font-weight:600;padding:14px 18px;border-radius:8px;margin:14px 0}
.ok{background:#dafbe1;border:2px solid #1a7f37;color:#0f5323}
.bad{background:#ffebe9;border:2px solid #cf222e;color:#82071e}
.meta{color:#57606a;font-size:.9em} table{border-collapse:collapse;margin:8px 0;font-size:.92em}
th,td{border:1px solid #d0d7de;padding:4px 9px;text-align:left;vertical-align:top} th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums} .pass{color:#1a7f37;font-weight:600}
.fail{color:#cf222e;font-weight:600} .tie{color:#bc4c00;font-weight:600} code{background:#f6f8fa;padding:0 3px}
.kpis{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.kpi{border:1px solid #d0d7de;border-radius:8px;padding:8px 14px;
min-width:130px} .kpi b{display:block;font-size:1.4em} .kpi span{color:#57606a;font-size:.85em}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:12px} @media(max-width:900px){.grid{grid-template-columns:1fr}}
.note{color:#57606a;font-size:.9em;max-width:900px}
.tok{font-family:ui-monospace,monospace;background:#f6f8fa;padding:0 3px;white-space:pre}
"""


def fmt(value, spec: str = ".2f", none: str = "–") -> str:
    """A figure formatted with `spec`; `none` (a dash) for a missing one."""
    return none if value is None else format(value, spec)


def token(text: Optional[str]) -> str:
    """A token's text, escaped and monospaced, its whitespace visible; "(ended)" for an output that had ended."""
    return "<i>(ended)</i>" if text is None else f'<span class="tok">{escape(repr(text)[1:-1])}</span>'


def mark(flag: bool, yes: str = "pass", no: str = "FAIL") -> str:
    """A green `yes` or a red `no`."""
    return f'<span class="pass">{yes}</span>' if flag else f'<span class="fail">{no}</span>'


class Figures:
    """Plotly figures as HTML fragments; the first carries plotly.js inline, the rest reuse it."""

    def __init__(self):
        self.first = True

    def __call__(self, fig: go.Figure, height: int = 330) -> str:
        fig.update_layout(height=height, margin=dict(l=55, r=20, t=44, b=48), template="plotly_white",
                          font=dict(size=12), legend=dict(orientation="h", y=-0.22))
        html = fig.to_html(full_html=False, include_plotlyjs=self.first, config={"displayModeBar": False})
        self.first = False
        return f"<div>{html}</div>"


def table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """An HTML table of ready-made cells; the columns in `numeric` right-aligned with tabular figures."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _compatibility(c: dict) -> str:
    if not c["draft_tokenizer"]:
        return (f"<p>{mark(True, 'compatible')}: {escape(c['message'])}. Target tokenizer "
                f"<code>{escape(c['target_tokenizer_class'])}</code>, {c['target_vocab']} tokens, "
                f"{c['target_rows']} output rows.</p>")
    rows = [["tokenizer class", escape(c["target_tokenizer_class"]), escape(str(c["draft_tokenizer_class"]))],
            ["tokenizer entries", str(c["target_vocab"]), str(c["draft_vocab"])],
            ["output rows (logits)", str(c["target_rows"]), str(c["draft_rows"])]]
    for name, value in c["special_target"].items():
        other = c["special_draft"].get(name)
        rows.append([f"{name} token", escape(str(value or "–")),
                     escape(str(other or "–")) + ("" if other == value else ' <span class="fail">≠</span>')])
    return (f"<p>{mark(c['ok'], 'compatible', 'refused')}: {escape(c['message'])}.</p>"
            + table(["", "target", "draft"], rows)
            + f"<p class='meta'>shared (token, id) pairs: {c['shared']} ({fmt(c['overlap'], '.1%')} of the union); "
              f"same token under another id: {c['same_string_other_id']}.</p>")


def _greedy(d: dict) -> str:
    rows = []
    for r in d["prompts"]:
        div = r["divergence"]
        if div is None:
            where = "–"
            status = mark(True, "identical")
        else:
            kind = '<span class="tie">near-tie</span>' if div["near_tie"] else '<span class="fail">bug</span>'
            status = kind
            where = (f"token {div['index']}: …{token(div['context'])} then AR {token(div['ar_token'])} vs "
                     f"speculative {token(div['spec_token'])}; top-2 logit gap {div['top2_gap']:.2e}")
        cmp = r["comparison"]
        rows.append([escape(str(r["id"])), escape(r["category"]),
                     escape(r["prompt"][:70]) + ("…" if len(r["prompt"]) > 70 else ""), str(len(r["ar_ids"])),
                     str(len(r["spec_ids"])), status, where, fmt(cmp["spec"]["alpha"]), fmt(cmp["speedup"]) + "×"])
    return table(["id", "category", "prompt", "AR tokens", "spec tokens", "greedy identity", "first divergence",
                   "α", "speedup"], rows, {3, 4, 7, 8})


def _fidelity(f: dict, fig: Figures) -> str:
    fit = f["fit"]
    given = f.get("given")
    what = ("the first emitted token of the engine" if given is None else
            f"the first emitted token of the first drafted step (this drafter's first step is the target's prefill: "
            f"counted over the {f['samples']} of {f.get('seeds')} seeds whose prefill emitted "
            f"<code>{escape(repr(given))}</code>, the target's most likely first token)")
    text = (f"<p>{mark(f['passed'])}: {what} over seeds 0…{max(f['samples'], f.get('seeds') or 0) - 1} at "
            f"temperature {f['temperature']:g}, against the target's exact distribution "
            f"(prompt <code>{escape(str(f['prompt_id']))}</code>, chosen as the most spread first token: "
            f"entropy {f['prompt_entropy']:.2f} nats). Chi-square {fit['chi2']:.1f} on {fit['dof']} degrees of freedom "
            f"({fit['bins']} bins, tokens expected fewer than 5 times pooled): <b>p = {fit['p_value']:.3g}</b> "
            f"(fails below {f.get('p_value_min', 1e-3):g}). Total-variation distance over the bins "
            f"<b>{fit['tv']:.3f}</b>, bound {fit['tv_bound']:.3f} for n = {fit['n']} (an exact sampler stays below it "
            f"with probability ≥ 1 − 10⁻⁴). {f['with_drafts']} of {f['samples']} steps counted verified drafted "
            f"tokens; {f['first_accepted']} kept the first one.</p>")
    return text + fig(fidelity_figure(f))


def _synthetic(cases: list[dict]) -> str:
    if not cases:
        return "<p class='meta'>skipped</p>"
    rows = [[escape(c["name"]), str(c["gamma"]), str(c["fit"]["n"]), f"{c['fit']['p_value']:.3g}",
             f"{c['fit']['tv']:.4f} / {c['fit']['tv_bound']:.4f}",
             ("must be flagged: " if c["planted_bug"] else "")
             + mark(c["ok"], "flagged" if c["planted_bug"] else "pass", "NOT flagged" if c["planted_bug"] else "FAIL")]
            for c in cases]
    return (table(["case", "γ", "draws", "p-value", "TV / bound", "result"], rows, {1, 2, 3, 4})
            + "<p class='note'>Monte-Carlo of <code>sampling.verify_chain</code> on random p and q over 12 tokens: the "
              "first emitted token must follow p whatever q is. The control drafts argmax q while reporting q, a known "
              "bug; it must be flagged, which shows the test has the power to catch it.</p>")


def fidelity_figure(f: dict) -> go.Figure:
    """The first emitted token: the target's exact probabilities beside the observed frequencies."""
    top = f["top"]
    figure = go.Figure([
        go.Bar(name="target's exact probability", x=[repr(t["token"])[1:-1] for t in top],
               y=[t["expected"] for t in top], marker_color=GREY),
        go.Bar(name=f"observed over {f['samples']} seeds", x=[repr(t["token"])[1:-1] for t in top],
               y=[t["observed"] for t in top], marker_color=BLUE)])
    figure.update_layout(title="First token: expected vs observed (top 10)", barmode="group",
                         yaxis_title="probability")
    return figure


def alpha_position_figure(p: dict) -> Optional[go.Figure]:
    """α_i by draft position, with the number of drafts judged there."""
    if p["alpha_by_position"]:
        pos = list(range(1, len(p["alpha_by_position"]) + 1))
        f1 = go.Figure(go.Bar(x=pos, y=p["alpha_by_position"], marker_color=GREEN,
                              text=[f"n={n}" for n in p["drafted_by_position"]], textposition="outside"))
        f1.update_layout(title="α_i: P(position i accepted | earlier ones accepted)", xaxis_title="draft position",
                         yaxis=dict(title="acceptance", range=[0, 1.1]), xaxis=dict(dtick=1))
        return f1
    return None


def gamma_figure(p: dict) -> Optional[go.Figure]:
    """Predicted speedup against γ (Leviathan, and with the measured verify cost), the measured point marked."""
    g = round(p["gamma_mean"]) if p["gamma_mean"] else None
    if p["gamma_curve"]:
        gs = [r["gamma"] for r in p["gamma_curve"]]
        f2 = go.Figure([go.Scatter(x=gs, y=[r["leviathan"] for r in p["gamma_curve"]],
                                   name="Leviathan (verify costs 1 forward)", line=dict(color=GREY, dash="dash")),
                        go.Scatter(x=gs, y=[r["with_profile"] for r in p["gamma_curve"]], name="with measured T(γ+1)",
                                   line=dict(color=BLUE))])
        if p["speedup"] is not None and g:
            f2.add_trace(go.Scatter(x=[g], y=[p["speedup"]], mode="markers", name="measured",
                                    marker=dict(color=ORANGE, size=12, symbol="diamond")))
        f2.add_hline(y=1, line=dict(color=RED, width=1))
        f2.update_layout(title=f"Predicted speedup vs γ at α={fmt(p['alpha'])}, c={fmt(p['cost_ratio'], '.3f')}",
                         xaxis_title="γ (drafted tokens per step)", yaxis_title="speedup over AR")
        return f2
    return None


def profile_figure(p: dict) -> Optional[go.Figure]:
    """The target's forward latency against tokens per forward."""
    prof = p["profile"]
    if prof:
        f3 = go.Figure(go.Scatter(x=prof["tokens"], y=[s * 1000 for s in prof["seconds"]], mode="lines+markers",
                                  line=dict(color=BLUE)))
        f3.update_layout(title=f"Target forward latency on {escape(prof['device'])} (context {prof['context']} tokens)",
                         xaxis=dict(title="tokens per forward", type="log", tickvals=prof["tokens"]),
                         yaxis=dict(title="ms (median of %d)" % prof["reps"], rangemode="tozero"))
        return f3
    return None


def batch_figure(p: dict) -> Optional[go.Figure]:
    """Predicted speedup as the batch grows, at the run's γ and at the best γ per batch."""
    if p["batch_curve"]:
        bc = p["batch_curve"]
        f4 = go.Figure([go.Scatter(x=[r["batch"] for r in bc], y=[r["speedup"] for r in bc], mode="lines+markers",
                                   name=f"γ={bc[0]['gamma']}", line=dict(color=BLUE)),
                        go.Scatter(x=[r["batch"] for r in bc], y=[r["best_speedup"] for r in bc], mode="lines+markers",
                                   name="best γ at each batch", line=dict(color=GREEN, dash="dot"),
                                   text=[f"γ={r['best_gamma']}" for r in bc],
                                   hovertemplate="b=%{x}: %{y:.2f}× (%{text})")])
        f4.add_hline(y=1, line=dict(color=RED, width=1))
        f4.update_layout(title="Predicted speedup as the batch grows", xaxis=dict(title="batch size b", type="log",
                         tickvals=[r["batch"] for r in bc]), yaxis=dict(title="speedup over AR", rangemode="tozero"))
        return f4
    return None


def _payoff(p: dict, options: dict, fig: Figures, positions: bool = True) -> str:
    """Part 3; `positions`: with the α_i figure (left to part 4's curves when the report has them)."""
    g = round(p["gamma_mean"]) if p["gamma_mean"] else None
    kpis = [("α acceptance rate", fmt(p["alpha"])), ("τ tokens / target forward", fmt(p["tau"])),
            ("c cost ratio", fmt(p["cost_ratio"], ".3f")),
            ("measured speedup over specviz's AR (median over prompts)", fmt(p["speedup"]) + "×"),
            (f"Leviathan prediction ({gamma_words(options.get('gamma'), p['gamma_mean'])})",
             fmt(p["predicted_speedup"]) + "×"),
            ("best γ (Leviathan)",
             f"{p['best_gamma']} → {fmt(p['best_gamma_speedup'])}×" if p["best_gamma"] else "–"),
            ("best γ (with this device's verify cost)",
             f"{p['best_gamma_hw']} → {fmt(p['best_gamma_hw_speedup'])}×" if p["best_gamma_hw"] else "–")]
    out = ['<div class="kpis">' + "".join(f'<div class="kpi"><b>{v}</b><span>{escape(k)}</span></div>' for k, v in kpis)
           + "</div>"]
    spread = [c["speedup"] for c in p["by_category"] if c["speedup"] is not None]
    if len(spread) > 1:
        out.append(f"<p class='note'>Per-category speedups range {min(spread):.2f}× … {max(spread):.2f}×: on a "
                   "machine shared with other work, wall-clock timings of sequential runs are noisy; α, τ and c are "
                   "steadier.</p>")
    out.append(f"<p class='meta'>AR {p['ar_tok_per_s']:.1f} tok/s, speculative {p['spec_tok_per_s']:.1f} tok/s "
               f"(greedy, {options['max_new_tokens']} new tokens per prompt, compute seconds); speedup over all tokens "
               f"{fmt(p['speedup_total'])}×. "
               f"c is measured {escape(p['cost_ratio_basis'])}. τ counts the resampled/bonus token (AR has τ = 1), "
               "as Spec-Bench, EAGLE and vLLM do.</p>")
    if p.get("first_draft"):
        out.append(f"<p class='meta'>Does it copy? {escape(first_draft_sentence(p['first_draft']))}. A position "
                   "repeats its context when the longest earlier match of its last 3–6 tokens predicts the target's "
                   "token there (text copied from the prompt, or a loop): prompt lookup drafts exactly those.</p>")
    if p.get("draft_vocab"):
        out.append(f"<p class='meta'>Its {escape(vocab_sentence(p['draft_vocab']))}. Here: AR's answers to these "
                   "prompts.</p>")
    out.append("<h3>By category</h3>" + table(
        ["category", "prompts", "tokens", "α", "τ", "speedup"],
        [[escape(c["name"]), str(c["prompts"]), str(c["new_tokens"]), fmt(c["alpha"]), fmt(c["tau"]),
          fmt(c["speedup"]) + "×"] for c in p["by_category"]], {1, 2, 3, 4, 5}))
    figs = [fig(f) for f in (alpha_position_figure(p) if positions else None, gamma_figure(p), profile_figure(p),
                             batch_figure(p)) if f]
    prof = p["profile"]
    out.append('<div class="grid">' + "".join(figs) + "</div>")
    if prof:
        rows = [[str(n), f"{raw * 1000:.1f}", f"{s * 1000:.1f}", f"{s / prof['seconds'][0]:.2f}"]
                for n, s, raw in zip(prof["tokens"], prof["seconds"], prof["raw_seconds"])]
        out.append("<h3>Hardware cost profile</h3>" + table(["tokens per forward", "ms measured (median)", "ms used",
                                                               "× one token"], rows, {0, 1, 2, 3})
                   + "<p class='note'>One target forward of n new tokens over a KV cache of "
                     f"{prof['context']} tokens, then rolled back. 'Used' takes the running minimum from the right, "
                     "since a forward of fewer tokens cannot cost more: the rest is noise.</p>")
    if p["batch_curve"]:
        rows = [[str(r["batch"]), str(r["verify_tokens"]) + (" (extrapolated)" if r["extrapolated"] else ""),
                 fmt(r["speedup"]) + "×", f"{r['best_gamma']} → {fmt(r['best_speedup'])}×"] for r in p["batch_curve"]]
        out.append("<h3>The batching caveat</h3>" + table(["batch b", "tokens in the verify forward",
                                                              f"speedup at γ={g}", "best γ"], rows, {0, 1, 2}))
        out.append(
            "<p class='note'>The model: with b sequences decoded together, one AR step is a forward of b tokens, "
            "costing T(b), for b tokens. A speculative step drafts γ tokens (γ draft forwards, each c·T(b), assuming "
            "the draft scales like the target) and verifies γ+1 tokens per sequence in one forward of b·(γ+1) tokens, "
            "costing T(b·(γ+1)), for b·E tokens, where E = (1 − α^(γ+1)) / (1 − α). So "
            "<b>S(b) = E·T(b) / (γ·c·T(b) + T(b·(γ+1)))</b>. T is the measured profile above (interpolated; linear "
            "beyond its largest size). At b = 1 with a flat T this is Leviathan et al.'s S = E / (γc + 1). While the "
            "device is memory-bound T barely grows and verification is almost free; once b·(γ+1) tokens make it "
            "compute-bound, verifying rejected drafts costs real time and the speculative gain shrinks.</p>")
    return "".join(out)


def figures(report: dict) -> dict[str, Optional[go.Figure]]:
    """The report's figures by name (None where the run has no data for one), for the app's plots; acceptance by
    position both conditional and unconditional where the report says why it misses."""
    p, why = report["payoff"], misses_report.figures(report.get("misses") or {})
    return {"fidelity": fidelity_figure(report["fidelity"]),
            "alpha_position": why["position"] or alpha_position_figure(p), "gamma": gamma_figure(p),
            "profile": profile_figure(p), "batch": batch_figure(p), "accepted_length": why["accepted_length"],
            "gaps": why["gaps"]}


def to_html(report: dict) -> str:
    """The whole report as one self-contained HTML page, from CheckReport.to_dict()."""
    fig = Figures()
    env, opts = report["environment"], report["options"]
    ok = report["correct"]
    problems = "".join(f"<li>{escape(p)}</li>" for p in report["problems"])
    gamma = opts["gamma"]
    fid = dict(report["fidelity"], p_value_min=opts["p_value_min"])
    g = report["greedy"]
    why = (report.get("misses") or {}).get("steps")
    ties = f" {g['near_ties']} near-tie flips (top-2 gap < {opts['near_tie']:g})." if g["near_ties"] else ""
    body = [
        f"<h1>specviz check: {escape(report['drafter'])} drafting for {escape(report['target'])}</h1>",
        f"<div class='meta'>method {escape(report['method'])} · γ={gamma} · {env['device']} {env['dtype']} · "
        f"{escape(env['machine'])} · torch {env['torch']} · transformers {env['transformers']}</div>",
        f"<div class='verdict {'ok' if ok else 'bad'}'>{escape(report['verdict'])}</div>",
        f"<ul>{problems}</ul>" if problems else "",
        "<h2>1 · Compatible?</h2>", _compatibility(report["compatibility"]),
        "<h2>2 · Correct?</h2>",
        f"<h3>Greedy identity against AR</h3><p>{mark(g['identical_all'], 'identical on every prompt', 'differs')}: "
        f"each prompt decoded greedily by plain AR and by the speculative engine must give the same tokens in "
        f"{env['dtype']}.{ties} At a divergence the target's top-2 logit gap tells a numerical near-tie from a bug. "
        f"Verification against one-token decoding: the largest |Δlogit| over the {g['judged_positions']} positions "
        f"both computed is <b>{g['verify_logit_max_abs_diff']:.3g}</b> (guarantee here: {escape(str(g['guarantee']))}; "
        f"0 means bit for bit).</p>",
        _greedy(g),
        "<h3>Exact sampling on the real pair</h3>", _fidelity(fid, fig),
        "<h3>Synthetic p/q suite</h3>", _synthetic(report["synthetic"]),
        "<h2>3 · Does it pay?</h2>", _payoff(report["payoff"], opts, fig, positions=not why),
        "<h2>4 · Why does it miss?</h2>" + misses_report.section(report.get("misses"), fig, table) if why else "",
        "<p class='meta'>Part timings (wall s): " + ", ".join(f"{k} {v:.1f}" for k, v in report["seconds"].items())
        + ". All figures are in the JSON report (<code>--json</code>).</p>",
    ]
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>specviz check: "
            f"{escape(report['verdict'])}</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>")
