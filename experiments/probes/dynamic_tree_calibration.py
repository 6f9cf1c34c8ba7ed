"""Is the drafter's confidence its accuracy, and which dynamic tree (N nodes, d levels, k per level) commits most per
unit of verify cost (DecodeConfig.tree_nodes, tree_depth, tree_topk)?

At every position of the target's greedy answers (AR, so the context is what a lossless run would hold there) the
shipped EAGLE drafter grows a dynamic tree with every drafted node kept (N = all, d = 6) for each k, and Medusa
proposes its heads' top-8; a node counts as accepted when its path equals the answer's next tokens (greedy
acceptance: no target forward over the tree is needed). Prints the calibration (path probability against the accepted
share, in bins), then for each (k, d, N) the tokens a step it commits (τ = 1 + the deepest accepted node kept) and
τ per unit of step cost, in AR steps: T(1 + N)/T(1) plus c per drafter call (a k-row EAGLE call costs what the probe
measures against a one-row one), under two cost models: the committed verify profile with its c, and a profile and c
measured now (verify_profile's interleaved rounds; drafter calls and AR steps timed in interleaved rounds, so their
ratios hold on a shared machine).
Usage: .venv/bin/python experiments/probes/dynamic_tree_calibration.py [PROMPTS.jsonl] [--limit N] [--tokens T]
       [--profile PROFILE.json] [--ks 1,2,3,4,6,8]
       (default: experiments/results/train-unanswered24.jsonl, 24 prompts, 64 tokens, the committed
       assets/profiles/profile-bf16.json, k 1, 2, 3, 4, 6, 8)"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import engines, metrics  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.core.cache import CachedLM  # noqa: E402
from specviz.core.profile import SIZES, verify_profile  # noqa: E402
from specviz.core.trees import best_nodes  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.engines.eagle import EagleProposer  # noqa: E402
from specviz.engines.medusa import MedusaProposer  # noqa: E402
from specviz.models import loader as models  # noqa: E402
from specviz.paths import DRAFTERS, PROFILES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KS, DEPTH, MEDUSA_K = (1, 2, 3, 4, 6, 8), 6, 8
NS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32)
BINS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001)

args = argparse.ArgumentParser()
args.add_argument("prompts", nargs="?", default=str(ROOT / "experiments/results/train-unanswered24.jsonl"))
args.add_argument("--limit", type=int, default=24)
args.add_argument("--tokens", type=int, default=64)
args.add_argument("--profile", default=str(PROFILES / "profile-bf16.json"))
args.add_argument("--ks", default=",".join(map(str, KS)), help="the k (tree_topk) values grown")
args = args.parse_args()
KS = tuple(int(k) for k in args.ks.split(","))

torch.set_num_threads(2)
target = models.get()
eagle = drafters.load(DRAFTERS / "smollm2-135m-eagle", target)
medusa = drafters.load(DRAFTERS / "smollm2-135m-medusa", target)
rows = [json.loads(line) for line in open(args.prompts)][:args.limit]
ar = engines.build("ar", target)


def accepted_depths(paths_tokens: list[list[int]], answer: list[int]) -> list[bool]:
    return [tokens == answer[:len(tokens)] for tokens in paths_tokens]


def node_paths(parents: tuple, tokens: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i, p in enumerate(parents):
        out.append((out[p] if p >= 0 else []) + [tokens[i]])
    return out


eagle_records = {k: [] for k in KS}   # k -> per position: (depths, scores, accepted, parents, paths)
medusa_records = []                   # per position: (top probs (K, 8), matches (K, 8))
for n, row in enumerate(rows):
    ids = target.encode_prompt(row["prompt"])
    answer = engines.generate(ar, ids, DecodeConfig(method="ar", max_new_tokens=args.tokens)).token_ids
    seq = ids + answer
    _, hidden = CachedLM.of(target).logits(seq, keep=1, features=eagle.features)  # (len(seq), f)
    _, final = CachedLM.of(target).logits(seq, keep=1, features=True)
    state = EagleProposer(eagle).start(target.vocab_size, target.eos_ids)
    for t in range(len(answer) - 1):
        ctx, rest = seq[:len(ids) + t + 1], answer[t + 1:]  # the root is answer[t]; rest what follows it
        state.observe(hidden[len(state.feats):len(ctx) - 1])
        root = state.context(ctx)
        feat = root[0]
        for k in KS:
            cfg = DecodeConfig(method="eagle", tree="dynamic", tree_depth=DEPTH, tree_topk=k)
            object.__setattr__(cfg, "tree_nodes", 10**6)  # keep every drafted node (past the field's range)
            grown = state.grow_tree(root, cfg, DEPTH)
            paths = node_paths(grown.tree.parents, grown.node_tokens)
            scores = []
            for i, p in enumerate(grown.tree.parents):
                scores.append((scores[p] if p >= 0 else 1.0) * grown.q_nodes[i])
            eagle_records[k].append((grown.tree.depths, scores, accepted_depths(paths, rest), grown.tree.parents,
                                     grown.tree.paths))
        mstate = MedusaProposer(medusa).start(target.vocab_size, target.eos_ids)
        mstate.observe(final[:len(ctx) - 1])
        feats = medusa.module(medusa.inputs(mstate.feature[None]))[:, 0]
        probs = torch.stack([torch.softmax(medusa.logits(f, head=h).float().cpu(), -1) for h, f in enumerate(feats)])
        top = torch.topk(probs, MEDUSA_K)
        tokens = medusa.to_target_ids(top.indices.flatten()).reshape(top.indices.shape)
        truth = torch.tensor((rest + [-1] * len(feats))[:len(feats)])
        medusa_records.append((top.values, tokens == truth[:, None]))
    print(f"prompt {n + 1}/{len(rows)}: {len(answer)} tokens", file=sys.stderr, flush=True)

# --- calibration: path probability against the accepted share (k = 4, every drafted node) ---
print(f"# {len(eagle_records[KS[0]])} positions of {len(rows)} answers ({args.prompts}, {args.tokens} tokens)")
K_CAL = 4 if 4 in KS else KS[-1]  # the k whose nodes the calibration reads
for name, depth_only in ((f"EAGLE k={K_CAL}, every drafted node", None), (f"EAGLE k={K_CAL}, depth 1 (q itself)", 1),
                         (f"EAGLE k={K_CAL}, depth 3", 3)):
    print(f"\n## calibration, {name}\n| path probability | nodes | mean path probability | accepted share |\n"
          "|---|---|---|---|")
    for lo, hi in zip(BINS, BINS[1:]):
        picked = [(s, a) for depths, scores, acc, *_ in eagle_records[K_CAL] for d, s, a in zip(depths, scores, acc)
                  if lo <= s < hi and depth_only in (None, d)]
        if picked:
            print(f"| {lo:.2f}-{min(hi, 1):.2f} | {len(picked)} | {statistics.mean(s for s, _ in picked):.3f} | "
                  f"{statistics.mean(a for _, a in picked):.3f} |")


def tau_eagle(records, depth: int) -> dict[int, float]:
    """τ for each N in NS: the kept nodes are a prefix of one order (trees.best_nodes), so one pass serves them all."""
    total = dict.fromkeys(NS, 0)
    for depths, scores, acc, parents, _ in records:
        order = best_nodes(list(parents), [s if depths[i] <= depth else 0.0 for i, s in enumerate(scores)], max(NS))
        deepest, running = 0, []
        for i in order:
            deepest = max(deepest, depths[i] if acc[i] else 0)
            running.append(deepest)
        for n in NS:
            total[n] += 1 + (running[min(n, len(running)) - 1] if running else 0)
    return {n: total[n] / len(records) for n in NS}


def tau_static(records, paths) -> float:
    """τ of a static tree given as rank paths: the record's nodes (k >= 2 drafts them) named by their rank path."""
    return statistics.mean(1 + max((len(p) for p, a in zip(named, acc) if a and p in paths), default=0)
                           for _, _, acc, _, named in records)


