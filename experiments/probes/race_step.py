"""Where a step of the race goes over the fused AR (issue 31): for each lane, tokens a second against AR's in the same
process (each question runs every lane in turn; the first question only warms up), τ, and a step's milliseconds split by
the engine's own timers into drafting (proposal and grafts: StepEvent.draft_s) and verification (the target's forward
and the verdicts: verify_s), the remainder being the loop (events, commit). `forward` is the part of verify_s inside the
target's fused decoder (its layers, final norm and LM head, timed around FusedLlama's calls), and `ceiling` the lane's
speed over AR were that forward all a step cost: drafting, grafts, verdicts and bookkeeping free. Lanes are
`gamma,lookup,retrieve` for EAGLE's static tree (0,0,0 is not allowed: use pld:G for prompt lookup alone); a lane
ending in `/torch` runs the drafter's step in torch rather than in one C call (fused.FusedEagle3), for an A/B.

    .venv/bin/python experiments/probes/race_step.py --limit 13 1,4,4 2,6,6 pld:2 \\
        > experiments/results/race_step-avx512bf16.txt
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz import engines, prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models import loader as models  # noqa: E402

QUESTIONS = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


def run_lanes(target, lanes: dict, rows: list[dict], forward: list[float] | None = None) -> dict:
    """Every lane (name: (engine, DecodeConfig)) on each question in turn, the first question only warming up.
    Returns per lane [seconds, tokens, steps, drafting s, verifying s, forward s (from `forward[0]`, which timers
    around the target's calls add to; 0 without), the token ids of each question]."""
    forward = forward if forward is not None else [0.0]
    totals = {name: [0.0, 0, 0, 0.0, 0.0, 0.0, []] for name in lanes}
    for i, row in enumerate(rows):
        ids = target.encode_prompt(row["prompt"])
        for name, (engine, cfg) in lanes.items():
            start, forward[0] = time.perf_counter(), 0.0
            steps = list(engine.steps(ids, cfg.with_(seed=i)))
            seconds = time.perf_counter() - start
            if i == 0:
                continue
            t = totals[name]
            t[0] += seconds
            t[1] += sum(len(s.emitted) for s in steps)
            t[2] += len(steps)
            t[3] += sum(s.draft_s for s in steps)
            t[4] += sum(s.verify_s for s in steps)
            t[5] += forward[0]
            t[6].append([e.token_id for s in steps for e in s.emitted])
    return totals


def time_forward(target) -> list[float]:
    """Timers around the target's fused decoder calls (embed, layers, norm, head): the returned list's one element
    adds up the seconds spent inside them (run_lanes resets it per lane); never moves where there is no fused
    decoder."""
    forward = [0.0]

    def timed(f):
        def call(*a, **k):
            start = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                forward[0] += time.perf_counter() - start
        return call

    if target.fused is not None:
        for name in ("embed", "layers", "norm", "head"):
            setattr(target.fused, name, timed(getattr(target.fused, name)))
    return forward


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("lanes", nargs="+", help="gamma,lookup,retrieve (EAGLE's tree, /torch: its step in torch) or pld:G")
    ap.add_argument("--limit", type=int, default=13)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    args = ap.parse_args()
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    common = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    lanes = {"ar": (engines.build("ar", target), DecodeConfig(method="ar", **common))}
    eagle = engines.build("eagle", target)
    for lane in args.lanes:
        if lane.startswith("pld:"):
            lanes[lane] = (engines.build("pld", target), DecodeConfig(method="pld", gamma=int(lane[4:]), **common))
        else:
            race, _, torch_step = lane.partition("/")
            engine = eagle
            if torch_step:  # the drafter's step in torch, not in one C call: a second copy without its fused step
                engine = engines.build("eagle", target)
                engine.proposer.d.fused = None
            gamma, lookup, retrieve = (int(x) for x in race.split(","))
            cfg = DecodeConfig(method="eagle", gamma=gamma, lookup=lookup, retrieve=retrieve, **common)
            lanes[lane] = (engine, cfg)
    forward = time_forward(target)
    rows = prompts.pick(prompts.read(QUESTIONS), limit=args.limit + 1)
    print(f"# {cpu_name()}, {kernels.describe()}; {torch.get_num_threads()} threads; {args.limit} Spec-Bench questions "
          f"after one warm-up, {args.max_new_tokens} tokens, temperature {args.temperature}, top-p {args.top_p}")
    totals = run_lanes(target, lanes, rows, forward)
    ar_rate = totals["ar"][1] / totals["ar"][0]
    head = ("lane", "tok/s", "x AR", "tau", "ms/step", "draft", "verify", "forward", "rest", "ceiling")
    print(f"{head[0]:10s} " + " ".join(f"{h:>{w}s}" for h, w in zip(head[1:], (7, 6, 5, 8, 6, 7, 7, 5, 7))))
    for name, (seconds, tokens, steps, draft, verify, fwd, _) in totals.items():
        ms = 1e3 / steps
        ceiling = f"{tokens / fwd / ar_rate:6.2f}x" if fwd else "      -"
        print(f"{name:10s} {tokens / seconds:7.1f} {tokens / seconds / ar_rate:5.2f}x {tokens / steps:5.2f} "
              f"{seconds * ms:8.2f} {draft * ms:6.2f} {verify * ms:7.2f} {fwd * ms:7.2f} "
              f"{(seconds - draft - verify) * ms:5.2f} {ceiling}")


if __name__ == "__main__":
    main()
