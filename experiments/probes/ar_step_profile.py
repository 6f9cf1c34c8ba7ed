"""What one AR step of the default target costs on this CPU, against what the memory could give (issue 31).

Measures, in one run: the read bandwidth (torch.sum over 1 GiB of bf16, 2 threads); the tok/s of
`engines.build("ar", target)` for 64 greedy tokens after a short prompt (median of --reps runs, interleaved):
specviz on its fused decoder (models/fused.py, "after"), specviz on the stock transformers decoder ("before",
the same LoadedModel with fused=None: torch's matmuls, DynamicCache, a padding row), and the stock references
(transformers bf16 sdpa, fp32 sdpa); a torch.profiler table of AR steps, per op, for both specviz decoders, and
the fused step's parts (the C layers, the final norm and head, the rest); T(k)/T(1) of verifying k drafts; and
each Linear shape of the target (576x576, 192x576, 1536x576, 576x1536, the 49152x576 head) for 1..32 rows
through torch bf16 (oneDNN), torch fp32, specviz's C kernels.linear and the packed matmul of the fused
decoder, with the GB/s each streams. The matmuls rotate over enough copies of each weight to leave the caches
(the model's 269 MB never fit).

Usage: .venv/bin/python experiments/probes/ar_step_profile.py [--skip-shapes] [--skip-profile] [--no-references]
Writes experiments/results/ar_step_profile-<cpu>.txt (cpu: amx, avx512bf16, avx512 or avx2). The kernels' threads
follow SPECVIZ_KERNEL_THREADS (default: torch's, 2 here).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from timing import median_seconds  # noqa: E402  (experiments/probes/timing.py: the probes' one median timer)

from specviz import engines  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.core.cache import CachedLM  # noqa: E402
from specviz.models import fused, kernels, loader  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper and a storm."
SHAPES = {"q/o 576x576": (576, 576), "k/v 192x576": (192, 576), "gate/up 1536x576": (1536, 576),
          "down 576x1536": (576, 1536), "head 49152x576": (49152, 576)}
ROWS = (1, 2, 4, 8, 16, 32)


def cpu_name() -> str:
    flags = kernels.cpu_flags()
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512bf16"
    return "avx512" if "avx512f" in flags else "avx2"


def bandwidth(out) -> float:
    big = torch.ones(1 << 29, dtype=torch.bfloat16)  # 1 GiB
    seconds = median_seconds(lambda: torch.sum(big), reps=7, warmup=2)
    gbs = big.numel() * 2 / seconds / 1e9
    out(f"read bandwidth: torch.sum over 1 GiB bf16, {torch.get_num_threads()} threads: {gbs:.1f} GB/s "
        f"({seconds * 1e3:.1f} ms)")
    return gbs


def step_bytes(model: torch.nn.Module) -> int:
    """The bytes one decode step streams: every Linear weight (the tied head once) and the norms."""
    seen, total = set(), 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and not isinstance(module, torch.nn.Embedding):
            if weight.data_ptr() not in seen:
                seen.add(weight.data_ptr())
                total += weight.numel() * weight.element_size()
    return total


def ar_rates(targets: dict, reps: int, out, tokens: int = 64) -> dict:
    """tok/s of each named target's AR engine, runs interleaved, median of reps."""
    rates = {name: [] for name in targets}
    ids = next(iter(targets.values())).encode_prompt(PROMPT)
    cfg = DecodeConfig(method="ar", max_new_tokens=tokens)
    outputs = {}
    for name, target in targets.items():  # warm-up
        engines.generate(engines.build("ar", target), ids, cfg)
    for _ in range(reps):
        for name, target in targets.items():
            run = engines.generate(engines.build("ar", target), ids, cfg)
            seconds = sum(e.draft_s + e.verify_s for e in run.events)
            rates[name].append(len(run.token_ids) / seconds)
            outputs[name] = run.token_ids
    result = {}
    for name, target in targets.items():
        rate = statistics.median(rates[name])
        gb = step_bytes(target.model) / 1e9
        result[name] = rate
        out(f"AR {name:28s} {rate:6.1f} tok/s  ({1e3 / rate:5.1f} ms/token, {gb * rate:5.1f} GB/s of {gb * 1e3:.0f} MB "
            f"weights; runs {', '.join(f'{r:.1f}' for r in rates[name])}; {len(outputs[name])} tokens)")
    return result


@torch.inference_mode()
def ar_profile(target, label: str, out, steps: int = 32) -> None:
    from torch.profiler import ProfilerActivity, profile

    ids = target.encode_prompt(PROMPT)
    lm = CachedLM.of(target)
    tokens = list(ids) + [int(lm.logits(ids)[0].argmax())]
    for _ in range(4):  # warm
        tokens.append(int(lm.logits(tokens)[0].argmax()))
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            tokens.append(int(lm.logits(tokens)[0].argmax()))
    wall = (time.perf_counter() - start) / steps
    out(f"\ntorch.profiler, {label}: {steps} AR steps of CachedLM.logits (profiled wall {wall * 1e3:.1f} ms/step; "
        f"self CPU ms per step, top ops):")
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows)
    out(f"  {'op':40s} {'self ms/step':>12s} {'calls/step':>10s} {'share':>6s}")
    for e in rows[:16]:
        out(f"  {e.key[:40]:40s} {e.self_cpu_time_total / 1e3 / steps:12.2f} {e.count / steps:10.1f} "
            f"{100 * e.self_cpu_time_total / total:5.1f}%")
    out(f"  {'(all ops)':40s} {total / 1e3 / steps:12.2f}")


