"""`python -m specviz train {eagle,medusa,layerskip,draft}`: train a drafter against a frozen target.

Stages, each resumable from `--out`:
  1. data      the target answers prompts greedily (self-distillation). Default: the committed token ids
               in assets/distill/ for the default target; with --data, a user's own prompts.
  2. features  teacher-forced target forwards of like-length sequences; their hidden states (fp16) in a
               memory-mapped file, resumable.
  3. train     the drafter learns from those features and the target's own soft labels (its LM head
               applied to the cached features), never from the raw text. Checkpoints every few steps.
  4. measure   the held-out split is decoded with the new drafter: τ, α and greedy identity.
"""
from __future__ import annotations

import functools
import json
import math
import platform
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specviz.train import distill

from specviz.drafters import trained as drafters

from specviz import metrics
from specviz.config import DEFAULT_TARGET
from specviz.paths import ASSETS, PROFILES

DEFAULT_DATA = distill.ORIGINAL
PROFILE = PROFILES / "profile-bf16.json"   # T(k) and drafter costs on 2 CPU cores, where the drafters ship
DRAFT_VOCAB = 8192   # a new drafter's compressed vocabulary: the N tokens most frequent in its training data


@dataclass
class TrainOptions:
    kind: str = "eagle"                # "eagle" | "medusa" | "layerskip" | "draft"
    out: Path = Path("out/train")
    target: str = DEFAULT_TARGET
    data: tuple | str | None = None    # prompt files and/or example (ids) files; None = the default self-distillation data
    steps: int = 600
    epochs: int | None = None          # instead of steps: passes over the training tokens
    batch_tokens: int = 4096
    lr: float = 1e-3
    draft_vocab: int | None = None     # N most frequent tokens, 0 = full; None = DRAFT_VOCAB, or with init its own
    features: str = "fused"            # eagle: "fused" (EAGLE-3: a low, a middle and a high layer) or "final" (EAGLE-1)
    medusa_heads: int = 4
    tree_size: int = 16                # medusa: nodes in the candidate tree
    exit_layer: int = 10               # layerskip: draft from the hidden state after this many layers
    draft_layers: tuple = (0, 1, 2, 3)  # draft: the target layers its own layers start from
    max_new_tokens: int = 160          # answer length when generating data
    resume: bool = False
    init: Path | None = None           # start from this trained drafter: its weights, layout and vocabulary
    seed: int = 0
    checkpoint_every: int = 50
    eval_prompts: int = 8
    precision: str = "auto"            # "auto" (bf16 where the CPU has native bf16, else fp32), "bf16", "fp32"


PRECISIONS = ("auto", "bf16", "fp32")


def mixed_bf16(precision: str) -> bool:
    """Whether training (and its feature pass) runs its matmuls in bf16 under autocast, the weights and the
    optimizer staying fp32. Where the CPU has native bf16 (AVX512-BF16/AMX) a bf16 matmul of a training batch
    is 3.7x the fp32 one (4096 x 576 @ 576 x 8192 on a 2-core Xeon: 42.5 against 157.8 ms); elsewhere torch
    emulates bf16 and fp32 is faster."""
    from specviz.models import loader as models

    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is unknown: use one of {', '.join(PRECISIONS)}")
    return precision == "bf16" or (precision == "auto" and models.native_bf16())


