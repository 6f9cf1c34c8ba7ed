"""Does a change to the C kernels make verifying k rows faster, and does it keep every bit? (issue 40, item 2)

Builds the kernels once per variant, each `name=source[:flags]`: source `.` for this worktree's kernels, else a git
revision whose specviz/models/kernels/ is compiled from `git show` into a temp folder (the baseline: the commit the
branch started from), flags comma-separated -D options (packed_linear.c's ROWS, TWO_ROWS, PREFETCH_*; llama.c's
CHUNK). Times the default target's 30 fused layers over k rows at --context cached positions, every variant in a
random order within each repetition (the host is shared and drifts: only interleaved medians compare), and checks
that every variant gives the first one's bits for every k (the layers' output; the summation order is each build's
own, so variants of one build must agree). The tables: medians, then minima (the host is shared: the least disturbed
sample), in ms, each variant over the first, and T(k)/T(1). On a busy host --clock cpu with one kernel thread
(SPECVIZ_KERNEL_THREADS=1) times the work itself: the CPU seconds the forward took, not the time it waited for a core.

    SPECVIZ_KERNEL_ISA=avx2 .venv/bin/python experiments/probes/kernel_ab.py base=db8d258 new=. --reps 30
"""
from __future__ import annotations

import argparse
import os
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

KERNELS = "specviz/models/kernels"


def build(spec: str, isa: str, folder: Path):
    """The variant `name=source[:flags]` compiled for `isa`, loaded and typed for the fused decoder."""
    name, _, rest = spec.partition("=")
    source, _, flags = rest.partition(":")
    where = kernels.SOURCE_DIR
    if source != ".":
        where = folder / f"src-{name}"
        where.mkdir()
        for file in (*kernels.SOURCES, *kernels.HEADERS):
            text = subprocess.run(["git", "show", f"{source}:{KERNELS}/{file}"], cwd=ROOT, check=True,
                                  capture_output=True).stdout
            (where / file).write_bytes(text)
    out = folder / f"kernels-{name}.so"
    command = kernels.compile_command(isa, out, where)
    command[command.index("-o"):command.index("-o")] = [f for f in flags.split(",") if f]
    subprocess.run(command, check=True, capture_output=True)
    return name, fused.load_build(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="name=source[:flags]; the first is the baseline")
    ap.add_argument("--rows", default="1,2,3,4,5,8,16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this process's CPU seconds (with SPECVIZ_KERNEL_THREADS=1: the time the forward ran, "
                         "not the time other work held the core; no threads spin waiting for each other)")
    args = ap.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    decoder = target.fused
    if decoder is None:
        raise SystemExit("the fused decoder does not run here")
    isa = kernels.best_isa()
    rows = [int(r) for r in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        libs = dict(build(spec, isa, Path(tmp)) for spec in args.variants)
        names = list(libs)
        cache = decoder.new_cache()
        decoder.layers(cache, decoder.embed(torch.randint(0, 1000, (args.context,))), 0)
        differ = set()
        for n in rows:  # the bits: every variant against the first, the same rows at the same positions
            hidden = decoder.embed(torch.randint(0, 1000, (n,)))
            outs = {}
            for name in names:
                with fused.run_on(libs[name]):
                    outs[name] = decoder.layers(cache, hidden, args.context)[0]
            differ |= {(name, n) for name in names if not torch.equal(outs[name], outs[names[0]])}
        seconds = {(v, n): [] for v in names for n in rows}
        for _ in range(args.reps):
            for n in random.sample(rows, len(rows)):
                hidden = decoder.embed(torch.randint(0, 1000, (n,)))
                for v in random.sample(names, len(names)):
                    with fused.run_on(libs[v]):
                        start = clock()
                        decoder.layers(cache, hidden, args.context)
                        seconds[(v, n)].append(clock() - start)
    env = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("SPECVIZ_")]
    print(f"# {' '.join([*env, 'python', *sys.argv])}")
    print(f"# load average at the end (1, 5, 15 min): {', '.join(f'{v:.1f}' for v in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs (other work shared the cores)")
    print(f"# {cpu_name()}; {kernels.ISA_NAMES[isa]} build; {kernels.threads()} threads; the 30 fused layers over k "
          f"rows at {args.context} cached positions, ms ({args.clock} clock), {args.reps} interleaved repetitions")
    print(f"# variants: {'; '.join(args.variants)}")
    print("# bits: " + ("every variant gives the first's layer outputs for every k" if not differ else
                        "DIFFER: " + ", ".join(f"{v} k={n}" for v, n in sorted(differ))))
    for label, pick in (("medians", statistics.median), ("best (least disturbed by the host's other work)", min)):
        value = {key: pick(values) * 1e3 for key, values in seconds.items()}
        others = names[1:]
        print(f"\n{label}, ms")
        print("| k | " + " | ".join(names) + " | " + " | ".join(f"{v}/{names[0]}" for v in others) + " | "
              + " | ".join(f"T(k)/T(1) {v}" for v in names) + " |")
        print("|---|" + "---|" * (2 * len(names) + len(others)))
        for n in rows:
            print(f"| {n} | " + " | ".join(f"{value[(v, n)]:.2f}" for v in names) + " | "
                  + " | ".join(f"{value[(v, n)] / value[(names[0], n)]:.2f}" for v in others) + " | "
                  + " | ".join(f"{value[(v, n)] / value[(v, rows[0])]:.2f}" for v in names) + " |")

if __name__ == "__main__":
    main()
