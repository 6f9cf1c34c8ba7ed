"""llama.cpp as the outside yardstick (issue 31): its plain decoding of the same model on the same machine, beside
specviz's AR, in tok/s and in GB/s of weights streamed, in one run.

llama.cpp decodes the embedded GGUF itself (Q4_1, the file specviz de-quantizes to bf16) and the same weights in bf16
(dequantized and written as BF16 with the gguf package, so both engines stream the same 269 MB a token).
`llama-bench -p 0 -n 128 -t 2 -r REPS` gives its tg128; specviz's AR decodes 128 tokens after a short prompt,
REPS times, and reports the median (the engine's own timers, as bench does). Runs alternate between the engines.

Usage: .venv/bin/python experiments/probes/llama_cpp_yardstick.py [--bench PATH ...] [--reps 5] [--sizes 1,2,4,8,16]
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
    """The embedded Q4_1 GGUF's weights in BF16 (the bf16 values specviz decodes with), written with the gguf package
    (`make server` builds no llama-quantize): every quantized tensor dequantized and stored as BF16, the rest and the
    metadata copied."""
    out = ROOT / "out/yardstick/smollm2-135m-bf16.gguf"
    if out.exists():
        return out
    import gguf
    import numpy as np
    import torch

    reader = gguf.GGUFReader(str(q4))
    writer = gguf.GGUFWriter(str(out), "llama")
    for key, field in reader.fields.items():
        if key in ("general.architecture", "general.file_type") or key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        writer.add_key_value(key, field.contents(), vtype,
                             sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if values.ndim == 1:  # norms stay F32, as llama.cpp's converter keeps them
            writer.add_tensor(t.name, values)
            continue
        bits = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16).view(torch.int16).numpy()
        writer.add_tensor(t.name, bits.view(np.uint16), raw_shape=bits.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def batched_costs(binary: Path, gguf: Path, sizes: list[int], reps: int) -> dict[int, float]:
    """llama-bench's pp<k> (`-p k -n 0`) as milliseconds a forward of k tokens: T(k) = k / rate."""
    out = subprocess.run([str(binary), "-m", str(gguf), "-p", ",".join(map(str, sizes)), "-n", "0", "-t", "2",
                          "-r", str(reps), "-o", "json"], capture_output=True, text=True, check=True).stdout
    return {int(r["n_prompt"]): 1000 * int(r["n_prompt"]) / float(r["avg_ts"]) for r in json.loads(out)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", nargs="+", default=[str(ROOT / ".venv/bin/llama-bench")])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="", help="also llama.cpp's T(k)/T(1) on the BF16 weights for these k "
                    "(comma-separated, e.g. 1,2,3,4,5,8,16: llama-bench -p k -n 0), beside specviz's `profile`")
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
    if args.sizes:
        sizes = sorted({1, *(int(k) for k in args.sizes.split(","))})
        lines += ["", "T(k) ms (T(k)/T(1)) on the BF16 weights, llama-bench -p k -n 0 -t 2, mean of "
                  f"{args.reps}:", "| build | " + " | ".join(f"k={k}" for k in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for b in args.bench:
            cost = batched_costs(Path(b), ggufs["BF16 (the same weights)"], sizes, args.reps)
            lines.append(f"| {Path(b).parent.parent.name}/{Path(b).name} | "
                         + " | ".join(f"{cost[k]:.1f} ({cost[k] / cost[1]:.2f})" for k in sizes) + " |")
    text = "\n".join(lines)
    print(text)
    tag = "amx" if "AMX" in cpu else "avx512bf16" if "BF16" in cpu else "avx512" if "512" in cpu else "avx2"
    (ROOT / f"experiments/results/llama_cpp_yardstick-{tag}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
