"""One, three and eight rows through the one-layer drafter's matmul shapes (EAGLE-3's fc, its q, k|v, o, gate, down and
the 8192-token draft head): torch fp32, torch bf16, specviz's bf16 row kernel (kernels.linear) and the packed matmul
the drafters run on (fused.PackedLinear, weights packed once). Microseconds a call, medians; the weights are cache-
resident after the warm-up, so a real step (weights streamed from memory) is slower for every column.
Usage: .venv/bin/python experiments/probes/probe_drafter_matmuls.py > experiments/results/drafter_matmuls-<cpu>.txt"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from timing import median_seconds  # noqa: E402  (beside this file)

from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import fused, kernels  # noqa: E402

torch.set_num_threads(2)
assert kernels.available()


def timeit(f):
    return round(median_seconds(f, 200, warmup=10) * 1e6, 1)


print(f"# {cpu_name()}; {kernels.describe()}; 2 threads; microseconds a call")
print("| in | out | rows | fp32 torch | bf16 torch | bf16 row kernel | bf16 packed |")
print("|---|---|---|---|---|---|---|")
for (i, o) in ((1728, 576), (1152, 576), (1152, 192), (576, 576), (576, 1536), (1536, 576), (576, 8192)):
    w = torch.randn(o, i)
    wb = w.bfloat16().contiguous()
    packed = fused.pack(wb)
    for m in (1, 3, 8):
        x = torch.randn(m, i)
        xb = x.bfloat16()
        print(f"| {i} | {o} | {m} | {timeit(lambda: torch.nn.functional.linear(x, w))} | "
              f"{timeit(lambda: torch.nn.functional.linear(xb, wb))} | {timeit(lambda: kernels.linear(xb, wb))} | "
              f"{timeit(lambda: fused.linear_packed(xb, packed, o))} |")
