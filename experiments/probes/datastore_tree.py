"""Experiment (README, "The datastore branch"): the datastore's draft as a chain (the former rule: follow the most
voted next token while it holds a quarter of the occurrences still agreeing) against the tree it drafts now
(Datastore.drafts: the most voted nodes first, each with MIN_SHARE of its parent's votes), teacher-forced at every
third position of held-out answers (every eighth of the last two chunks' answers of assets/distill/ in order), with a
datastore of every other committed answer. Per position: the tokens a greedy verification would accept from the
branch alone, and the nodes it costs. No model runs:
    .venv/bin/python experiments/probes/datastore_tree.py > experiments/results/datastore_tree.txt"""
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz.core import answers, retrieval  # noqa: E402
from specviz.core.retrieval import Datastore  # noqa: E402

FORMER_SHARE = 0.25


def former_chain(store: Datastore, tokens: list[int], length: int) -> list[int]:
    """The datastore's continuation before it drafted trees: one chain, voted token by token."""
    ends = store.occurrences(tokens)
    if not len(ends) or length <= 0:
        return []
    follow = store.tokens[[min(e + d, len(store.tokens) - 1) for e in ends for d in range(1, length + 1)]]
    follow = follow.reshape(len(ends), length)
    alive = follow[:, 0] == follow[:, 0]
    out: list[int] = []
    for depth in range(length):
        column = follow[alive, depth]
        column = column[column >= 0]
        if not len(column):
            break
        token, votes = Counter(column.tolist()).most_common(1)[0]
        if votes < FORMER_SHARE * alive.sum():
            break
        out.append(int(token))
        alive &= follow[:, depth] == token
    return out


def accepted(chains: list[list[int]], truth: list[int]) -> int:
    best = 0
    for chain in chains:
        k = 0
        while k < min(len(chain), len(truth)) and chain[k] == truth[k]:
            k += 1
        best = max(best, k)
    return best


def node_count(chains: list[list[int]]) -> int:
    return len({tuple(c[:k]) for c in chains for k in range(1, len(c) + 1)})


if __name__ == "__main__":
    examples = answers.committed_examples()
    size = answers.read_manifest(answers.PROMPTS_OUT)["chunk_size"]
    held = examples[-2 * size:][::8]
    store = Datastore(e["answer_ids"] for e in examples[:-2 * size])
    rules = [("chain (former rule)", 0.25, lambda ctx, n: [former_chain(store, ctx, n)])]
    rules += [(f"tree, MIN_SHARE {share}", share, lambda ctx, n: store.drafts(ctx, n)) for share in (0.25, 0.1, 0.05)]
    print(f"held-out answers {len(held)}, datastore tokens {len(store)}")
    print("| draft | budget (tokens) | accepted per position | nodes per position |")
    print("|---|---|---|---|")
    for name, share, draft in rules:
        retrieval.MIN_SHARE = share
        for budget in (6, 8, 12, 16):
            acc = nodes = positions = 0
            for e in held:
                ctx, answer = list(e["prompt_ids"]), e["answer_ids"]
                for i in range(0, len(answer) - 1, 3):
                    chains = draft(ctx + answer[:i], budget)
                    acc += accepted(chains, answer[i:i + 16])
                    nodes += node_count(chains)
                    positions += 1
            print(f"| {name} | {budget} | {acc / positions:.3f} | {nodes / positions:.2f} |", flush=True)
