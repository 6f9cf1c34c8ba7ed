"""`python -m specviz bench`: methods against AR over a prompt file, per prompt and per category, as JSON and a
table; the prompt file's reader and the stock AR references."""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path

from specviz import hardware, prompts
from specviz import methods as registry
from specviz.cli.common import InputError, config_of, draft_for, load_target, tune
from specviz.config import DecodeConfig, parse_gamma
from specviz.errors import ConfigError
from specviz.hardware import DEFAULT_RACE, DYNAMIC, method_spec


def _bench_methods(specs: list[str], args) -> dict[str, tuple[str, str | None, dict, str | None]]:
    """--method entries `name[:gamma][+pld[:n]][+ret[:n]][@drafter]` → {label: (method, gamma or None, branches,
    what it drafts with)}. `@` names a drafter folder (or Hub id) for a trained method, a draft model for vanilla, so
    one run can race two drafters of the same kind over the same AR baseline; without it, --drafter / --draft. `+pld`
    and `+ret` graft prompt lookup's and the datastore's continuation onto a tree drafter's tree
    (DecodeConfig.lookup, retrieve)."""
    out = {}
    for spec in specs:
        name, gamma, grafts, at, what = method_spec(spec)
        if name not in registry.SPECULATIVE:
            raise ConfigError(f"method={name!r} is not benchmarkable: use {', '.join(registry.SPECULATIVE)}, "
                              "optionally with :gamma, +pld, +ret and @drafter (AR is always the baseline)")
        if at and (not registry.spec(name).has_weights or not what):
            raise ConfigError(f"method={spec!r}: @ names a drafter folder (eagle, medusa, layerskip, draft) or a draft "
                              "model (vanilla), e.g. eagle@out/train/eagle/drafter; pld drafts from the prompt")
        out[spec] = (name, gamma or None, _stored_tree(name, gamma, grafts, args), what or draft_for(args, name))
    return out


def _stored_tree(name: str, gamma: str, grafts: dict, args) -> dict:
    """A tree drafter's entry that writes its γ and no +dyn races the drafter's stored tree cut to that depth (DFlash:
    its block's first γ slots as a chain), as tuning.race_name writes a race and the start line names one, unless
    --tree says otherwise; a bare entry races the method's tree here (config_of)."""
    if gamma and "tree" not in grafts and args.tree is None and registry.spec(name).tree:
        return {**grafts, "tree": "static"}
    return grafts


def _in_full(spec: str, args) -> str:
    """A bench entry with the branches it leaves out written in: a tree drafter's entry without +pld or +ret grafts
    the branch --lookup / --retrieve give, else this machine's default race's (config_of), and its label names it;
    where that race grows a dynamic tree (DFlash's whole block: hardware.CPU_TREES) the label names its γ and nodes
    too (dflash → dflash:7+pld:4+ret:2+dyn:8)."""
    name, gamma, grafts, _, _ = method_spec(spec)
    grafts = _stored_tree(name, gamma, grafts, args)
    head, at, drafter = spec.partition("@")
    branches = config_of(args, name)
    for kind, key in (("pld", "lookup"), ("ret", "retrieve")):
        if key in registry.spec(name).grafts and key not in grafts and getattr(branches, key):
            head += f"+{kind}:{getattr(branches, key)}"
    if branches.tree == "dynamic" and "tree" not in grafts and "lookup" in registry.spec(name).grafts:
        first, *rest = head.split("+")
        head = "+".join([first if gamma else f"{first}:{branches.gamma}", *rest, f"{DYNAMIC}:{branches.tree_nodes}"])
    return head + at + drafter


