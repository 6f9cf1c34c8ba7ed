"""The default target's first-start conversion from its GGUF, timed with gguf_once and without, in fresh processes.

Each arm loads `smollm2-135m` through loader.load into an empty cache folder (so it converts the GGUF, as a first
start does) and records the seconds of the transformers part (config, tokenizer, weights) and a digest of every
tensor and the tokenizer's vocabulary; arms alternate (A B A B ...), and the digests must agree.

    .venv/bin/python experiments/probes/gguf_load.py [--pairs 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ARM = r"""
import contextlib, hashlib, json, os, sys, time
os.environ["SPECVIZ_CACHE_DIR"] = sys.argv[2]
from specviz.models import gguf_once, loader
if sys.argv[1] == "without":
    gguf_once.once = contextlib.nullcontext
from transformers import AutoModelForCausalLM, AutoTokenizer  # imported before the clock starts
import torch
source = loader.resolve("smollm2-135m")
t = time.perf_counter()
with gguf_once.once():
    tok = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(source.location, gguf_file=source.gguf_file, dtype=torch.bfloat16)
seconds = time.perf_counter() - t
h = hashlib.sha256()
for name, tensor in sorted(model.state_dict().items()):
    h.update(name.encode() + tensor.view(torch.int16).numpy().tobytes())
h.update(json.dumps(sorted(tok.get_vocab().items())).encode())
print(json.dumps({"seconds": seconds, "digest": h.hexdigest()[:16]}))
"""


def arm(which: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        done = subprocess.run([sys.executable, "-c", ARM, which, cache], cwd=ROOT, capture_output=True, text=True,
                              check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    print(f"# {cpu}; load average {Path('/proc/loadavg').read_text().split()[0]}")
    seconds: dict[str, list[float]] = {"without": [], "with": []}
    digests = set()
    for _ in range(args.pairs):
        for which in ("without", "with"):
            result = arm(which)
            seconds[which].append(result["seconds"])
            digests.add(result["digest"])
            print(f"{which:>7} gguf_once: {result['seconds']:.2f} s (tensors and vocabulary {result['digest']})",
                  flush=True)
    a, b = statistics.median(seconds["without"]), statistics.median(seconds["with"])
    print(f"median without {a:.2f} s, with {b:.2f} s: {a / b:.2f}x; "
          f"{'the same tensors and vocabulary in every arm' if len(digests) == 1 else 'DIGESTS DIFFER'}")


if __name__ == "__main__":
    main()
