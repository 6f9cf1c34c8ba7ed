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
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz import methods, metrics
from specviz.config import DEFAULT_TARGET
from specviz.core import answers
from specviz.drafters import dflash
from specviz.drafters import trained as drafters
from specviz.drafters.config import DrafterConfig, DrafterError
from specviz.drafters.modules import load_into
from specviz.paths import ASSETS
from specviz.train import distill, templates
from specviz.train.checkpoint import read_checkpoint
from specviz.train.features import Batches, autocast, exit_features_for, features_for
from specviz.train.losses import head_accuracy
from specviz.train.trees import choose_eagle_tree, choose_tree_for_cost

DEFAULT_DATA = answers.ORIGINAL
DRAFT_VOCAB = 8192   # a new drafter's compressed vocabulary: the N tokens most frequent in its training data


@dataclass
class TrainOptions:
    kind: str = "eagle"                # "eagle" | "medusa" | "layerskip" | "draft"
    out: Path = Path("out/train")
    target: str = DEFAULT_TARGET
    # prompt files and/or example (ids) files; None = the default self-distillation data
    data: tuple | str | None = None
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
    block_size: int = 8                # dflash: tokens a block drafted in one forward (the verified one, then masks)
    hidden_layers: int = 2             # dflash: its own decoder layers
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
    is several times the fp32 one; elsewhere torch emulates bf16 and fp32 is faster (the figures:
    experiments/LOG.md)."""
    from specviz.models import loader as models

    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is unknown: use one of {', '.join(PRECISIONS)}")
    return precision == "bf16" or (precision == "auto" and models.native_bf16())


def examples_for(opts: TrainOptions, target, log) -> list[dict]:
    """Stage 1: the self-distillation examples (prompt ids + the target's answer ids)."""
    files = data_files(opts)
    if not files and opts.target == DEFAULT_TARGET and DEFAULT_DATA.is_file():
        examples = answers.committed_examples()
        log(f"data: {DEFAULT_DATA.relative_to(ASSETS.parent)} and {answers.PROMPTS_OUT.relative_to(ASSETS.parent)}, "
            f"{len(examples)} answers (committed self-distillation ids)")
        return examples
    examples, prompts = [], [] if files else templates.default_prompts()
    for f in files:  # generated examples are used as they are; prompts are answered by the target below
        if Path(f).is_dir():
            examples += answers.read_chunks(f)
            log(f"data: {f} (self-distillation chunks)")
        elif answers.is_example_file(f):
            examples += answers.read_examples(f)
            log(f"data: {f} (self-distillation ids)")
        else:
            prompts += distill.read_prompt_file(f)
    if not prompts and not examples:
        raise answers.DistillError(f"data file {', '.join(files)!r} has no prompts: use JSONL with 'prompt' or one "
                                   "prompt a line")
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
    return examples + answers.read_examples(path)


def data_files(opts: TrainOptions) -> list[str]:
    return [opts.data] if isinstance(opts.data, str) else list(opts.data or [])


@dataclass
class TrainResult:
    folder: Path                       # the saved drafter
    losses: list[float]                # per step, this invocation
    held_out: dict                     # τ, α, identity on the held-out prompts


def train(opts: TrainOptions, log=print, target=None, custom_loss=None) -> TrainResult:
    """Every stage; `target` (a LoadedModel) defaults to loading opts.target in fp32 on the CPU. `custom_loss`, a
    function with the signature of the kind's loss (eagle_loss's for EAGLE), replaces it (an experiment's own loss:
    experiments/probes/copy_weight_train.py)."""
    from specviz.models import loader as models

    torch.manual_seed(opts.seed)
    distill.check_prompt_files(data_files(opts))  # no prompts, or too few: one line before the target loads
    ckpt_path = opts.out / "checkpoint.pt"
    if opts.resume and not ckpt_path.is_file():
        log(f"resume: no checkpoint in {opts.out} ({ckpt_path.name}): starting fresh")
    opts.out.mkdir(parents=True, exist_ok=True)
    target = target or models.get(opts.target, torch.device("cpu"), torch.float32)
    spec = methods.spec(opts.kind)  # its layout: the DrafterConfig fields its options set (methods.MethodSpec.layout)
    check_layer_options(opts, spec, target.model.config.num_hidden_layers)
    init = init_from(opts, target) if opts.init else None
    examples = examples_for(opts, target, log)
    train_ex, held_out = distill.split_for_training(examples)
    layers = feature_layers(opts, spec, init, target.model.config.num_hidden_layers)
    exit_layer = (init[0].exit_layer if init else opts.exit_layer) if exits_early(spec) else None
    bf16 = mixed_bf16(opts.precision)
    log(f"precision: {'bf16 autocast (fp32 weights and optimizer)' if bf16 else 'fp32'}")
    feats, seqs = stage_features(train_ex, target, opts.out, "", log, layers, exit_layer, bf16)
    module, cfg, vocab_ids = build_drafter(opts, spec, init, target, seqs, layers, log)
    starts = [len(e["prompt_ids"]) for e in train_ex] if spec.answers_only else None
    run = new_run(opts, spec, module, vocab_ids, target, (feats, seqs), layers, bf16, custom_loss, starts)
    if opts.epochs:
        opts.steps = math.ceil(opts.epochs * len(feats) / opts.batch_tokens)
    if opts.resume and ckpt_path.is_file():
        run.resume(ckpt_path, log)
    held_feats, held_seqs = stage_features(held_out, target, opts.out, "held_out_", log, layers, exit_layer, bf16)
    # scored in one padded batch every checkpoint, so a fixed, bounded cost: HELD_SCORED sequences of at most
    # HELD_LENGTH tokens (scoring every held-out sequence padded to the longest cost as much as many training steps)
    held = HeldOut(held_out, held_feats, held_seqs, scored_batch(held_out, held_seqs, held_feats, HELD_SCORED))
    if init and run.step == 0:  # the curve starts at the init's own score, and a run that only loses keeps its weights
        log(run.score_held(held.batch))
    losses = optimize(run, opts, held, ckpt_path)
    if run.best[1] is not None:
        module.load_state_dict(run.best[1])
    cfg.training = training_record(opts, train_ex, seqs, vocab_ids, held_out, run.seconds, bf16)
    choose_drafter_tree(spec, cfg, opts, run, held, log)
    final = opts.out / "drafter"
    drafters.save(final, module, cfg, vocab_ids, card(cfg, opts))
    log(f"saved {final} ({drafters.n_params(module) / 1e6:.2f} M parameters)")
    if data_files(opts):  # your own data: its answers become the drafter's datastore (the +ret branch)
        save_datastore(final, cfg, examples, log)
    measured = measure(final, target, held_out[:opts.eval_prompts], log)
    cfg.training["held_out"] = measured
    drafters.save(final, module, cfg, vocab_ids, card(cfg, opts))
    return TrainResult(final, losses, measured)


def exits_early(spec: methods.MethodSpec) -> bool:
    """LayerSkip: drafts from an early exit, read through the target's final norm."""
    return "exit_layer" in spec.layout


def check_layer_options(opts: TrainOptions, spec: methods.MethodSpec, n_layers: int) -> None:
    """The layer indices the options name exist in the target (an --init drafter brings its own)."""
    if exits_early(spec) and not opts.init and not 1 <= opts.exit_layer < n_layers:
        raise DrafterError(f"exit-layer={opts.exit_layer} is out of range for {opts.target}: use "
                                    f"1..{n_layers - 1}")
    if "draft_layers" in spec.layout and not opts.init and not all(0 <= i < n_layers for i in opts.draft_layers):
        raise DrafterError(f"draft-layers={','.join(map(str, opts.draft_layers))} is out of range for "
                                    f"{opts.target}: use indices 0..{n_layers - 1}")


def feature_layers(opts: TrainOptions, spec: methods.MethodSpec, init, n_layers: int) -> tuple:
    """The target layers whose hidden states the drafter fuses (EAGLE-3); () reads the final hidden state only."""
    if init:
        return tuple(init[0].feature_layers)
    fused = "feature_layers" in spec.layout and opts.features == "fused"
    pick = getattr(methods.load(spec.module), "default_layers", drafters.eagle3_layers)  # DFlash: its own choice
    return tuple(pick(n_layers)) if fused else ()


def stage_features(examples: list[dict], target, out: Path, prefix: str, log, layers: tuple, exit_layer: int | None,
                   bf16: bool) -> tuple[torch.Tensor, list[list[int]]]:
    """Stage 2: the target's features over `examples`, cached under `out` as {prefix}features.f16; with an
    exit layer (LayerSkip) the early hidden state ({prefix}exit_features.pt) follows them on the last axis, since
    the exit adapter reads the early hidden state and the labels come from the last."""
    feats, seqs = features_for(examples, target, out / f"{prefix}features.f16", log, layers, bf16)
    if exit_layer is not None:
        feats = torch.cat([feats, exit_features_for(examples, target, exit_layer, out / f"{prefix}exit_features.pt",
                                                    log, bf16)], -1)
    return feats, seqs


def build_drafter(opts: TrainOptions, spec: methods.MethodSpec, init, target, seqs: list[list[int]], layers: tuple,
                  log) -> tuple[torch.nn.Module, DrafterConfig, torch.Tensor | None]:
    """The module to train, its config and its draft vocabulary: an --init drafter goes on learning in its own
    layout, over its own vocabulary (or a re-chosen one); a new one gets the kind's layout from the options."""
    if init:
        cfg, state = init
        vocab_ids = state.pop("vocab_ids", None)
        vocab_ids = None if vocab_ids is None else vocab_ids.long()
        if opts.draft_vocab is not None and opts.draft_vocab != cfg.draft_vocab:
            vocab_ids = rechoose_vocab(cfg, opts, seqs, target.vocab_size, log)
        module = drafters.build_module(cfg, target.model)
        load_into(module, state, str(opts.init))
        module.train()
        log(f"init: {opts.init} ({drafters.describe(cfg)})")
        return module, cfg, vocab_ids
    n_vocab = DRAFT_VOCAB if opts.draft_vocab is None else opts.draft_vocab
    vocab_ids = drafters.frequent_vocab(seqs, target.vocab_size, n_vocab) if n_vocab else None
    given = {"medusa_heads": opts.medusa_heads, "exit_layer": opts.exit_layer,
             "draft_layers": list(opts.draft_layers), "feature_layers": list(layers), "block_size": opts.block_size,
             "num_hidden_layers": opts.hidden_layers,
             "mask_token_id": dflash.mask_token(target.tokenizer, target.vocab_size)}
    extra = {k: given[k] for k in spec.layout}
    cfg = DrafterConfig.for_target(opts.kind, opts.target, target.model.config, n_vocab, **extra)
    module = drafters.build_module(cfg, target.model).train()
    if layers:  # EAGLE-3 reads its output through its own norm and the target's head: start from the target's norm
        module.norm.weight.data.copy_(target.model.get_decoder().norm.weight.data)
    return module, cfg, vocab_ids


@dataclass
class Run:
    """Stage 3's state: the module, the loss and what it reads (the target's head rows over the draft vocabulary,
    its input embeddings, the noise added to the features), the optimizer, its schedule and the batches; the steps
    taken, the training seconds and the best held-out score with its weights, all saved in each checkpoint."""
    module: torch.nn.Module
    loss_fn: object
    head: torch.Tensor
    embed: torch.nn.Module
    noise: float
    bf16: bool
    batches: Batches
    optim: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    step: int = 0
    seconds: float = 0.0
    best: tuple = (float("-inf"), None)

    def resume(self, path: Path, log) -> None:
        """Continue from a checkpoint that save() wrote, read as tensors and plain values only (never code: a
        checkpoint from someone else cannot run anything); one line (DrafterError) for any other file."""
        ckpt = read_checkpoint(path)
        try:
            self.module.load_state_dict(ckpt["module"])
            self.optim.load_state_dict(ckpt["optim"])
            self.schedule.load_state_dict(ckpt["schedule"])
            self.batches.rng.setstate(ckpt["rng"])
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:
            raise DrafterError(f"checkpoint {str(path)!r} is of another drafter or layout ({type(exc).__name__}): "
                               "train into a new --out, or drop --resume") from None
        self.step, self.seconds = int(ckpt["step"]), float(ckpt["seconds"])
        self.best = ckpt["best"]
        log(f"resumed from {path} at step {self.step}")

    def save(self, path: Path) -> None:
        torch.save({"module": self.module.state_dict(), "optim": self.optim.state_dict(),
                    "schedule": self.schedule.state_dict(), "step": self.step, "seconds": self.seconds,
                    "rng": self.batches.rng.getstate(), "best": self.best}, path)

    def train_step(self) -> tuple[float, dict, float]:
        """One optimizer step on a sampled batch: its loss, the loss's statistics, and tokens a second."""
        t0 = time.perf_counter()
        ids, f, valid = self.batches.sample()
        with autocast(self.bf16):
            loss, stats = self.loss_fn(self.module, self.head, self.embed, ids, f, valid, self.noise)
        self.optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
        self.optim.step()
        self.schedule.step()
        self.step += 1
        dt = time.perf_counter() - t0
        self.seconds += dt
        return float(loss.detach()), stats, int(valid.sum()) / dt

    def score_held(self, held_batch: tuple) -> str:
        """The held-out score now, the weights kept in self.best where it is the best yet; the line that says it."""
        score, stats = self.held_score(held_batch)
        if score > self.best[0]:  # keep the weights that do best on held-out data
            self.best = (score, {k: v.detach().clone() for k, v in self.module.state_dict().items()})
        return f"step {self.step}: held-out " + ", ".join(f"{k} {v:.3f}" for k, v in stats.items())

    def held_score(self, held_batch: tuple) -> tuple[float, dict]:
        """Teacher-forced top-1 agreement with the target on the held-out split (summed over draft positions)."""
        self.module.eval()
        with torch.no_grad(), autocast(self.bf16):
            _, st = self.loss_fn(self.module, self.head, self.embed, *held_batch, 0.0)
        self.module.train()
        return sum(st.values()), st


def new_run(opts: TrainOptions, spec: methods.MethodSpec, module: torch.nn.Module, vocab_ids: torch.Tensor | None,
            target, features: tuple[torch.Tensor, list[list[int]]], layers: tuple, bf16: bool, custom_loss,
            starts: list[int] | None = None) -> Run:
    """The optimizer (AdamW, a 20-step warm-up then a cosine over opts.steps), the kind's loss (or `custom_loss`)
    and the batches over the training features."""
    feats, seqs = features
    weight = target.model.get_output_embeddings().weight.detach()
    head = weight if vocab_ids is None else weight[vocab_ids]
    noise = (0.1 * float(feats[:4096].float().pow(2).mean().sqrt()) if "feature_layers" in spec.layout and not layers
             else 0.0)
    optim = torch.optim.AdamW(module.parameters(), lr=opts.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, opts.steps)))))
    loss_fn = methods.load(spec.loss)
    if exits_early(spec):
        loss_fn = functools.partial(loss_fn, norm=target.model.get_decoder().norm)
    return Run(module, custom_loss or loss_fn, head, target.model.get_input_embeddings(), noise, bf16,
               Batches(seqs, feats, opts.batch_tokens, opts.seed, starts), optim, schedule)


