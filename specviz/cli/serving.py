"""`python -m specviz watch` and `probe`: a drafter where it is served (specviz/serving/; docs/serving.md)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specviz.cli.bench import read_prompts
from specviz.cli.common import DEFAULTS, InputError, _float_arg, _int_arg


def serving_parsers(sub) -> None:
    """watch and probe: a serving engine (vLLM, llama.cpp, SGLang, TensorRT-LLM) through its /metrics and its API."""
    from specviz.serving import probe, watch

    w = sub.add_parser("watch", help="live speculative-decoding figures from a serving engine's /metrics")
    w.add_argument("url", help="the server, e.g. http://127.0.0.1:8080 (its /metrics is scraped)")
    w.add_argument("--interval", default=str(watch.INTERVAL), help="seconds between scrapes (default %(default)s)")
    w.add_argument("--duration", default=None, help="stop after this many seconds (default: until interrupted)")
    w.add_argument("--json", default=None, help="write the time series and the summary as JSON here")
    w.add_argument("--gamma", default=None, help="the engine's drafted tokens per step, for the prediction (default: "
                   "the positions it exports, else its mean draft length)")
    w.add_argument("--cost-ratio", default="0", help="c, one draft step / one target step, for the prediction "
                   "(default %(default)s: drafting is free, an upper bound)")
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


def cmd_watch(args) -> int:
    """Scrape a server's /metrics until --duration; exit 2 when it cannot be read or exports no speculation."""
    from specviz.serving import watch
    from specviz.serving.prometheus import ServerError, base_url

    interval = _float_arg("interval", args.interval, 0.1, 3600)
    duration = None if args.duration is None else _float_arg("duration", args.duration, 0.1, 1e7)
    gamma = None if args.gamma is None else _int_arg("gamma", args.gamma, 1, 64)
    cost = _float_arg("cost-ratio", args.cost_ratio, 0, 100)
    try:
        base_url(args.url)
        watch.run(args.url, interval, duration, gamma, args.json, cost,
                  command="python -m specviz " + " ".join(sys.argv[1:]))
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
    try:
        for url in (args.url, args.reference):
            if url is not None:
                base_url(url)
        rows = read_prompts(args.prompts, None, args.limit)
        options = probe.ProbeOptions(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed)
        data = probe.run_probe(args.url, rows, options, args.reference, log=lambda line: print(line, flush=True))
    except ServerError as exc:
        raise InputError(str(exc)) from None
    data["command"] = "python -m specviz " + " ".join(sys.argv[1:])
    print(probe.format_probe(data))
    for path, text in ((args.json, lambda: json.dumps(data, indent=1, ensure_ascii=False)),
                       (args.html, lambda: probe.to_html(data))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text(), encoding="utf-8")
            print(f"wrote {path}")
    return 2 if data["errors"] else (0 if data["correct"] else 1)