@torch.inference_mode()
def fused_parts(target, out, reps: int = 21) -> None:
    """The fused step's parts at the prompt's length: the C layers (one call), the final norm + LM head, the whole
    CachedLM.logits step; and T(k)/T(1) of a forward verifying k drafts."""
    ids = target.encode_prompt(PROMPT)
    lm = CachedLM.of(target)
    tokens = list(ids) + [int(lm.logits(ids)[0].argmax())]
    decoder, start = target.fused, len(tokens) - 1
    hidden = decoder.embed(torch.tensor(tokens[-1:]))
    row = torch.randn(1, decoder.d).bfloat16()

    def step(k: int = 0):
        lm.logits(tokens, [5] * k, keep=k + 1)
        lm.rollback(start)
    parts = {"C layers (llama_layers)": lambda: decoder.layers(lm.cache, hidden, start),
             "final norm + head": lambda: decoder.head(decoder.norm(row)), "whole step": step}
    times = {name: [] for name in parts}
    for _ in range(reps):
        for name, f in parts.items():
            times[name].append(median_seconds(f, 1, warmup=0))
    out(f"\nfused step parts at {start} cached tokens (ms, median of {reps}, interleaved):")
    for name, ts in times.items():
        out(f"  {name:28s} {statistics.median(ts) * 1e3:7.2f}")
    sizes = (0, 1, 3, 7, 15, 31)
    costs = {k: [] for k in sizes}
    for _ in range(7):
        for k in sizes:
            costs[k].append(median_seconds(lambda: step(k), 1, warmup=0))
    base = statistics.median(costs[0])
    out("  T(k)/T(1), a forward of k rows (1 token + k-1 drafts): " + ", ".join(
        f"{k + 1}: {statistics.median(costs[k]) / base:.2f}" for k in sizes) + f"  (T(1) {base * 1e3:.1f} ms)")


@torch.inference_mode()
def linear_shapes(out, budget_mb: int = 160) -> None:
    """Each shape x rows: ms and GB/s of the weight read, rotating over copies that exceed the caches."""
    generator = torch.Generator().manual_seed(0)
    out(f"\nLinear shapes, ms per call (GB/s of weight streamed), weights rotated over >= {budget_mb} MB of copies:")
    kinds = ["torch bf16", "torch fp32"] + (["kernels.linear", "packed (fused)"] if kernels.available() else [])
    out(f"  {'shape':18s} {'rows':>4s} " + " ".join(f"{k:>22s}" for k in kinds))
    for label, (n, k) in SHAPES.items():
        base = (torch.randn(n, k, generator=generator) * 0.05).bfloat16()
        copies = max(2, budget_mb * 10 ** 6 // (n * k * 2))
        w16 = [base.clone() for _ in range(copies)]
        w32 = [w.float() for w in w16[:max(2, copies // 2)]]
        packed = [fused.pack(w) for w in w16] if kernels.available() else []
        for rows in ROWS:
            x16 = torch.randn(rows, k, generator=generator).bfloat16()
            x32 = x16.float()
            cells = []
            for kind in kinds:
                ws = {"torch fp32": w32, "packed (fused)": packed}.get(kind, w16)
                x = x32 if kind == "torch fp32" else x16
                f = {"kernels.linear": kernels.linear, "packed (fused)": lambda x, w: packed_linear(x, w, n)}.get(
                    kind, torch.nn.functional.linear)
                i = [0]

                def call():
                    f(x, ws[i[0] % len(ws)])
                    i[0] += 1
                reps = max(5, min(200, len(ws) * 3))
                seconds = median_seconds(call, reps, warmup=len(ws))
                gbs = n * k * (4 if kind == "torch fp32" else 2) / seconds / 1e9
                cells.append(f"{seconds * 1e3:8.3f} ({gbs:5.1f} GB/s)")
            out(f"  {label:18s} {rows:4d} " + " ".join(f"{c:>22s}" for c in cells))
        del w16, w32, packed


def packed_linear(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    return fused.linear_packed(x, packed, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--skip-shapes", action="store_true")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--no-references", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    path = Path(args.out or ROOT / "experiments" / "results" / f"ar_step_profile-{cpu_name()}.txt")
    lines = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    cpu = torch.device("cpu")
    out(f"cpu: {kernels.cpuinfo('model name')} ({cpu_name()}), torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads")
    gbs = bandwidth(out)
    target = loader.get()
    stock_decoder = loader.stock_decoder(target)
    out(f"target: {target.name} {target.dtype} attention={target.attention} fused={target.fused is not None} "
        f"({kernels.describe()}, {kernels.threads()} kernel threads); stock decoder: matmul={target.matmul} "
        f"pad_one_row={stock_decoder.pad_one_row} max_rows={stock_decoder.max_rows}; "
        f"{step_bytes(target.model) / 1e6:.0f} MB a step, roofline {gbs * 1e9 / step_bytes(target.model):.0f} tok/s")
    targets = {"specviz fused (after)": target} if target.fused is not None else {}
    targets["specviz stock decoder (before)"] = stock_decoder
    if not args.no_references:
        targets["stock bf16 sdpa"] = loader.get(target.name, cpu, torch.bfloat16, attention="sdpa")
        targets["stock fp32 sdpa"] = loader.get(target.name, cpu, torch.float32)
    ar_rates(targets, args.reps, out)
    if not args.skip_profile:
        ar_profile(stock_decoder, "specviz on the stock decoder (before)", out)
        if target.fused is not None:
            ar_profile(target, "specviz on the fused decoder (after)", out)
            fused_parts(target, out)
    if not args.skip_shapes:
        linear_shapes(out)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