def _races(specs: list[str], args) -> list[str]:
    """The --method entries as this machine races them, each saying so on stderr where it differs: `default` as the
    race it is here, a tree entry's left-out branches written in (_in_full), and a race named twice (`default pld:4`
    where the default is pld:4) raced once, in one row: the same race twice would time the same thing twice."""
    given = specs
    if DEFAULT_RACE in specs:  # named by the race it is here
        specs = [hardware.default_pair().race() if m == DEFAULT_RACE else m for m in specs]
        print(f"specviz: bench --method {' '.join(given)} races {' '.join(specs)}", file=sys.stderr)
    named = [_in_full(m, args) for m in specs]
    if named != specs:  # a tree entry without +pld/+ret races this machine's branches: its label says which
        print(f"specviz: bench --method {' '.join(specs)} races {' '.join(named)} (the branches left out are this "
              "machine's default race's; +pld:0+ret:0 races the tree alone)", file=sys.stderr)
        specs = named
    once = list(dict.fromkeys(specs))
    if once != specs:
        twice = [m for m in once if specs.count(m) > 1]
        print(f"specviz: bench --method {' '.join(given)} names {' '.join(twice)} more than once: each race runs once, "
              "in one row", file=sys.stderr)
    return once


def _bench_configs(methods: dict, args) -> dict[str, DecodeConfig]:
    """Each entry's decode settings: the command line's, its own γ and branches over them."""
    return {label: config_of(args, m, grafts).with_(**({"gamma": parse_gamma(g)} if g else {}))
            for label, (m, g, grafts, _) in methods.items()}


def read_prompts(path: str | None, categories: list[str] | None, limit: int | None,
                 built_in: list[dict] | None = None) -> list[dict]:
    """specviz.prompts.read (no path: the `built_in` rows), then the categories and the round-robin --limit (a small
    sample still spans them); a bad file or value is one InputError line."""
    try:
        rows = prompts.pick((built_in or []) if path is None else prompts.read(path), categories, limit,
                            source="the built-in prompts" if path is None else path)
    except prompts.PromptFileError as exc:
        raise InputError(str(exc)) from None
    if not rows:
        raise InputError(f"prompt file {path!r} holds no prompts")
    return rows


def _hf_assisted(target, draft, ids: list[int], cfg: DecodeConfig) -> tuple[list[int], float]:
    """transformers' own assisted generation with the same draft and γ, greedy, timed."""
    import torch

    from specviz.core.cache import clock

    input_ids = torch.tensor([ids], device=target.device)
    kwargs = dict(assistant_model=draft.model, max_new_tokens=cfg.max_new_tokens, do_sample=False,
                  num_assistant_tokens=cfg.initial_gamma(), num_assistant_tokens_schedule="constant",
                  eos_token_id=sorted(target.eos_ids), pad_token_id=sorted(target.eos_ids)[0])
    with torch.inference_mode():
        t0 = clock(target.device)
        out = target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        t1 = clock(target.device)
    return [int(t) for t in out[0, len(ids):]], t1 - t0


