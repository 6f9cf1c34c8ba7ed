"""What is this host's bound on verifying k rows, and how close does the fused forward come to it? (issue 40, item 2)

A forward of k rows streams every weight once and does k rows of multiply-adds, so it cannot take less than
max(stream, k x arithmetic): the stream is the weights' (and the cache's) bytes over the read bandwidth (torch.sum
over 512 MiB of bf16, as `specviz profile` measures it), a row's arithmetic its multiply-adds over the rate the
vCPUs sustain. That rate comes from a register-only probe (fma_peak.c beside this file, compiled with the kernels
build's own flags, kernels.ISAS): independent accumulator chains, no memory operands, on 1 and on the kernels'
threads; for the AVX2 and AVX-512F builds 256-/512-bit fp32 FMAs (their matmul widens bf16 to fp32), for
AVX512-BF16 vdpbf16ps. A forced build (SPECVIZ_KERNEL_ISA=avx2 on a Zen 4) gets its bound from its own probe: a
Zen 4 runs 256-bit FMAs faster than a Zen 2, so the ratio, not the figure, carries to an AVX2-class host.

The host is shared, so each repetition measures everything once, interleaved: the read bandwidth, the FMA rate on 1
and on all threads, and the default target's forward (its 30 fused layers over k rows at --context cached
positions, the final norm and the LM head: what a verification of k rows costs) for each k in a random order; the
table gives medians and minima, and the floor comes from the best bandwidth and FMA rate of the same repetitions (the
samples least disturbed by other work on a shared host).

    .venv/bin/python experiments/probes/host_bound.py > experiments/results/host_bound-avx512bf16.txt
    SPECVIZ_KERNEL_ISA=avx2 .venv/bin/python experiments/probes/host_bound.py \\
        > experiments/results/host_bound-avx2-on-zen4.txt

On a busy host, one core with CPU clocks (the bound and T(k) of a one-thread forward):
    SPECVIZ_KERNEL_THREADS=1 .venv/bin/python experiments/probes/host_bound.py --clock cpu
"""
from __future__ import annotations

import argparse
import ctypes
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
from specviz.models import kernels  # noqa: E402
from specviz.models import loader as models  # noqa: E402

HERE = Path(__file__).resolve().parent
KINDS = {"avx2": (0, "256-bit fp32 FMA"), "avx512": (1, "512-bit fp32 FMA"), "avx512bf16": (2, "vdpbf16ps zmm")}
BANDWIDTH_BYTES = 512 << 20


