"""`python -m specviz generate`: one prompt, its tokens coloured by verdict in the terminal (with --race, beside plain
AR on the race clock, and the speedup)."""
from __future__ import annotations

import sys

from specviz import methods as registry
from specviz.cli.common import config_of, draft_for, load_target, tune


def cmd_generate(args) -> int:
    from specviz import metrics
    from specviz.config import check_prompt
    from specviz.core.profile import profile_of
    from specviz.engines import session
    from specviz.serving.export import Exporter
    from specviz.ui import render
    from specviz.ui.logic import short_label

    config_of(args, args.method)  # a bad setting fails before the model loads
    check_prompt(args.prompt)
    counters = Exporter() if args.metrics_file else None  # --metrics-file: vLLM's spec_decode names
    if counters:
        counters.write(args.metrics_file)  # at zero: a path that cannot be written fails before any run
    target = load_target(args)
    tune(args, target, [args.method])
    cfg = config_of(args, args.method)
    prepared = session.prepare(args.prompt, cfg, target, draft_for(args, cfg.method))
    colour = sys.stdout.isatty() and not args.no_color or args.color
    out = sys.stdout
    lanes = {"ar": [], "spec": []}
    speculative = registry.spec(cfg.method).speculative
    stream = prepared.race() if args.race and speculative else (
        session.Tick("spec", e, 0.0) for e in prepared.spec_steps())
    out.write(f"── {cfg.method} ──\n")
    for tick in stream:
        lanes[tick.lane].append(tick.event)
        if counters and tick.lane == "spec":
            counters.observe(tick.event, short_label(cfg))
        if tick.lane == "spec":
            out.write(render.to_ansi(render.spans([tick.event]), colour))
            out.flush()
    out.write("\n")
    if speculative:
        out.write("legend: "
                  + (render.legend_ansi() if colour else "accepted rejected discarded resampled bonus") + "\n")
    spec = metrics.summarize(cfg.method, lanes["spec"])
    line = f"{spec.new_tokens} tokens in {spec.seconds:.2f} s compute = {spec.tok_per_s:.1f} tok/s · τ={spec.tau:.2f}"
    if spec.alpha is not None:
        line += f" · α={spec.alpha:.2f}"
    out.write(line + "\n")
    if lanes["ar"]:
        # priced as the app prices a race: with this machine's verify profile (the calibration's where tune took one,
        # else measured now: about a second)
        cmp = metrics.compare(lanes["ar"], lanes["spec"], cfg.method, cfg.greedy, profile_of(target))
        out.write(f"AR: {cmp.ar.new_tokens} tokens = {cmp.ar.tok_per_s:.1f} tok/s · speedup {cmp.speedup:.2f}×")
        if cmp.predicted_speedup is not None:
            how = ("tree prediction, from each kind of node's acceptance" if cmp.prediction_formula ==
                   metrics.TREE_FORMULA else f"Leviathan prediction at α={cmp.spec.alpha:.2f}, γ={cmp.mean_gamma:.1f}")
            out.write(f" ({how}: {cmp.predicted_speedup:.2f}×, c={cmp.cost_ratio:.2f})")
        out.write("\n" + metrics.why_line(cmp) + "\n")
        if cmp.identical is not None:
            out.write("identical to plain decoding\n" if cmp.identical else
                      f"differs from plain decoding at token {cmp.first_divergence}\n")
    if counters:
        counters.write(args.metrics_file)
        out.write(f"wrote {args.metrics_file}\n")
    return 0
