"""Experiment (README, "The datastore branch"): how often a drafted node of prompt lookup's and of the datastore's
continuation would be accepted, teacher-forced at every other position of held-out answers (a sixth of chunks 72-77
of assets/distill/prompts), with a datastore built from chunks 0-69 only. For the datastore's nodes not shared with
the lookup's continuation: the share accepted beyond the lookup's accepted length, by the n-gram length the lookup
matched (0 = no match). The datastore's continuation is the chain it drafted then (datastore_tree.former_chain:
Datastore.continuation, since replaced by the tree of Datastore.drafts). No model runs:
    .venv/bin/python experiments/probes/datastore_rows.py > experiments/results/datastore_rows.txt"""
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from datastore_tree import former_chain  # noqa: E402  (beside this file)

from specviz.core import answers  # noqa: E402
from specviz.core.lookup import match  # noqa: E402
from specviz.core.retrieval import Datastore  # noqa: E402

L = 6
folder = answers.PROMPTS_OUT
rows = answers.read_chunks(folder)
size = answers.read_manifest(folder)["chunk_size"]
store = Datastore(r["answer_ids"] for r in rows if r["i"] // size < 70)
held = [r for r in rows if r["i"] // size >= 72][::6]


def agree(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


lookup_reached, lookup_acc = defaultdict(int), defaultdict(lambda: [0] * L)
nodes, beyond = defaultdict(int), defaultdict(int)
for r in held:
    full = r["prompt_ids"] + r["answer_ids"]
    for t in range(len(r["prompt_ids"]), len(full) - 1, 2):
        ctx, truth = full[:t + 1], full[t + 1:t + 1 + L]
        chain, order = match(ctx, L, 3, 1)
        got = agree(chain, truth)
        lookup_reached[order] += 1
        for d in range(len(chain)):
            lookup_acc[order][d] += got > d
        retrieved = former_chain(store, ctx, L)
        kept = agree(retrieved, truth)
        for d in range(len(retrieved)):
            if retrieved[:d + 1] != chain[:d + 1]:  # a node of its own (a shared one merges into the lookup's)
                nodes[order] += 1
                beyond[order] += kept > d and got <= d
print(f"held-out answers {len(held)}, datastore tokens {len(store)}")
print("| lookup match (tokens) | positions | lookup's node accepted, depth 1..6 | datastore's own nodes "
      "| accepted beyond the lookup |")
print("|---|---|---|---|---|")
for order in sorted(lookup_reached):
    n = lookup_reached[order]
    depths = ", ".join(f"{a / n:.3f}" for a in lookup_acc[order])
    print(f"| {order} | {n} | {depths} | {nodes[order]} | {beyond[order] / max(nodes[order], 1):.3f} |")