@dataclass
class HeldOut:
    """The held-out split as training scores it: its examples, their features and sequences, and the padded
    batch scored at each checkpoint."""
    examples: list[dict]
    feats: torch.Tensor
    seqs: list[list[int]]
    batch: tuple


def optimize(run: Run, opts: TrainOptions, held: HeldOut, ckpt_path: Path) -> list[float]:
    """Stage 3's loop up to opts.steps: every opts.checkpoint_every steps and at the last, the held-out score (the
    best-scoring weights are kept in run.best) and a checkpoint. Returns this invocation's losses, one a step."""
    from tqdm import tqdm

    bar = tqdm(total=opts.steps, initial=run.step, desc=f"train {opts.kind}", unit="step")
    losses: list[float] = []
    while run.step < opts.steps:
        loss, stats, tok_s = run.train_step()
        losses.append(loss)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:.0f}", **{k: f"{v:.2f}" for k, v in stats.items()})
        if run.step % opts.checkpoint_every == 0 or run.step == opts.steps:
            bar.write(run.score_held(held.batch))
            run.save(ckpt_path)
    bar.close()
    return losses


def training_record(opts: TrainOptions, train_ex: list[dict], seqs: list[list[int]], vocab_ids, held_out: list[dict],
                    seconds: float, bf16: bool) -> dict:
    """What the drafter's config.json and card say about its training."""
    return {**({"init": str(opts.init)} if opts.init else {}),
            "data": "self-distillation: " + (" + ".join(data_files(opts)) or (
                "the committed ids in assets/distill/" if opts.target == DEFAULT_TARGET
                else "the project's default prompts")) + f", {len(train_ex)} sequences, "
            f"{sum(map(len, seqs))} tokens", "steps": opts.steps, "batch_tokens": opts.batch_tokens,
            "draft_vocab_coverage_held_out": coverage(vocab_ids, held_out),
            "train_seconds": round(seconds), "precision": "bf16 autocast" if bf16 else "fp32",
            "hardware": f"{platform.machine()} CPU, {torch.get_num_threads()} threads",
            "torch": torch.__version__}


