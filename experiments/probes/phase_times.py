"""Where does a fused forward of k rows spend its time, phase by phase? (issue 40, item 2)

Builds the kernels with -DPHASE_TIMES (llama.c: each thread adds the time it spends in each of a layer's ten phases,
and of that the time it spends waiting for the other thread at the phase's end) and runs the default target's 30
layers over k rows at --context cached positions, the sizes interleaved in each repetition. Per phase: the
milliseconds a forward spends in it (thread 0's, which is every thread's but for the wait), of which waiting, and
for the four matmuls the GB/s of weights they stream (their bytes over the phase's time). A timed build runs a few
percent slower than the plain one; compare its phases with each other, not its totals with `profile`.

    .venv/bin/python experiments/probes/phase_times.py --rows 1,4,8,16
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_ab import build  # noqa: E402

from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import fused, kernels  # noqa: E402
from specviz.models import loader as models  # noqa: E402

PHASES = ("input norm", "q|k|v matmul", "rope + cache", "attention", "o matmul", "post norm", "gate|up matmul",
          "silu * up", "down matmul", "states copy")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--flags", default="", help="more -D flags for the build, comma-separated")
    args = ap.parse_args()
    target = models.get("smollm2-135m", torch.device("cpu"), torch.bfloat16)
    decoder = target.fused
    cfg = target.model.config
    d, hd, f = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads, cfg.intermediate_size
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
    weight_bytes = {1: qkv * d * 2, 4: d * d * 2, 6: 2 * f * d * 2, 8: d * f * 2}  # a layer's, per matmul phase
    rows = [int(r) for r in args.rows.split(",")]
    isa = kernels.best_isa()
    extra = ["-DPHASE_TIMES", *(f for f in args.flags.split(",") if f)]
    with tempfile.TemporaryDirectory() as tmp:
        _, lib = build(f"timed=.:{','.join(extra)}", isa, Path(tmp))
        lib.llama_phase_times.argtypes = [ctypes.c_void_p]
        buf = torch.zeros(len(PHASES) * 4, dtype=torch.float64)
        totals = {n: torch.zeros(len(PHASES), 2, 2, dtype=torch.float64) for n in rows}
        cache = decoder.new_cache()
        decoder.layers(cache, decoder.embed(torch.randint(0, 1000, (args.context,))), 0)
        with fused.run_on(lib):
            lib.llama_phase_times(buf.data_ptr())
            for rep in range(args.reps + 2):
                for n in rows:
                    hidden = decoder.embed(torch.randint(0, 1000, (n,)))
                    decoder.layers(cache, hidden, args.context)
                    lib.llama_phase_times(buf.data_ptr())
                    if rep >= 2:  # two warm-up rounds
                        totals[n] += buf.view(len(PHASES), 2, 2)
    print(f"# python {' '.join(sys.argv)}")
    print(f"# {cpu_name()}; {kernels.ISA_NAMES[isa]} build (-DPHASE_TIMES {' '.join(extra[1:])}); "
          f"{kernels.threads()} threads; 30 layers over k rows at {args.context} cached positions; "
          f"ms a forward, mean of {args.reps}; wait: thread 0's time waiting for the other at the phase's end")
    header = "| phase | " + " | ".join(f"k={n} ms | wait | GB/s" for n in rows) + " |"
    print(header)
    print("|---|" + "---|---|---|" * len(rows))
    for i, name in enumerate(PHASES):
        cells = []
        for n in rows:
            ms = totals[n][i, 0, 0].item() / args.reps / 1e6
            wait = totals[n][i, 0, 1].item() / args.reps / 1e6
            gbs = f"{30 * weight_bytes[i] / ms / 1e6:.1f}" if i in weight_bytes and ms else ""
            cells.append(f"{ms:.3f} | {wait:.3f} | {gbs}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    sums = [totals[n][:, 0, 0].sum().item() / args.reps / 1e6 for n in rows]
    mm = [sum(totals[n][i, 0, 0].item() for i in weight_bytes) / args.reps / 1e6 for n in rows]
    print("| all phases | " + " | ".join(f"{s:.3f} | | " for s in sums) + " |")
    print("| the matmuls | " + " | ".join(f"{m:.3f} | | {30 * sum(weight_bytes.values()) / m / 1e6:.1f}"
                                        for m in mm) + " |")


if __name__ == "__main__":
    main()
