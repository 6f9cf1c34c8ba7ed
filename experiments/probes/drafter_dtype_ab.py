"""The one-layer drafters in fp32 (torch) against bf16 on specviz's row kernel (what drafters.load picks beside a bf16
CPU target), in the default race's trees (+pld:6+ret:6), interleaved over 12 Spec-Bench questions, 128 new tokens,
greedy: drafting ms a step, the whole step, τ and tok/s.
Usage: .venv/bin/python experiments/probes/drafter_dtype_ab.py > experiments/results/drafter_dtype_ab.txt"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import engines, metrics, paths  # noqa: E402
from specviz.cli.bench import read_prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.engines.eagle import eagle_tree_engine  # noqa: E402
from specviz.engines.medusa import medusa_engine  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models import loader as models  # noqa: E402

target = models.get()  # the default target in this device's default dtype (on a CPU what `bench` loads)
prompts = read_prompts(str(paths.SPEC_BENCH), None, 48)
sel = prompts[1::4][:12]
def fp32(d):
    kernels.swap_out(d.module)
    d.module.float()
    d.dtype = torch.float32
    d.head_weight = d.head_weight.float()
    d.row_kernel = False
    return d
engs = {}
for kind, mk in (("eagle", eagle_tree_engine), ("medusa", medusa_engine)):
    D = paths.DRAFTERS / f"smollm2-135m-{kind}"
    engs[kind + " fp32"] = mk(target, fp32(drafters.load(D, target)))
    d16 = drafters.load(D, target)
    assert d16.row_kernel and d16.dtype == torch.bfloat16
    engs[kind + " bf16-row"] = mk(target, d16)
cfgs = {k: DecodeConfig(method=k.split()[0], lookup=6, retrieve=6, max_new_tokens=128) for k in engs}
ids0 = target.encode_prompt("Hello")
for k, e in engs.items():
    engines.generate(e, ids0, cfgs[k].with_(max_new_tokens=16))
acc = {k: [0, 0, 0, 0] for k in engs}
for i, r in enumerate(sel):
    ids = target.encode_prompt(r["prompt"])
    order = list(engs) if i % 2 == 0 else list(engs)[::-1]
    for k in order:
        run = engines.generate(engs[k], ids, cfgs[k])
        s = metrics.summarize(k, run.events)
        a = acc[k]
        a[0] += sum(e.draft_s for e in run.events)
        a[1] += s.seconds
        a[2] += len(run.token_ids)
        a[3] += len(run.events)
for k, (ds, sec, tok, st) in acc.items():
    print(f"{k:16s} draft {ds/st*1e3:5.2f} ms/step  step {sec/st*1e3:6.1f} ms  tau {tok/st:.3f}  tok/s {tok/sec:.2f}")
