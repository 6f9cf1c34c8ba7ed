"""DFlash's training loss: blocks at random anchors of each sequence, all drafted in one forward of the drafter.

A block at anchor a holds the true token at a, then block_size - 1 mask tokens at positions a + 1 ..; it sees the
target's hidden states at the positions before a (the context, as when drafting after a verified step) and the
rest of its own block (bidirectional), never another block. The output at slot k learns the target's own
distribution of the token at a + k (its LM head on the final hidden state at a + k - 1: soft labels), weighted
exp(-(k - 1) / gamma) as in the paper (later slots count less: they are reached only when every earlier one was
right). Many blocks of a sequence share its context rows, so one forward trains them all.
"""
from __future__ import annotations

import math

import torch

from specviz.train.losses import HeadKL

ANCHORS_PER_BLOCK = 2.0  # blocks per sequence: this many per block_size candidate anchors


def decay(block_size: int) -> float:
    """The paper's gamma: 7 for blocks of 16, 5 for 10, 4 for 8 (about half the block, at least 1)."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))


def anchors(valid: torch.Tensor, block_size: int,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, K) anchor positions and their (B, K) validity: per row, random positions a >= 1 whose token and next
    token are both scored (valid), about ANCHORS_PER_BLOCK per block_size of them, without repeats."""
    rows = []
    for r in range(valid.shape[0]):
        v = valid[r]
        cand = torch.nonzero(v[1:-1] & v[2:]).flatten() + 1 if v.shape[0] > 2 else torch.zeros(0, dtype=torch.long)
        n = min(len(cand), max(1, math.ceil(ANCHORS_PER_BLOCK * len(cand) / block_size)))
        rows.append(cand[torch.randperm(len(cand), generator=generator)[:n]].sort().values)
    k = max(1, max(len(r) for r in rows))
    out = torch.zeros(valid.shape[0], k, dtype=torch.long)
    ok = torch.zeros(valid.shape[0], k, dtype=torch.bool)
    for r, a in enumerate(rows):
        out[r, :len(a)], ok[r, :len(a)] = a, True
    return out, ok


def block_mask(anchor: torch.Tensor, ok: torch.Tensor, width: int, block_size: int) -> torch.Tensor:
    """(B, 1, K * bs, width + K * bs) bool: block n's slots see the context rows before its anchor and their own
    block; an unused block (not ok) sees its own first slot only (its outputs are never scored)."""
    b, k = anchor.shape
    ctx = torch.arange(width)[None, None, :] < anchor[:, :, None]  # (B, K, width)
    ctx = ctx & ok[:, :, None]
    own = torch.eye(k, dtype=torch.bool)[None].expand(b, k, k)  # (B, K, K) block n sees block n
    ctx = ctx.repeat_interleave(block_size, 1)  # (B, K*bs, width)
    blocks = own.repeat_interleave(block_size, 1).repeat_interleave(block_size, 2)
    return torch.cat([ctx, blocks], -1)[:, None]


def dflash_loss(module, head, embed, ids, feats, valid, noise: float, generator: torch.Generator | None = None):
    """The weighted soft-label loss over every scored slot of blocks at random anchors; stats: the top-1 agreement
    with the target at each slot k (top1_k, each slot on its own: a block is drafted at once), and tau, the
    tokens a step would commit on the blocks whose every slot is scored (1 + the right drafts before the first
    wrong one). Held out (module not training): anchors drawn from a fixed seed, so checkpoints compare."""
    cfg = module.cfg
    bs, d = cfg.block_size, cfg.hidden_size
    if generator is None and not module.training:
        generator = torch.Generator().manual_seed(0)
    b, w = ids.shape
    anchor, ok = anchors(valid, bs, generator)
    k = anchor.shape[1]
    slot = torch.arange(bs)
    pos = anchor[:, :, None] + slot  # (B, K, bs) the positions of each block's slots
    inside = (pos < w) & ok[:, :, None]
    pos_c = pos.clamp(max=w - 1)
    block_ids = torch.where(slot == 0, ids.gather(1, anchor)[:, :, None], torch.full_like(pos, cfg.mask_token_id))
    context = module.context_kv(feats[..., d:], torch.arange(w))
    out = module(embed(block_ids.view(b, k * bs)), pos_c.view(b, k * bs), context,
                 block_mask(anchor, ok, w, bs)).view(b, k, bs, d)
    scored = inside & valid.gather(1, pos_c.view(b, -1)).view(b, k, bs)
    scored[:, :, 0] = False  # slot 0 is the known token
    true = feats[..., :d].gather(1, (pos_c - 1).clamp(min=0).view(b, -1, 1).expand(-1, -1, d)).view(b, k, bs, d)
    kl, t_top, p_top = HeadKL.apply(out[scored], true[scored].detach(), head.detach(), 1)
    gamma = decay(bs)
    weight = torch.exp(-(slot - 1).clamp(min=0).float() / gamma).expand(b, k, bs)[scored]
    loss = (weight * kl).sum() / weight.sum().clamp_min(1e-9)
    right = torch.zeros(b, k, bs, dtype=torch.bool)
    right[scored] = p_top[:, 0] == t_top
    stats = {}
    for s in range(1, bs):
        n = int(scored[:, :, s].sum())
        if n:
            stats[f"top1_{s}"] = float(right[:, :, s].sum()) / n
    full = scored[:, :, 1:].all(-1)  # blocks whose every slot is scored
    if full.any():
        prefix = right[:, :, 1:][full].int().cumprod(-1).sum(-1).float()
        stats["tau"] = 1.0 + float(prefix.mean())
    return loss, stats