def autocast(bf16: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


def examples_for(opts: TrainOptions, target, log) -> list[dict]:
    """Stage 1: the self-distillation examples (prompt ids + the target's answer ids)."""
    files = data_files(opts)
    if not files and opts.target == DEFAULT_TARGET and DEFAULT_DATA.is_file():
        examples = distill.committed_examples()
        log(f"data: {DEFAULT_DATA.relative_to(ASSETS.parent)} and {distill.PROMPTS_OUT.relative_to(ASSETS.parent)}, "
            f"{len(examples)} answers (committed self-distillation ids)")
        return examples
    examples, prompts = [], [] if files else distill.default_prompts()
    for f in files:  # generated examples are used as they are; prompts are answered by the target below
        if Path(f).is_dir():
            examples += distill.read_chunks(f)
            log(f"data: {f} (self-distillation chunks)")
        elif distill.is_example_file(f):
            examples += distill.read_examples(f)
            log(f"data: {f} (self-distillation ids)")
        else:
            prompts += distill.read_prompt_file(f)
    if not prompts and not examples:
        raise ValueError(f"data file {', '.join(files)!r} has no prompts: use JSONL with 'prompt' or one prompt a line")
    if not prompts:
        return examples
    path = opts.out / "data.jsonl"
    log(f"data: the target answers {len(prompts)} prompts ({path}, resumable)")
    from tqdm import tqdm

    bar = tqdm(total=len(prompts), desc="answering", unit="prompt")
    start = time.perf_counter()

    def progress(done: int, total: int, tokens: int) -> None:
        bar.n = done
        bar.set_postfix(tok_s=f"{tokens / max(1e-9, time.perf_counter() - start):.0f}")
        bar.refresh()

    distill.generate_answers(target, prompts, path, opts.max_new_tokens, progress=progress)
    bar.close()
    return examples + distill.read_examples(path)


def data_files(opts: TrainOptions) -> list[str]:
    return [opts.data] if isinstance(opts.data, str) else list(opts.data or [])


@torch.inference_mode()
def features_for(examples: list[dict], target, path: Path, log, layers: tuple = (),
                 bf16: bool = False) -> tuple[torch.Tensor, list[list[int]]]:
    """Stage 2: the target's final-norm hidden states of every sequence, (total, d) fp16; with `layers` (EAGLE-3),
    those hidden states after them too: (total, d + len(layers) * d), [final | fused]. bf16: the target's matmuls
    run in bf16 (autocast), as the engine runs it on such CPUs.
    They are written into a raw fp16 file at `path`, memory-mapped (all-chunk EAGLE-3 features are ~13 GB: held in
    RAM they took a 24 GiB machine to its limit), with `path`.json beside it recording what they are and how many
    groups of sequences are done, so a killed pass resumes where it stopped and a finished one is reused."""
    seqs = list(distill.sequences(examples))
    d = target.model.config.hidden_size
    key = {"n": len(seqs), "rows": sum(map(len, seqs)), "width": d * (1 + len(layers)), "layers": list(layers), "bf16": bf16}
    # Sequences of similar length run together, right-padded: under the causal mask the padding after a
    # sequence cannot reach its rows. Batches of 8 were twice the tokens/s of one at a time (2065 against
    # 1056 on 2 cores, bf16 autocast; 16 were slower again).
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    groups, group = [], []
    for i in order:  # at most FEATURE_BATCH sequences and FEATURE_TOKENS padded tokens (the longest run alone)
        if group and (len(group) == FEATURE_BATCH or (len(group) + 1) * len(seqs[i]) > FEATURE_TOKENS):
            groups.append(group)
            group = []
        group.append(i)
    groups.append(group)
    meta_path = path.with_name(path.name + ".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() and path.is_file() else {}
    done = meta.get("done", 0) if {k: meta.get(k) for k in key} == key else 0
    if done == len(groups):
        log(f"features: reusing {path}")
        return _mapped(path, key, shared=False), seqs
    if done:
        log(f"features: resuming {path} after {done} of {len(groups)} groups of sequences")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    feats = _mapped(path, key, shared=True)  # writes land in the file (the page cache), not in the process's memory
    offsets = offsets_of(seqs)
    decoder = target.model.get_decoder()
    from tqdm import tqdm

    bar = tqdm(total=len(seqs), initial=sum(map(len, groups[:done])), desc="features", unit="seq")
    saved = time.monotonic()
    for g in range(done, len(groups)):
        width = max(len(seqs[i]) for i in groups[g])
        ids = torch.tensor([seqs[i] + [0] * (width - len(seqs[i])) for i in groups[g]], device=target.device)
        with autocast(bf16):
            out = decoder(input_ids=ids, output_hidden_states=bool(layers))
        for row, i in enumerate(groups[g]):
            n = len(seqs[i])
            parts = [out.last_hidden_state[row, :n]] + [out.hidden_states[k][row, :n] for k in layers]
            feats[offsets[i]:offsets[i + 1]] = torch.cat(parts, -1).to(torch.float16).cpu()
        bar.update(len(groups[g]))
        if g + 1 == len(groups) or time.monotonic() - saved > 30:  # a process killed after this keeps these rows:
            meta_path.write_text(json.dumps({**key, "done": g + 1}))  # they are in the page cache, not its memory
            saved = time.monotonic()
    bar.close()
    return feats, seqs


def _mapped(path: Path, key: dict, shared: bool) -> torch.Tensor:
    """The features file as a (rows, width) fp16 tensor over a memory map (shared: writes go to the file; it is
    created at its full size)."""
    return torch.from_file(str(path), shared=shared, size=key["rows"] * key["width"], dtype=torch.float16).view(
        key["rows"], key["width"])


@torch.inference_mode()
def exit_features_for(examples: list[dict], target, layer: int, path: Path, log, bf16: bool = False) -> torch.Tensor:
    """Stage 2 for layerskip: the hidden states after `layer` target layers, (total, d) fp16, cached."""
    seqs = list(distill.sequences(examples))
    if path.is_file():
        saved = torch.load(path, weights_only=True, mmap=True)
        if saved["n"] == len(seqs) and saved["layer"] == layer and saved.get("bf16", False) == bf16:
            log(f"exit features: reusing {path}")
            return saved["features"]
    from tqdm import tqdm

    from specviz.engines.layerskip import SplitLM

    chunks = []
    for seq in tqdm(seqs, desc=f"layer-{layer} features", unit="seq"):
        lm = SplitLM(target.model, target.device, layer)  # only the first `layer` layers run
        with autocast(bf16):
            lm.early(seq)
        chunks.append(lm.pending[0][0].to(torch.float16).cpu())
    feats = torch.cat(chunks)
    torch.save({"n": len(seqs), "layer": layer, "bf16": bf16, "features": feats}, path)
    return feats


def offsets_of(seqs: list[list[int]]) -> list[int]:
    """Where each sequence starts in the rows of the concatenated features, and their total last."""
    offsets = [0]
    for seq in seqs:
        offsets.append(offsets[-1] + len(seq))
    return offsets


class Batches:
    """Random batches of whole sequences, right-padded, at most `batch_tokens` tokens each with the padding
    (or one longer sequence alone)."""

    def __init__(self, seqs: list[list[int]], feats: torch.Tensor, batch_tokens: int, seed: int):
        self.seqs, self.feats, self.batch_tokens = seqs, feats, batch_tokens
        self.offsets = offsets_of(seqs)
        self.rng = random.Random(seed)
        self.by_length = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))

    def sample(self, shuffle: bool = True):
        """shuffle: sequences of similar length around a random one (a batch pads to its longest sequence:
        drawn at random, a 2000-token sequence among short ones made most of a batch padding: 256-584 real
        tokens/s in an EAGLE-3 run whose steps reach about 1800 without padding); else the first sequences in order."""
        if shuffle:
            n, a = len(self.by_length), self.rng.randrange(len(self.by_length))
            length = lambda k: len(self.seqs[self.by_length[k]])  # noqa: E731 (ascending in k)
            lo, hi = a, a + 1
            while True:  # grow the window towards the longer side first, then the shorter, while the padded
                if hi < n and (hi - lo + 1) * length(hi) <= self.batch_tokens:  # batch fits the budget
                    hi += 1
                elif lo > 0 and (hi - lo + 1) * length(hi - 1) <= self.batch_tokens:
                    lo -= 1
                else:
                    break
            picked = self.by_length[lo:hi]
        else:
            picked, total = [], 0
            for i in range(len(self.seqs)):
                if total and total + len(self.seqs[i]) > self.batch_tokens:
                    break
                picked.append(i)
                total += len(self.seqs[i])
        return self.batch(picked)

    def batch(self, picked: list[int]):
        """These sequences, right-padded: ids (B, W), features (B, W, D) fp32, valid (B, W)."""
        width = max(len(self.seqs[i]) for i in picked)
        ids = torch.zeros(len(picked), width, dtype=torch.long)
        feats = torch.zeros(len(picked), width, self.feats.shape[1])
        valid = torch.zeros(len(picked), width, dtype=torch.bool)
        for row, i in enumerate(picked):
            n = len(self.seqs[i])
            ids[row, :n] = torch.tensor(self.seqs[i])
            feats[row, :n] = self.feats[self.offsets[i]:self.offsets[i] + n].float()
            valid[row, :n] = True
        return ids, feats, valid


