"""Experiment (not shipped): go on training EAGLE with the KL of the positions where the answer repeats its context
(the longest earlier 3..6-token suffix match predicts the true next token) weighted W times the others.
Usage: PYTHONPATH=. python assets/bench/copy_weight_train.py W -- <python -m specviz train eagle's arguments>"""
import sys, torch, torch.nn.functional as F
from specviz.train import loop as train
from specviz.cli import main as cli
W = float(sys.argv[1]); args = sys.argv[3:]

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

orig = train.eagle_loss
def weighted_loss(module, head, embed, ids, feats, valid, noise, unroll=3, ranks=1):
    if not module.training:
        return orig(module, head, embed, ids, feats, valid, noise, unroll, ranks)
    cm = copy_mask(ids)
    d = module.cfg.hidden_size
    t = feats.shape[1] - 1
    feats_, f_in = feats[..., :d], feats[:, :-1, d:]
    f_in = module.lift(f_in)
    loss, stats, keys, values = 0.0, {}, None, None
    for step in range(unroll):
        emb = embed(F.pad(ids[:, 1 + step:], (0, step)))
        positions = torch.arange(t) + step
        mask = None if step == 0 else train.unroll_mask(t, step)
        pred, (k, v) = module(f_in, emb, positions, None if step == 0 else (keys, values), mask)
        keys, values = k, v
        m = F.pad(valid[:, 1 + step:], (0, step))
        true = F.pad(feats_[:, 1 + step:], (0, 0, 0, step))[m]
        w = 1.0 + (W - 1.0) * F.pad(cm[:, 2 + step:], (0, step + 1))[m].float()  # row i predicts token i+2+step
        kl, t_top, p_top = train._HeadKL.apply(module.readout(pred[m]), true.detach(), head.detach(), 1)
        loss = loss + (kl * w).sum() / w.sum() * (0.8 ** step)
        stats[f"top1_{step + 1}"] = train.top1(t_top, p_top)
        f_in = pred
    return loss, stats
train.eagle_loss = weighted_loss
sys.exit(cli.main(["train", "eagle"] + args))
