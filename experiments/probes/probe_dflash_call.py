"""Where a DFlash step's drafting time goes: one block forward (block_size rows over a context of 300 cached
positions), the context's new rows (3 positions, as after a step that kept 2), the draft head over the block's
slots, and an op profile of the block forward; beside one AR step of the target for scale.
--torch-linears: the module's Linears on torch's bf16 matmul, as before DFlash was one of the drafters on specviz's
packed kernels (methods.MethodSpec.small).
Usage: .venv/bin/python experiments/probes/probe_dflash_call.py DRAFTER_FOLDER [--threads 1] [--torch-linears]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from timing import median_seconds  # noqa: E402  (beside this file)

from specviz.drafters import trained as drafters  # noqa: E402
from specviz.models.loader import load  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("drafter")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--context", type=int, default=300)
ap.add_argument("--torch-linears", action="store_true")
args = ap.parse_args()
torch.set_num_threads(args.threads)
if args.torch_linears:
    drafters.SMALL_KINDS = tuple(k for k in drafters.SMALL_KINDS if k != "dflash")
t = load("smollm2-135m")
d = drafters.load(args.drafter, t)
m, cfg = d.module, d.cfg
print(f"{type(m).__name__}: {cfg.num_hidden_layers} layers, block {cfg.block_size}, module {d.dtype}, "
      f"linear {type(m.layers[0].self_attn.q_proj).__name__}, head rows {d.head_weight.shape[0]}, "
      f"target matmul {t.matmul}, {args.threads} thread(s)")
S, bs = args.context, cfg.block_size
feats = torch.randn(1, S + 3, d.feature_size)


def ms(f, n=100):
    return round(median_seconds(f, n) * 1000, 3)


with torch.inference_mode():
    ctx = m.context_kv(d.inputs(feats[:, :S]), torch.arange(S))
    ids = torch.full((bs,), cfg.mask_token_id, dtype=torch.long)
    ids[0] = 42
    pos = torch.arange(S, S + bs)
    block = lambda: m(d.embed(ids)[None], pos, ctx)  # noqa: E731
    out = block()
    rows = {
        "block forward": ms(block),
        "embed": ms(lambda: d.embed(ids)[None]),
        "context, 3 new rows": ms(lambda: m.context_kv(d.inputs(feats[:, S:S + 3]), torch.arange(S, S + 3))),
        f"head, {bs - 1} slots": ms(lambda: d.logits(out[0, 1:])),
    }
    for k, v in rows.items():
        print(f"{k:>24}: {v} ms")
    from torch.profiler import profile
    with profile() as p:
        for _ in range(20):
            block()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