def cmd_bench(args) -> int:
    from tqdm import tqdm

    from specviz import engines, metrics
    from specviz.models import drafts
    from specviz.serving.export import Exporter

    specs = args.method or ["vanilla", "pld"]
    _bench_configs(_bench_methods(specs, args), args)  # a bad entry or setting fails before the model loads
    what_if_values(args.what_if)  # so does a --what-if value that is neither a profile file nor a device
    prompts = read_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit)
    counters = Exporter() if args.metrics_file else None  # --metrics-file: vLLM's spec_decode names
    if counters:
        counters.write(args.metrics_file)  # at zero: a path that cannot be written fails before any run
    target = load_target(args)
    # the start line prices a run of these prompts (their median length's prefill)
    args.prompt_tokens = int(statistics.median([len(target.encode_prompt(r["prompt"])) for r in prompts] or [0]))
    tune(args, target, [method_spec(m)[0] for m in specs] + specs)
    args.method = specs = _races(specs, args)
    methods = _bench_methods(specs, args)
    cfgs = _bench_configs(methods, args)
    base = config_of(args, "ar", {"lookup": 0, "retrieve": 0, "tree": "static"})
    built = {label: engines.build(m, target, what) for label, (m, _, _, what) in methods.items()}
    ar = engines.build("ar", target)
    draft = drafts.load_draft(args.draft, target) if args.compare_hf else None
    # a trained drafter's compressed vocabulary (target ids); None for the full one and other methods
    vocabs = {label: getattr(engine, "draft_vocab_ids", None) for label, engine in built.items()}
    refs = _reference_ars(target) if args.ar_reference else {}
    _warm_up(target, [ar, *built.values(), *refs.values()], base)
    rows, runs = [], {label: [] for label in built}  # runs: each method's (events, AR's events) per prompt
    for row in tqdm(prompts, desc="bench", unit="prompt", file=sys.stderr):
        ids = target.encode_prompt(row["prompt"])
        ar_run = engines.generate(ar, ids, base)
        ar_sum = metrics.summarize("ar", ar_run.events)
        results = _run_methods(ids, built, cfgs, refs, base, counters, runs, ar_run.events)
        if draft is not None:
            hf_ids, hf_s = _hf_assisted(target, draft, ids, base)
            results.append(("hf-assisted", hf_ids, hf_s, None, None, None))
        rows += [_bench_row(row, result, ar_run.token_ids, ar_sum, base.greedy, vocabs) for result in results]
        if counters:
            counters.write(args.metrics_file)
    summary = with_fastest_plain([_summarize_rows(m, [r for r in rows if r["method"] == m])
                                  for m in dict.fromkeys(r["method"] for r in rows)])
    why = why_it_misses(summary, prompts, runs)
    report = _bench_report(args, target, base, summary, rows)
    tables = what_if_tables(target, built, methods, runs, args.what_if) if args.what_if else {}
    report["what_if"] = {label: t["rows"] for label, t in tables.items()} or None
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(format_summary(summary))
    for label, line in why.items():
        print(f"{label}: {line}")
    for label, t in tables.items():
        print(f"\n{label}: {t['text']}")
    print(f"wrote {args.json}")
    return 0


def why_it_misses(summary: list[dict], rows: list[dict], runs: dict) -> dict[str, str]:
    """Each speculative method's summary gets "misses" (check/misses.py over its events, by the prompts'
    categories); returns its one-line summary by method."""
    from specviz.check import misses

    lines = {}
    for s in summary:
        if s["method"] in runs:
            s["misses"] = misses.analyse((row["category"], events) for row, (events, _) in zip(rows, runs[s["method"]]))
            lines[s["method"]] = misses.summary_line(s["misses"])
    return lines


def what_if_values(values: list[str] | None) -> list:
    """--what-if's values as profile clocks and devices (whatif.clock_or_device): a bad one is one InputError line."""
    from specviz import whatif

    try:
        return [whatif.clock_or_device(v) for v in values or []]
    except whatif.WhatIfError as exc:
        raise InputError(str(exc)) from None


def what_if_tables(target, built: dict, methods: dict, runs: dict, values: list[str]) -> dict:
    """Each method's steps, pooled over the prompts, re-timed on this machine (its verify profile), on each profile
    file (with the method's drafter cost where the file has one) and on each named device's roofline bound:
    {label: {"rows": [...], "text": the table}}."""
    from specviz import whatif
    from specviz.core.profile import profile_of

    here = profile_of(target)
    out = {}
    for label, engine in built.items():
        rec = whatif.Recorded.pooled(runs[label])
        files = [v for v in values if Path(v).is_file()]
        clocks = [whatif.profile_clock(v, methods[label][0]) for v in files]
        devices = [whatif.device(v) for v in values if v not in files]
        rows = whatif.table(rec, here, whatif.target_of(target.model, engine), devices, clocks)
        out[label] = {"rows": [r.to_dict() for r in rows], "text": whatif.format_table(rows, rec.measured_speedup)}
    return out


def _warm_up(target, engines_: list, base: DecodeConfig) -> None:
    """One short untimed run of every engine (first-call allocations)."""
    from specviz import engines

    warm_ids = target.encode_prompt("Hello")
    for e in engines_:
        engines.generate(e, warm_ids, base.with_(max_new_tokens=16, method=e.method))