def choose_drafter_tree(spec: methods.MethodSpec, cfg: DrafterConfig, opts: TrainOptions, run: Run,
                        held: HeldOut, log) -> None:
    """The candidate tree of a tree drafter, from its measured held-out accuracy: Medusa's per head, EAGLE's per
    draft depth (choose_tree_for_cost / choose_eagle_tree); chain drafters have none."""
    if spec.tree_from == "heads":
        accuracy = head_accuracy(run.module.eval(), run.head, held.feats, held.seqs,
                                 [len(e["prompt_ids"]) for e in held.examples])
        cfg.tree = [list(p) for p in drafters.choose_tree(accuracy, opts.tree_size)]
        cfg.training["head_top1_held_out_answers"] = [round(float(a), 3) for a in accuracy[:, 0]]
        cfg.training["head_rank_accuracy_held_out"] = [[round(float(a), 3) for a in row] for row in accuracy]
        log("held-out top-1 accuracy by head: " + ", ".join(f"{float(a):.2f}" for a in accuracy[:, 0]))
        choose_tree_for_cost(cfg, accuracy, opts.target, opts.kind, log, max_size=opts.tree_size)
    if spec.tree_from == "depths":
        choose_eagle_tree(cfg, run.module, run.head, run.embed, held.batch, opts.target, log)


