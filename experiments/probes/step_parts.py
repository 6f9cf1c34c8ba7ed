"""Where does a race step's time go outside the target's kernels, function by function? (issue 40, item 3)

Wraps the engine's functions (the tree engine's verify and draft, EAGLE's proposal, the drafter's C step and head,
the warp and top-p, the argmax, the sampled tree walk, the draws, prompt lookup and the datastore, the verdicts, the
cache's bookkeeping) with wall-clock timers, runs a lane on Spec-Bench questions (the first only warms up), greedy or
sampled, and prints each function's milliseconds a drafted step, mean and median, its callees included (so the lines
overlap: `verify` holds `tree_logits`, which holds `layers` and `head`). The prompts' prefills are left out. Timers
cost about a microsecond a call.

    .venv/bin/python experiments/probes/step_parts.py --lane 1,4,2 --limit 8 \\
        > experiments/results/step_parts-avx512bf16.txt
"""
from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from race_step import QUESTIONS  # noqa: E402

import specviz.core.cache as cache  # noqa: E402
import specviz.core.retrieval as retrieval  # noqa: E402
import specviz.core.sampling as sampling  # noqa: E402
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
           (eagle.EagleSession, "context"), (fused.FusedEagle3, "step"), (fused.FusedEagle3, "context"),
           (trained.Drafter, "logits"),
           (features.FeatureHistory, "observe"), (tree, "warp"), (tree, "argmax_rows"), (tree, "tree_verdicts"),
           (tree, "commit"), (trees, "tree_inputs"), (attention, "visible_index"), (cache, "fused"),
           (tree.TreeEngine, "cycle"), (tree.TreeEngine, "prefill"), (tree, "match"), (tree, "graft"),
           (retrieval.Datastore, "drafts"), (tree, "verify_tree"), (sampling, "nucleus"), (tree, "pick"),
           (trees, "tree_visible")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lane", default="1,4,2", help="gamma,lookup,retrieve of EAGLE's tree")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    args = ap.parse_args()
    step: dict[str, float] = collections.defaultdict(float)  # this step's seconds per function

    def timed(name, f):
        @functools.wraps(f)
        def call(*a, **k):
            start = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                step[name] += time.perf_counter() - start
        return call

    for owner, name in WRAPPED:  # a name two owners share is told apart by its owner's
        shared = sum(n == name for _, n in WRAPPED) > 1
        setattr(owner, name, timed(f"{owner.__name__}.{name}" if shared else name, getattr(owner, name)))
    target = models.get("smollm2-135m", torch.device("cpu"), torch.bfloat16)
    engine = engines.build("eagle", target)
    gamma, lookup, retrieve = (int(x) for x in args.lane.split(","))
    cfg = DecodeConfig(method="eagle", gamma=gamma, lookup=lookup, retrieve=retrieve, max_new_tokens=128,
                       temperature=args.temperature, top_p=args.top_p)
    rows = prompts.pick(prompts.read(QUESTIONS), limit=args.limit + 1)
    ids = [target.encode_prompt(r["prompt"]) for r in rows]
    list(engine.steps(ids[0], cfg))
    drafted: list[dict[str, float]] = []
    for prompt in ids[1:]:
        run = tree.TreeEngine.start(engine, prompt, cfg)  # EAGLE's engine is the tree engine
        while run.finish_reason is None:
            step.clear()
            tree.TreeEngine.cycle(engine, run)
            if "prefill" not in step:  # the prompt's forward, or no room left to draft
                drafted.append(dict(step))
    print(f"# python {' '.join(sys.argv)}")
    print(f"# {cpu_name()}; {kernels.describe()}; {kernels.threads()} threads; eagle:{args.lane}, temperature "
          f"{args.temperature}, top-p {args.top_p}, 128 tokens, {args.limit} Spec-Bench questions after one warm-up: "
          f"{len(drafted)} drafted steps (prefills left out)")
    print("| function | ms a step, mean | median |")
    print("|---|---|---|")
    names = {k for d in drafted for k in d}
    for name in sorted(names, key=lambda k: -sum(d.get(k, 0.0) for d in drafted)):
        seconds = [d.get(name, 0.0) for d in drafted]
        print(f"| {name} | {1e3 * statistics.fmean(seconds):.3f} | {1e3 * statistics.median(seconds):.3f} |")


if __name__ == "__main__":
    main()
