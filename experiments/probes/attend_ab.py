"""The row-wise attention kernel of this tree against the one at a git revision (default 3bde054, before the
even/odd rewrite), or against this tree's own AVX2 build (`avx2`: the AVX-512 build is what runs where the CPU has
it), interleaved in one process: the kernel alone (300 cached keys, 9 heads over 3 key/value heads,
30 layers) and the default target's forward (AR's one token, padded to two rows, against a tree of the root and 15
nodes) at 150, 450 and 800 cached tokens; the row matmuls run this tree's build throughout.
Usage: .venv/bin/python experiments/probes/attend_ab.py [REVISION | avx2] > experiments/results/attend_ab.txt
(REVISION: one from before the kernels moved into specviz/models/kernels/, when they were one Python file that
`git show REVISION:specviz/kernels.py` reads)"""
import functools
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from timing import median_seconds  # noqa: E402  (beside this file)

from specviz import paths  # noqa: E402
from specviz.core.cache import CachedLM  # noqa: E402
from specviz.core.trees import Tree  # noqa: E402
from specviz.models import attention, kernels  # noqa: E402
from specviz.models.loader import load  # noqa: E402

torch.set_num_threads(2)
revision = sys.argv[1] if len(sys.argv) > 1 else "3bde054"
assert kernels.available(), "no C compiler or no AVX2/FMA here"
best = kernels.best_isa()
this_attend = kernels.attend
# name -> (the build's library, for the kernel alone; the attend function the target's forward calls)
builds = {f"this tree ({best})": (kernels.library(best), functools.partial(this_attend, isa=best))}
if revision in kernels.ISAS:
    builds[f"this tree ({revision})"] = (kernels.library(revision), functools.partial(this_attend, isa=revision))
else:
    old = types.ModuleType("old_kernels")
    exec(subprocess.check_output(["git", "show", f"{revision}:specviz/kernels.py"]).decode(), old.__dict__)
    assert old.available()
    builds[revision] = (old._lib, old.attend)  # the old file's own handle: a frozen snapshot, not specviz's API


generator = torch.Generator().manual_seed(0)
heads, kv_heads, dim = 9, 3, 64
print("kernel alone, x30 layers, 2 threads (ms, median of 300)")
for length, rows in ((300, 2), (300, 16), (800, 2), (800, 16)):
    k = torch.randn(kv_heads, length, dim, generator=generator).bfloat16()
    v = torch.randn(kv_heads, length, dim, generator=generator).bfloat16()
    mask = torch.ones(1, 1, rows, length, dtype=torch.bool)
    mask[0, 0] = torch.arange(length)[None, :] <= (length - rows + torch.arange(rows))[:, None]
    index, offsets = attention.visible_index(mask, rows, length)
    q = torch.randn(rows, heads, dim, generator=generator)
    out = torch.empty_like(q)
    for name, (lib, _) in builds.items():
        def call():
            return lib.attend_bf16(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), index.data_ptr(),
                                   offsets.data_ptr(), rows, heads, kv_heads, dim, k.stride(0), dim ** -0.5, 2)
        print(f"  {length} keys, {rows} rows, {name}: {30e3 * median_seconds(call, 300, warmup=20):.2f}")

target = load("smollm2-135m")
questions = [json.loads(line) for line in open(paths.SPEC_BENCH)]
tree = Tree.from_choices([(0,), (0, 0), (0, 0, 0)] + [(1,) + (0,) * i for i in range(6)]
                         + [(2,) + (0,) * i for i in range(6)])
print("the target's forward (ms, median of 25, the two kernels interleaved)")
for context in (150, 450, 800):
    ids = sum((target.encode_prompt(q["turns"][0]) for q in questions[:20]), [])[:context]
    lm = CachedLM.of(target)
    lm.logits(ids, keep=1)

    def ar():
        start = time.perf_counter()
        lm.logits(ids + [5], keep=1)
        took = time.perf_counter() - start
        lm.rollback(len(ids))
        return took

    def verify():
        lm.rollback(len(ids) - 1)
        start = time.perf_counter()
        lm.tree_logits(ids, tree, [7] * tree.size, features=(3, 16, 28))
        took = time.perf_counter() - start
        lm.rollback(len(ids) - 1)
        lm.logits(ids, keep=1)
        return took

    times = {}
    for rep in range(26):
        for name, (_, attend) in builds.items():
            kernels.attend = attend  # what specviz.models.attention calls
            a, b = ar(), verify()
            if rep:  # the first round warms up
                times.setdefault((name, "ar"), []).append(a)
                times.setdefault((name, "tree"), []).append(b)
    for name in builds:
        a, b = (1000 * statistics.median(times[(name, kind)]) for kind in ("ar", "tree"))
        print(f"  {context} cached, {name}: AR {a:.1f}, tree of 16 rows {b:.1f}, ratio {b / a:.2f}")
kernels.attend = this_attend