def tau_medusa(depth: int, k: int) -> dict[int, float]:
    """τ for each N in NS: choose_tree grows best first, so its first n nodes in that order are its tree of n."""
    total = dict.fromkeys(NS, 0)
    for values, match in medusa_records:
        top = values[:depth, :k]
        order = sorted(drafters.choose_tree(top, max(NS)), key=lambda p: (-drafters.path_value(top, p), len(p)))
        deepest, running = 0, []
        for p in order:
            deepest = max(deepest, len(p) if all(bool(match[h, r]) for h, r in enumerate(p)) else 0)
            running.append(deepest)
        for n in NS:
            total[n] += 1 + running[min(n, len(running)) - 1]
    return {n: total[n] / len(medusa_records) for n in NS}


eagle_taus = {(k, depth): tau_eagle(eagle_records[k], depth) for k in KS for depth in range(1, DEPTH + 1)}
medusa_taus = {(k, depth): tau_medusa(depth, k) for k in (1, 2, 3, 4, 8)
               for depth in range(1, len(medusa_records[0][0]) + 1)}


# --- costs: T(k)/T(1) (the committed profile, and one measured now), c = a drafter call / an AR step ---
def interleaved(calls: dict, rounds: int = 15) -> dict:
    """Median seconds of each call, timed in rounds (each round every call once): a busy spell of a shared machine
    falls on all of them alike, so their ratios hold."""
    times = {name: [] for name in calls}
    for r in range(rounds + 1):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def eagle_call(m: int):
    visible, ids, inputs = torch.ones(m, m, dtype=torch.bool), torch.tensor(seq[-m:]), feat[None].expand(m, -1)
    return lambda: eagle.logits(state.feed_nodes(state.kv, inputs, ids, visible, 1)[0]).float()


