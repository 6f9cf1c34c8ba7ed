"""How far do a forward's matmuls overlap with the weight stream (issue 40)? For k rows: the fused layers over a
128-token cache (the weights streamed from memory) and the head, against layer 0's four packed matmuls called 30
times (their 7 MB stays in cache: the arithmetic alone). overlap = (streamed 1 row + resident k rows − streamed k rows)
/ resident k rows: 1 when the arithmetic hides entirely under the stream, 0 when it adds to it. Median of 15.

    .venv/bin/python experiments/probes/resident_vs_streamed.py \\
        > experiments/results/resident_vs_streamed-avx512bf16.txt
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from timing import median_seconds  # noqa: E402  (beside this file)

from specviz.models import fused as F  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models.loader import load  # noqa: E402

torch.set_num_threads(2)


def ms(f) -> float:
    return 1000 * median_seconds(f, 15)


target = load("smollm2-135m")
decoder = target.fused
cache = decoder.new_cache()
decoder.layers(cache, decoder.embed(torch.randint(0, 49000, (128,))), 0)


rows = {}
for k in (1, 2, 4, 8, 16):
    x = decoder.embed(torch.randint(0, 49000, (k,)))
    streamed = ms(lambda: decoder.layers(cache, x, 128))
    head = ms(lambda: decoder.head(decoder.norm(x)))
    zeros = {K: torch.zeros(k, K, dtype=torch.bfloat16) for _, _, K in decoder.matmuls(0)}
    resident = sum(ms(lambda: F.linear_packed(zeros[K], w, n)) for w, n, K in decoder.matmuls(0)) * decoder.n_layers
    rows[k] = (streamed, head, resident)
print(f"# {kernels.describe()}; 2 threads; 128 cached tokens; median of 15")
print("| k | layers streamed ms | T/T(1) | head ms | matmuls resident ms (30 x layer 0) | overlap |")
print("|---|---|---|---|---|---|")
for k, (streamed, head, resident) in rows.items():
    overlap = (rows[1][0] + resident - streamed) / resident if k > 1 else float("nan")
    print(f"| {k} | {streamed:.2f} | {streamed / rows[1][0]:.2f} | {head:.2f} | {resident:.2f} | {overlap:.2f} |")
