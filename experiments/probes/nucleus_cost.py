"""What top-p costs a row of SmolLM2's 49,152 logits (issue 33): sampling.warp at temperature 0.7, top-p 0.95, which
ranks only the likeliest tokens first (sampling.nucleus), against the full sort it replaced, on the target's own logits
after a few Spec-Bench prompts (1 and 11 rows: an AR step and a default race's tree), and the same on random logits,
whose nucleus is wide. Also: whether nucleus gives the bits of a full ranking whose runs of tied tokens share the mass
above them (what nucleus defines), and in how many rows the old full sort kept another set of tokens (it cut a run of
ties wherever its unstable sort happened to put them; the target's bf16 logits tie often).

    .venv/bin/python experiments/probes/nucleus_cost.py > experiments/results/nucleus_cost.txt
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from timing import median_seconds  # noqa: E402  (experiments/probes/timing.py: the probes' one median timer)

from specviz import prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.core.cache import CachedLM  # noqa: E402
from specviz.core.sampling import warp  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import loader  # noqa: E402

QUESTIONS = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


def full_sort(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """warp as it was: every token ranked."""
    probs = torch.softmax(logits.float() / cfg.temperature, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    sorted_p = sorted_p.masked_fill(mass_before >= cfg.top_p, 0.0)
    probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return probs / probs.sum(dim=-1, keepdim=True)


def full_ranking(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """Every token ranked, a run of ties sharing the mass above it (tests/test_sampling.py's reference)."""
    probs = torch.softmax(logits.float() / cfg.temperature, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cat([torch.zeros_like(sorted_p[..., :1]), torch.cumsum(sorted_p, dim=-1)[..., :-1]], dim=-1)
    first = torch.searchsorted(-sorted_p.contiguous(), -sorted_p.contiguous(), side="left")
    sorted_p = sorted_p.masked_fill(torch.gather(before, -1, first) >= cfg.top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_p / sorted_p.sum(dim=-1, keepdim=True))


def main() -> None:
    cfg = DecodeConfig(temperature=0.7, top_p=0.95)
    cpu = torch.device("cpu")
    target = loader.get("smollm2-135m", cpu, loader.default_dtype(cpu))
    rows = []
    for row in prompts.pick(prompts.read(QUESTIONS), limit=11):
        lm = CachedLM.of(target)
        rows.append(lm.logits(target.encode_prompt(row["prompt"]))[0])
    real = torch.stack(rows)  # (11, V)
    print(f"# {cpu_name()}; {torch.get_num_threads()} threads; temperature 0.7, top-p 0.95, V = {real.shape[-1]}")
    print(f"{'logits':16s} {'rows':>4s} {'nucleus ms':>11s} {'old full sort ms':>17s} {'bits = full ranking':>20s} "
          f"{'rows keeping another set than the old sort':>43s}")
    torch.manual_seed(0)
    for name, logits in (("target's own", real), ("random (N(0,9))", torch.randn_like(real) * 3)):
        for n in (1, 11):
            x = logits[:n]
            new, old = median_seconds(lambda: warp(x, cfg), 21), median_seconds(lambda: full_sort(x, cfg), 21)
            same = torch.equal(warp(x, cfg), full_ranking(x, cfg))
            other = int(((warp(x, cfg) > 0) != (full_sort(x, cfg) > 0)).any(dim=-1).sum())
            print(f"{name:16s} {n:4d} {new * 1e3:11.2f} {old * 1e3:17.2f} {str(same):>20s} {other:43d}")


if __name__ == "__main__":
    main()
