"""Does the summary card's predicted speedup track the measured one for the default race (issue 43, item 2)? The
app's default race (the shipped CPU default, EAGLE's tree with both branches; --adopt: this machine's choice) on held-out training prompts (index 30000 on: never answered for
distillation, never Spec-Bench), greedy, as the /race endpoint runs it: per prompt the measured speedup, the
prediction compare() now makes (a tree race: metrics.tree_prediction, from per-node acceptance and the measured
T(rows)/T(1)), the chain formula it used before (Leviathan with γ = mean rows, priced by T(γ+1)/T(1)) and the
what-if clock's row for this machine (specviz/whatif.py), each with its error against the measured speedup.

    .venv/bin/python experiments/probes/tree_prediction_heldout.py --limit 6 > experiments/results/tree_prediction_heldout.txt
"""  # noqa: E501
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz import hardware, metrics, prompts, whatif  # noqa: E402
from specviz.core.profile import profile_of  # noqa: E402
from specviz.core.roofline import weight_bytes  # noqa: E402
from specviz.models import loader as models  # noqa: E402
from specviz.paths import TRAIN_PROMPTS  # noqa: E402
from specviz.ui import controls  # noqa: E402
from specviz.ui.logic import DEFAULTS, make_config, race_stream  # noqa: E402

HELD_OUT_FROM = 30000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    ap.add_argument("--adopt", action="store_true", help="race what this machine chooses at start-up (hardware.adopt; "
                    "on busy cores a noisy T(k) may choose a chain) instead of the shipped CPU default, EAGLE's tree")
    args = ap.parse_args()
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    profile = profile_of(target)  # as app.warm_up measures it before the first race
    print(f"# {hardware.cpu_name()}, {hardware.describe(target.device, target.dtype)}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.adopt:
        print(f"# default race: {hardware.adopt(target) or 'the pair defaults'}")
    pair = hardware.default_pair() if args.adopt else hardware.EMBEDDED_PAIR
    method = pair.method
    cfg = make_config(method, str(pair.gamma_for(method)), max_new_tokens=args.max_new_tokens,
                      lookup=str(pair.lookup_for(method)), retrieve=str(pair.retrieve_for(method)))
    cfg = cfg.with_(**controls.tree_settings(method, DEFAULTS.tree, DEFAULTS.tree_nodes))
    rows = prompts.pick(prompts.read(TRAIN_PROMPTS)[HELD_OUT_FROM:], limit=args.limit)
    print(f"# {len(rows)} training prompts from index {HELD_OUT_FROM} (held out), round-robin by category; "
          f"{cfg.method} γ={cfg.gamma} lookup={cfg.lookup} retrieve={cfg.retrieve}, {args.max_new_tokens} tokens")
    print("| prompt | category | measured | predicted (tree) | err | before (chain, γ = mean rows) | err | "
          "what-if here | err |")
    print("|---|---|---|---|---|---|---|---|---|")
    errs: dict[str, list[float]] = {"tree": [], "chain": [], "whatif": []}
    tgt = whatif.Target(weight_bytes(target.model), sum(p.numel() for p in target.model.parameters()))
    for r in rows:
        snap = None
        for snap in race_stream(r["prompt"], cfg, pair.draft, pair.target):
            pass
        c = snap.comparison
        ar_ev, spec_ev = snap.lanes["ar"].events, snap.lanes["spec"].events
        before = metrics.profiled_speedup(c.spec.alpha, round(c.mean_gamma), c.cost_ratio, profile)
        here = whatif.table(whatif.Recorded.of(spec_ev, ar_ev), profile, tgt, devices=[])[0].speedup
        line = [str(r["id"]), r["category"], f"{c.speedup:.2f}"]
        for key, value in (("tree", c.predicted_speedup), ("chain", before), ("whatif", here)):
            err = value / c.speedup - 1
            errs[key].append(abs(err))
            line += [f"{value:.2f}", f"{err:+.0%}"]
        print("| " + " | ".join(line) + " |", flush=True)
    for key, label in (("tree", "tree prediction (compare, the card)"), ("chain", "chain formula (before)"),
                       ("whatif", "what-if clock, this machine")):
        print(f"# {label}: mean |error| {statistics.mean(errs[key]):.1%}, worst {max(errs[key]):.1%}")


if __name__ == "__main__":
    main()
