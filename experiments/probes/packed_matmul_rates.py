"""Is verifying k rows bound by the bf16 units or by memory and compute taking turns? (issue 31)

The fused decoder's packed matmul (models/kernels/packed_linear.c) runs the target's Linears. For k = 1..32 rows this
times it two ways, in one run:
- cache-resident: one 3072x576 weight (gate+up, 3.5 MB, in L3) called 30 times: the rate the dot-product units give
  when memory is no limit;
- streaming: 20 distinct gate+up weights and 20 distinct 576x1536 down weights (106 MB, beyond every cache): what a
  forward sees, with each weight read from memory once per call.
The peak is the CPU's bf16 multiply-add rate, 32 a cycle a core for AVX512-BF16's vdpbf16ps on 512 bits (Zen 4 issues
one a cycle), at the clock /proc/cpuinfo reports. Where streaming k rows takes about the cache-resident compute time
plus the one-row memory time, compute and memory take turns rather than overlap.
With --model, also the default target's 30 layers: the fused decoder's whole forward over k rows (FusedLlama.layers,
64 cached tokens) against the same layers' four matmuls alone (QKV, O, gate+up, down through linear_packed on the
decoder's own packed weights): what a verified row costs beyond its arithmetic (attention, norms, RoPE, SiLU, the
phases' barriers).

Usage: .venv/bin/python experiments/probes/packed_matmul_rates.py [--reps 9] [--model]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from timing import median_seconds  # noqa: E402  (experiments/probes/timing.py: the probes' one median timer)

from specviz.models import fused, kernels  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--model", action="store_true", help="also the target's layers against their matmuls alone")
    args = ap.parse_args()
    threads = kernels.threads()
    mhz = float(kernels.cpuinfo("cpu MHz") or 0)
    peak = 32 * mhz * 1e6 * threads if "avx512_bf16" in kernels.cpu_flags() else float("nan")
    print(f"# {kernels.cpuinfo('model name')}, {threads} threads, {mhz:.0f} MHz; {kernels.describe()}")
    print(f"# bf16 peak (32 multiply-adds a cycle a core at the clock /proc/cpuinfo reports; past 100%: the cores "
          f"boost above it): {peak / 1e9:.0f} G MAC/s")
    torch.manual_seed(0)
    gate_up = [fused.pack(torch.randn(3072, 576).bfloat16()) for _ in range(20)]
    down = [fused.pack(torch.randn(576, 1536).bfloat16()) for _ in range(20)]
    streamed = 20 * 2 * 3072 * 576  # multiply-adds a row over the streamed weights (= their bf16 weights)
    print(f"{'k':>3} {'resident G MAC/s':>17} {'% peak':>7} {'streaming G MAC/s':>18} {'GB/s':>6} {'ms':>6} "
          f"{'resident ms':>12} {'streaming / (resident + k=1 streaming)':>39}")
    one_row = None
    for k in (1, 2, 4, 8, 12, 16, 32):
        x, x_down = torch.randn(k, 576).bfloat16(), torch.randn(k, 1536).bfloat16()

        def resident() -> None:
            for _ in range(40):
                fused.linear_packed(x, gate_up[0], 3072)

        def streaming() -> None:
            for w in gate_up:
                fused.linear_packed(x, w, 3072)
            for w in down:
                fused.linear_packed(x_down, w, 576)

        t_res = median_seconds(resident, args.reps) * streamed / (40 * 3072 * 576)  # scaled to the streamed MACs
        t_str = median_seconds(streaming, args.reps)
        one_row = one_row if one_row is not None else t_str
        print(f"{k:3d} {k * streamed / t_res / 1e9:17.1f} {100 * k * streamed / t_res / peak:6.0f}% "
              f"{k * streamed / t_str / 1e9:18.1f} {2 * streamed / t_str / 1e9:6.1f} {t_str * 1e3:6.2f} "
              f"{t_res * 1e3:12.2f} {t_str / (t_res + one_row):39.2f}")
    if args.model:
        model_rows(args.reps)


def model_rows(reps: int) -> None:
    from specviz.core.cache import CachedLM
    from specviz.models import loader

    cpu = torch.device("cpu")
    target = loader.get("smollm2-135m", cpu, loader.default_dtype(cpu))
    decoder = target.fused
    lm = CachedLM.of(target)
    lm.logits(list(range(100, 164)))  # 64 cached tokens
    layers = [decoder.matmuls(i) for i in range(decoder.n_layers)]
    print(f"\n# {target.name}: {decoder.n_layers} layers over k rows after 64 cached tokens; matmuls alone: the same "
          f"packed weights through linear_packed")
    print(f"{'k':>3} {'layers ms':>10} {'T(k)/T(1)':>10} {'matmuls ms':>11} {'M(k)/M(1)':>10} {'rest ms':>8}")
    first = None
    for k in (1, 2, 4, 8, 12, 16):
        hidden = decoder.embed(torch.arange(200, 200 + k))
        inputs = {n_in: torch.randn(k, n_in).bfloat16() for n_in in {k_in for _, _, k_in in layers[0]}}

        def matmuls() -> None:
            for layer in layers:
                for packed, n_out, n_in in layer:
                    fused.linear_packed(inputs[n_in], packed, n_out)

        t_layers = median_seconds(lambda: decoder.layers(lm.cache, hidden, 64), reps)
        t_mm = median_seconds(matmuls, reps)
        first = first or (t_layers, t_mm)
        print(f"{k:3d} {t_layers * 1e3:10.2f} {t_layers / first[0]:10.2f} {t_mm * 1e3:11.2f} {t_mm / first[1]:10.2f} "
              f"{(t_layers - t_mm) * 1e3:8.2f}")


if __name__ == "__main__":
    main()