def _run_methods(ids: list[int], built: dict, cfgs: dict, refs: dict, base: DecodeConfig, counters,
                 runs: dict | None = None, ar_events=None) -> list[tuple]:
    """One prompt through every method, then every stock AR reference: (label, token ids, seconds, α, τ,
    RepeatSplit) each, α, τ and the split None for the references. The methods' counters go to `counters`, their
    events beside AR's to `runs` (label -> list)."""
    from specviz import engines, metrics
    from specviz.core.lookup import RepeatSplit

    results = []
    for m in built:
        run = engines.generate(built[m], ids, cfgs[m])
        s = metrics.summarize(m, run.events)
        if runs is not None:
            runs[m].append((run.events, ar_events))
        if counters:
            counters.observe_run(run.events, m)
        results.append((m, run.token_ids, s.seconds, s.alpha, s.tau, RepeatSplit.of(ids, run.events)))
    for label, engine in refs.items():
        ref = engines.generate(engine, ids, base)
        results.append((label, ref.token_ids, metrics.summarize("ar", ref.events).seconds, None, None, None))
    return results


def _bench_row(row: dict, result: tuple, ar_ids: list[int], ar_sum, greedy: bool, vocabs: dict) -> dict:
    """One method's figures on one prompt, beside AR's on the same prompt."""
    from specviz.drafters import trained as drafters

    m, token_ids, seconds, alpha, tau, split = result
    n = len(token_ids)
    return {
        "id": row["id"], "category": row["category"], "method": m, "new_tokens": n, "token_ids": token_ids,
        "seconds": seconds, "tok_per_s": n / seconds if seconds else None,
        "ar_seconds": ar_sum.seconds, "ar_tok_per_s": ar_sum.tok_per_s, "ar_new_tokens": ar_sum.new_tokens,
        "speedup": ((ar_sum.seconds / ar_sum.new_tokens) / (seconds / n) if n and seconds and ar_sum.new_tokens
                    else None),
        "alpha": alpha, "tau": tau,
        "identical_to_ar": (token_ids == ar_ids) if greedy else None,
        # the share of AR's tokens a compressed draft vocabulary holds (the rest can never be drafted)
        "draft_vocab_coverage": drafters.coverage(vocabs.get(m), ar_ids),
        # the first draft where the answer repeats its context and elsewhere (does the drafter copy?)
        "first_draft": split.to_dict() if split else None,
    }


def _bench_report(args, target, base: DecodeConfig, summary: list[dict], rows: list[dict]) -> dict:
    """The JSON a bench writes: the command, the machine and versions, the settings, the summary and the rows."""
    import torch
    import transformers

    from specviz import hardware

    return {
        "command": "python -m specviz " + " ".join(sys.argv[1:]),
        "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
        "hardware": hardware.describe(target.device, target.dtype), "attention": target.attention,
        "pad_one_row": target.pad_one_row, "guarantee": target.guarantee,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}",
        "cpu": hardware.cpu_name(), "default_race": (getattr(args, "tuned_line", None)
                                                        or hardware.default_pair(target.device).why or None),
        "target": args.target, "draft": args.draft, "config": base.to_dict(),
        "summary": summary, "rows": rows,
    }


def _reference_ars(target) -> dict:
    """Plain AR as users run it elsewhere, beside the baseline: the same dtype with stock sdpa attention and no
    padding row ("ar-sdpa", when the baseline is the bitwise engine), and fp32 ("ar-fp32")."""
    import torch

    from specviz import engines
    from specviz.models import loader as models

    refs = {}
    if target.attention != "sdpa" or target.pad_one_row:
        refs["ar-sdpa"] = engines.build("ar", models.get(target.name, target.device, target.dtype, attention="sdpa"))
    if target.dtype != torch.float32:
        refs["ar-fp32"] = engines.build("ar", models.get(target.name, target.device, torch.float32))
    return refs


