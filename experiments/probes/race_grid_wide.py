"""The race grid with its wide shapes (issue 51): the races that pay only where a verified row is cheap, beside
race_grid.py's small ones, all replayed from one recording, greedy and sampled (this probe now writes the shipped
grid: race_grid.py's recording holds no dynamic tree and no branch past 6).

What it adds: EAGLE-2's dynamic trees (DecodeConfig.tree "dynamic", γ 2-3, top-k 4) of 8-64 nodes, with prompt
lookup's branch and the datastore's up to 16 tokens; EAGLE's stored tree with those wide grafts; prompt lookup's chain
at γ 8, 12 and 16. How: as race_grid.py, one run of the largest race (eagle:3+pld:16+ret:16+dyn:64: at top-k 4 and 3
levels a dynamic tree has 4 + 16 + 16 = 36 candidates, so 64 nodes keeps every one) per held-out prompt, each
candidate replayed at its step positions: a dynamic tree of n nodes is the n recorded nodes of highest path
probability (trees.best_nodes: the grown candidates do not depend on n, and the n best are a prefix of the 64 best),
EAGLE's stored tree is the recorded nodes at its rank paths ([0], [1], [0, 0]), the chains are recomputed from the
context. The replay of the largest race must reproduce its measured steps (printed).

Sampled (--temperature 0.7 --top-p 0.95): every draft a tree carries is a point mass (docs/exactness.md), so a
sampled step accepts a child exactly when the token the target's warped distribution yields there is that child's:
the tokens a candidate keeps at a recorded step are again the longest prefix of the run's own (sampled) continuation
its tree holds, plus one. The recording's continuation is one sample of the target's, so the replay is an unbiased
estimate of each candidate's sampled τ, as the greedy replay is an exact count. Stored under "sampled" (the rule
prices a race run at temperature > 0 with it: tuning.choose).

DFlash (--drafter dflash, greedy; issue 52): its races join the same grid, replayed from a recording of its own
(dflash:7+pld:16+ret:16+dyn:64) on the same prompts. Its block comes from one drafter forward whatever the tree, so
the recording keeps each step's block itself: every slot's top-k tokens and probabilities (k = the dynamic tree's
top-k). A candidate's tree is then rebuilt exactly as the engine builds it (engines/dflash.py): the chain of its
first g slots' argmaxes, or top_tree over their top-k (nodes > 0), with the same grafts. Not sampled: there a slot's
own draft is drawn from q and judged by min(1, p/q), not a point mass, so a replay would not be an exact count.

    .venv/bin/python experiments/probes/race_grid_wide.py --limit 24               # greedy: "configs"
    .venv/bin/python experiments/probes/race_grid_wide.py --limit 12 --temperature 0.7 --top-p 0.95   # "sampled"
    .venv/bin/python experiments/probes/race_grid_wide.py --limit 24 --drafter dflash   # DFlash's, into "configs"
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
sys.path.insert(0, str(ROOT / "experiments" / "probes"))

from race_grid import HELD_OUT_FROM, prefixes  # noqa: E402

from specviz import engines, prompts, tuning  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.core.lookup import match  # noqa: E402
from specviz.core.retrieval import datastore_for  # noqa: E402
from specviz.core.trees import best_nodes  # noqa: E402
from specviz.engines import dflash  # noqa: E402
from specviz.engines.tree import ANSWERS  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import loader as models  # noqa: E402
from specviz.paths import TRAIN_PROMPTS  # noqa: E402

DEPTH = 3
LARGEST = DecodeConfig(method="eagle", gamma=DEPTH, lookup=16, retrieve=16, tree="dynamic", tree_nodes=64,
                       tree_depth=DEPTH, tree_topk=4)
STATIC = ((0,), (1,), (0, 0))  # the shipped EAGLE's stored tree, as rank paths
RETRIEVES = (0, 2, 4, 6, 8, 16)
BLOCK = 7  # DFlash's drafts a step: the shipped drafter's block of 8 less the verified token
BLOCK_LARGEST = DecodeConfig(method="dflash", gamma=BLOCK, lookup=16, retrieve=16, tree="dynamic", tree_nodes=64,
                             tree_topk=4)


def eagle_nodes(drafts) -> list[tuple[tuple[int, ...], tuple[int, ...], float]]:
    """(token path, rank path, path probability) of each of EAGLE's own nodes in a step (grafted: head < 0)."""
    paths: dict[int, tuple] = {}
    for i, d in enumerate(drafts):
        if d.head >= 0:
            tok, rank, score = paths[d.parent] if d.parent >= 0 else ((), (), 1.0)
            paths[i] = (tok + (d.token_id,), rank + (d.rank,), score * min(d.q_draft, 1.0))
    return list(paths.values())


