"""llama.cpp as the outside yardstick (issue 31): its plain decoding of the same model on the same machine, beside
specviz's AR, in tok/s and in GB/s of weights streamed, in one run.

llama.cpp decodes the embedded GGUF itself (Q4_1, the file specviz de-quantizes to bf16) and the same weights in bf16
(made from it with `llama-quantize --allow-requantize ... BF16`, so both engines stream the same 269 MB a token).
`llama-bench -p 0 -n 128 -t 2 -r REPS` gives its tg128; specviz's AR decodes 128 tokens after a short prompt,
REPS times, and reports the median (the engine's own timers, as bench does). Runs alternate between the engines.

Usage: .venv/bin/python experiments/probes/llama_cpp_yardstick.py [--bench PATH ...] [--reps 5]
  --bench: llama-bench binaries to compare (default: .venv/bin/llama-bench, the portable AVX2 build of `make server`;
  add a native build, e.g. out/llama.cpp/build-native/bin/llama-bench, to see what the CPU's own ISA gives).
Writes experiments/results/llama_cpp_yardstick-<cpu>.txt.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz import engines  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.core import roofline  # noqa: E402
from specviz.models import kernels, loader  # noqa: E402
from specviz.serving.server import embedded_gguf  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper and a storm."
TOKENS = 128


def llama_bench(binary: Path, gguf: Path, reps: int) -> float:
    """llama-bench's tg128 (tok/s, its mean over reps) on 2 threads."""
    out = subprocess.run([str(binary), "-m", str(gguf), "-p", "0", "-n", str(TOKENS), "-t", "2", "-r", str(reps),
                          "-o", "json"], capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def bf16_gguf(q4: Path) -> Path:
    out = ROOT / "out/yardstick/smollm2-135m-bf16.gguf"
    if not out.exists():
        quantize = ROOT / "out/llama.cpp/build/bin/llama-quantize"
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(quantize), "--allow-requantize", str(q4), str(out), "BF16", "2"], check=True,
                       capture_output=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", nargs="+", default=[str(ROOT / ".venv/bin/llama-bench")])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    q4 = embedded_gguf()
    ggufs = {"Q4_1 (the embedded GGUF)": q4, "BF16 (the same weights)": bf16_gguf(q4)}
    target = loader.get("smollm2-135m")
    weights = roofline.weight_bytes(target.model)
    ar = engines.build("ar", target)
    ids = target.encode_prompt(PROMPT)
    cfg = DecodeConfig(method="ar", max_new_tokens=TOKENS)
    engines.generate(ar, ids, cfg.with_(max_new_tokens=16))  # warm-up

    def specviz_ar() -> float:
        run = engines.generate(ar, ids, cfg)
        return len(run.token_ids) / sum(e.draft_s + e.verify_s for e in run.events)

    rates: dict[str, list[float]] = {}
    for _ in range(args.reps):  # alternate: a slow spell falls on both engines alike
        rates.setdefault("specviz AR (fused bf16)", []).append(specviz_ar())
        for b in args.bench:
            for name, g in ggufs.items():
                rates.setdefault(f"llama.cpp {name} [{Path(b).parent.parent.name}/{Path(b).name}]", []).append(
                    llama_bench(Path(b), g, 1))
    bandwidth = roofline.read_bandwidth()
    cpu = kernels.describe()
    lines = [f"cpu: {cpu}; read bandwidth {bandwidth / 1e9:.1f} GB/s (torch.sum, 2 threads); {TOKENS} tokens, "
             f"2 threads, median of {args.reps} alternating runs",
             "| decoder | tok/s | weights a token | GB/s of weights |", "|---|---|---|---|"]
    for name, rs in rates.items():
        tps = statistics.median(rs)
        size = weights if name.startswith("specviz") else next(g for k, g in ggufs.items() if k in name).stat().st_size
        lines.append(f"| {name} | {tps:.1f} | {size / 1e6:.0f} MB | {tps * size / 1e9:.1f} |")
    text = "\n".join(lines)
    print(text)
    tag = "amx" if "AMX" in cpu else "avx512bf16" if "BF16" in cpu else "avx512" if "512" in cpu else "avx2"
    (ROOT / f"experiments/results/llama_cpp_yardstick-{tag}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
