"""`python -m specviz probe URL --prompts FILE`: a prompt file through a server's OpenAI-compatible chat API, one
request at a time, greedy and sampled; each request's speculative figures from the response where the engine puts
them there (llama.cpp `timings.draft_n` / `draft_n_accepted`, SGLang `meta_info.spec_verify_ct`, vLLM's
`metrics.speculative_decoding` with --per-request-spec-decode-metrics: drafts, tokens and accepted lengths), and
from the server's /metrics around the request where it exports them (drafts and acceptance by position). With a
reference server (the same model without speculation) every greedy answer is compared with the reference's, and the
first divergence is shown with its context and, where the reference returns log-probabilities, its top-2 gap there.
Before any of it, the server's vocabulary is checked against the one it is judged by (serving/vocab.py): a server
running another tokenizer is refused in one line.

Definitions (DESIGN.md, vLLM): draft acceptance = accepted / drafted tokens; τ = 1 + accepted / drafts (tokens per
drafted step, the bonus token included); tokens per target forward = n / (n − accepted) for n generated tokens (every
decode step, drafted or not, the prefill's first token included); acceptance at position i = accepted at i / drafts,
α_i = that given the earlier positions kept. Torch-free; the report is check's HTML family (check/report.py).
"""
from __future__ import annotations

import json as jsonlib
import time
from dataclasses import asdict, dataclass
from html import escape
from typing import Callable, Optional

from specviz.serving.prometheus import (
    ServerError,
    Snapshot,
    Unreachable,
    base_url,
    conditional,
    http,
    scrape,
    window,
)
from specviz.serving.vocab import Expected, check_served

SAMPLED_TEMPERATURE = 1.0   # the sampled pass's temperature, as check's sampling part (0 = greedy only)
NEAR_TIE = 1e-3             # a greedy divergence where the reference's top-2 log-prob gap is below this is numerical,
                            # not a bug (check's CheckOptions.near_tie: a logit gap equals the log-prob gap)
REQUEST_TIMEOUT = 300.0     # seconds for one chat completion
CONTEXT_CHARS = 40          # text shown before a divergence


@dataclass(frozen=True)
class ProbeOptions:
    max_new_tokens: int = 128                 # DecodeConfig's default; the CLI validates through DecodeConfig
    temperature: float = SAMPLED_TEMPERATURE  # the sampled pass; 0 = greedy only
    seed: int = 0
    timeout: float = REQUEST_TIMEOUT


