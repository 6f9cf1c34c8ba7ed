"""One and three rows through the drafter's matmul shapes: torch fp32, torch bf16 and specviz's bf16 row kernel.
Usage: .venv/bin/python experiments/probes/probe_drafter_matmuls.py"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from timing import median_seconds  # noqa: E402  (beside this file)

from specviz.models import kernels  # noqa: E402

torch.set_num_threads(2)
assert kernels.available()
def timeit(f):
    return round(median_seconds(f, 300, warmup=10) * 1e6, 1)
for (i, o) in ((2304, 576), (1152, 576), (576, 1536), (1536, 576), (576, 8192)):
    w = torch.randn(o, i)
    wb = w.bfloat16().contiguous()
    for m in (1, 3):
        x = torch.randn(m, i)
        xb = x.bfloat16()
        print(i, o, "rows", m, "fp32 torch", timeit(lambda: torch.nn.functional.linear(x, w)),
              "bf16 torch", timeit(lambda: torch.nn.functional.linear(xb, wb)),
              "bf16 C", timeit(lambda: kernels.linear(xb, wb)))
