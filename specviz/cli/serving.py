"""`python -m specviz watch` and `probe`: a drafter where it is served (specviz/serving/; docs/serving.md)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specviz.cli.bench import read_prompts
from specviz.cli.common import DEFAULTS, InputError, float_arg, int_arg


def serving_parsers(sub) -> None:
    """watch and probe: a serving engine (vLLM, llama.cpp, SGLang, TensorRT-LLM) through its /metrics and its API."""
    from specviz.serving import probe, watch
    from specviz.serving.engines import DRAFTERS

    w = sub.add_parser("watch", help="live speculative-decoding figures from a serving engine's /metrics")
    w.add_argument("url", help="the server, e.g. http://127.0.0.1:8080 (its /metrics is scraped)")
    w.add_argument("--interval", default=str(watch.INTERVAL), help="seconds between scrapes (default %(default)s)")
    w.add_argument("--duration", default=None, help="stop after this many seconds (default: until interrupted)")
    w.add_argument("--json", default=None, help="write the time series and the summary as JSON here")
    w.add_argument("--gamma", default=None, help="the engine's drafted tokens per step, for the prediction (default: "
                   "the positions it exports, else its mean draft length)")
    w.add_argument("--cost-ratio", default="0", help="c, one draft step / one target step, for the prediction "
                   "(default %(default)s: drafting is free, an upper bound)")
    w.add_argument("--drafter", default=None, help="what drafts on the server (ngram, eagle, draft, medusa, ...): the "
                   "verdict judges acceptance by position against what that kind leads one to expect")
    pb = sub.add_parser("probe", help="a prompt file through a server's OpenAI-compatible API, greedy and sampled: α, "
                        "τ, tok/s per category; greedy identity against --reference (exit 1 when it differs)")
    pb.add_argument("url", help="the server, e.g. http://127.0.0.1:8080")
    pb.add_argument("--prompts", required=True, help="JSONL (id/question_id, category, prompt or turns) or one prompt "
                    "a line")
    pb.add_argument("--limit", type=int, default=None, help="at most N prompts, round-robin across categories")
    pb.add_argument("--max-new-tokens", default=DEFAULTS.max_new_tokens, help="per request (default %(default)s)")
    pb.add_argument("--temperature", default=probe.SAMPLED_TEMPERATURE, help="of the sampled pass; 0 = greedy only "
                    "(default %(default)s)")
    pb.add_argument("--seed", default=DEFAULTS.seed, help="sent with every request (default %(default)s)")
    pb.add_argument("--reference", default=None, help="the same model served without speculation: every greedy "
                    "answer must equal its answer")
    pb.add_argument("--json", default=None, help="write every figure as JSON here")
    pb.add_argument("--html", default=None, help="write a self-contained HTML report here")
    pb.add_argument("--local", action="store_true", help="also run the same drafter in specviz on the same prompts "
                    "(chat template, greedy, chain length) and compare acceptance by position with the server's")
    pb.add_argument("--drafter", default=None, help="with --local (required there): the drafter the server runs "
                    f"({', '.join(DRAFTERS['vllm'])} or a drafter folder)")
    pb.add_argument("--gamma", default=None, help="with --local: drafted tokens per step (default: the server's "
                    "positions, else 3)")
    engine_parsers(sub)


def engine_parsers(sub) -> None:
    """export and serve: a drafter trained here into the layouts engines load, served by the real engine."""
    from specviz.serving import engines
    from specviz.serving.engine_export import KINDS
    from specviz.serving.export_common import FORMATS

    ex = sub.add_parser("export", help="the target or a drafter in the layouts serving engines load (vLLM, SGLang, "
                        "llama.cpp), checked by loading it back; a README in each folder gives the serving command")
    ex.add_argument("what", help=f"target, {', '.join(KINDS)} (the shipped drafters) or a drafter folder trained here")
    ex.add_argument("--target", default="smollm2-135m", help="the target spec (default %(default)s)")
    ex.add_argument("--out", default=None, help="the folder to write (default out/export/NAME); a drafter's export "
                    "also needs the target's, which is written once and kept under out/export/TARGET")
    ex.add_argument("--force", action="store_true", help="export again even when out/ holds this export")
    ex.add_argument("--format", default=FORMATS[0], help=f"a drafter's format, one of {', '.join(FORMATS)}: native "
                    "(each method's engine layout, the default), speculators (vLLM's: EAGLE-3, served by `vllm serve "
                    "DRAFTER`), gguf (llama.cpp's: EAGLE-3 and DFlash; native writes the draft model's GGUF)")
    sv = sub.add_parser("serve", help="serve the target with a drafter on a real engine (vLLM or llama.cpp) at "
                        "127.0.0.1, exporting what it needs; stops the engine on Ctrl-C or exit")
    sv.add_argument("--engine", required=True, help=f"one of {', '.join(engines.ENGINES)}")
    sv.add_argument("--drafter", required=True, help=f"{', '.join(('ngram', *KINDS))}, or a drafter folder trained "
                    f"here (vLLM: all; llama.cpp: {', '.join(engines.DRAFTERS['llama.cpp'])}); {engines.NO_DRAFTER}: "
                    "the engine without speculation, the --reference of a probe")
    sv.add_argument("--format", default="native", help="the drafter export's format: native (default) or "
                    "speculators (vLLM with --drafter eagle: the drafter folder alone, naming the target)")
    sv.add_argument("--port", default=None, help="the port on 127.0.0.1 (default: a free one)")
    sv.add_argument("--duration", default=None, help="stop after this many seconds (default: until Ctrl-C)")
    sv.add_argument("--log", default=None, help="the engine's output goes here (default: a file under /tmp)")


def cmd_watch(args) -> int:
    """Scrape a server's /metrics until --duration; exit 2 when it cannot be read or exports no speculation."""
    from specviz.serving import watch
    from specviz.serving.prometheus import ServerError, base_url

    interval = float_arg("interval", args.interval, 0.1, 3600)
    duration = None if args.duration is None else float_arg("duration", args.duration, 0.1, 1e7)
    gamma = None if args.gamma is None else int_arg("gamma", args.gamma, 1, 64)
    cost = float_arg("cost-ratio", args.cost_ratio, 0, 100)
    try:
        base_url(args.url)
        watch.run(args.url, interval, duration, gamma, args.json, cost,
                  command="python -m specviz " + " ".join(sys.argv[1:]), drafter=args.drafter)
    except ServerError as exc:
        raise InputError(str(exc)) from None
    return 0