def chat(url: str, prompt: str, max_tokens: int, temperature: float, seed: int, timeout: float,
         logprobs: bool = False) -> dict:
    """One OpenAI-compatible chat completion; ServerError (one line) on any failure or a malformed answer."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": temperature,
            "seed": seed, "stream": False}
    if logprobs:
        body.update(logprobs=True, top_logprobs=2)
    target = base_url(url) + "/v1/chat/completions"
    status, raw = http("POST", target, timeout=timeout, json=body)
    try:
        data = jsonlib.loads(raw)
    except ValueError:
        data = None
    if status != 200:
        detail = data.get("error") if isinstance(data, dict) else None
        detail = detail.get("message", detail) if isinstance(detail, dict) else detail
        raise ServerError(f"{target} answered HTTP {status}" + (f": {str(detail).splitlines()[0][:160]}" if detail
                                                                else ""))
    if not isinstance(data, dict) or not data.get("choices"):
        raise ServerError(f"{target} did not answer an OpenAI chat completion (no 'choices')")
    return data


def _tokens(resp: dict) -> Optional[list[dict]]:
    content = ((resp["choices"][0].get("logprobs") or {}).get("content")) if resp.get("choices") else None
    return content if isinstance(content, list) else None


def figures(resp: dict) -> dict:
    """The speculative figures a response carries itself: llama.cpp's timings, SGLang's meta_info."""
    choice = resp["choices"][0]
    usage = resp.get("usage") or {}
    text = (choice.get("message") or {}).get("content") or ""
    out = {"text": text, "finish_reason": choice.get("finish_reason"), "model": resp.get("model"),
           "completion_tokens": usage.get("completion_tokens"), "prompt_tokens": usage.get("prompt_tokens"),
           "draft_tokens": None, "accepted_tokens": None, "drafts": None, "accepted_lengths": None,
           "verify_steps": None, "server_tok_per_s": None, "source": None}
    spec = (resp.get("metrics") or {}).get("speculative_decoding") if isinstance(resp.get("metrics"), dict) else None
    if isinstance(spec, dict) and "num_draft_tokens" in spec:  # vLLM, --per-request-spec-decode-metrics
        histogram = spec.get("acceptance_histogram")
        out.update(draft_tokens=spec["num_draft_tokens"], accepted_tokens=spec.get("num_accepted_draft_tokens"),
                   drafts=spec.get("num_spec_steps"), source="metrics.speculative_decoding",
                   accepted_lengths=list(histogram) if isinstance(histogram, list) else None)
    timings = resp.get("timings") or {}
    if "predicted_n" in timings:  # llama.cpp: draft_n is left out when the request drafted nothing
        out.update(draft_tokens=timings.get("draft_n", 0), accepted_tokens=timings.get("draft_n_accepted", 0),
                   source="timings")
    if timings.get("predicted_n"):
        out["completion_tokens"] = out["completion_tokens"] or timings["predicted_n"]
        out["server_tok_per_s"] = timings.get("predicted_per_second")
    meta = resp.get("meta_info") or choice.get("meta_info") or {}
    if meta.get("spec_verify_ct"):
        out.update(verify_steps=meta["spec_verify_ct"], source=out["source"] or "meta_info")
        if out["accepted_tokens"] is None and out["completion_tokens"]:
            out["accepted_tokens"] = out["completion_tokens"] - meta["spec_verify_ct"]
    return out


def _ratio(a, b) -> Optional[float]:
    return a / b if a is not None and b else None


def _per_forward(n, accepted) -> Optional[float]:
    return n / (n - accepted) if n and accepted is not None and n > accepted else None


def divergence(text: str, reference: str) -> Optional[dict]:
    """The first character where two greedy answers differ, with the text before it."""
    if text == reference:
        return None
    i = next((k for k, (a, b) in enumerate(zip(text, reference)) if a != b), min(len(text), len(reference)))
    return {"index": i, "context": text[max(0, i - CONTEXT_CHARS):i], "spec": text[i:i + 20] or None,
            "reference": reference[i:i + 20] or None}


def _gap_at(tokens: Optional[list[dict]], char_index: int) -> Optional[float]:
    """The reference's top-2 log-prob gap at the token holding char_index (None without log-probs)."""
    if not tokens:
        return None
    seen = 0
    for tok in tokens:
        seen += len(tok.get("token", ""))
        if seen > char_index:
            top = sorted((t.get("logprob", float("-inf")) for t in tok.get("top_logprobs") or []), reverse=True)
            return top[0] - top[1] if len(top) >= 2 else None
    return None