def fma_probe(isa: str, folder: Path) -> ctypes.CDLL:
    """fma_peak.c compiled with `isa`'s flags (those of the kernels build), loaded."""
    out = folder / f"fma_peak-{isa}.so"
    subprocess.run([*kernels.compile_command(isa, out)[:2], *kernels.ISAS[isa][0], "-fopenmp", "-fPIC", "-shared",
                    str(HERE / "fma_peak.c"), "-o", str(out)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(out))
    lib.mac_rate.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_int]
    lib.mac_rate.restype = ctypes.c_double
    return lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,3,4,5,8,16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu (with SPECVIZ_KERNEL_THREADS=1): the forward's CPU seconds, one core's read bandwidth "
                         "(torch.sum on one thread over its CPU seconds) and the FMA rate over each thread's CPU "
                         "seconds: on a busy host, the work itself rather than the time other work held the cores")
    args = ap.parse_args()
    cpu_clock = args.clock == "cpu"
    clock = time.process_time if cpu_clock else time.perf_counter
    rows = [int(r) for r in args.rows.split(",")]
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    decoder = target.fused
    if decoder is None:
        raise SystemExit("the fused decoder does not run here")
    isa, threads = kernels.best_isa(), kernels.threads()
    if cpu_clock:
        if threads != 1:
            raise SystemExit("--clock cpu times one kernel thread: set SPECVIZ_KERNEL_THREADS=1")
        torch.set_num_threads(1)  # the bandwidth of the one core the forward runs on
    kind, what = KINDS[isa]
    # a row's multiply-adds: the four packed matmuls of each layer and the LM head (attention's, printed apart)
    matmuls = [m for layer in range(decoder.n_layers) for m in decoder.matmuls(layer)]
    macs = sum(n * k for _, n, k in matmuls) + decoder.vocab * decoder.d
    weight_bytes = sum(p.numel() * 2 for p, _, _ in matmuls) + decoder.head_packed.numel() * 2
    kv_bytes = 2 * decoder.n_layers * decoder.kv_heads * decoder.head_dim * 2 * (args.context + max(rows))
    attention_macs = 2 * decoder.n_layers * decoder.heads * decoder.head_dim * args.context
    stream_bytes = weight_bytes + kv_bytes
    buffer = torch.ones(BANDWIDTH_BYTES // 2, dtype=torch.bfloat16)
    cache = decoder.new_cache()
    decoder.layers(cache, decoder.embed(torch.randint(0, 1000, (args.context,))), 0)

    def forward(hidden: torch.Tensor) -> None:
        last, _ = decoder.layers(cache, hidden, args.context)
        decoder.head(decoder.norm(last))

    with tempfile.TemporaryDirectory() as tmp:
        probe = fma_probe(isa, Path(tmp))
        iters = 400_000  # ~10-40 ms a call
        samples: dict = {"bandwidth": [], "rate1": [], "rate": [], **{k: [] for k in rows}}
        for rep in range(args.reps + 1):
            tasks = ["bandwidth", "rate1", "rate", *rows]
            for task in random.sample(tasks, len(tasks)):
                if task == "bandwidth":
                    start = clock()
                    buffer.sum()
                    value = BANDWIDTH_BYTES / (clock() - start)
                elif task == "rate1":
                    value = probe.mac_rate(kind, iters, 1, cpu_clock)
                elif task == "rate":
                    value = probe.mac_rate(kind, iters, 2, cpu_clock)
                else:
                    hidden = decoder.embed(torch.randint(0, 1000, (task,)))
                    start = clock()
                    forward(hidden)
                    value = clock() - start
                if rep:  # the first: warm-up
                    samples[task].append(value)
    med = {key: statistics.median(values) for key, values in samples.items()}
    best = {key: max(samples[key]) for key in ("bandwidth", "rate1", "rate")}
    env = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("SPECVIZ_")]
    print(f"# {' '.join([*env, 'python', *sys.argv])}")
    print(f"# load average at the end (1, 5, 15 min): {', '.join(f'{v:.1f}' for v in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs (other work shared the cores)")
    native = [name for name, (_, needs) in kernels.ISAS.items() if needs <= kernels.cpu_flags()][-1]
    forced = f" (forced: SPECVIZ_KERNEL_ISA={isa}; this CPU's widest: {kernels.ISA_NAMES[native]})" * (isa != native)
    print(f"# {cpu_name()}; {kernels.ISA_NAMES[isa]} build{forced}; {threads} kernel thread(s); {args.clock} clock; "
          f"medians of {args.reps} repetitions, every measurement interleaved in each")
    print(f"# read bandwidth (torch.sum over {BANDWIDTH_BYTES >> 20} MiB bf16, {torch.get_num_threads()} thread(s)): "
          f"{med['bandwidth'] / 1e9:.1f} GB/s (best {best['bandwidth'] / 1e9:.1f})")
    print(f"# register-only {what} rate ({'12' if kind == 0 else '24'} independent chains): "
          f"{med['rate1'] / 1e9:.1f} G multiply-adds/s on 1 thread (best {best['rate1'] / 1e9:.1f}), "
          f"{med['rate'] / 1e9:.1f} on 2 (best {best['rate'] / 1e9:.1f})")
    print(f"# {target.name}: a forward streams {weight_bytes / 1e6:.0f} MB of packed weights + {kv_bytes / 1e6:.1f} MB "
          f"of keys/values ({args.context} cached positions); a row: {macs / 1e6:.1f} M multiply-adds in the packed "
          f"matmuls (30 layers x QKV, O, gate+up, down, and the LM head), + {attention_macs / 1e6:.1f} M in "
          f"attention (not in the floor)")
    # the floor from the best sample of each rate (the least disturbed by the host's other work), T(k) both ways
    stream = stream_bytes / best["bandwidth"]
    arith = macs / best["rate1" if threads == 1 else "rate"]
    low = {k: min(samples[k]) for k in rows}
    print(f"# floor(k) = max(stream {stream * 1e3:.2f} ms, k x {arith * 1e3:.2f} ms) at the best bandwidth and "
          f"{threads}-thread FMA rate; T(k): the fused forward (30 layers, final norm, LM head) over k rows, median "
          f"and best; efficiency = floor / best T")
    print("| k | stream ms | k x arithmetic ms | floor ms | floor(k)/floor(1) | T(k) ms | T(k)/T(1) | best T(k) ms "
          "| best T(k)/T(1) | efficiency |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    floor1 = max(stream, arith)
    for k in rows:
        floor = max(stream, k * arith)
        print(f"| {k} | {stream * 1e3:.2f} | {k * arith * 1e3:.2f} | {floor * 1e3:.2f} | {floor / floor1:.2f} | "
              f"{med[k] * 1e3:.2f} | {med[k] / med[rows[0]]:.2f} | {low[k] * 1e3:.2f} | {low[k] / low[rows[0]]:.2f} "
              f"| {floor / low[k]:.2f} |")

if __name__ == "__main__":
    main()