def save_datastore(final: Path, cfg: DrafterConfig, examples: list[dict], log) -> None:
    """A user's own data: the target's answers in it become the drafter's datastore (the +ret branch)."""
    from specviz.core import retrieval

    store = retrieval.Datastore(e["answer_ids"] for e in examples)
    store.save(final / retrieval.DATASTORE_FILE)
    cfg.training["datastore"] = (f"{retrieval.DATASTORE_FILE}: the target's answers in this data, "
                                 f"{len(store)} tokens")
    log(f"datastore: {final / retrieval.DATASTORE_FILE} ({len(store)} answer tokens; --retrieve drafts from it)")


def init_from(opts: TrainOptions, target) -> tuple[DrafterConfig, dict]:
    """The layout and weights of the drafter that `--init` names: a folder this project trained (any kind), or a
    published Medusa-1 / EAGLE-1 / EAGLE-3 checkpoint, of the kind being trained and for this target."""
    cfg, state = drafters.read_layout(Path(opts.init), target)
    if cfg.kind != opts.kind:
        raise DrafterError(f"init={str(opts.init)!r} is a {cfg.kind} drafter: train {cfg.kind} from it, "
                                    f"or give a {opts.kind} drafter")
    if cfg.hidden_size != target.model.config.hidden_size or cfg.vocab_size != target.vocab_size:
        raise DrafterError(f"init={str(opts.init)!r} was trained for {cfg.target} (hidden {cfg.hidden_size}, "
                                    f"vocab {cfg.vocab_size}), not {opts.target}")
    cfg.training = {}
    return cfg, state


