"""How many multiply-adds a second does the packed matmul's tile sustain on one core for k rows, with the weights in
cache (memory no limit)? Against a git revision's kernels (kernel_ab.py's `name=source[:flags]` variants), on one
thread, the best of --reps interleaved calls (the least disturbed by a shared host's other work): the gate+up weight
(3072 x 576) and the down weight (576 x 1536) of the default target's shapes, random values, STORE_F32. Compare with
host_bound.py's register-only FMA rate on one thread.

    SPECVIZ_KERNEL_ISA=avx2 .venv/bin/python experiments/probes/packed_tile_rates.py base=db8d258 new=.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_ab import build  # noqa: E402  (the same variants, built the same way)

from specviz.models import fused, kernels  # noqa: E402

SHAPES = {"gate+up": (3072, 576), "down": (576, 1536)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="name=source[:flags]; the first is the baseline")
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8,12,16")
    ap.add_argument("--reps", type=int, default=60)
    args = ap.parse_args()
    isa = kernels.best_isa()
    rows = [int(r) for r in args.rows.split(",")]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        libs = dict(build(spec, isa, Path(tmp)) for spec in args.variants)
        names = list(libs)
        with fused.run_on(libs[names[0]]):  # the layout is the same in every variant
            packed = {s: fused.pack(torch.randn(*shape).bfloat16()) for s, shape in SHAPES.items()}
        best: dict = {}
        for _ in range(args.reps):
            for m in random.sample(rows, len(rows)):
                for s, (n, k) in SHAPES.items():
                    x, y = torch.randn(m, k).bfloat16(), torch.empty(m, n)
                    for name in random.sample(names, len(names)):
                        lib = libs[name]
                        start = time.perf_counter()
                        for _ in range(5):
                            lib.linear_packed(x.data_ptr(), packed[s].data_ptr(), y.data_ptr(), m, k, n, 2, 1)
                        seconds = (time.perf_counter() - start) / 5
                        best[(name, m, s)] = min(best.get((name, m, s), 1e9), seconds)
    env = " ".join(f"{k}={v}" for k, v in sorted(__import__("os").environ.items()) if k.startswith("SPECVIZ_"))
    print(f"# {env} python {' '.join(sys.argv)}".replace("#  ", "# "))
    print(f"# {kernels.cpuinfo('model name')}; {kernels.ISA_NAMES[isa]} build; 1 thread; weights in cache; G "
          f"multiply-adds a second, the best of {args.reps} interleaved calls")
    print("| k | " + " | ".join(f"{v} {s}" for v in names for s in SHAPES) + " |")
    print("|---|" + "---|" * (len(names) * len(SHAPES)))
    for m in rows:
        print(f"| {m} | " + " | ".join(f"{m * n * k / best[(v, m, s)] / 1e9:.1f}" for v in names
                                       for s, (n, k) in SHAPES.items()) + " |")


if __name__ == "__main__":
    main()