def _summarize_rows(method: str, rows: list[dict]) -> dict:
    """Totals over prompts: speedup = total AR seconds / total method seconds over the same tokens."""
    tokens = sum(r["new_tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    ar_tokens = sum(r["ar_new_tokens"] for r in rows)
    ar_seconds = sum(r["ar_seconds"] for r in rows)
    ar_rate = ar_tokens / ar_seconds if ar_seconds else None
    rate = tokens / seconds if seconds else None
    alphas = [(r["alpha"], r["tau"], r["new_tokens"]) for r in rows if r["alpha"] is not None]
    steps = sum(n / tau for _, tau, n in alphas if tau)
    identical = [r["identical_to_ar"] for r in rows]
    return {
        "method": method, "prompts": len(rows), "new_tokens": tokens, "tok_per_s": rate, "ar_tok_per_s": ar_rate,
        "speedup": rate / ar_rate if rate and ar_rate else None,
        "alpha": (sum(a * n for a, _, n in alphas) / sum(n for *_, n in alphas)) if alphas else None,
        "tau": (sum(n for *_, n in alphas) / steps) if steps else None,
        "identical_all": None if None in identical else all(identical),
        "draft_vocab_coverage": (sum(r["draft_vocab_coverage"] * r["ar_new_tokens"] for r in rows) / ar_tokens
                                 if ar_tokens and all(r.get("draft_vocab_coverage") is not None for r in rows)
                                 else None),
        "first_draft": _first_draft_total(rows),
    }


PLAIN = ("ar", "ar-sdpa", "ar-fp32")  # the plain decoders a bench times: specviz's AR and the stock references


def with_fastest_plain(summary: list[dict]) -> list[dict]:
    """Each method's headline speedup over the fastest plain decoder of the run (specviz's AR, every AR row's
    baseline, or a stock reference when one is faster), beside its speedup over specviz's own AR."""
    ar = next((s["ar_tok_per_s"] for s in summary if s["ar_tok_per_s"]), None)
    plain = {"ar": ar, **{s["method"]: s["tok_per_s"] for s in summary if s["method"] in PLAIN}}
    name, rate = max(((k, v) for k, v in plain.items() if v), key=lambda kv: kv[1], default=(None, None))
    for s in summary:
        s["baseline"] = name
        s["baseline_tok_per_s"] = rate
        s["speedup_over_fastest"] = s["tok_per_s"] / rate if s["tok_per_s"] and rate else None
    return summary


def _first_draft_total(rows: list[dict]) -> dict | None:
    """The rows' RepeatSplit counts added up (None for the reference runs, which draft nothing)."""
    from specviz.core.lookup import RepeatSplit

    splits = [RepeatSplit.from_dict(r["first_draft"]) for r in rows if r.get("first_draft")]
    return sum(splits, RepeatSplit()).to_dict() if splits else None


def format_summary(summary: list[dict]) -> str:
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    base = next((s for s in summary if s.get("baseline")), None)
    lines = [f"speedup: over the fastest plain decoder of the run ({base['baseline']}, "
             f"{base['baseline_tok_per_s']:.1f} tok/s); × AR: over specviz's own AR" if base else "",
             "| method | prompts | tokens | tok/s | AR tok/s | speedup | × AR | α | τ | identical "
             "| 1st draft right: repeats / new (share repeating) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        fd = s.get("first_draft") or {}
        split = (f"{f(fd.get('repeat_rate'), '.2f')} / {f(fd.get('new_rate'), '.2f')} "
                 f"({f(fd.get('repeat_share'), '.0%')})"
                 if fd else "-")
        lines.append(f"| {s['method']} | {s['prompts']} | {s['new_tokens']} | {f(s['tok_per_s'], '.1f')} | "
                     f"{f(s['ar_tok_per_s'], '.1f')} | {f(s.get('speedup_over_fastest'), '.2f')}× | "
                     f"{f(s['speedup'], '.2f')}× | {f(s['alpha'], '.2f')} | "
                     f"{f(s['tau'], '.2f')} | {f(s['identical_all'], '')} | {split} |")
    return "\n".join(lines)
