"""Timers around the target forward's parts (the attention kernel, the Linear layers, the LM head) for AR's one
token and a tree of 16 rows at 300 cached tokens. Usage: .venv/bin/python experiments/probes/probe_forward_parts.py"""
import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

import specviz.core.cache as C  # noqa: E402
from specviz import paths  # noqa: E402
from specviz.core.cache import CachedLM  # noqa: E402
from specviz.core.trees import Tree  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models.loader import load  # noqa: E402

torch.set_num_threads(2)
t = load("smollm2-135m")
q = json.loads(open(paths.SPEC_BENCH).readline())
ids = t.encode_prompt(q["turns"][0])
ids = (ids * 4)[:300]
lm = CachedLM.of(t)
lm.logits(ids, keep=1)
acc = collections.Counter()
def wrap(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        s = time.perf_counter()
        r = f(*a, **k)
        acc[label] += time.perf_counter() - s
        return r
    setattr(obj, name, g)
wrap(kernels, "attend", "attend")
wrap(torch.nn.Linear, "forward", "linear")
wrap(C, "lm_head", "head")
tree15 = Tree.from_choices([(0,), (0,0), (0,0,0)] + [(1,)+(0,)*i for i in range(6)] + [(2,)+(0,)*i for i in range(6)])
def ar():
    lm.logits(ids + [5], keep=1)
    lm.rollback(len(ids))
def tr():
    lm.rollback(len(ids) - 1)
    lm.tree_logits(ids, tree15, [7] * tree15.size, features=(3, 16, 28))
    lm.rollback(len(ids) - 1)
    lm.logits(ids, keep=1)
def tr_only():
    lm.rollback(len(ids) - 1)
    lm.logits(ids, keep=1)
for f in (ar, tr, tr_only):
    f()
for name, f in (("ar", ar), ("tree(+1 single)", tr), ("single(n_fed=1 via rollback)", tr_only)):
    acc.clear()
    n = 10
    s = time.perf_counter()
    for _ in range(n):
        f()
    tot = time.perf_counter() - s
    print(name, "total ms", round(1000 * tot / n, 1), {k: round(1000 * v / n, 1) for k, v in acc.items()})
print("the tree forward alone: the second line minus the third (each of its runs refills the root with one single "
      "forward);\n'linear' counts every nn.Linear, the LM head ('head') included")
