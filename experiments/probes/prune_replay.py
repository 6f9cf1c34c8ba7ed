"""Would pruning the default race's tree pay? Runs EAGLE's tree with prompt lookup's and the datastore's branches
(`gamma,lookup,retrieve`) greedily over Spec-Bench questions, keeps every node's source, depth, rank and verdict, and
prints the acceptance of each kind of node, then replays the steps under a rule that drops every node (and its subtree)
whose kind was accepted less often than a threshold: τ and rows a step as the replay counts them, and the speed the
committed verify profile predicts (T(rows)/T(1) plus a drafting cost in AR steps, --draft-cost). The per-kind rates are
measured on the same steps they prune (in-sample: an upper bound for a rule learned online).

    .venv/bin/python experiments/probes/prune_replay.py 1,4,4 --limit 24 > experiments/results/prune_replay-1,4,4.txt
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz import engines, prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD, Verdict  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import loader as models  # noqa: E402

QUESTIONS = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
PROFILE = ROOT / "assets" / "profiles" / "profile-bf16.json"
SOURCES = {LOOKUP_HEAD: "lookup", RETRIEVAL_HEAD: "datastore"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("lane", help="gamma,lookup,retrieve of EAGLE's static tree")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--draft-cost", type=float, default=0.25, help="drafting, in AR steps (race_step.py: 0.25)")
    ap.add_argument("--profile", default=str(PROFILE))
    args = ap.parse_args()
    gamma, lookup, retrieve = (int(x) for x in args.lane.split(","))
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    engine = engines.build("eagle", target)
    cfg = DecodeConfig(method="eagle", gamma=gamma, lookup=lookup, retrieve=retrieve, max_new_tokens=128)
    steps = []  # per step: (parent, kind, accepted) for every node, parents first
    for i, row in enumerate(prompts.pick(prompts.read(QUESTIONS), limit=args.limit)):
        for event in engine.steps(target.encode_prompt(row["prompt"]), cfg.with_(seed=i)):
            if event.drafts:
                steps.append([(d.parent, (SOURCES.get(d.head, "eagle"), d.depth, d.rank if d.head >= 0 else 0),
                               d.verdict is Verdict.ACCEPTED) for d in event.drafts])
    profile = json.loads(Path(args.profile).read_text())["ratios"]
    ks = sorted(int(k) for k in profile)

    def cost(rows: float) -> float:
        return float(np.interp(rows, ks, [profile[str(k)] for k in ks])) + args.draft_cost

    seen = collections.defaultdict(lambda: [0, 0])
    for step in steps:
        for _, kind, accepted in step:
            seen[kind][0] += 1
            seen[kind][1] += accepted
    rate = {kind: a / n for kind, (n, a) in seen.items()}
    print(f"# {cpu_name()}; eagle:{gamma}+pld:{lookup}+ret:{retrieve}, {args.limit} Spec-Bench questions, greedy, "
          f"128 tokens; {len(steps)} steps; cost = T(rows)/T(1) from {Path(args.profile).name} + {args.draft_cost}")
    print("| node (source, depth, rank) | a step | accepted |")
    print("|---|---|---|")
    for kind in sorted(seen):
        print(f"| {kind} | {seen[kind][0] / len(steps):.2f} | {rate[kind]:.3f} |")
    print("\n| threshold | τ | rows a step | predicted x AR |")
    print("|---|---|---|---|")
    for threshold in (0.0, 0.05, 0.08, 0.10, 0.12, 0.15, 0.20, 0.25):
        tau = rows = 0
        for step in steps:
            keep: list[bool] = []
            for parent, kind, _ in step:
                keep.append(rate[kind] >= threshold and (parent < 0 or keep[parent]))
            tau += 1 + sum(k and accepted for k, (_, _, accepted) in zip(keep, step))
            rows += 1 + sum(keep)
        tau, rows = tau / len(steps), rows / len(steps)
        print(f"| {threshold:.2f} | {tau:.3f} | {rows:.2f} | {tau / cost(rows):.3f}x |")


if __name__ == "__main__":
    main()
