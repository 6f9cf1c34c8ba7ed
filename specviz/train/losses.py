"""The drafters' training losses against the target's own distribution (KL through the target's LM head, a block
of rows at a time), their top-1 readouts, and the held-out accuracies the trees are chosen from."""
from __future__ import annotations

import torch
import torch.nn.functional as F

HEAD_BLOCK = 64  # rows of logits at a time: 64 x 8192 fp32 is 2 MiB, a core's L2


class HeadKL(torch.autograd.Function):
    """Per row, KL(softmax(true @ head.T) || softmax(pred @ head.T)), `HEAD_BLOCK` rows at a time, with the
    gradient for `pred` computed in the same pass (as fused linear cross-entropy kernels do), so the (rows,
    vocab) logits never exist whole: the whole-tensor version spent most of an EAGLE training step streaming
    the 128 MiB of a 4096 x 8192 fp32 logits tensor once per elementwise pass, far longer than the step's
    matmuls (the figures: experiments/LOG.md). The matmuls run in autocast's dtype when it is on.
    Also returns, without gradient, the target's top token and the drafter's top `ranks` tokens per row."""

    @staticmethod
    def forward(ctx, pred, true, head, ranks):
        mm = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32
        w = head.to(mm)
        n = len(pred)
        kl = torch.empty(n)
        grad = torch.empty(pred.shape) if ctx.needs_input_grad[0] else None
        t_top, p_top = torch.empty(n, dtype=torch.long), torch.empty(n, ranks, dtype=torch.long)
        with torch.autocast("cpu", enabled=False), torch.no_grad():
            for s in range(0, n, HEAD_BLOCK):
                rows = slice(s, s + HEAD_BLOCK)
                q = (pred[rows].to(mm) @ w.T).float()
                t = (true[rows].to(mm) @ w.T).float()
                lse_t, lse_q = torch.logsumexp(t, -1, keepdim=True), torch.logsumexp(q, -1, keepdim=True)
                p = torch.exp(t - lse_t)
                kl[rows] = (p * (t - q)).sum(-1) - lse_t.squeeze(-1) + lse_q.squeeze(-1)
                t_top[rows] = t.argmax(-1)
                p_top[rows] = q.argmax(-1, keepdim=True) if ranks == 1 else q.topk(ranks, -1).indices
                if grad is not None:  # d KL / d q = softmax(q) - p
                    grad[rows] = (torch.exp(q - lse_q).sub_(p).to(mm) @ w).float()
        ctx.save_for_backward(grad)
        ctx.pred_dtype = pred.dtype
        ctx.mark_non_differentiable(t_top, p_top)
        return kl, t_top, p_top

    @staticmethod
    def backward(ctx, g_kl, _t_top, _p_top):
        grad, = ctx.saved_tensors
        return (grad * g_kl[:, None]).to(ctx.pred_dtype), None, None, None