def medusa_call():
    heads = medusa.module(medusa.inputs(mstate.feature[None]))[:, 0]
    return [medusa.logits(f, head=h).float() for h, f in enumerate(heads)]


lm = CachedLM.of(target)
lm.logits(seq[:-1])


def ar_step():
    lm.logits(seq[:-1], seq[-1:], keep=1)
    lm.rollback(len(seq) - 1)


timed = interleaved({"ar": ar_step, "medusa": medusa_call, **{f"eagle{k}": eagle_call(k) for k in sorted({1, *KS})}})
rows_cost = {k: timed[f"eagle{k}"] / timed["eagle1"] for k in KS}
print(f"\n## costs at {len(seq)} cached tokens (medians of 15 interleaved rounds): AR step {1000 * timed['ar']:.1f} "
      "ms, "
      f"EAGLE call (module + draft head) {1000 * timed['eagle1']:.2f} ms, Medusa heads {1000 * timed['medusa']:.2f} ms"
      "\nk-row EAGLE call against one row: " + " ".join(f"k={k}: {v:.2f}" for k, v in rows_cost.items()))
raw = json.loads(Path(args.profile).read_text())
committed = {row["method"]: row.get("c") for row in raw.get("costs", [])}
scenarios = {f"committed profile {args.profile} with its c": (metrics.CostProfile(**raw["profile"]), committed),
             "profile measured now (interleaved rounds) with c measured now":
                 (verify_profile(target, SIZES, reps=9),
                  {"eagle": timed["eagle1"] / timed["ar"], "medusa": timed["medusa"] / timed["ar"]})}

for label, (profile, c) in scenarios.items():
    print(f"\n# cost model: {label}\n" + " ".join(f"T({k})/T(1)={profile.ratio(k):.2f}" for k in (2, 4, 8, 12, 16, 24,
                                                                                                     32))
          + f"; c eagle {c['eagle']:.3f}, medusa {c['medusa']:.3f}")
    shipped = [tuple(p) for p in eagle.cfg.tree]  # every node of it is drafted by a dynamic tree of k >= 2 too
    cost = profile.ratio(1 + len(shipped)) + c["eagle"] * max(map(len, shipped))
    tau = tau_static(eagle_records[max(KS)], set(shipped))
    print(f"\n## EAGLE static, the shipped tree {shipped}: τ {tau:.3f}, cost {cost:.3f} AR steps, "
          f"τ/cost {tau / cost:.3f}")
    print("\n## EAGLE dynamic: τ / (τ per unit cost); cost = T(1+N)/T(1) + c·(1 + (d-1)·row cost of k)\n"
          "| k | d | " + " | ".join(f"N={n}" for n in NS) + " |\n|---|---|" + "---|" * len(NS))
    best = []
    for k in KS:
        for depth in range(1, DEPTH + 1):
            taus = eagle_taus[k, depth]
            cells = []
            for n in NS:
                cost = profile.ratio(1 + n) + c["eagle"] * (1 + (depth - 1) * rows_cost[k])
                cells.append(f"{taus[n]:.2f} / {taus[n] / cost:.2f}")
                best.append((taus[n] / cost, taus[n], k, depth, n))
            print(f"| {k} | {depth} | " + " | ".join(cells) + " |")
    best.sort(reverse=True)
    print("best τ/cost: " + "; ".join(f"k={k} d={d} N={n}: {v:.3f} (τ {t:.2f})" for v, t, k, d, n in best[:8]))

    print("\n## Medusa dynamic: τ / (τ per unit cost); cost = T(1+N)/T(1) + c\n"
          "| k | d | " + " | ".join(f"N={n}" for n in NS) + " |\n|---|---|" + "---|" * len(NS))
    mbest = []
    for k, depth in medusa_taus:
        taus = medusa_taus[k, depth]
        cells = []
        for n in NS:
            cost = profile.ratio(1 + n) + c["medusa"]
            cells.append(f"{taus[n]:.2f} / {taus[n] / cost:.2f}")
            mbest.append((taus[n] / cost, taus[n], k, depth, n))
        print(f"| {k} | {depth} | " + " | ".join(cells) + " |")
    mbest.sort(reverse=True)
    print("best τ/cost: " + "; ".join(f"k={k} d={d} N={n}: {v:.3f} (τ {t:.2f})" for v, t, k, d, n in mbest[:8]))
    static_m = [tuple(p) for p in medusa.cfg.tree]
    tau = statistics.mean(1 + max((len(p) for p in static_m if all(bool(m[h, r]) for h, r in enumerate(p))),
                                  default=0) for _, m in medusa_records)
    cost = profile.ratio(1 + len(static_m)) + c["medusa"]
    print(f"Medusa static {static_m}: τ {tau:.3f}, τ/cost {tau / cost:.3f}")