FEATURE_BATCH = 8  # sequences per target forward in the feature pass,
FEATURE_TOKENS = 2048  # and padded tokens (its activations: every layer's hidden states are returned)
HELD_SCORED, HELD_LENGTH = 128, 384  # held-out sequences (of at most that length) scored at each checkpoint
# and for the EAGLE tree
HEAD_BLOCK = 64  # rows of logits at a time: 64 x 8192 fp32 is 2 MiB, a core's L2


class _HeadKL(torch.autograd.Function):
    """Per row, KL(softmax(true @ head.T) || softmax(pred @ head.T)), `HEAD_BLOCK` rows at a time, with the
    gradient for `pred` computed in the same pass (as fused linear cross-entropy kernels do), so the (rows,
    vocab) logits never exist whole. On 2 cores the whole-tensor version was most of an EAGLE training
    step: each elementwise pass over 4096 x 8192 fp32 logits streams 128 MiB (a sub took 51 ms, an argmax
    60 ms), 5.8 s a step against 0.8 s of matmuls. The matmuls run in autocast's dtype when it is on.
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
    kl, t_top, p_top = _HeadKL.apply(pred.reshape(-1, pred.shape[-1]), true.reshape(-1, true.shape[-1]).detach(),
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
        true = torch.nn.functional.pad(feats[:, 1 + step:], (0, 0, 0, step))[m]  # (r, d): only scored rows meet the head
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


def profile_for(target_name: str, path: Path | None = None) -> tuple[metrics.CostProfile, dict] | None:
    """A verify profile and drafter costs (`python -m specviz profile --json`): the file at path, which must be the
    target's (DrafterError otherwise), or by default the committed one of the default target in its default CPU
    dtype (assets/profiles/profile-bf16.json), None for other targets."""
    if path is None:
        if target_name != DEFAULT_TARGET or not PROFILE.is_file():
            return None
        path = PROFILE
    try:
        d = json.loads(Path(path).read_text())
        profile = metrics.CostProfile(**d["profile"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise drafters.DrafterError(f"profile {str(path)!r} is not a verify profile written by `python -m specviz "
                                    f"profile --json` ({type(exc).__name__}: {exc})") from None
    if d.get("target", target_name) != target_name:
        raise drafters.DrafterError(f"profile {str(path)!r} was measured on target {d['target']!r}, "
                                    f"not on the drafter's target {target_name!r}")
    return profile, {c["method"]: c.get("c") for c in d.get("costs", [])}


@dataclass
class TrainResult:
    folder: Path                       # the saved drafter
    losses: list[float]                # per step, this invocation
    held_out: dict                     # τ, α, identity on the held-out prompts


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


def train(opts: TrainOptions, log=print, target=None) -> TrainResult:
    """Every stage; `target` (a LoadedModel) defaults to loading opts.target in fp32 on the CPU."""
    from tqdm import tqdm

    from specviz.models import loader as models

    torch.manual_seed(opts.seed)
    opts.out.mkdir(parents=True, exist_ok=True)
    target = target or models.get(opts.target, torch.device("cpu"), torch.float32)
    n_layers = target.model.config.num_hidden_layers
    if opts.kind == "layerskip" and not opts.init and not 1 <= opts.exit_layer < n_layers:
        raise drafters.DrafterError(f"exit-layer={opts.exit_layer} is out of range for {opts.target}: use 1..{n_layers - 1}")
    if opts.kind == "draft" and not opts.init and not all(0 <= i < n_layers for i in opts.draft_layers):
        raise drafters.DrafterError(f"draft-layers={','.join(map(str, opts.draft_layers))} is out of range for "
                                    f"{opts.target}: use indices 0..{n_layers - 1}")
    init = init_from(opts, target) if opts.init else None
    examples = examples_for(opts, target, log)
    train_ex, held_out = distill.split(examples)
    if init:
        layers = tuple(init[0].feature_layers)
    else:
        layers = tuple(drafters.eagle3_layers(n_layers)) if opts.kind == "eagle" and opts.features == "fused" else ()
    exit_layer = init[0].exit_layer if init else opts.exit_layer
    bf16 = mixed_bf16(opts.precision)
    log(f"precision: {'bf16 autocast (fp32 weights and optimizer)' if bf16 else 'fp32'}")
    feats, seqs = features_for(train_ex, target, opts.out / "features.f16", log, layers, bf16)
    if opts.kind == "layerskip":  # the exit adapter reads the early hidden state, the labels come from the last
        feats = torch.cat([feats, exit_features_for(train_ex, target, exit_layer, opts.out / "exit_features.pt", log, bf16)], -1)
    if init:  # a trained drafter goes on learning in its own layout, over its own vocabulary
        cfg, state = init
        vocab_ids = state.pop("vocab_ids", None)
        vocab_ids = None if vocab_ids is None else vocab_ids.long()
        if opts.draft_vocab is not None and opts.draft_vocab != cfg.draft_vocab:
            vocab_ids = rechoose_vocab(cfg, opts, seqs, target.vocab_size, log)
        module = drafters.DraftLM.from_target(cfg, target.model) if opts.kind == "draft" else drafters.build_module(cfg)
        drafters.load_into(module, state, str(opts.init))
        module.train()
        log(f"init: {opts.init} ({drafters.describe(cfg)})")
    else:
        n_vocab = DRAFT_VOCAB if opts.draft_vocab is None else opts.draft_vocab
        vocab_ids = drafters.frequent_vocab(seqs, target.vocab_size, n_vocab) if n_vocab else None
        extra = {"medusa": {"medusa_heads": opts.medusa_heads}, "layerskip": {"exit_layer": opts.exit_layer},
                 "draft": {"draft_layers": list(opts.draft_layers)}, "eagle": {"feature_layers": list(layers)}}.get(opts.kind, {})
        cfg = drafters.DrafterConfig.for_target(opts.kind, opts.target, target.model.config, n_vocab, **extra)
        module = (drafters.DraftLM.from_target(cfg, target.model) if opts.kind == "draft" else drafters.build_module(cfg)).train()
        if layers:  # EAGLE-3 reads its output through its own norm and the target's head: start from the target's norm
            module.norm.weight.data.copy_(target.model.get_decoder().norm.weight.data)
    weight = target.model.get_output_embeddings().weight.detach()
    head = weight if vocab_ids is None else weight[vocab_ids]
    embed = target.model.get_input_embeddings()
    noise = 0.1 * float(feats[:4096].float().pow(2).mean().sqrt()) if opts.kind == "eagle" and not layers else 0.0
    optim = torch.optim.AdamW(module.parameters(), lr=opts.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, opts.steps)))))
    if opts.epochs:
        opts.steps = math.ceil(opts.epochs * len(feats) / opts.batch_tokens)
    ckpt_path, step, seconds = opts.out / "checkpoint.pt", 0, 0.0
    batches = Batches(seqs, feats, opts.batch_tokens, opts.seed)
    ckpt = None
    if opts.resume and ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, weights_only=False)
        module.load_state_dict(ckpt["module"])
        optim.load_state_dict(ckpt["optim"])
        schedule.load_state_dict(ckpt["schedule"])
        step, seconds = ckpt["step"], ckpt["seconds"]
        batches.rng.setstate(ckpt["rng"])
        log(f"resumed from {ckpt_path} at step {step}")
    loss_fn = {"eagle": eagle_loss, "medusa": medusa_loss, "draft": draft_loss,
               "layerskip": functools.partial(layerskip_loss, norm=target.model.get_decoder().norm)}[opts.kind]
    held_feats, held_seqs = features_for(held_out, target, opts.out / "held_out_features.f16", log, layers, bf16)
    if opts.kind == "layerskip":
        held_feats = torch.cat([held_feats, exit_features_for(held_out, target, exit_layer,
                                                              opts.out / "held_out_exit_features.pt", log, bf16)], -1)
    # scored in one padded batch every checkpoint, so a fixed, bounded cost (the first 256 held-out sequences of
    # the real-prompt data, padded to their longest, 2000 tokens, took two minutes, as long as 40 steps)
    held_batch = scored_batch(held_out, held_seqs, held_feats, HELD_SCORED)

    def held_score() -> tuple[float, dict]:
        """Teacher-forced top-1 agreement with the target on the held-out split (summed over draft positions)."""
        module.eval()
        with torch.no_grad(), autocast(bf16):
            _, st = loss_fn(module, head, embed, *held_batch, 0.0)
        module.train()
        return sum(st.values()), st

    best = ckpt["best"] if ckpt else (float("-inf"), None)
    bar = tqdm(total=opts.steps, initial=step, desc=f"train {opts.kind}", unit="step")
    losses: list[float] = []
    held_stats: dict = {}
    while step < opts.steps:
        t0 = time.perf_counter()
        ids, f, valid = batches.sample()
        with autocast(bf16):
            loss, stats = loss_fn(module, head, embed, ids, f, valid, noise)
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optim.step()
        schedule.step()
        step += 1
        dt = time.perf_counter() - t0
        seconds += dt
        losses.append(float(loss.detach()))
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", tok_s=f"{int(valid.sum()) / dt:.0f}", **{k: f"{v:.2f}" for k, v in stats.items()})
        if step % opts.checkpoint_every == 0 or step == opts.steps:
            score, held_stats = held_score()
            if score > best[0]:  # keep the weights that do best on held-out data
                best = (score, {k: v.detach().clone() for k, v in module.state_dict().items()})
            bar.write(f"step {step}: held-out " + ", ".join(f"{k} {v:.3f}" for k, v in held_stats.items()))
            torch.save({"module": module.state_dict(), "optim": optim.state_dict(), "schedule": schedule.state_dict(),
                        "step": step, "seconds": seconds, "rng": batches.rng.getstate(), "best": best}, ckpt_path)
    bar.close()
    if best[1] is not None:
        module.load_state_dict(best[1])
    cfg.training = {**({"init": str(opts.init)} if opts.init else {}), "data": "self-distillation: " + (" + ".join(data_files(opts)) or ("the committed ids in assets/distill/" if opts.target == DEFAULT_TARGET else "the project's default prompts")) + f", {len(train_ex)} sequences, "
                    f"{sum(map(len, seqs))} tokens", "steps": opts.steps, "batch_tokens": opts.batch_tokens,
                    "draft_vocab_coverage_held_out": coverage(vocab_ids, held_out),
                    "train_seconds": round(seconds), "precision": "bf16 autocast" if bf16 else "fp32", "hardware": f"{platform.machine()} CPU, {torch.get_num_threads()} threads",
                    "torch": torch.__version__}
    if opts.kind == "medusa":
        accuracy = head_accuracy(module.eval(), head, held_feats, held_seqs, [len(e["prompt_ids"]) for e in held_out])
        cfg.tree = [list(p) for p in drafters.choose_tree(accuracy, opts.tree_size)]
        cfg.training["head_top1_held_out_answers"] = [round(float(a), 3) for a in accuracy[:, 0]]
        cfg.training["head_rank_accuracy_held_out"] = [[round(float(a), 3) for a in row] for row in accuracy]
        log("held-out top-1 accuracy by head: " + ", ".join(f"{float(a):.2f}" for a in accuracy[:, 0]))
        choose_tree_for_cost(cfg, accuracy, opts.target, "medusa", log, max_size=opts.tree_size)
    if opts.kind == "eagle":
        choose_eagle_tree(cfg, module, head, embed, held_batch, opts.target, log)
    final = opts.out / "drafter"
    drafters.save(final, module, cfg, vocab_ids, card(cfg, opts))
    log(f"saved {final} ({drafters.n_params(module) / 1e6:.2f} M parameters)")
    if data_files(opts):  # your own data: its answers become the drafter's datastore (the +ret branch)
        from specviz.core import retrieval

        store = retrieval.Datastore(e["answer_ids"] for e in examples)
        store.save(final / retrieval.DATASTORE_FILE)
        cfg.training["datastore"] = f"{retrieval.DATASTORE_FILE}: the target's answers in this data, {len(store)} tokens"
        log(f"datastore: {final / retrieval.DATASTORE_FILE} ({len(store)} answer tokens; --retrieve drafts from it)")
    held = measure(final, target, held_out[:opts.eval_prompts], log)
    cfg.training["held_out"] = held
    drafters.save(final, module, cfg, vocab_ids, card(cfg, opts))
    return TrainResult(final, losses, held)


def init_from(opts: TrainOptions, target) -> tuple[drafters.DrafterConfig, dict]:
    """The layout and weights of the drafter that `--init` names: a folder this project trained (any kind), or a
    published Medusa-1 / EAGLE-1 / EAGLE-3 checkpoint, of the kind being trained and for this target."""
    cfg, state = drafters.read_layout(Path(opts.init), target)
    if cfg.kind != opts.kind:
        raise drafters.DrafterError(f"init={str(opts.init)!r} is a {cfg.kind} drafter: train {cfg.kind} from it, "
                                    f"or give a {opts.kind} drafter")
    if cfg.hidden_size != target.model.config.hidden_size or cfg.vocab_size != target.vocab_size:
        raise drafters.DrafterError(f"init={str(opts.init)!r} was trained for {cfg.target} (hidden {cfg.hidden_size}, "
                                    f"vocab {cfg.vocab_size}), not {opts.target}")
    cfg.training = {}
    return cfg, state


def rechoose_vocab(cfg: drafters.DrafterConfig, opts: TrainOptions, seqs, vocab_size: int, log) -> torch.Tensor | None:
    """An --init drafter given another --draft-vocab: the N tokens most frequent in the new training data. Its
    weights stay valid, since it reads its output through the target's own LM head rows (one per token), so only
    the rows it reads change; a published drafter with an LM head of its own cannot change vocabulary."""
    if cfg.own_lm_head or cfg.own_lm_heads:
        raise drafters.DrafterError(f"init={str(opts.init)!r} has its own LM head over {cfg.draft_vocab or cfg.vocab_size} "
                                    f"tokens, so draft-vocab={opts.draft_vocab} cannot apply: leave --draft-vocab out")
    log(f"draft vocabulary: {cfg.draft_vocab or 'full'} -> {opts.draft_vocab or 'full'} "
        "(the most frequent tokens in this data; the weights read the target's head rows, so they carry over)")
    cfg.draft_vocab = opts.draft_vocab
    return drafters.frequent_vocab(seqs, vocab_size, opts.draft_vocab) if opts.draft_vocab else None


def choose_eagle_tree(cfg, module, head, embed, held_batch, target_name: str, log) -> None:
    """EAGLE's candidate tree from measurement: its per-depth, per-rank accuracy on held-out answers and the
    target's verify profile T(k) (with the drafter's cost per level): the tree with the most expected tokens per
    unit of time. Without a profile for the target it drafts a chain."""
    accuracy = eagle_depth_accuracy(module, head, embed, held_batch)
    module.train()
    cfg.training["depth_rank_accuracy_held_out"] = [[round(float(a), 3) for a in row] for row in accuracy]
    log("held-out accuracy by depth (rank 0..3): " + "; ".join(" ".join(f"{float(a):.2f}" for a in row) for row in accuracy))
    choose_tree_for_cost(cfg, accuracy, target_name, "eagle", log)


def choose_tree_for_cost(cfg, accuracy: torch.Tensor, target_name: str, kind: str, log, max_size: int = 32,
                         profile_path: Path | None = None) -> None:
    """cfg.tree := the tree with the most expected tokens per unit of time (drafters.tree_for_cost) from the
    held-out accuracy[depth, rank] and a verify profile (default: the committed one) with the drafter's measured
    cost: per tree level for EAGLE, once per step for Medusa. Without a profile for the target the tree stays."""
    found = profile_for(target_name, profile_path)
    if found is None or not len(accuracy):
        return
    profile, costs = found
    cost = costs.get(kind) or 0.1
    tree, tokens, speed = drafters.tree_for_cost(accuracy, profile.ratio, cost if kind == "eagle" else 0.0,
                                                 max_size=max_size, step_cost=0.0 if kind == "eagle" else cost)
    cfg.tree = [list(p) for p in tree]
    cfg.training["tree_choice"] = {"nodes": len(tree), "expected_tokens_per_step": round(tokens, 3),
                                   "predicted_speedup": round(speed, 3),
                                   ("draft_cost_per_level" if kind == "eagle" else "draft_cost_per_step"): round(cost, 3),
                                   "profile": str(PROFILE.relative_to(ASSETS.parent) if profile_path is None
                                                  else profile_path)}
    log(f"tree: {len(tree)} nodes, {tokens:.2f} expected tokens per step, predicted {speed:.2f}× AR")


def scored_batch(held_out: list[dict], seqs: list[list[int]], feats: torch.Tensor, limit: int) -> tuple:
    """The first `limit` held-out sequences of at most HELD_LENGTH tokens, in order, as one padded batch
    (ids, features, valid) whose valid mask keeps the answers only (the templated prompts are easy)."""
    scored = [i for i, seq in enumerate(seqs) if len(seq) <= HELD_LENGTH][:limit]
    ids, f, valid = Batches(seqs, feats, 0, 0).batch(scored)
    for row, i in enumerate(scored):
        valid[row, :len(held_out[i]["prompt_ids"])] = False
    return ids, f, valid


TREE_HELD_OUT = 60  # held-out answers `tree` measures by default


def retree(folder: Path, data: list[str] | None = None, held: int = TREE_HELD_OUT, write: bool = False, log=print,
           target=None, profile: Path | None = None) -> dict:
    """A trained Medusa or EAGLE drafter's tree re-chosen from measurement without retraining: its rank accuracy
    (Medusa: per head; EAGLE: per draft depth, from its own features, as at training) on `held` held-out answers
    (the split training uses; default data: the committed ids) and a verify profile (choose_tree_for_cost; default:
    the committed one, or this machine's from `python -m specviz profile --json`). Returns {"old": tree, "new": tree,
    "accuracy": ...}; with write, config.json gets the new tree and the figures, and the model card a line saying so."""
    folder = Path(folder)
    raw = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else None
    if raw is None or "kind" not in raw:
        raise drafters.DrafterError(f"{str(folder)!r} is not a drafter trained here (no config.json with a kind)")
    kind = raw["kind"]
    if kind not in ("medusa", "eagle"):
        raise drafters.DrafterError(f"drafter {str(folder)!r} is a {kind} drafter: only Medusa's and EAGLE's trees "
                                    "are re-chosen (the others draft a chain)")
    profile_for(raw["target"], profile)  # a bad profile file is reported before the features are computed
    from specviz.models import loader as models

    target = target or models.get(raw["target"], torch.device("cpu"), torch.float32, attention="sdpa")
    examples: list[dict] = []
    for f in data or [str(DEFAULT_DATA)]:
        examples += distill.read_chunks(f) if Path(f).is_dir() else distill.read_examples(f)
    held_out = distill.split(examples)[1][:held]
    if not held_out:
        raise drafters.DrafterError("no held-out examples in the data: give more (every 20th example is held out)")
    key = "head_rank_accuracy_held_out" if kind == "medusa" else "depth_rank_accuracy_held_out"
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():  # the features are a map of a file in tmp
        if kind == "medusa":
            d = drafters.load(folder, target)
            cfg = d.cfg
            feats, seqs = features_for(held_out, target, Path(tmp) / "features.f16", log)
            accuracy = head_accuracy(d.module.float(), d.head_weight.float(), feats, seqs,
                                     [len(e["prompt_ids"]) for e in held_out])
        else:  # as training scores it: the training module, bf16 autocast where the CPU has it
            cfg, state = drafters.read_layout(folder, target)
            vocab_ids = state.pop("vocab_ids", None)
            module = drafters.build_module(cfg)
            drafters.load_into(module, state, str(folder))
            weight = target.model.get_output_embeddings().weight.detach().float()
            bf16 = mixed_bf16("auto")
            feats, seqs = features_for(held_out, target, Path(tmp) / "features.f16", log, tuple(cfg.feature_layers), bf16)
            with autocast(bf16):
                accuracy = eagle_depth_accuracy(module, weight if vocab_ids is None else weight[vocab_ids.long()],
                                                target.model.get_input_embeddings(),
                                                scored_batch(held_out, seqs, feats, len(held_out))).float()
    old = [list(p) for p in cfg.tree]
    cfg.training = dict(cfg.training)
    cfg.training[key] = [[round(float(a), 3) for a in row] for row in accuracy]
    choose_tree_for_cost(cfg, accuracy, cfg.target, kind, log,
                         max_size=max(len(old), TrainOptions.tree_size) if kind == "medusa" else 32, profile_path=profile)
    log(f"tree: {len(old)} nodes before, {len(cfg.tree)} now: {cfg.tree}")
    if write:
        raw["tree"] = cfg.tree
        raw["training"] = {**raw.get("training", {}), key: cfg.training[key], "held_out_sequences_for_tree": len(held_out),
                           **({"tree_choice": cfg.training["tree_choice"]} if "tree_choice" in cfg.training else {})}
        (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        choice = cfg.training.get("tree_choice", {})
        given = ((f" --data {' '.join(data)}" if data else "") + (f" --held-out {held}" if held != TREE_HELD_OUT else "")
                 + (f" --profile {profile}" if profile else ""))
        line = (f"\nTree re-chosen without retraining (`python -m specviz tree {folder}{given} --write`): {len(cfg.tree)} nodes "
                f"instead of {len(old)}, from the {'heads' if kind == 'medusa' else 'draft depths'}' rank accuracy on "
                f"{len(held_out)} held-out answers and the verify profile ({choice.get('expected_tokens_per_step')} "
                f"expected tokens per step, predicted {choice.get('predicted_speedup')}x AR).\n")
        card_path = folder / "README.md"
        text = card_path.read_text() if card_path.is_file() else ""
        card_path.write_text(text.split("\nTree re-chosen without retraining")[0].rstrip("\n") + "\n" + line)
    return {"old": old, "new": cfg.tree, "accuracy": cfg.training[key]}


def coverage(vocab_ids: torch.Tensor | None, examples: list[dict]) -> float:
    """The share of answer tokens the draft vocabulary holds (1.0 for the full vocabulary)."""
    share = drafters.coverage(vocab_ids, [t for e in examples for t in e["answer_ids"]])
    return 1.0 if share is None else round(share, 4)


def measure(folder: Path, target, held_out: list[dict], log, max_new_tokens: int = 64) -> dict:
    """Stage 4: decode held-out prompts greedily with the drafter; τ, α and identity with AR."""
    from specviz import engines, metrics
    from specviz.config import DecodeConfig

    spec = engines.build_trained(folder, target)
    ar = engines.build("ar", target)
    cfg = DecodeConfig(method=spec.method, max_new_tokens=max_new_tokens)
    runs, identical = [], 0
    for e in held_out:
        run = engines.generate(spec, e["prompt_ids"], cfg)
        identical += run.token_ids == engines.generate(ar, e["prompt_ids"], cfg).token_ids
        runs.append(run)
    s = metrics.summarize(spec.method, [e for r in runs for e in r.events])
    out = {"prompts": len(held_out), "max_new_tokens": max_new_tokens, "tau": round(s.tau, 3),
           "alpha": round(s.alpha or 0.0, 3), "identical": f"{identical}/{len(held_out)}"}
    log(f"held-out: τ {out['tau']}, α {out['alpha']}, greedy identical to AR {out['identical']}")
    return out


def card(cfg: drafters.DrafterConfig, opts: TrainOptions) -> str:
    t = cfg.training
    lines = [f"# {cfg.kind} drafter for {cfg.target}", "", drafters.describe(cfg) + ".", "",
             f"Reproduce: `python -m specviz train {cfg.kind} --out {opts.out} --steps {opts.steps}"
             + (f" --init {opts.init}" if opts.init else "")
             + (f" --lr {opts.lr:g}" if opts.lr != TrainOptions.lr else "")
             + (f" --draft-vocab {opts.draft_vocab}" if opts.draft_vocab is not None and (
                 opts.init or opts.draft_vocab != DRAFT_VOCAB) else "")
             + (" --features final" if cfg.kind == "eagle" and not cfg.feature_layers and not opts.init else "")
             + "".join(f" --data {f}" if i == 0 else f" {f}" for i, f in enumerate(data_files(opts))) + "`"
             + (" (`make drafters` runs this for every shipped drafter)" if opts.target == DEFAULT_TARGET and all(
                 Path(f).resolve().is_relative_to(ASSETS) for f in data_files(opts)) else ""),
             "", "Target frozen; trained on its own features and soft labels (self-distillation, never Spec-Bench).", ""]
    for key, value in t.items():
        lines.append(f"- {key.replace('_', ' ')}: {json.dumps(value) if isinstance(value, dict) else value}")
    return "\n".join(lines) + "\n"