def replay(step: dict, g: int, nodes: int, lookup: int, retrieve: int) -> tuple[int, int]:
    """(rows, tokens kept) of one candidate at one recorded step: nodes 0 is EAGLE's stored tree cut to depth g, n > 0
    a dynamic tree of n nodes grown g levels; g 0 prompt lookup's chain alone."""
    tree: set[tuple[int, ...]] = set()
    if g and "block" in step:
        tree = block_tree(step["block"], g, nodes)
    elif g and nodes:
        mine = [n for n in step["eagle"] if len(n[0]) <= g]
        parents = [next((j for j, m in enumerate(mine) if m[0] == n[0][:-1]), -1) for n in mine]
        order = sorted(range(len(mine)), key=lambda i: len(mine[i][0]))  # parents before children
        where = {i: k for k, i in enumerate(order)}
        keep = best_nodes([where[parents[i]] if parents[i] >= 0 else -1 for i in order],
                          [mine[i][2] for i in order], nodes)
        tree = {mine[order[k]][0] for k in keep}
    elif g:
        tree = {tok for tok, rank, _ in step["eagle"] if rank in STATIC and len(rank) <= g}
    chain, order = step["lookup"]
    tree |= prefixes(chain[:lookup])
    if retrieve and (order < LARGEST.pld_ngram_max or not lookup):
        for c in step["retrieve"][str(retrieve)]:
            tree |= prefixes(c)
    future = step["future"]
    accepted = max((k for k in range(len(future)) if tuple(future[:k]) in tree or k == 0), default=0)
    return 1 + len(tree), min(accepted + 1, len(future))


def block_tree(block: dict, g: int, nodes: int) -> set[tuple[int, ...]]:
    """DFlash's tree over its block's first g slots (BlockSpy.take), as engines/dflash.py builds it greedy: the chain
    of the argmaxes, or (nodes > 0) top_tree's nodes, a node of rank r at depth d carrying slot d's r-th token in the
    order of the engine's own top-k (block_nodes, whose width is the tree's largest rank + 2: bf16 logits tie often,
    and torch.topk orders ties by its k)."""
    values = block["values"][:g]
    if nodes:
        shape = dflash.top_tree(values, len(values[0]), nodes)
        paths = shape.paths if shape is not None else ((0,),)
    else:
        paths = tuple((0,) * d for d in range(1, len(values) + 1))
    tokens = block["tokens"][max(r for p in paths for r in p) + 2]
    return {tuple(tokens[d][r] for d, r in enumerate(path)) for path in paths}


def block_candidates() -> dict[str, tuple[int, int, int, int]]:
    """DFlash's races: its block's first g slots as a chain, the whole block as a dynamic tree of n nodes (and a
    shallower one), each with prompt lookup's and the datastore's branches."""
    out = {}
    for n in (0, 4, 8):
        for r in (0, 2, 4, 8):
            for g in (1, 2, 3, 4, 5, 7):
                out[tuning.race_name(g, n, r, 0, "dflash")] = (g, 0, n, r)
            for g, nodes in ((3, 8), (3, 16), (7, 8), (7, 16), (7, 32), (7, 64)):
                out[tuning.race_name(g, n, r, nodes, "dflash")] = (g, nodes, n, r)
    return out


def candidates() -> dict[str, tuple[int, int, int, int]]:
    """The races replayed, by bench's --method name -> (g, nodes, lookup, retrieve): the wide ones and race_grid.py's
    small ones, all from the one recording (so that the rule compares them at the same positions)."""
    out = {tuning.race_name(0, n, 0): (0, 0, n, 0) for n in (8, 12, 16)}
    for nodes in (8, 16, 24, 32, 48, 64):
        for g in (2, 3):
            for n in (0, 4, 8, 16):
                for r in (0, 4, 8, 16):
                    out[tuning.race_name(g, n, r, nodes)] = (g, nodes, n, r)
    out.update({tuning.race_name(0, n, 0): (0, 0, n, 0) for n in (1, 2, 3, 4, 6)})
    for g in (1, 2):
        for n in (0, 1, 2, 3, 4, 6, 8, 12, 16):
            for r in RETRIEVES:
                out[tuning.race_name(g, n, r)] = (g, 0, n, r)
    return out


class BlockSpy:
    """Each step's DFlash block (its per-slot logits), caught as the engine's own session computes it."""

    def __init__(self):
        self.last = None
        self._orig = dflash.DFlashSession.block_logits
        spy = self

        def block_logits(session, tokens):
            spy.last = out = spy._orig(session, tokens)
            spy.session = session
            return out
        dflash.DFlashSession.block_logits = block_logits

    def take(self, k: int, depth: int) -> dict | None:
        """The last block's first `depth` slots: "values", each slot's k largest probabilities (top_tree's input),
        and "tokens", for each width w of the engine's top-k (2 to k + 1), each slot's top w target token ids."""
        if self.last is None:
            return None
        probs = torch.softmax(self.last[:depth].float(), dim=-1)  # greedy: sampling.warp's plain softmax
        values = torch.topk(probs, k).values.tolist()
        tokens = {w: [self.session.d.target_ids(row) for row in torch.topk(probs, w).indices.tolist()]
                  for w in range(2, k + 2)}
        self.last = None
        return {"values": values, "tokens": tokens}


