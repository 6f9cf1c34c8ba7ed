"""A DFlash drafter folder from a training run still under way: its checkpoint's best held-out weights, with the
config and draft vocabulary the run built (train/loop.py's build_drafter, recomputed from the same data; for a run
started with --init, that drafter's own layout and vocabulary, which the run kept), so the drafter can be measured
while training goes on.

    python -m specviz.train.dflash_snapshot OUT DEST --data FILE... [--block-size 8] [--init FOLDER]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from specviz.core import answers
from specviz.drafters import trained as drafters
from specviz.drafters.config import DrafterConfig
from specviz.drafters.dflash import DFlash, dflash_layers, mask_token
from specviz.drafters.modules import load_into
from specviz.train import distill
from specviz.train.checkpoint import read_checkpoint


def snapshot(out: Path, data: list[str], dest: Path, target, block_size: int, draft_vocab: int = 8192,
             log=print, init: Path | None = None) -> Path:
    ckpt = read_checkpoint(out / "checkpoint.pt")
    score, best = ckpt["best"]
    state = best if best is not None else ckpt["module"]
    examples: list[dict] = []
    for f in data:
        examples += answers.read_chunks(f) if Path(f).is_dir() else answers.read_examples(f)
    train_ex, held_out = distill.split(examples)
    seqs = list(distill.sequences(train_ex))
    if init is not None:  # the run went on in the init's layout and over its vocabulary (loop.build_drafter)
        cfg, kept = drafters.read_layout(init, target)
        vocab_ids = kept.get("vocab_ids")
        vocab_ids = None if vocab_ids is None else vocab_ids.long()
    else:
        vocab_ids = drafters.frequent_vocab(seqs, target.vocab_size, draft_vocab) if draft_vocab else None
        mc = target.model.config
        layers = len({k.split(".")[1] for k in state if k.startswith("layers.")})
        cfg = DrafterConfig.for_target("dflash", target.name, mc, draft_vocab,
                                       feature_layers=dflash_layers(mc.num_hidden_layers), block_size=block_size,
                                       num_hidden_layers=layers,
                                       mask_token_id=mask_token(target.tokenizer, target.vocab_size))
    module = DFlash(cfg)
    load_into(module, state, str(out / "checkpoint.pt"))
    cfg.training = {**({"init": str(init)} if init is not None else {}),
                    "data": "self-distillation: " + " + ".join(data) + f", {len(train_ex)} sequences, "
                    f"{sum(map(len, seqs))} tokens", "snapshot_of": str(out / "checkpoint.pt"),
                    "steps_at_snapshot": ckpt["step"], "train_seconds": round(ckpt["seconds"]),
                    "held_out_score_best": round(float(score), 3) if best is not None else None}
    card = (f"# dflash drafter for {cfg.target}\n\n{drafters.describe(cfg)}.\n\n"
            f"A snapshot of {out}/checkpoint.pt at step {ckpt['step']} (its best held-out weights), taken while "
            "training went on (`python -m specviz.train.dflash_snapshot`).\n\n"
            "Target frozen; trained on its own features and soft labels (self-distillation, never Spec-Bench).\n\n"
            + "".join(f"- {k.replace('_', ' ')}: {v}\n" for k, v in cfg.training.items()))
    drafters.save(dest, module, cfg, vocab_ids, card)
    log(f"saved {dest}: step {ckpt['step']}, best held-out score {cfg.training['held_out_score_best']}")
    return dest


def main(argv: list[str] | None = None) -> int:
    import torch

    from specviz.config import DEFAULT_TARGET
    from specviz.models import loader as models

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("dest")
    p.add_argument("--data", nargs="+", required=True)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--init", type=Path, help="the drafter the run started from (train's --init): its layout and "
                   "vocabulary")
    a = p.parse_args(argv)
    target = models.get(a.target, torch.device("cpu"), torch.float32)
    snapshot(Path(a.out), a.data, Path(a.dest), target, a.block_size, a.draft_vocab, init=a.init)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
