"""DFlash's step in two C calls (fused.FusedDFlash) against the torch module on the packed matmul (before), in one
process: the shipped drafter loaded twice, one with its C step switched off; on each Spec-Bench question AR and the
race under both, in a random order (the first question only warms up). Prints tok/s, each race over AR, and a step's
drafting milliseconds (the engines' own clocks); the tokens of both must be AR's (greedy).

    .venv/bin/python experiments/probes/dflash_fused_ab.py [--limit 16] [--race dflash:7+pld:4+ret:2+dyn:8]
"""
import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz import engines  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.engines.dflash import build  # noqa: E402
from specviz.hardware import cpu_name, method_spec  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models.loader import load  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--limit", type=int, default=16)
ap.add_argument("--tokens", type=int, default=128)
ap.add_argument("--race", default="dflash:7+pld:4+ret:2+dyn:8")
args = ap.parse_args()
target = load("smollm2-135m")
folder = ROOT / "assets/drafters/smollm2-135m-dflash"
c_step, torch_step = drafters.load(folder, target), drafters.load(folder, target)
torch_step.fused = None
name, gamma, grafts, _, _ = method_spec(args.race)
cfg = DecodeConfig(method=name, gamma=int(gamma), max_new_tokens=args.tokens,
                   **{k: (int(v) if k != "tree" else v) for k, v in grafts.items()})
lanes = {"ar": (engines.build("ar", target), DecodeConfig(method="ar", max_new_tokens=args.tokens)),
         "C step": (build(target, c_step), cfg), "torch module": (build(target, torch_step), cfg)}
questions = [json.loads(line) for line in open(ROOT.parent / "shared/data/spec_bench/question.jsonl")][:args.limit + 1]
seconds = {k: 0.0 for k in lanes}
tokens = {k: 0 for k in lanes}
draft_ms = {k: [] for k in lanes}
rng = random.Random(0)
for i, q in enumerate(questions):
    ids = target.encode_prompt(q["turns"][0])
    order = list(lanes)
    rng.shuffle(order)
    out = {}
    for lane in order:
        eng, c = lanes[lane]
        t0 = time.perf_counter()
        run = engines.generate(eng, ids, c)
        dt = time.perf_counter() - t0
        out[lane] = run.token_ids
        if i:
            seconds[lane] += dt
            tokens[lane] += len(run.token_ids)
            draft_ms[lane] += [e.draft_s * 1000 for e in run.events[1:]]
    assert out["C step"] == out["ar"] == out["torch module"], q["question_id"]
print(f"# python experiments/probes/dflash_fused_ab.py --limit {args.limit} --tokens {args.tokens} --race {args.race}")
print(f"# {cpu_name()}; {kernels.describe()}; {kernels.threads()} kernel threads; {args.limit} Spec-Bench questions "
      "after one to warm up; every run's tokens AR's")
print("| lane | tok/s | over AR | drafting ms a step (median) |")
print("|---|---|---|---|")
ar = tokens["ar"] / seconds["ar"]
for lane in lanes:
    rate = tokens[lane] / seconds[lane]
    d = f"{statistics.median(draft_ms[lane]):.2f}" if lane != "ar" else ""
    print(f"| {lane} | {rate:.1f} | {rate / ar:.3f} | {d} |")