def cmd_probe(args) -> int:
    """Exit 0 when greedy answers equal the reference's (or there is none), 1 when not, 2 for bad input or a request
    that failed."""
    from specviz.config import DecodeConfig
    from specviz.serving import probe
    from specviz.serving.prometheus import ServerError, base_url

    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    gamma = None if args.gamma is None else int_arg("gamma", args.gamma, 1, 16)
    if args.local and args.drafter is None:
        raise InputError("probe --local needs --drafter: the drafter the server runs (ngram, eagle, medusa, draft or a "
                         "drafter folder)")
    if args.local:
        from specviz.serving import engines

        try:
            engines.drafter_kind(args.drafter)
        except engines.ServeError as exc:
            raise InputError(str(exc)) from None
    try:
        for url in (args.url, args.reference):
            if url is not None:
                base_url(url)
        rows = read_prompts(args.prompts, None, args.limit)
        options = probe.ProbeOptions(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed)
        expect = None
        if args.local:  # the served vocabulary must be the target's that --local runs (serving/local.py)
            from specviz.serving import local, vocab

            expect = vocab.expected_for(local.TARGET)
        data = probe.run_probe(args.url, rows, options, args.reference, log=lambda line: print(line, flush=True),
                               expect=expect)
    except ServerError as exc:
        raise InputError(str(exc)) from None
    data["command"] = "python -m specviz " + " ".join(sys.argv[1:])
    if args.local:
        from specviz.serving import local

        served = local.served_figures(data)
        k = gamma or len(served["per_position"]) or 3
        data["served"] = served
        data["local"] = local.run_local(rows, args.drafter, k, cfg.max_new_tokens,
                                        log=lambda line: print(line, flush=True))
        data["comparison"] = local.compare(served, data["local"], local.served_weights(data.get("model")))
        data["local_verdict"] = data["comparison"]["verdict"]
    print(probe.format_probe(data))
    for path, text in ((args.json, lambda: json.dumps(data, indent=1, ensure_ascii=False)),
                       (args.html, lambda: probe.to_html(data))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text(), encoding="utf-8")
            print(f"wrote {path}")
    return 2 if data["errors"] else (0 if data["correct"] else 1)


