"""Does a kernel variant make the race faster, step by step? (issue 40)

kernel_ab.py times the target's layers alone; this runs whole races. Each variant `name=source[:flags]` (as
kernel_ab.py builds them) runs AR and the lane on every question in turn, the variants in a random order per
question (the first question only warms up), and the table gives, per variant and lane: tok/s, the lane over AR
of the same variant, a step's milliseconds and how they split (race_step.py's columns: drafting, verification,
the target's forward inside it). The tokens of every variant must match the first's (greedy).

    .venv/bin/python experiments/probes/race_ab.py base=HEAD new=. --lane 1,4,0 --limit 10
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_ab import build  # noqa: E402
from race_step import QUESTIONS, time_forward  # noqa: E402

from specviz import engines, prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import fused, kernels  # noqa: E402
from specviz.models import loader as models  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="name=source[:flags]; the first is the baseline")
    ap.add_argument("--lane", default="1,4,0", help="gamma,lookup,retrieve of EAGLE's tree, or pld:G")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    common = dict(max_new_tokens=args.max_new_tokens, temperature=0.0)
    if args.lane.startswith("pld:"):
        lane = (engines.build("pld", target), DecodeConfig(method="pld", gamma=int(args.lane[4:]), **common))
    else:
        gamma, lookup, retrieve = (int(x) for x in args.lane.split(","))
        lane = (engines.build("eagle", target),
                DecodeConfig(method="eagle", gamma=gamma, lookup=lookup, retrieve=retrieve, **common))
    ar = (engines.build("ar", target), DecodeConfig(method="ar", **common))
    forward = time_forward(target)
    rows = prompts.pick(prompts.read(QUESTIONS), limit=args.limit + 1)
    totals: dict = {}
    tokens: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        libs = dict(build(spec, kernels.best_isa(), Path(tmp)) for spec in args.variants)
        for i, row in enumerate(rows):
            ids = target.encode_prompt(row["prompt"])
            for v in random.sample(list(libs), len(libs)):
                for kind, (engine, cfg) in (("ar", ar), ("lane", lane)):
                    with fused.run_on(libs[v]):
                        start, forward[0] = time.perf_counter(), 0.0
                        steps = list(engine.steps(ids, cfg.with_(seed=i)))
                        seconds = time.perf_counter() - start
                    if i == 0:
                        continue
                    t = totals.setdefault((v, kind), [0.0, 0, 0, 0.0, 0.0, 0.0])
                    for j, x in enumerate((seconds, sum(len(s.emitted) for s in steps), len(steps),
                                           sum(s.draft_s for s in steps), sum(s.verify_s for s in steps), forward[0])):
                        t[j] += x
                    tokens.setdefault((v, kind), []).append([e.token_id for s in steps for e in s.emitted])
    names = list(libs)
    same = all(tokens[(v, k)] == tokens[(names[0], k)] for v in names for k in ("ar", "lane"))
    print(f"# python {' '.join(sys.argv)}")
    print(f"# {cpu_name()}; {kernels.ISA_NAMES[kernels.best_isa()]} build; {kernels.threads()} threads; "
          f"{args.limit} Spec-Bench questions after one warm-up, {args.max_new_tokens} tokens, greedy; variants "
          f"in a random order per question; tokens {'identical across variants' if same else 'DIFFER'}")
    print("| variant | lane | tok/s | x AR | ms/step | draft | verify | forward |")
    print("|---|---|---|---|---|---|---|---|")
    for v in names:
        ar_rate = totals[(v, "ar")][1] / totals[(v, "ar")][0]
        for kind in ("ar", "lane"):
            seconds, toks, steps, draft, verify, fwd = totals[(v, kind)]
            ms = 1e3 / steps
            print(f"| {v} | {args.lane if kind == 'lane' else 'ar'} | {toks / seconds:.1f} | "
                  f"{toks / seconds / ar_rate:.2f} | {seconds * ms:.2f} | {draft * ms:.2f} | {verify * ms:.2f} | "
                  f"{fwd * ms:.2f} |")


if __name__ == "__main__":
    main()
