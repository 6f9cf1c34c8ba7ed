"""What k rows cost at a longer context, and whether a tree's mask or EAGLE-3's features add to it (issue 40): the
target's whole forward (CachedLM: layers, norm, head, bookkeeping) at 250 cached tokens for 1 and 7 causal rows and a
7-row tree, then the fused layers alone (causal, masked, with the hidden states out) and the head. Median of 21.

    .venv/bin/python experiments/probes/context_rows.py > experiments/results/context_rows-avx512bf16.txt
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from timing import median_seconds  # noqa: E402  (beside this file)

from specviz.core.cache import CachedLM  # noqa: E402
from specviz.core.trees import Tree  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models.loader import load  # noqa: E402

torch.set_num_threads(2)


def ms(f) -> float:
    return 1000 * median_seconds(f, 21)


target = load("smollm2-135m")
lm = CachedLM.of(target)
ids = list(range(1000, 1250))
n = len(ids)
lm.logits(ids, keep=1)
tree = Tree.from_choices([(0,), (1,), (0, 0), (2,), (0, 0, 0), (3,)])  # 6 nodes: 7 rows with the root


def causal(k: int):
    def run():
        lm.rollback(n - 1)
        lm.logits(ids + [5] * (k - 1), keep=k)
    return run


def tree_forward(features):
    def run():
        lm.rollback(n - 1)
        lm.tree_logits(ids, tree, [7] * tree.size, features=features)
    return run


fused, cache = target.fused, lm.cache
x = fused.embed(torch.tensor([5] * 7))
mask = torch.ones(1, 1, 7, n + 7, dtype=torch.bool)
mask[0, 0, :, n:] = torch.tril(torch.ones(7, 7, dtype=torch.bool))
one = ms(causal(1))
rows = [("forward, 1 causal row", one), ("forward, 7 causal rows", ms(causal(7))),
        ("forward, a 7-row tree", ms(tree_forward(False))),
        ("forward, a 7-row tree + EAGLE-3's features", ms(tree_forward((3, 16, 28)))),
        ("fused layers, 7 causal rows", ms(lambda: fused.layers(cache, x, n))),
        ("fused layers, 7 rows masked", ms(lambda: fused.layers(cache, x, n, mask=mask))),
        ("fused layers, 7 rows masked + hidden states", ms(lambda: fused.layers(cache, x, n, mask=mask, states=True))),
        ("norm + head, 7 rows", ms(lambda: fused.head(fused.norm(x))))]
print(f"# {kernels.describe()}; 2 threads; {n} cached tokens; median of 21")
print("| what | ms | over the 1-row forward |\n|---|---|---|")
for name, value in rows:
    print(f"| {name} | {value:.2f} | {value / one:.2f} |")
