"""The one-layer drafters' matmuls on the packed matmul (fused.PackedLinear and the draft head packed once, what
drafters.trained.load builds) against the bf16 row kernel they ran on before (kernels.RowLinear, kernels.linear for the
head): the default race (EAGLE's tree at γ 1 with prompt lookup's and the datastore's branches of 4) run with each in
turn, question by question, in one process, after AR. Prints tokens a second, the speedup over AR, τ, and a step's
drafting, verification and whole milliseconds (the engine's timers), and whether the three lanes emitted the same
tokens.

    .venv/bin/python experiments/probes/drafter_packed_ab.py --limit 13 > experiments/results/drafter_packed_ab.txt
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from race_step import run_lanes  # noqa: E402  (beside this file)

from specviz import engines, prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.drafters import trained  # noqa: E402
from specviz.engines import eagle  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import fused, kernels  # noqa: E402
from specviz.models import loader as models  # noqa: E402

QUESTIONS = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
DRAFTER = ROOT / "assets" / "drafters" / "smollm2-135m-eagle"


def on_row_kernel(module: torch.nn.Module) -> None:
    """Every PackedLinear of `module` back to a RowLinear over the same weight (the drafters before)."""
    for name, child in module.named_children():
        if isinstance(child, fused.PackedLinear):
            setattr(module, name, kernels.RowLinear(child.to_linear()))
        else:
            on_row_kernel(child)


class RowHead(trained.Drafter):
    """A drafter whose draft head runs kernels.linear, as before."""

    def logits(self, feats: torch.Tensor, head: int | None = None) -> torch.Tensor:
        rows = self.readout(feats.reshape(-1, feats.shape[-1])).to(torch.bfloat16).contiguous()
        return kernels.linear(rows, self.head_weight).reshape(*feats.shape[:-1], -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=13)
    args = ap.parse_args()
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    packed = trained.load(DRAFTER, target)
    before = trained.load(DRAFTER, target)
    assert packed.head_packed is not None, "the packed matmul does not serve the drafters here"
    on_row_kernel(before.module)
    before.__class__ = RowHead
    cfg = DecodeConfig(method="eagle", gamma=1, lookup=4, retrieve=4, max_new_tokens=128)
    lanes = {"ar": (engines.build("ar", target), DecodeConfig(method="ar", max_new_tokens=128)),
             "row kernel": (eagle.build(target, before), cfg), "packed": (eagle.build(target, packed), cfg)}
    rows = prompts.pick(prompts.read(QUESTIONS), limit=args.limit + 1)
    print(f"# {cpu_name()}; {torch.get_num_threads()} threads; {args.limit} Spec-Bench questions after one warm-up, "
          f"128 tokens, greedy; eagle:1+pld:4+ret:4 with its drafter on each kernel")
    totals = run_lanes(target, lanes, rows)
    ar_rate = totals["ar"][1] / totals["ar"][0]
    print("| lane | tok/s | x AR | τ | draft ms | verify ms | step ms |")
    print("|---|---|---|---|---|---|---|")
    for name, (seconds, tokens, steps, draft, verify, _, _) in totals.items():
        ms = 1e3 / steps
        print(f"| {name} | {tokens / seconds:.1f} | {tokens / seconds / ar_rate:.3f}x | {tokens / steps:.2f} | "
              f"{draft * ms:.2f} | {verify * ms:.2f} | {seconds * ms:.2f} |")
    same = totals["row kernel"][6] == totals["packed"][6] == totals["ar"][6]
    print(f"same tokens (row kernel, packed, AR): {same}")


if __name__ == "__main__":
    main()
