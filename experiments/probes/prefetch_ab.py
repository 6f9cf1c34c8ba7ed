"""How far ahead, into which cache and for which passes should the packed matmul prefetch its weights? Builds the
kernels once per variant (packed_linear.c's PREFETCH_LINES, PREFETCH_HINT, PREFETCH_MIN_ROWS as -D flags; `default`
is the committed setting) and times the default target's 30 fused layers over k rows at 300 cached positions, every
variant in a random order within each repetition (the host drifts between runs, so only interleaved medians
compare). Variants: `default`, or `lines,hint,min_rows` with hint 0 (_MM_HINT_T0, L1), 1 (_MM_HINT_T1, L2),
2 (_MM_HINT_T2) or nta (_MM_HINT_NTA).

    .venv/bin/python experiments/probes/prefetch_ab.py default 16,0,5 32,1,1 96,1,1 64,0,1 --reps 40 \\
        > experiments/results/prefetch_ab-avx512bf16.txt
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import fused, kernels  # noqa: E402
from specviz.models import loader as models  # noqa: E402

HINTS = {"0": "_MM_HINT_T0", "1": "_MM_HINT_T1", "2": "_MM_HINT_T2", "nta": "_MM_HINT_NTA"}


def build(variant: str, isa: str, folder: Path):
    """The kernels built for `isa` with the variant's -D flags, loaded and typed for the fused decoder."""
    flags = []
    if variant != "default":
        lines, hint, min_rows = variant.split(",")
        flags = [f"-DPREFETCH_LINES={int(lines)}", f"-DPREFETCH_HINT={HINTS[hint]}",
                 f"-DPREFETCH_MIN_ROWS={int(min_rows)}"]
    out = folder / f"kernels-{variant.replace(',', '_')}.so"
    command = kernels.compile_command(isa, out)
    command[command.index("-o"):command.index("-o")] = flags
    subprocess.run(command, check=True, capture_output=True)
    return fused.load_build(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--rows", default="1,2,3,4,8,12,16")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--context", type=int, default=300)
    args = ap.parse_args()
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    decoder = target.fused
    if decoder is None:
        raise SystemExit("the fused decoder does not run here")
    isa = kernels.best_isa()
    with tempfile.TemporaryDirectory() as tmp:
        libs = {v: build(v, isa, Path(tmp)) for v in args.variants}
        rows = [int(r) for r in args.rows.split(",")]
        cache = decoder.new_cache()
        decoder.layers(cache, decoder.embed(torch.randint(0, 1000, (args.context,))), 0)
        seconds = {(v, n): [] for v in libs for n in rows}
        for _ in range(args.reps):
            for n in rows:
                hidden = decoder.embed(torch.randint(0, 1000, (n,)))
                for v in random.sample(list(libs), len(libs)):
                    with fused.run_on(libs[v]):
                        start = time.perf_counter()
                        decoder.layers(cache, hidden, args.context)
                        seconds[(v, n)].append(time.perf_counter() - start)
    print(f"# {cpu_name()}; {kernels.ISA_NAMES[isa]} build; {torch.get_num_threads()} threads; the 30 fused layers "
          f"over k rows at {args.context} cached positions, ms, medians of {args.reps} interleaved repetitions")
    median = {key: statistics.median(values) * 1e3 for key, values in seconds.items()}
    print("| k | " + " | ".join(args.variants) + " |")
    print("|---|" + "---|" * len(args.variants))
    for n in rows:
        print(f"| {n} | " + " | ".join(f"{median[(v, n)]:.2f}" for v in args.variants) + " |")
    print(f"| T({rows[-1]})/T({rows[0]}) | " + " | ".join(f"{median[(v, rows[-1])] / median[(v, rows[0])]:.2f}"
                                                       for v in args.variants) + " |")


if __name__ == "__main__":
    main()
