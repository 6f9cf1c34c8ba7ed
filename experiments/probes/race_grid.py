"""The machine-independent half of choosing the default race: for every candidate race (EAGLE's static tree of depth
g with prompt lookup's branch of L tokens and the datastore's of R nodes; prompt lookup alone at γ L), how many rows
each step verifies and how many tokens it keeps, on held-out prompts, greedy. With greedy decoding these depend on the
drafts and the target's tokens only, never on the CPU: the machine supplies T(rows)/T(1) and the drafting cost at
start-up (specviz/tuning.py), and the product reads this file (assets/profiles/race-grid-<target>.json).

How: one greedy run of the largest race (eagle:2+pld:6+ret:6) per prompt. At each of its steps the context is known,
so prompt lookup's chain and the datastore's chains for every L and R are recomputed from it (pure functions of the
context), EAGLE's tree is read from the step's own nodes (pruned to depth g), and the target's greedy continuation is
the run's own output from that position on (greedy output is AR's, whatever the race). A candidate's step keeps the
longest prefix of that continuation that its tree holds, plus one token of the target's; its rows are one plus its
distinct tree nodes. The candidates are replayed at the largest race's step positions (a sample of positions, as
experiments/probes/prune_replay.py does); the replay of the largest race itself must reproduce its measured steps,
which the probe checks and prints.

Prompts: held out from everything the drafters and the datastore saw (the distillation answered the first 78 chunks
of 256 training prompts; these come from index 30000 on) and never Spec-Bench (the evaluation set).

    .venv/bin/python experiments/probes/race_grid.py --limit 24 --out assets/profiles/race-grid-smollm2-135m.json
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz import engines, prompts, tuning  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.core.lookup import match  # noqa: E402
from specviz.core.retrieval import datastore_for  # noqa: E402
from specviz.engines.tree import ANSWERS  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import loader as models  # noqa: E402
from specviz.paths import TRAIN_PROMPTS  # noqa: E402

HELD_OUT_FROM = 30000   # training prompts from this index on were never answered for distillation (78 chunks of 256)
EAGLE_DEPTHS = (1, 2)   # the shipped EAGLE's stored tree is [[0], [1], [0, 0]]: depth 2 holds it whole
LOOKUPS = (0, 1, 2, 3, 4, 6)
RETRIEVES = (0, 2, 4, 6)
LARGEST = DecodeConfig(method="eagle", gamma=max(EAGLE_DEPTHS), lookup=max(LOOKUPS), retrieve=max(RETRIEVES))


def prefixes(chain) -> set[tuple[int, ...]]:
    return {tuple(chain[:i]) for i in range(1, len(chain) + 1)}


def eagle_paths(drafts) -> list[tuple[tuple[int, ...], int]]:
    """(token path from the root, depth) of each of EAGLE's own nodes in a step (grafted nodes have heads < 0)."""
    paths: dict[int, tuple[int, ...]] = {}
    for i, d in enumerate(drafts):
        if d.head >= 0:
            paths[i] = (paths[d.parent] if d.parent >= 0 else ()) + (d.token_id,)
    return [(p, len(p)) for p in paths.values()]


def replay(step: dict, g: int, lookup: int, retrieve: int) -> tuple[int, int]:
    """(rows, tokens kept) of one candidate race at one recorded step."""
    tree: set[tuple[int, ...]] = {p for p, depth in step["eagle"] if depth <= g}
    chain, order = step["lookup"]
    tree |= prefixes(chain[:lookup])
    if retrieve and (order < LARGEST.pld_ngram_max or not lookup):
        for c in step["retrieve"][retrieve]:
            tree |= prefixes(c)
    future = step["future"]
    accepted = max((k for k in range(len(future)) if tuple(future[:k]) in tree or k == 0), default=0)
    return 1 + len(tree), min(accepted + 1, len(future))


def record(engine, target, store, prompt_ids: list[int], cfg: DecodeConfig) -> tuple[list[dict], list[int]]:
    """The largest race's steps on one prompt, each with what a candidate needs to be replayed there."""
    events = list(engine.steps(prompt_ids, cfg))
    output = [t.token_id for e in events for t in e.emitted]
    steps, done = [], 0
    for e in events:
        context = prompt_ids + output[:done]
        cap = cfg.max_new_tokens - done - 1
        if e.drafts and cap > 0:
            chain, order = match(context, min(max(LOOKUPS), cap), cfg.pld_ngram_max, cfg.pld_ngram_min,
                                 target.eos_ids)
            steps.append({"eagle": eagle_paths(e.drafts), "lookup": (chain, order),
                          "retrieve": {r: store.drafts(context, r, cap) for r in RETRIEVES if r},
                          "future": output[done:done + max(EAGLE_DEPTHS) + max(LOOKUPS) + 2],
                          "measured": (1 + len(e.drafts), len(e.emitted))})
        done += len(e.emitted)
    return steps, output


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default=str(ROOT / "assets" / "profiles" / "race-grid-smollm2-135m.json"))
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    engine, store = engines.build("eagle", target), datastore_for(target.name, ANSWERS[target.name])
    cfg = LARGEST.with_(max_new_tokens=args.max_new_tokens)
    rows = prompts.pick(prompts.read(TRAIN_PROMPTS)[HELD_OUT_FROM:], limit=args.limit)
    steps, t0 = [], time.time()
    for row in rows:
        steps += record(engine, target, store, target.encode_prompt(row["prompt"]), cfg)[0]
    same = sum(replay(s, max(EAGLE_DEPTHS), max(LOOKUPS), max(RETRIEVES)) == s["measured"] for s in steps)
    configs = {}
    for name, (g, lookup, retrieve) in tuning.candidates(EAGLE_DEPTHS, LOOKUPS, RETRIEVES).items():
        hist, tokens = collections.Counter(), 0
        for s in steps:
            r, t = replay(s, g, lookup, retrieve)
            hist[r] += 1
            tokens += t
        configs[name] = {"steps": len(steps), "tokens": tokens, "rows": {str(k): hist[k] for k in sorted(hist)}}
    out = {"target": target.name, "greedy": True, "max_new_tokens": args.max_new_tokens,
           "prompts": f"{len(rows)} training prompts from index {HELD_OUT_FROM} (held out), round-robin by category",
           "recorded_with": "eagle:2+pld:6+ret:6", "steps": len(steps), "replay_matches_measured": same,
           "command": "python experiments/probes/race_grid.py " + " ".join(sys.argv[1:]), "cpu": cpu_name(),
           "configs": configs}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"# {cpu_name()}; {len(rows)} held-out prompts, {len(steps)} steps of eagle:2+pld:6+ret:6 in "
          f"{time.time() - t0:.0f} s; the replay of that race matches {same}/{len(steps)} measured steps")
    print("| race | τ | rows a step |")
    print("|---|---|---|")
    for name, c in sorted(configs.items(), key=lambda kv: -kv[1]["tokens"]):
        mean_rows = sum(int(k) * v for k, v in c["rows"].items()) / c["steps"]
        print(f"| {name} | {c['tokens'] / c['steps']:.3f} | {mean_rows:.2f} |")


if __name__ == "__main__":
    main()