def rechoose_vocab(cfg: DrafterConfig, opts: TrainOptions, seqs, vocab_size: int, log) -> torch.Tensor | None:
    """An --init drafter given another --draft-vocab: the N tokens most frequent in the new training data. Its
    weights stay valid, since it reads its output through the target's own LM head rows (one per token), so only
    the rows it reads change; a published drafter with an LM head of its own cannot change vocabulary."""
    if cfg.own_lm_head or cfg.own_lm_heads:
        raise DrafterError(f"init={str(opts.init)!r} has its own LM head over "
                                    f"{cfg.draft_vocab or cfg.vocab_size} tokens, so draft-vocab={opts.draft_vocab} "
                                    "cannot apply: leave --draft-vocab out")
    log(f"draft vocabulary: {cfg.draft_vocab or 'full'} -> {opts.draft_vocab or 'full'} "
        "(the most frequent tokens in this data; the weights read the target's head rows, so they carry over)")
    cfg.draft_vocab = opts.draft_vocab
    return drafters.frequent_vocab(seqs, vocab_size, opts.draft_vocab) if opts.draft_vocab else None


def scored_batch(held_out: list[dict], seqs: list[list[int]], feats: torch.Tensor, limit: int) -> tuple:
    """The first `limit` held-out sequences of at most HELD_LENGTH tokens, in order, as one padded batch
    (ids, features, valid) whose valid mask keeps the answers only (the templated prompts are easy)."""
    scored = [i for i, seq in enumerate(seqs) if len(seq) <= HELD_LENGTH][:limit]
    ids, f, valid = Batches(seqs, feats, 0, 0).batch(scored)
    for row, i in enumerate(scored):
        valid[row, :len(held_out[i]["prompt_ids"])] = False
    return ids, f, valid


