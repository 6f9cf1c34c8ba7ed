"""Greedy answers to a batch of encoded prompts, the self-distillation data's generator: our own batched loop
(finished rows leave the batch) and transformers' model.generate as its reference."""
from __future__ import annotations

import torch


def pad_id(target) -> int:
    """The token left padding uses: the tokenizer's pad token, else an end-of-sequence token."""
    pad = getattr(target.tokenizer, "pad_token_id", None)
    return pad if pad is not None else min(target.eos_ids)


def left_padded(prompt_ids: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's ids, left-padded to the longest prompt, and its attention mask (0 = padding): (B, W) each."""
    width = max(len(e) for e in prompt_ids)
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in prompt_ids], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in prompt_ids], device=device)
    return ids, mask


@torch.inference_mode()
def answer_batch(target, prompt_ids: list[list[int]], max_new_tokens: int, pad: int) -> list[list[int]]:
    """Greedy answers to a batch of encoded prompts, each cut after its first end-of-sequence token (kept) or
    at max_new_tokens.

    Like model.generate on the left-padded batch, but a row that has finished leaves the batch (its KV cache
    rows are dropped), so the batch does not keep computing padding for its shortest answers while the longest
    one runs on: on the shared prompts a batch's answers range from a few tokens to the cap.
    """
    from transformers import DynamicCache

    eos = target.eos_ids
    dev = target.device
    ids, mask = left_padded(prompt_ids, pad, dev)                                                 # (B, W)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)                                                # (B, W)
    cache = DynamicCache(config=target.model.config)
    logits = target.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                          use_cache=True, logits_to_keep=1).logits[:, -1]                       # (B, V)
    answers: list[list[int]] = [[] for _ in prompt_ids]
    alive = list(range(len(prompt_ids)))   # batch row -> prompt index
    last = positions[:, -1]                # (B,) position of each row's latest token
    while True:
        tokens = logits.argmax(-1)         # (B,)
        keep = []
        for row, (i, t) in enumerate(zip(alive, tokens.tolist())):
            answers[i].append(int(t))
            if t not in eos and len(answers[i]) < max_new_tokens:
                keep.append(row)
        if not keep:
            return answers
        if len(keep) < len(alive):         # finished rows leave the batch
            index = torch.tensor(keep, device=dev)
            cache.batch_select_indices(index)
            mask, last, tokens = mask[index], last[index], tokens[index]
            alive = [alive[row] for row in keep]
        mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
        last = last + 1
        logits = target.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last[:, None],
                              cache=cache, use_cache=True).logits[:, -1]


@torch.inference_mode()
def answer_batch_generate(target, prompt_ids: list[list[int]], max_new_tokens: int, pad: int) -> list[list[int]]:
    """answer_batch through transformers' model.generate (the reference: rows run until the longest is done)."""
    eos = target.eos_ids
    ids, mask = left_padded(prompt_ids, pad, target.device)
    width = ids.shape[1]
    out = target.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=pad, eos_token_id=sorted(eos))
    answers = []
    for row in out[:, width:].tolist():
        answer = []
        for t in row:
            answer.append(int(t))
            if t in eos:
                break
        answers.append(answer)
    return answers
