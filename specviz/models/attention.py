"""Row-wise attention: each query row attends on its own, over exactly the keys it may see.

Why: a verified position's logits should be bit for bit what one-token decoding computes there. One-token
decoding attends with one query over the whole cache (q = 1, kv = its position + 1, no mask). A verification
forward of k rows with a masked kernel (sdpa or eager) reduces over a longer key axis with the future masked
out and blocks its rows together, and the rounding changes with both: measured on the default target in
bf16 on CPU, up to 0.9 in a logit with sdpa, and 0.5 with eager whenever the key length or the row count
differs (eager is bitwise only on some CPUs and cache lengths).

Here every row i runs the one-query computation one-token decoding runs: one query over its visible keys,
in cache order (a chain's prefix, a tree node's context plus its ancestors), no mask, in fp32. Its result
then depends only on the row and those keys, whatever else is in the forward. Registered with
transformers' AttentionInterface as "rowwise", so the stock model runs it (attn_implementation="rowwise");
no modeling code is forked. Where the C kernels run (specviz/models/kernels/attend.c: a bf16 cache on CPU with
AVX2, or AVX-512), one C call per layer computes every (row, head) on its own: each is one fixed sequence of
operations, so its bits never depend on the other rows (its cost: docs/performance.md; the versions before it and
their A/B runs: experiments/LOG.md). Elsewhere the torch ops below run, row by row.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from specviz.models import kernels

NAME = "rowwise"


def rowwise_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """query (b, h, q, d), key/value (b, h_kv, kv, d), attention_mask None (causal) or bool (b, 1, q, kv)
    with True = visible. Returns (b, q, h, d), as transformers' attention functions do.

    Each row: scores = q · Kᵀ · scale, softmax, · V, in fp32 over its own contiguous copy of the keys it
    sees, the query heads grouped by their key/value head (no repeat). The shapes are the one-token step's,
    so the kernels, and the bits, are too."""
    b, h, q_len, d = query.shape
    h_kv = key.shape[1]
    scale = scaling if scaling is not None else d ** -0.5
    if kernels.can_attend(query, key):  # the same computation in one C call for all rows and heads
        index, offsets = visible_index(attention_mask, q_len, key.shape[2])
        out = kernels.attend(query[0].transpose(0, 1).float(), key[0], value[0], index, offsets, scale)
        return out.to(query.dtype).unsqueeze(0), None
    q32 = query.float().reshape(b, h_kv, h // h_kv, q_len, d)  # query head j*g + i reads key/value head j
    k32, v32 = key.float(), value.float()                       # (b, h_kv, kv, d)
    rows = []
    for i, seen in enumerate(visible_keys(attention_mask, q_len, key.shape[2])):
        if isinstance(seen, int):
            k, v = k32[:, :, :seen].contiguous(), v32[:, :, :seen].contiguous()
        else:
            k, v = k32.index_select(2, seen), v32.index_select(2, seen)
        scores = torch.matmul(q32[:, :, :, i], k.transpose(-1, -2)) * scale  # (b, h_kv, g, n)
        rows.append(torch.matmul(torch.softmax(scores, dim=-1), v))          # (b, h_kv, g, d)
    out = torch.stack(rows, dim=3).reshape(b, h, q_len, d)                    # (b, h, q, d)
    return out.transpose(1, 2).to(query.dtype).contiguous(), None


def visible_keys(mask: torch.Tensor | None, q_len: int, kv_len: int) -> list:
    """Per query row, the keys it sees: an int n for the prefix 0..n-1, else a tensor of cache indices.
    Every layer gets the same mask, so the answer is computed once and kept on the mask tensor."""
    if mask is None:  # causal: the new rows are the last q_len of the cache
        return [kv_len - q_len + i + 1 for i in range(q_len)]
    rows = getattr(mask, "_visible_rows", None)
    if rows is None:
        allowed = mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0  # (q, kv); additive: 0 = visible
        rows = []
        for row in allowed:
            index = row.nonzero()[:, 0]  # (n,) in cache order
            n = int(index.shape[0])
            rows.append(n if n and int(index[-1]) == n - 1 else index)
        mask._visible_rows = rows
    return rows


class Visible(NamedTuple):
    """The cache slots each of n query rows sees, compact: row r sees slots 0 .. lead[r] - 1, then base +
    index[offsets[r]:offsets[r + 1]] (a tree's rows: the context, then their ancestors and themselves;
    trees.tree_visible). The fused decoder spells it out in C (kernels/llama.c: row_spans)."""
    lead: torch.Tensor     # (n,) int64
    index: torch.Tensor    # int32
    offsets: torch.Tensor  # (n + 1,) int64
    base: int


def visible_index(mask: torch.Tensor | None, q_len: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """visible_keys as flat int32 cache positions and int64 row offsets (row i: index[offsets[i]:offsets[i+1]]),
    kept on the mask tensor (or per shape for the causal case), as every layer asks again."""
    cached = getattr(mask, "_visible_index", None) if mask is not None else _causal_index.get((q_len, kv_len))
    if cached is not None:
        return cached
    if mask is None:
        parts = [torch.arange(seen, dtype=torch.int32) for seen in visible_keys(mask, q_len, kv_len)]
        counts = torch.tensor([len(p) for p in parts], dtype=torch.int64)
        index = torch.cat(parts)
    else:  # every row's visible keys in cache order, row after row: one nonzero over the mask, not one a row
        allowed = (mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0).cpu()  # (q, kv)
        index, counts = allowed.nonzero()[:, 1].to(torch.int32), allowed.sum(1)
    offsets = torch.zeros(q_len + 1, dtype=torch.int64)
    offsets[1:] = counts.cumsum(0)
    cached = (index.contiguous(), offsets)
    if mask is not None:
        mask._visible_index = cached
    else:
        if len(_causal_index) > 64:
            _causal_index.clear()
        _causal_index[(q_len, kv_len)] = cached
    return cached


_causal_index: dict = {}


def register() -> None:
    """Make "rowwise" an attention implementation transformers models accept (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, rowwise_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