def head_kl(pred: torch.Tensor, true: torch.Tensor, head: torch.Tensor, mask: torch.Tensor | None = None,
            ranks: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The drafter's hidden states `pred` and the target's `true` (..., d) read through the (draft-vocabulary)
    LM head: the mean over masked rows (every row without a mask) of KL(target || drafter), and per scored row
    the target's top token (r,) and the drafter's top `ranks` tokens (r, ranks)."""
    if mask is not None:
        pred, true = pred[mask], true[mask]
    kl, t_top, p_top = HeadKL.apply(pred.reshape(-1, pred.shape[-1]), true.reshape(-1, true.shape[-1]).detach(),
                                     head.detach(), ranks)
    return kl.mean() if len(kl) else kl.sum(), t_top, p_top


def top1(t_top: torch.Tensor, p_top: torch.Tensor) -> float:
    """How often the drafter's top token is the target's."""
    return float((p_top[:, 0] == t_top).float().mean()) if len(t_top) else 0.0


def unroll_mask(t: int, step: int) -> torch.Tensor:
    """(t, step * t) bool: at unroll step s (0-based), query i sits at position i + s and sees the true pairs
    at positions <= i (step 0's keys) plus its own chain of guesses (index i of every later step), as it
    will when drafting: the drafter's cache holds true pairs, and the guesses of this draft on top."""
    allowed = torch.zeros(t, (step + 1) * t, dtype=torch.bool)
    allowed[:, :t] = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for s in range(1, step + 1):
        allowed[:, s * t:(s + 1) * t] = torch.eye(t, dtype=torch.bool)
    return allowed


def eagle_loss(module, head, embed, ids, feats, valid, noise: float, unroll: int = 3, ranks: int = 1):
    """Predict the feature at t+1 from (feature at t, token t+1): the target's soft labels, plus (EAGLE-1)
    regression onto its feature. Then `unroll - 1` more steps from the drafter's own guesses, with the attention
    it will have at drafting time, so later draft positions are trained for too (EAGLE-3's training-time test).
    EAGLE-3's `feats` hold [final | fused] side by side: it reads the fused ones, its labels come from the final."""
    d = module.cfg.hidden_size
    eagle3 = bool(module.cfg.feature_layers)
    t = feats.shape[1] - 1
    feats, f_in = (feats[..., :d], feats[:, :-1, d:]) if eagle3 else (feats, feats[:, :-1])
    if noise:
        f_in = f_in + (torch.rand_like(f_in) - 0.5) * 2 * noise
    f_in = module.lift(f_in)
    loss, stats, keys, values = 0.0, {}, None, None
    alive = torch.ones(valid.shape[0], t, dtype=torch.bool)  # chains whose drafts so far were all the target's
    for step in range(unroll):
        if step >= t:
            break
        emb = embed(torch.nn.functional.pad(ids[:, 1 + step:], (0, step)))  # token at position i + step + 1
        positions = torch.arange(t) + step
        mask = None if step == 0 else unroll_mask(t, step)
        pred, (k, v) = module(f_in, emb, positions, None if step == 0 else (keys, values), mask)
        keys, values = k, v  # every step's keys stay visible to the next (see unroll_mask)
        m = torch.nn.functional.pad(valid[:, 1 + step:], (0, step))  # (B, t) the positions scored
        if not m.any():
            break
        # (r, d): only scored rows meet the head
        true = torch.nn.functional.pad(feats[:, 1 + step:], (0, 0, 0, step))[m]
        kl, t_top, p_top = head_kl(module.readout(pred[m]), true, head, ranks=ranks)
        if eagle3:  # its output is a hidden state of its own, not the target's feature: labels only
            loss = loss + kl * (0.8 ** step)
        else:
            reg = F.smooth_l1_loss(pred[m], true)
            loss = loss + (reg + 0.1 * kl) * (0.8 ** step)
        stats[f"top1_{step + 1}"] = top1(t_top, p_top)
        if ranks > 1:  # how often the target's token is the drafter's rank-r candidate at this depth, on the
            # chains whose earlier drafts were all accepted (the only ones drafting reaches this depth on)
            hits = p_top == t_top[:, None]  # (r, ranks)
            live = alive[m]
            if not live.any():
                break
            stats[f"ranks_{step + 1}"] = hits[live].float().mean(0).tolist()
            alive = alive & m
            alive[m] = live & hits[:, 0]
        f_in = pred  # the next step drafts from this step's guesses
    return loss, stats


def medusa_loss(module, head, embed, ids, feats, valid, noise: float):
    """Head k (1..K) learns the target's distribution k positions ahead of the LM head."""
    outs = module(feats)  # (K, B, T, d)
    loss, stats = 0.0, {}
    for k in range(outs.shape[0]):  # against the target's own next-token distribution k + 1 positions on
        shift = k + 1
        mask = valid[:, shift:] & valid[:, :-shift]
        kl, t_top, p_top = head_kl(outs[k][:, :-shift], feats[:, shift:], head, mask)
        loss = loss + kl * (0.8 ** k)
        stats[f"top1_h{k + 1}"] = top1(t_top, p_top)
    return loss, stats


@torch.no_grad()
def head_accuracy(module, head: torch.Tensor, feats: torch.Tensor, seqs: list[list[int]], prompt_lens: list[int],
                  ranks: int = 8) -> torch.Tensor:
    """(K, ranks): how often head k's rank-r candidate is the target's own next token k + 1 positions on,
    counted where that token is part of the answer (templated prompt tokens are easy and would inflate it)."""
    k_heads = module.cfg.medusa_heads
    hits, total = torch.zeros(k_heads, ranks), torch.zeros(k_heads, 1)
    start = 0
    for seq, prompt_len in zip(seqs, prompt_lens):
        f = feats[start:start + len(seq)].float()
        start += len(seq)
        target_next = (f @ head.T).argmax(-1)  # (T,) the target's choice after each position
        top = (module(f) @ head.T).topk(ranks, -1).indices  # (K, T, ranks)
        for k in range(k_heads):
            lo, n = max(0, prompt_len - k - 2), len(seq) - (k + 1)  # position j guesses token j + k + 2
            if n <= lo:
                continue
            hits[k] += (top[k, lo:n] == target_next[lo + k + 1:, None]).float().sum(0)
            total[k] += n - lo
    return hits / total.clamp_min(1)


@torch.no_grad()
def eagle_depth_accuracy(module, head, embed, batch, depth: int = 6, ranks: int = 4) -> torch.Tensor:
    """(depth, ranks): how often the drafter's rank-r candidate at draft depth k is the target's own next token
    where its top-1 drafts at depths 1..k - 1 were all right (drafted from its own features, as it drafts).
    Held-out answers."""
    module.eval()
    _, stats = eagle_loss(module, head, embed, *batch, 0.0, unroll=depth, ranks=ranks)
    return torch.tensor([stats[f"ranks_{k}"] for k in range(1, depth + 1) if f"ranks_{k}" in stats])


def layerskip_loss(module, head, embed, ids, feats, valid, noise: float, norm=None):
    """The exit adapter learns the target's own next-token distribution from the early hidden state.
    `feats` holds [final feature | hidden state after the exit layer] side by side."""
    d = feats.shape[-1] // 2
    final, early = feats[..., :d], feats[..., d:]
    kl, t_top, p_top = head_kl(norm(module(early)), final, head, valid)
    return kl, {"top1": top1(t_top, p_top)}


def draft_loss(module, head, embed, ids, feats, valid, noise: float):
    """The draft model learns the target's own next-token distribution at every position (distillation)."""
    out, _ = module(embed(ids), torch.arange(ids.shape[1]))
    kl, t_top, p_top = head_kl(out, feats, head, valid)
    return kl, {"top1": top1(t_top, p_top)}
