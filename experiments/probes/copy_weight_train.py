"""Experiment (not shipped): go on training EAGLE with the KL of the positions where the answer repeats its context
(the longest earlier 3..6-token suffix match predicts the true next token) weighted W times the others.
Usage: .venv/bin/python experiments/probes/copy_weight_train.py W [--] --init DRAFTER --out FOLDER [--steps N]
       [--lr LR] [--data FILE ...] [--batch-tokens N] [--seed N] [--precision P]
(those of `python -m specviz train eagle`'s options, with its defaults; it trains through train.train's
`custom_loss`)"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz.train import loop as train  # noqa: E402
from specviz.train import losses  # noqa: E402

W = float(sys.argv[1])
DEFAULTS = train.TrainOptions(kind="eagle")
parser = argparse.ArgumentParser(prog="copy_weight_train.py W")
parser.add_argument("--init", type=Path, default=None)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--steps", type=int, default=DEFAULTS.steps)
parser.add_argument("--lr", type=float, default=DEFAULTS.lr)
parser.add_argument("--data", nargs="+", default=None)
parser.add_argument("--batch-tokens", type=int, default=DEFAULTS.batch_tokens)
parser.add_argument("--seed", type=int, default=DEFAULTS.seed)
parser.add_argument("--precision", default=DEFAULTS.precision)
args = parser.parse_args([a for a in sys.argv[2:] if a != "--"])


def copy_mask(ids, nmin=3, nmax=6):
    """(B, T) bool: position p's token is what the longest earlier >= nmin-token suffix match of ids[:p] predicts."""
    B, T = ids.shape
    out = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        seq = ids[b].tolist()
        last = {}  # n-gram -> the position after its last occurrence
        for p in range(T):
            for n in range(nmax, nmin - 1, -1):
                if p >= n:
                    key = tuple(seq[p - n:p])
                    if key in last:
                        out[b, p] = seq[last[key]] == seq[p]
                        break
            for n in range(nmin, nmax + 1):  # record n-grams ending at p-1... (after the lookup: earlier only)
                if p >= n:
                    last[tuple(seq[p - n:p])] = p
    return out


def weighted_loss(module, head, embed, ids, feats, valid, noise, unroll=3, ranks=1):
    if not module.training:  # the held-out score: the shipped loss's
        return losses.eagle_loss(module, head, embed, ids, feats, valid, noise, unroll, ranks)
    cm = copy_mask(ids)
    d = module.cfg.hidden_size
    t = feats.shape[1] - 1
    feats_, f_in = feats[..., :d], feats[:, :-1, d:]
    f_in = module.lift(f_in)
    loss, stats, keys, values = 0.0, {}, None, None
    for step in range(unroll):
        emb = embed(F.pad(ids[:, 1 + step:], (0, step)))
        positions = torch.arange(t) + step
        mask = None if step == 0 else losses.unroll_mask(t, step)
        pred, (k, v) = module(f_in, emb, positions, None if step == 0 else (keys, values), mask)
        keys, values = k, v
        m = F.pad(valid[:, 1 + step:], (0, step))
        true = F.pad(feats_[:, 1 + step:], (0, 0, 0, step))[m]
        copies = F.pad(cm[:, 2 + step:], (0, step + 1))[m]  # row i predicts token i+2+step
        rows = module.readout(pred[m])
        # the mean KL of each group (head_kl's mean over the rows its mask keeps), weighted W to 1 per row
        kl_copy, t_copy, p_copy = losses.head_kl(rows, true, head, copies)
        kl_other, t_other, p_other = losses.head_kl(rows, true, head, ~copies)
        n_copy, n_other = int(copies.sum()), int((~copies).sum())
        loss = loss + (W * n_copy * kl_copy + n_other * kl_other) / (W * n_copy + n_other) * (0.8 ** step)
        stats[f"top1_{step + 1}"] = losses.top1(torch.cat([t_copy, t_other]), torch.cat([p_copy, p_other]))
        f_in = pred
    return loss, stats


opts = train.TrainOptions(kind="eagle", out=args.out, init=args.init, data=tuple(args.data) if args.data else None,
                          steps=args.steps, lr=args.lr, batch_tokens=args.batch_tokens, seed=args.seed,
                          precision=args.precision)
train.train(opts, custom_loss=weighted_loss)