def run_probe(url: str, rows: list[dict], options: ProbeOptions = ProbeOptions(), reference: Optional[str] = None,
              log: Callable[[str], None] = print, expect: Optional[Expected] = None) -> dict:
    """Every prompt greedy (and sampled when options.temperature > 0) through `url`, greedy through `reference`.
    ServerError when the first request fails; a later failed request is recorded and reported; VocabMismatch, before
    any request, when the server tokenizes otherwise than `expect` or the reference."""
    try:
        before: Optional[Snapshot] = scrape(url)
    except Unreachable:
        raise
    except ServerError as exc:
        log(f"no metrics from the server ({exc}): per-response figures only")
        before = None
    vocabulary = check_served(url, expect, reference, log)
    modes = [("greedy", 0.0)] + ([("sampled", options.temperature)] if options.temperature > 0 else [])
    requests, engine, model = [], before.engine if before and before.speculative else None, None
    for n, row in enumerate(rows):
        for mode, temperature in modes:
            rec = {"id": row["id"], "category": row["category"], "prompt": row["prompt"], "mode": mode, "error": None}
            t0 = time.perf_counter()
            try:
                resp = chat(url, row["prompt"], options.max_new_tokens, temperature, options.seed, options.timeout)
            except ServerError as exc:
                if not requests:
                    raise
                rec["error"] = str(exc)
                log(f"prompt {row['id']} ({mode}): {exc}")
                requests.append(rec)
                continue
            seconds = time.perf_counter() - t0
            rec.update(figures(resp), seconds=seconds)
            model = model or rec["model"]
            if engine is None:
                engine = {"timings": "llamacpp", "meta_info": "sglang", "metrics.speculative_decoding": "vllm"}.get(
                    rec["source"])
            rec.update(per_position_counts=[], metrics_draft_tokens=None, metrics_accepted_tokens=None)
            if before is not None:
                try:
                    after = scrape(url)
                except ServerError as exc:
                    log(f"prompt {row['id']} ({mode}): metrics after the request: {exc}")
                    after = None
                if after is not None:
                    w = window(before, after)
                    rec.update(drafts=rec["drafts"] if rec["drafts"] is not None else w.drafts,
                               per_position_counts=[a * w.drafts for a in w.per_position],
                               metrics_draft_tokens=w.draft_tokens, metrics_accepted_tokens=w.accepted_tokens)
                    if rec["source"] is None and after.speculative:
                        rec.update(draft_tokens=w.draft_tokens, accepted_tokens=w.accepted_tokens, source="metrics")
                    before = after
            n_tok, acc = rec["completion_tokens"], rec["accepted_tokens"]
            rec.update(tok_per_s=_ratio(n_tok, seconds), acceptance_rate=_ratio(acc, rec["draft_tokens"]),
                       tau=1 + acc / rec["drafts"] if acc is not None and rec["drafts"] else None,
                       tokens_per_forward=_ratio(n_tok, rec["verify_steps"]) or _per_forward(n_tok, acc))
            requests.append(rec)
        if reference:
            _compare(requests, row, reference, options, log)
        log(f"[{n + 1}/{len(rows)}] {row['id']} ({row['category']}): " + " · ".join(
            f"{r['mode']} acceptance {_f(r.get('acceptance_rate'))} tokens per forward "
            f"{_f(r.get('tokens_per_forward'))}"
            for r in requests if r["id"] == row["id"] and r["mode"] in ("greedy", "sampled") and not r["error"])
            + ("" if not reference else f" · identical: {_identity_word(requests[-1])}"))
    data = assemble(url, reference, engine or "unknown", model, options, requests)
    data["vocabulary"] = vocabulary
    return data


def _identity_word(rec: dict) -> str:
    if rec.get("error"):
        return "error"
    return "yes" if rec["identical"] else ("near-tie" if rec["near_tie"] else "NO")


def _compare(requests: list[dict], row: dict, reference: str, options: ProbeOptions, log) -> None:
    """The reference's greedy answer to one prompt beside the speculative one."""
    spec = next((r for r in requests if r["id"] == row["id"] and r["mode"] == "greedy"), None)
    rec = {"id": row["id"], "category": row["category"], "prompt": row["prompt"], "mode": "reference", "error": None}
    try:
        resp = chat(reference, row["prompt"], options.max_new_tokens, 0.0, options.seed, options.timeout,
                    logprobs=True)
    except ServerError as exc:
        rec["error"] = str(exc)
        log(f"prompt {row['id']} (reference): {exc}")
        requests.append(rec)
        return
    ref = figures(resp)
    if spec is None or spec["error"]:
        rec.update(text=ref["text"], identical=None, divergence=None, near_tie=False,
                   error="no greedy answer from the server to compare")
    else:
        div = divergence(spec["text"], ref["text"])
        gap = _gap_at(_tokens(resp), div["index"]) if div else None
        if div:
            div["top2_gap"] = gap
        rec.update(text=ref["text"], completion_tokens=ref["completion_tokens"], identical=div is None,
                   divergence=div, near_tie=gap is not None and gap < NEAR_TIE)
    requests.append(rec)


