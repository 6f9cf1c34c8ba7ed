"""Where does a race step's time go outside the target's kernels, function by function? (issue 40, item 3)

Wraps the engine's functions (the tree engine's verify and draft, EAGLE's proposal, the drafter's C step and head,
the warp, the argmax, the tree's index and mask, the verdicts, the cache's bookkeeping) with wall-clock timers,
runs a lane on Spec-Bench questions (the first only warms up) and prints each function's milliseconds a step,
its callees included (so the lines overlap: `verify` holds `tree_logits`, which holds `layers` and `head`). The
prompts' prefills fall on `layers` and `head` too. Timers cost about a microsecond a call.

    .venv/bin/python experiments/probes/step_parts.py --lane 1,4,0 --limit 8 \\
        > experiments/results/step_parts-avx512bf16.txt
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from race_step import QUESTIONS  # noqa: E402

import specviz.core.cache as cache  # noqa: E402
import specviz.core.trees as trees  # noqa: E402
import specviz.drafters.trained as trained  # noqa: E402
import specviz.engines.eagle as eagle  # noqa: E402
import specviz.engines.features as features  # noqa: E402
import specviz.engines.tree as tree  # noqa: E402
import specviz.models.attention as attention  # noqa: E402
import specviz.models.fused as fused  # noqa: E402
from specviz import engines, prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models import loader as models  # noqa: E402

WRAPPED = [(tree.TreeEngine, "verify"), (tree.TreeEngine, "draft"), (tree.TreeEngine, "graft_branches"),
           (cache.CachedLM, "tree_logits"), (cache.CachedLM, "keep_path"), (fused.FusedLlama, "layers"),
           (fused.FusedLlama, "head"), (fused.FusedLlama, "norm"), (eagle.EagleProposer, "propose"),
           (eagle.EagleSession, "context_feature"), (fused.FusedEagle3, "step"), (trained.Drafter, "logits"),
           (features.FeatureHistory, "observe"), (tree, "warp"), (tree, "argmax_rows"), (tree, "tree_verdicts"),
           (tree, "commit"), (trees, "tree_inputs"), (attention, "visible_index"), (cache, "fused")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lane", default="1,4,0", help="gamma,lookup,retrieve of EAGLE's tree")
    ap.add_argument("--limit", type=int, default=8)
    args = ap.parse_args()
    seconds: dict[str, float] = {}

    def timed(name, f):
        @functools.wraps(f)
        def call(*a, **k):
            start = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        return call

    for owner, name in WRAPPED:
        setattr(owner, name, timed(name, getattr(owner, name)))
    target = models.get("smollm2-135m", torch.device("cpu"), torch.bfloat16)
    engine = engines.build("eagle", target)
    gamma, lookup, retrieve = (int(x) for x in args.lane.split(","))
    cfg = DecodeConfig(method="eagle", gamma=gamma, lookup=lookup, retrieve=retrieve, max_new_tokens=128)
    rows = prompts.pick(prompts.read(QUESTIONS), limit=args.limit + 1)
    ids = [target.encode_prompt(r["prompt"]) for r in rows]
    list(engine.steps(ids[0], cfg))
    seconds.clear()
    steps, start = 0, time.perf_counter()
    for prompt in ids[1:]:
        steps += len(list(engine.steps(prompt, cfg)))
    total = time.perf_counter() - start
    print(f"# python {' '.join(sys.argv)}")
    print(f"# {cpu_name()}; {kernels.describe()}; {kernels.threads()} threads; eagle:{args.lane}, greedy, 128 tokens, "
          f"{args.limit} Spec-Bench questions after one warm-up: {steps} steps, {1e3 * total / steps:.2f} ms a step")
    print("| function | ms a step (callees included) |")
    print("|---|---|")
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {1e3 * s / steps:.3f} |")


if __name__ == "__main__":
    main()