def record(engine, target, store, prompt_ids: list[int], cfg: DecodeConfig, spy: BlockSpy | None = None
           ) -> list[dict]:
    events, blocks = [], []
    for e in engine.steps(prompt_ids, cfg):  # a step's block is caught before its event is yielded
        events.append(e)
        blocks.append(spy.take(cfg.tree_topk, cfg.gamma) if spy else None)
    output = [t.token_id for e in events for t in e.emitted]
    steps, done = [], 0
    for e, block in zip(events, blocks):
        context = prompt_ids + output[:done]
        cap = cfg.max_new_tokens - done - 1
        if e.drafts and cap > 0:
            chain, order = match(context, min(cfg.lookup, cap), cfg.pld_ngram_max, cfg.pld_ngram_min, target.eos_ids)
            room = min(cfg.gamma, cap)
            mine = ({"block": {"values": block["values"][:room], "tokens": {w: t[:room] for w, t in
                                                                            block["tokens"].items()}}}
                    if block is not None else {"eagle": eagle_nodes(e.drafts)})
            steps.append({**mine, "lookup": (chain, order),
                          "retrieve": {str(r): store.drafts(context, r, cap) for r in RETRIEVES if r},
                          "future": output[done:done + max(DEPTH, cfg.gamma, cfg.lookup, cfg.retrieve) + 2],
                          "measured": (1 + len(e.drafts), len(e.emitted))})
        done += len(e.emitted)
    return steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--drafter", choices=("eagle", "dflash"), default="eagle",
                    help="dflash: DFlash's races, greedy, added to the grid's (module docstring)")
    ap.add_argument("--grid", default=str(ROOT / "assets" / "profiles" / "race-grid-smollm2-135m.json"))
    args = ap.parse_args()
    block = args.drafter == "dflash"
    if block and args.temperature > 0:
        ap.error("--drafter dflash replays greedy races only (module docstring): drop --temperature")
    torch.set_grad_enabled(False)
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    engine, store = engines.build(args.drafter, target), datastore_for(target.name, ANSWERS[target.name])
    spy = BlockSpy() if block else None
    cfg = (BLOCK_LARGEST if block else LARGEST).with_(max_new_tokens=args.max_new_tokens,
                                                       temperature=args.temperature, top_p=args.top_p)
    rows = prompts.pick(prompts.read(TRAIN_PROMPTS)[HELD_OUT_FROM:], limit=args.limit)
    steps, t0 = [], time.time()
    for row in rows:
        steps += record(engine, target, store, target.encode_prompt(row["prompt"]), cfg, spy)
    largest = (cfg.gamma if block else DEPTH, cfg.tree_nodes, cfg.lookup, cfg.retrieve)
    same = sum(replay(s, *largest) == tuple(s["measured"]) for s in steps)
    configs = {}
    for name, shape in (block_candidates() if block else candidates()).items():
        hist, tokens = collections.Counter(), 0
        for s in steps:
            r, t = replay(s, *shape)
            hist[r] += 1
            tokens += t
        configs[name] = {"steps": len(steps), "tokens": tokens, "rows": {str(k): hist[k] for k in sorted(hist)}}
    grid = json.loads(Path(args.grid).read_text())
    sampled = args.temperature > 0
    recorded = tuning.race_name(largest[0], largest[2], largest[3], largest[1], args.drafter)
    what = (f"{len(rows)} training prompts from index {HELD_OUT_FROM} (held out), {len(steps)} steps of {recorded}"
            f"{f' at temperature {args.temperature}, top-p {args.top_p}' if sampled else ' greedy'}; replay matches "
            f"{same}/{len(steps)} measured steps; command: python experiments/probes/race_grid_wide.py "
            + " ".join(sys.argv[1:]))
    # the other drafters' races stay: each drafter's races come from its own recording, on the same prompts
    mine = {tuning.race_drafter(n) for n in configs}
    kept = {n: c for n, c in grid.get("configs", {}).items() if tuning.race_drafter(n) not in mine}
    if sampled:
        grid["sampled"] = {"temperature": args.temperature, "top_p": args.top_p, "recorded": what, "configs": configs}
    elif block:
        grid.setdefault("recorded", {})[args.drafter] = what
        grid["configs"] = {**kept, **configs}
    else:  # every race of EAGLE and prompt lookup from this one recording: compared at the same positions
        grid.pop("wide", None)
        grid.update({"prompts": f"{len(rows)} training prompts from index {HELD_OUT_FROM} (held out), round-robin by "
                                "category", "recorded_with": recorded,
                     "steps": len(steps), "replay_matches_measured": same, "cpu": cpu_name(),
                     "command": "python experiments/probes/race_grid_wide.py " + " ".join(sys.argv[1:]),
                     "configs": {**kept, **configs}})
    Path(args.grid).write_text(json.dumps(grid, indent=1) + "\n")
    print(f"# {cpu_name()}; {what}; {time.time() - t0:.0f} s")
    print("| race | τ | rows a step |")
    print("|---|---|---|")
    for name, c in sorted(configs.items(), key=lambda kv: -kv[1]["tokens"])[:40]:
        mean_rows = sum(int(k) * v for k, v in c["rows"].items()) / c["steps"]
        print(f"| {name} | {c['tokens'] / c['steps']:.3f} | {mean_rows:.2f} |")


if __name__ == "__main__":
    main()