HELD_SCORED, HELD_LENGTH = 128, 384  # held-out sequences (of at most that length) scored at each checkpoint
def coverage(vocab_ids: torch.Tensor | None, examples: list[dict]) -> float:
    """The share of answer tokens the draft vocabulary holds (1.0 for the full vocabulary)."""
    share = drafters.coverage(vocab_ids, [t for e in examples for t in e["answer_ids"]])
    return 1.0 if share is None else round(share, 4)


def measure(folder: Path, target, held_out: list[dict], log, max_new_tokens: int = 64) -> dict:
    """Stage 4: decode held-out prompts greedily with the drafter; τ, α and identity with AR."""
    from specviz import engines
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


def card(cfg: DrafterConfig, opts: TrainOptions) -> str:
    t = cfg.training
    lines = [f"# {cfg.kind} drafter for {cfg.target}", "", drafters.describe(cfg) + ".", "",
             f"Reproduce: `python -m specviz train {cfg.kind} --out {opts.out} --steps {opts.steps}"
             + (f" --init {opts.init}" if opts.init else "")
             + (f" --lr {opts.lr:g}" if opts.lr != TrainOptions.lr else "")
             + (f" --draft-vocab {opts.draft_vocab}" if opts.draft_vocab is not None and (
                 opts.init or opts.draft_vocab != DRAFT_VOCAB) else "")
             + (" --features final" if "feature_layers" in methods.spec(cfg.kind).layout and not cfg.feature_layers
                and not opts.init else "")
             + "".join(f" --data {f}" if i == 0 else f" {f}" for i, f in enumerate(data_files(opts))) + "`"
             + (" (`make drafters` runs this for every shipped drafter)" if opts.target == DEFAULT_TARGET and all(
                 Path(f).resolve().is_relative_to(ASSETS) for f in data_files(opts)) else ""),
             "", "Target frozen; trained on its own features and soft labels (self-distillation, never Spec-Bench).",
             ""]
    for key, value in t.items():
        lines.append(f"- {key.replace('_', ' ')}: {json.dumps(value) if isinstance(value, dict) else value}")
    return "\n".join(lines) + "\n"