def cmd_export(args) -> int:
    """Exit 0 with the folder written (or reused), 2 for bad input."""
    from specviz.serving import engine_export as ee

    try:
        fmt = ee.check_format(args.format)
        folder = None if args.what == "target" else ee.drafter_folder(args.what)  # a bad name fails first
        if args.out:  # a folder of other files, or another source's export, is never replaced
            ee.check_out(Path(args.out), args.target if folder is None else str(folder))
        if folder is None and fmt != ee.NATIVE:
            raise ee.ExportError(f"format={fmt!r} is a drafter's format: the target has one layout (leave --format "
                                 "out)")
        if folder is not None and fmt != ee.NATIVE:
            ee.exporter(ee.read_drafter(folder)[0].kind, fmt)  # a method without this format fails before the target
        target_out = Path(args.out) if args.out and folder is None else None
        target = ee.export_target(args.target, out=target_out, force=args.force)
        if folder is not None:
            ee.export_drafter(folder, target, args.target, out=Path(args.out) if args.out else None,
                              force=args.force, fmt=fmt)
    except ee.ExportError as exc:
        raise InputError(str(exc)) from None
    return 0


def cmd_serve(args) -> int:
    """Serve until Ctrl-C, SIGTERM or --duration; exit 2 when the engine cannot start or dies."""
    import signal
    import time

    from specviz.serving import engines

    port = None if args.port is None else int_arg("port", args.port, 1, 65535)
    duration = None if args.duration is None else float_arg("duration", args.duration, 0.1, 1e7)

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        plan = engines.plan(args.engine, args.drafter, port, fmt=args.format)
        how = f"with drafter {plan.drafter} (γ={plan.gamma})" if plan.speculative else "without speculation"
        print(f"starting {plan.engine} {how} on {plan.url}: {plan.command}", flush=True)
        t0 = time.monotonic()
        with engines.Engine(plan, log_path=Path(args.log) if args.log else None) as engine:
            print(f"serving at {engine.url} (ready in {time.monotonic() - t0:.0f} s; engine process group "
                  f"{engine.pgid}; log {engine.log})", flush=True)
            if plan.speculative:
                print(f"  watch: {engines.watch_command(engine.url, args.drafter)}", flush=True)
                print(f"  probe: {engines.probe_command(engine.url, args.drafter)}", flush=True)
            else:  # the reference `probe --reference` compares greedy answers with
                print(f"  the reference of a probe: python -m specviz probe URL ... --reference {engine.url}",
                      flush=True)
            print("Ctrl-C stops it", flush=True)
            end = None if duration is None else time.monotonic() + duration
            while end is None or time.monotonic() < end:
                if engine.proc.poll() is not None:
                    raise engines.ServeError(f"{plan.engine} stopped by itself: {engine.tail()} (log: {engine.log})")
                time.sleep(0.5)
    except engines.ServeError as exc:
        raise InputError(str(exc)) from None
    except KeyboardInterrupt:
        print("stopped the engine", flush=True)
        return 0
    print("stopped the engine", flush=True)
    return 0


SERVING_COMMANDS = {"watch": cmd_watch, "probe": cmd_probe, "export": cmd_export, "serve": cmd_serve}