def _f(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def _group(recs: list[dict]) -> dict:
    """Totals over requests: acceptance, τ, tokens per forward, tok/s, acceptance by position."""
    ok = [r for r in recs if not r["error"]]
    tokens = sum(r["completion_tokens"] or 0 for r in ok)
    seconds = sum(r["seconds"] for r in ok)
    spec = [r for r in ok if r["draft_tokens"] is not None]
    drafted = sum(r["draft_tokens"] for r in spec)
    accepted = sum(r["accepted_tokens"] for r in spec)
    with_drafts = [r for r in spec if r["drafts"] is not None]
    drafts = sum(r["drafts"] for r in with_drafts)
    acc_d = sum(r["accepted_tokens"] for r in with_drafts)
    n_pos = max((len(r["per_position_counts"]) for r in with_drafts), default=0)
    counts = [sum(r["per_position_counts"][i] for r in with_drafts if i < len(r["per_position_counts"]))
              for i in range(n_pos)]
    spec_tokens = sum(r["completion_tokens"] or 0 for r in spec)
    server = [r["server_tok_per_s"] for r in ok if r["server_tok_per_s"]]
    per_position = [c / drafts for c in counts] if drafts else []
    lengths = [r["accepted_lengths"] for r in ok if r.get("accepted_lengths")]
    histogram = [sum(h[i] for h in lengths if i < len(h)) for i in range(max(map(len, lengths), default=0))]
    return {"accepted_lengths": histogram or None,
            "requests": len(recs), "failed": len(recs) - len(ok), "tokens": tokens, "seconds": seconds,
            "tok_per_s": _ratio(tokens, seconds), "server_tok_per_s": sum(server) / len(server) if server else None,
            "draft_tokens": drafted if spec else None, "accepted_tokens": accepted if spec else None,
            "drafts": drafts if with_drafts else None, "acceptance_rate": _ratio(accepted, drafted),
            "tau": 1 + acc_d / drafts if drafts else None,
            "tokens_per_forward": _per_forward(spec_tokens, accepted) if spec else None,
            "per_position": per_position, "per_position_conditional": conditional(per_position),
            "drafted_by_position": [round(drafts)] + [round(c) for c in counts[:-1]] if drafts else []}


def assemble(url: str, reference: Optional[str], engine: str, model: Optional[str], options: ProbeOptions,
             requests: list[dict]) -> dict:
    """Per-request records -> the probe's report (JSON-ready)."""
    probes = [r for r in requests if r["mode"] != "reference"]
    modes = sorted({r["mode"] for r in probes}, key=["greedy", "sampled"].index)
    categories = list(dict.fromkeys(r["category"] for r in probes))
    by_category = [dict(_group([r for r in probes if r["category"] == c and r["mode"] == m]), name=c, mode=m)
                   for m in modes for c in categories]
    refs = [r for r in requests if r["mode"] == "reference"]
    identity = None
    if reference:
        compared = [r for r in refs if r.get("identical") is not None]
        bugs = [r for r in compared if not r["identical"] and not r["near_tie"]]
        identity = {"reference": reference, "compared": len(compared), "prompts": len(refs),
                    "identical": sum(r["identical"] for r in compared),
                    "near_ties": sum(r["near_tie"] for r in compared),
                    "differs": len(bugs), "errors": sum(bool(r["error"]) for r in refs),
                    "passed": bool(compared) and not bugs and len(compared) == len(refs)}
    errors = [r for r in requests if r["error"]]
    whole = {m: _group([r for r in probes if r["mode"] == m]) for m in modes}
    g = whole.get("greedy", {})
    head = (f"draft acceptance {_f(g.get('acceptance_rate'))}, τ {_f(g.get('tau'))}, tokens per target forward "
            f"{_f(g.get('tokens_per_forward'))} (greedy)")
    if identity is None:
        verdict = f"{head}; greedy identity with the engine unspeculated not checked (no --reference)"
    elif identity["passed"]:
        verdict = (f"greedy output identical to the reference on {identity['identical']}/{identity['prompts']} prompts"
                   + (f" ({identity['near_ties']} near-tie flips)" if identity["near_ties"] else "") + f"; {head}")
    else:
        verdict = (f"greedy output DIFFERS from the reference on {identity['differs']}/{identity['prompts']} prompts"
                   + (f" ({identity['errors']} without an answer)" if identity["errors"] else "") + f"; {head}")
    return {"url": base_url(url), "engine": engine, "model": model, "options": asdict(options),
            "verdict": verdict, "correct": identity is None or identity["passed"], "errors": len(errors),
            "by_mode": whole, "by_category": by_category, "identity": identity, "requests": requests}


def format_probe(d: dict) -> str:
    """The probe's answers, for the terminal."""
    lines = [f"engine {d['engine']} · model {d['model']} · {d['url']}"]
    for mode, g in d["by_mode"].items():
        lines.append(f"{mode}: {g['requests']} requests, {g['tokens']} tokens, {_f(g['tok_per_s'], '.1f')} tok/s"
                     + (f" (server {_f(g['server_tok_per_s'], '.1f')})" if g["server_tok_per_s"] else "")
                     + f" · draft acceptance {_f(g['acceptance_rate'])} · τ {_f(g['tau'])} · tokens per target "
                       f"forward {_f(g['tokens_per_forward'])}")
        if g.get("accepted_lengths"):
            lines.append("   drafted steps keeping 0, 1, 2, … drafts (the engine's per-request counts): "
                         + " ".join(str(round(n)) for n in g["accepted_lengths"]))
        if g["per_position"]:
            lines.append("   acceptance by position: " + " ".join(f"{a:.2f}" for a in g["per_position"])
                         + " · α_i: " + " ".join(_f(a) for a in g["per_position_conditional"]))
    for c in d["by_category"]:
        lines.append(f"   {c['mode']} {c['name']}: acceptance {_f(c['acceptance_rate'])} τ {_f(c['tau'])} per forward "
                     f"{_f(c['tokens_per_forward'])} · {_f(c['tok_per_s'], '.1f')} tok/s")
    for r in d["requests"]:
        if r["mode"] == "reference" and r.get("divergence"):
            dv = r["divergence"]
            lines.append(f"   prompt {r['id']}: character {dv['index']} after {dv['context']!r}: speculative "
                         f"{dv['spec']!r} vs reference {dv['reference']!r}, top-2 gap {_f(dv['top2_gap'], '.2e')}"
                         + (" (near-tie)" if r["near_tie"] else ""))
        if r["error"]:
            lines.append(f"   prompt {r['id']} ({r['mode']}): {r['error']}")
    if d.get("local"):
        lines += side_by_side(d)
    lines.append("verdict: " + d["verdict"])
    if d.get("local_verdict"):
        lines.append("served vs local: " + d["local_verdict"])
    return "\n".join(lines)


def side_by_side(d: dict) -> list[str]:
    """probe --local: the server's and specviz's acceptance by position, one line each."""
    s, m = d["served"], d["local"]
    return [f"acceptance by position (accepted at i / drafts), greedy, γ={m['gamma']}:",
            f"   served ({d['engine']}, {_f(s['drafts'], '.0f')} drafts): " + " ".join(f"{a:.2f}" for a in
                                                                                  s["per_position"]),
            f"   local  (specviz {m['method']}, {m['dtype']}, {m['drafts']} drafts): " + " ".join(
                f"{a:.2f}" for a in m["per_position"])]


def to_html(d: dict) -> str:
    """The probe as one self-contained page, in check's report family (its CSS, tables, KPIs and α_i figure)."""
    from specviz.check import report

    fig = report.Figures()
    f = report.fmt
    kpis = []
    for mode, g in d["by_mode"].items():
        kpis += [(f"{mode}: draft acceptance", f(g["acceptance_rate"])), (f"{mode}: τ per drafted step", f(g["tau"])),
                 (f"{mode}: tokens per target forward", f(g["tokens_per_forward"])),
                 (f"{mode}: tok/s (wall, per request)", f(g["tok_per_s"], ".1f"))]
        if g["server_tok_per_s"]:
            kpis.append((f"{mode}: tok/s (server's own timing)", f(g["server_tok_per_s"], ".1f")))
    body = [f"<h1>specviz probe: {escape(str(d['model']))} served by {escape(d['engine'])}</h1>",
            f"<div class='meta'>{escape(d['url'])} · {len({r['id'] for r in d['requests']})} prompts · "
            f"{d['options']['max_new_tokens']} new tokens · sampled at T={d['options']['temperature']:g}, seed "
            f"{d['options']['seed']} · one request at a time</div>",
            f"<div class='verdict {'ok' if d['correct'] and not d['errors'] else 'bad'}'>{escape(d['verdict'])}</div>",
            '<div class="kpis">' + "".join(f'<div class="kpi"><b>{v}</b><span>{escape(k)}</span></div>'
                                           for k, v in kpis) + "</div>",
            "<p class='note'>Draft acceptance = accepted / drafted tokens; τ = 1 + accepted / drafts (tokens per "
            "drafted step, the bonus token included; from the server's /metrics around each request); tokens per "
            "target forward = n / (n − accepted) over every decode step, drafted or not. Drafted and accepted "
            "tokens come from each response where the engine reports them (llama.cpp's timings, SGLang's "
            "meta_info), else from the /metrics deltas around the request.</p>",
            "<h2>By category</h2>",
            report.table(["mode", "category", "requests", "tokens", "draft acceptance", "τ", "tokens / forward",
                           "tok/s"],
                          [[c["mode"], escape(str(c["name"])), str(c["requests"]), str(c["tokens"]),
                            f(c["acceptance_rate"]), f(c["tau"]), f(c["tokens_per_forward"]), f(c["tok_per_s"], ".1f")]
                           for c in d["by_category"]], {2, 3, 4, 5, 6, 7})]
    for mode, g in d["by_mode"].items():
        figure = report.alpha_position_figure({"alpha_by_position": g["per_position_conditional"],
                                               "drafted_by_position": g["drafted_by_position"]})
        if figure is not None:
            figure.update_layout(title=f"{mode}: α_i, P(position i accepted | earlier ones accepted)")
            body.append(fig(figure))
    if d["identity"]:
        idn = d["identity"]
        body.append(f"<h2>Greedy identity against {escape(idn['reference'])}</h2>")
        rows = []
        for r in d["requests"]:
            if r["mode"] != "reference":
                continue
            dv = r.get("divergence")
            if r["error"]:
                status, where = report.mark(False, "", "no answer"), escape(r["error"])
            elif dv is None:
                status, where = report.mark(True, "identical"), "–"
            else:
                status = '<span class="tie">near-tie</span>' if r["near_tie"] else '<span class="fail">differs</span>'
                where = (f"character {dv['index']}: …{report.token(dv['context'])} then speculative "
                         f"{report.token(dv['spec'])} vs reference {report.token(dv['reference'])}; reference top-2 "
                         f"log-prob gap {f(dv['top2_gap'], '.2e')}")
            rows.append([escape(str(r["id"])), escape(str(r["category"])), escape(r["prompt"][:70]), status, where])
        body.append(report.table(["id", "category", "prompt", "greedy identity", "first divergence"], rows))
    if d.get("local"):
        s, m = d["served"], d["local"]
        n = max(len(s["per_position"]), len(m["per_position"]))
        at = lambda xs, i: f(xs[i]) if i < len(xs) else "–"  # noqa: E731
        body += [f"<h2>Served beside specviz (probe --local: {escape(m['method'])}, {escape(m['dtype'])}, "
                 f"γ={m['gamma']}, greedy)</h2>",
                 f"<div class='verdict {'ok' if d['comparison'].get('agree') else 'bad'}'>"
                 f"{escape(d['local_verdict'])}</div>",
                 report.table(["position", f"served ({escape(d['engine'])})", "local (specviz)", "gap"],
                               [[str(i), at(s["per_position"], i), at(m["per_position"], i),
                                 at(d["comparison"]["gaps"], i)] for i in range(n)], {1, 2, 3})]
    rows = [[escape(str(r["id"])), escape(str(r["category"])), r["mode"], str(r.get("completion_tokens") or "–"),
             f(r.get("acceptance_rate")), f(r.get("tau")), f(r.get("tokens_per_forward")),
             f(r.get("tok_per_s"), ".1f"), escape(str(r.get("source") or "–")), escape(r["error"] or "")]
            for r in d["requests"] if r["mode"] != "reference"]
    body += ["<h2>Requests</h2>", report.table(["id", "category", "mode", "tokens", "draft acceptance", "τ",
                                                  "tokens / forward", "tok/s", "figures from", "error"], rows,
                                                 {3, 4, 5, 6, 7})]
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>specviz probe: "
            f"{escape(d['verdict'])}</title><style>{report.CSS}</style></head><body>{''.join(body)}</body></html>")
