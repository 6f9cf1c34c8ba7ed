"""One call of the shipped EAGLE module (one row, or three rows with the fused features) and one read of its draft
head, 300 cached positions, with an op profile. Usage: .venv/bin/python experiments/probes/probe_eagle_call.py"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from timing import median_seconds  # noqa: E402  (beside this file)

from specviz import paths  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.models.loader import load  # noqa: E402

torch.set_num_threads(2)
t = load("smollm2-135m")
d = drafters.load(paths.DRAFTERS / "smollm2-135m-eagle", t)
m = d.module
print(type(m).__name__, d.dtype)
S = 300
feats = torch.randn(1, S, d.feature_size)
ids = torch.randint(0, 1000, (S,))
def timeit(f):
    return round(median_seconds(f, 100) * 1000, 3)
with torch.inference_mode():
    out, kv = m(m.lift(d.inputs(feats)), d.embed(ids)[None], torch.arange(S), None)
    def one(n):
        return m(out[:, :n], d.embed(ids[:n])[None], torch.arange(S, S + n), kv)
    def ctx(n):
        return m(m.lift(d.inputs(feats[:, :n])), d.embed(ids[:n])[None], torch.arange(S, S + n), kv)
    print("module 1 row", timeit(lambda: one(1)), "2 rows", timeit(lambda: one(2)),
          "ctx call 3 rows", timeit(lambda: ctx(3)))
    print("head", timeit(lambda: d.logits(out[0, -1])))
    from torch.profiler import profile
    with profile() as p:
        for _ in range(20):
            one(1)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
