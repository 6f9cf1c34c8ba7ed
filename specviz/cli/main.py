"""`python -m specviz`: generate (coloured tokens in the terminal), bench (methods against AR) and check
(a drafter sanity check with a JSON and HTML report)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

from specviz import methods as registry
from specviz.cli.bench import cmd_bench, read_prompts
from specviz.cli.common import (
    DEFAULTS,
    PAIR_HELP,
    InputError,
    check_inputs,
    decode_args,
    default_pair,
    int_arg,
    load_target,
)
from specviz.cli.generate import cmd_generate
from specviz.cli.profile import cmd_profile
from specviz.cli.serving import SERVING_COMMANDS, serving_parsers
from specviz.config import DEFAULT_TARGET, GAMMA_MAX
from specviz.core import answers
from specviz.errors import ConfigError
from specviz.methods import CHECK_METHODS, METHODS, TRAINED_METHODS
from specviz.train.distill import CHUNK_SIZE as DISTILL_CHUNK
from specviz.train.distill import DEFAULT_BATCH as DISTILL_BATCH
from specviz.train.loop import DRAFT_VOCAB, PRECISIONS, TrainOptions
from specviz.train.retree import TREE_HELD_OUT


def cmd_check(args) -> int:
    """The drafter sanity check: compatible? correct? does it pay? Exit 0 when correct, 1 when not."""
    from tqdm import tqdm

    from specviz.check import report
    from specviz.check import run as check
    from specviz.check.options import CheckOptions

    given = {k: getattr(args, k) for k in ("gamma", "temperature", "samples", "max_new_tokens", "synthetic_samples")}
    options = CheckOptions(**{k: v for k, v in given.items() if v is not None})  # defaults live there
    prompts = read_prompts(args.prompts, None, args.limit, check.DEFAULT_PROMPTS)  # --limit takes the built-in too
    method = args.method or "vanilla"
    if not registry.spec(method).has_weights and args.draft:
        raise InputError(f"--draft {args.draft!r} does not apply to {method} ({registry.spec(method).label} has no "
                         "draft model): drop it")
    target = load_target(args)
    drafter, draft = check.drafter_for(method, target, args.draft)
    bars: dict[str, tqdm] = {}

    def progress(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=total, desc=stage, file=sys.stderr, leave=True, dynamic_ncols=True)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    result = check.run_check(target, drafter, draft=draft, prompts=prompts, options=options, progress=progress,
                             method=method)
    data = result.to_dict()
    data["command"] = "python -m specviz " + " ".join(sys.argv[1:])
    print(format_check(data))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1, ensure_ascii=False))
        print(f"wrote {args.json}")
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(report.to_html(data), encoding="utf-8")
        print(f"wrote {args.report}")
    return 0 if result.correct else 1


def format_check(d: dict) -> str:
    """The check's answers in order, for the terminal."""
    from specviz.core.lookup import first_draft_sentence
    from specviz.metrics import vocab_sentence

    f = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    c, g, fid, p = d["compatibility"], d["greedy"], d["fidelity"], d["payoff"]
    fit = fid["fit"]
    lines = [f"1. compatible: {c['message']}",
             f"2. greedy identity: {sum(r['identical'] for r in g['prompts'])}/{len(g['prompts'])} prompts identical"
             + (f", {g['near_ties']} near-tie flips" if g["near_ties"] else "")
             + f"; verification vs one-token decoding: max |Δlogit| {g['verify_logit_max_abs_diff']:.3g} over "
               f"{g['judged_positions']} positions ({g['guarantee']})"]
    for r in g["prompts"]:
        dv = r["divergence"]
        if dv:
            lines.append(f"   prompt {r['id']}: token {dv['index']} after {dv['context']!r}: AR {dv['ar_token']!r} vs "
                         f"speculative {dv['spec_token']!r}, top-2 gap {dv['top2_gap']:.2e}"
                         + (" (near-tie)" if dv["near_tie"] else " (BUG)"))
    after = "" if fid.get("given") is None else f" after the prefill emitted {fid['given']!r}, of {fid['seeds']} seeds"
    lines.append(f"   sampling fidelity ({fid['samples']} samples{after}, T={fid['temperature']:g}, prompt "
                 f"{fid['prompt_id']}): chi2={fit['chi2']:.1f} dof={fit['dof']} p={fit['p_value']:.3g}, "
                 f"TV={fit['tv']:.3f} (bound {fit['tv_bound']:.3f}) -> {'pass' if fid['passed'] else 'FAIL'}")
    if d["synthetic"]:
        lines.append("   synthetic p/q: "
                     + ", ".join(f"{s['name']} {'ok' if s['ok'] else 'FAIL'}" for s in d["synthetic"]))
    lines.append(f"3. α={f(p['alpha'])} τ={f(p['tau'])} c={f(p['cost_ratio'], '.3f')} · speedup "
                 f"{f(p['speedup'])}× (median over prompts) "
                 f"(Leviathan {f(p['predicted_speedup'])}×) · best γ {p['best_gamma']} (Leviathan), "
                 f"{p['best_gamma_hw']} (with this device's verify cost)")
    lines.append("   α by position: " + " ".join(f(a) for a in p["alpha_by_position"]))
    if p.get("first_draft"):
        lines.append("   " + first_draft_sentence(p["first_draft"]))
    if p.get("draft_vocab"):
        lines.append("   " + vocab_sentence(p["draft_vocab"]))
    for cat in p["by_category"]:
        lines.append(f"   {cat['name']}: α={f(cat['alpha'])} τ={f(cat['tau'])} speedup {f(cat['speedup'])}×")
    if p["batch_curve"]:
        lines.append("   predicted speedup by batch: "
                     + ", ".join(f"b={r['batch']} {r['speedup']:.2f}×" for r in p["batch_curve"]))
    lines.append(("verdict: " if d["correct"] else "verdict: ") + d["verdict"])
    return "\n".join(lines)


TRAIN_DEFAULTS = TrainOptions()
METRICS_FILE_HELP = ("also write the speculative runs' counters here as Prometheus text, under vLLM's spec_decode "
                     "names with the prefix specviz: (as the app's /metrics)")


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown flag, a choice not offered) in one line like every other bad value here,
    not after its usage block; the subcommands' parsers are of this class too (add_subparsers' default)."""

    def error(self, message: str):
        self.exit(2, f"specviz: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m specviz", description="See and check speculative decoding.")
    sub = p.add_subparsers(dest="command", required=True)
    generate_parser(sub)
    bench_parser(sub)
    check_parser(sub)
    profile_parser(sub)
    train_parser(sub)
    tree_parser(sub)
    distill_parser(sub)
    serving_parsers(sub)
    return p


def generate_parser(sub) -> None:
    """`generate`: one prompt, its tokens coloured by verdict."""
    g = sub.add_parser("generate", help="generate with colour-coded verdicts")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default=DEFAULTS.method, help=f"one of {', '.join(METHODS)} (default %(default)s)")
    g.add_argument("--race", action="store_true", help="also run plain AR on the race clock and report the speedup")
    g.add_argument("--no-color", action="store_true")
    g.add_argument("--color", action="store_true", help="force ANSI colours even when not a terminal")
    g.add_argument("--metrics-file", default=None, help=METRICS_FILE_HELP)
    decode_args(g)


def bench_parser(sub) -> None:
    """`bench`: methods against AR over a prompt file."""
    b = sub.add_parser("bench", help="run methods against AR over a prompt file")
    b.add_argument("--prompts", required=True, help="JSONL (id/question_id, category, prompt or turns) or one prompt a "
                                                    "line")
    b.add_argument("--method", nargs="+", help="methods to compare with AR, each optionally with its own γ and "
                   "drafter as name[:gamma][@drafter], e.g. vanilla:2 eagle:5 eagle@out/train/eagle/drafter (two EAGLE "
                   "drafters over one AR baseline; default: vanilla pld); a tree drafter also takes +pld[:n] and "
                   "+ret[:n] (prompt lookup's and the datastore's branches) and +dyn[:n] (a dynamic tree of n nodes), "
                   "e.g. eagle+pld:6+ret:6+dyn; `default` is the race the app would run on this machine (chosen from "
                   "its measured T(k))")
    b.add_argument("--limit", type=int, default=None, help="at most N prompts, round-robin across categories")
    b.add_argument("--categories", default=None, help="comma-separated categories to keep")
    b.add_argument("--compare-hf", action="store_true", help="add transformers' assisted generation with the same "
                                                             "draft and γ")
    b.add_argument("--ar-reference", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the stock plain decoders (transformers bf16 sdpa and fp32) beside specviz's AR; "
                   "the headline speedup is over the fastest of them all (default on; --no-ar-reference skips them "
                   "and the headline falls back to specviz's AR)")
    b.add_argument("--json", required=True, help="output file")
    b.add_argument("--metrics-file", default=None, help=METRICS_FILE_HELP + ", rewritten after every prompt")
    b.add_argument("--what-if", nargs="+", default=None, metavar="PROFILE_OR_DEVICE",
                   help="after the measured table, each method's steps (pooled over the prompts) re-timed on this "
                   "machine's verify profile and on each verify profile file (`python -m specviz profile --json "
                   "FILE`) or device of assets/devices.json named here (its roofline bound; its name or a unique "
                   "start of it, any case), e.g. --what-if gpu.json 'NVIDIA T4' 'NVIDIA H100'")
    decode_args(b)


def check_parser(sub) -> None:
    """`check`: the drafter sanity check."""
    c = sub.add_parser("check", help="drafter sanity check: compatible? correct? does it pay? (exit 1 when incorrect)")
    c.add_argument("--target", default=None, help=f"model spec (default {PAIR_HELP})")
    c.add_argument("--method", choices=CHECK_METHODS, default=None,
                   help=f"vanilla: a draft model (default); pld: prompt lookup; {', '.join(TRAINED_METHODS)}: a "
                   "trained drafter")
    c.add_argument("--draft", "--drafter", dest="draft", default=None,
                   help=f"vanilla: int8 (default) or a model spec; {', '.join(TRAINED_METHODS)}: a drafter folder "
                   "(train's OUT/drafter) or Hub id (default: the shipped one)")
    c.add_argument("--prompts", default=None, help="JSONL or one prompt a line (default: a small built-in set)")
    c.add_argument("--limit", type=int, default=None, help="at most N prompts, round-robin across categories")
    c.add_argument("--gamma", default=None, help=f"drafted tokens per step, 1..{GAMMA_MAX} or auto (default 4)")
    c.add_argument("--temperature", default=None, help="temperature of the sampling-fidelity part (default 1.0)")
    c.add_argument("--samples", default=None, help="seeds for the sampling-fidelity part (default 400)")
    c.add_argument("--synthetic-samples", default=None, help="draws per synthetic p/q case, 0 = skip (default 4000)")
    c.add_argument("--max-new-tokens", default=None, help="per prompt in the greedy and speed part (default 64)")
    c.add_argument("--report", default=None, help="write a self-contained HTML report here")
    c.add_argument("--json", default=None, help="write every figure as JSON here")
    c.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    c.add_argument("--dtype", default="auto", help="auto (bf16 on GPU and on CPUs with a bf16 vector path, else fp32), "
                                                   "float32, bfloat16, float16")


def profile_parser(sub) -> None:
    """`profile`: the verify profile T(k) and the drafters' cost ratios."""
    pr = sub.add_parser("profile", help="what verifying k tokens costs (T(k)) and each drafter's cost ratio c")
    pr.add_argument("--target", default=None, help=f"model spec (default {PAIR_HELP})")
    pr.add_argument("--draft", default=None, help="vanilla's draft: int8 (default) or a model spec")
    pr.add_argument("--sizes", default=None, help="comma-separated tokens per forward, 1 always among them (default "
                                                  "1,2,3,4,5,6,8,12,16,24,32)")
    pr.add_argument("--reps", default="5", help="timed forwards per size, median (default %(default)s)")
    pr.add_argument("--context", default="128", help="tokens already in the KV cache (default %(default)s)")
    pr.add_argument("--no-drafters", action="store_true", help="only T(k), not the drafters' c")
    pr.add_argument("--json", default=None, help="write the profile and the costs as JSON here")
    pr.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    pr.add_argument("--dtype", default="auto", help="auto (bf16 on GPU and on CPUs with a bf16 vector path, else "
                                                    "fp32), float32, bfloat16, float16")
    pr.set_defaults(method=None)


def train_parser(sub) -> None:
    """`train`: a drafter against the frozen target."""
    t = sub.add_parser("train", help="train a drafter against the target (resumable)")
    t.add_argument("kind", choices=TRAINED_METHODS, help="eagle: one decoder layer over the target's features; "
                   "medusa: heads proposing a candidate tree; layerskip: the target's first layers and an exit "
                   "adapter; draft: a small distilled model sharing the target's embeddings and LM head")
    t.add_argument("--target", default=DEFAULT_TARGET, help="model spec (default %(default)s)")
    t.add_argument("--data", nargs="+", default=None, help="one or more files: your own prompts (JSONL with 'prompt', "
                   "or one a line), which the target answers, and/or self-distillation ids (JSONL(.gz) of prompt_ids "
                   "and answer_ids, used as they are), and/or folders written by `distill` (default: the committed "
                   "self-distillation data)")
    t.add_argument("--out", required=True, help="working folder: data, features, checkpoints; the drafter lands in "
                                                "OUT/drafter")
    t.add_argument("--steps", default=str(TRAIN_DEFAULTS.steps), help="optimizer steps (default %(default)s)")
    t.add_argument("--epochs", default=None, help="instead of --steps: passes over the training tokens")
    t.add_argument("--batch-tokens", default=str(TRAIN_DEFAULTS.batch_tokens), help="tokens per step (default "
                                                                                    "%(default)s)")
    t.add_argument("--lr", default=str(TRAIN_DEFAULTS.lr), help="peak learning rate (default %(default)s)")
    t.add_argument("--draft-vocab", default=None,
                   help=f"compressed draft vocabulary: the N tokens most frequent in the training data; 0 = full "
                   f"(default {DRAFT_VOCAB}; with --init the init's own, and another N re-chooses it)")
    t.add_argument("--features", default=TRAIN_DEFAULTS.features, choices=("fused", "final"),
                   help="eagle: fused = the target's hidden states after a low, a middle and a high layer (EAGLE-3); "
                   "final = its last hidden state only (EAGLE-1) (default %(default)s)")
    t.add_argument("--heads", default=str(TRAIN_DEFAULTS.medusa_heads), help="medusa heads (default %(default)s)")
    t.add_argument("--exit-layer", default=str(TRAIN_DEFAULTS.exit_layer), help="layerskip: draft after this many "
                                                                                "target layers (default %(default)s)")
    t.add_argument("--draft-layers", default=",".join(map(str, TRAIN_DEFAULTS.draft_layers)),
                   help="draft: the target layers its own layers start from, comma-separated (default %(default)s)")
    t.add_argument("--block-size", default=str(TRAIN_DEFAULTS.block_size), help="dflash: tokens a block drafted in "
                   "one forward, the verified one first (default %(default)s)")
    t.add_argument("--layers", default=str(TRAIN_DEFAULTS.hidden_layers), help="dflash: its own decoder layers "
                   "(default %(default)s)")
    t.add_argument("--tree-size", default=str(TRAIN_DEFAULTS.tree_size), help="medusa: nodes in the candidate tree; "
                   "for the default target, at most this many, the size chosen from held-out accuracy and the "
                   "committed verify profile (default %(default)s)")
    t.add_argument("--precision", default=TRAIN_DEFAULTS.precision, choices=PRECISIONS,
                   help="auto: the matmuls of training and of its feature pass in bf16 (autocast; weights and "
                   "optimizer fp32) where the CPU has native bf16 (AVX512-BF16/AMX), else fp32 (default %(default)s)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    t.add_argument("--init", default=None, help="start from this drafter folder of the same kind (e.g. a shipped one, "
                   "to go on training it on new data or your own domain): its weights, layout and draft vocabulary "
                   "are kept (--draft-vocab re-chooses the vocabulary), and the other layout options above are ignored")
    t.add_argument("--seed", default="0")


def tree_parser(sub) -> None:
    """`tree`: a trained drafter's tree re-chosen without retraining."""
    tr = sub.add_parser("tree", help="re-choose a trained Medusa or EAGLE drafter's tree from its held-out accuracy "
                        "and a verify profile (the committed one, or --profile), without retraining")
    tr.add_argument("drafter", help="a Medusa or EAGLE drafter folder trained here (e.g. "
                                    "assets/drafters/smollm2-135m-medusa)")
    tr.add_argument("--data", nargs="+", default=None, help="self-distillation ids (JSONL(.gz)) or distill folders "
                    "whose held-out split (every 20th example) is measured (default: the committed ids the drafter was "
                    "trained on)")
    tr.add_argument("--held-out", default=str(TREE_HELD_OUT), help="held-out answers to measure (default %(default)s)")
    tr.add_argument("--profile", default=None, help="a verify profile of this machine (python -m specviz profile "
                    "--json FILE) to fit the tree to (default: the committed one, assets/profiles/profile-bf16.json)")
    tr.add_argument("--write", action="store_true", help="save the new tree in the drafter's config.json and model "
                                                         "card")


def distill_parser(sub) -> None:
    """`distill`: the self-distillation data."""
    d = sub.add_parser("distill", help="self-distillation data: the target answers a prompt file greedily, in "
                                       "resumable chunks")
    d.add_argument("--prompts", default=None, help="JSONL(.gz) of id, category, prompt (default: the shared prompt "
                   "set, ../shared/data/prompts/train_prompts.jsonl.gz)")
    d.add_argument("--out", default=None, help="folder of chunk-NNNNN.jsonl.gz files and manifest.json (default "
                   "assets/distill/prompts)")
    d.add_argument("--chunks", default=None, help="stop once the first N chunks of the file are done (default: all)")
    d.add_argument("--max-tokens", default=None, help="stop once finished chunks hold at least M answer tokens")
    d.add_argument("--batch-size", default=None, help="prompts per generate call (default: "
                   f"{', '.join(f'{b} in {d}' for d, b in DISTILL_BATCH.items())}, the fastest measured)")
    d.add_argument("--chunk-size", default=str(DISTILL_CHUNK), help="prompts per chunk file (default %(default)s)")
    d.add_argument("--max-new-tokens", default="256", help="answer length cap (default %(default)s)")
    d.add_argument("--target", default=DEFAULT_TARGET, help="model spec (default %(default)s)")
    d.add_argument("--dtype", default="auto", help="float32, bfloat16 or auto (default %(default)s: bfloat16 on a CPU "
                   "with native bf16 such as AMX, float32 elsewhere, the fastest batched generation measured on each)")
    d.add_argument("--threads", default="0", help="torch threads, 0 = torch's default (one per core); 1 runs best "
                   "beside other jobs on the same cores: start one such worker per core on the same --out, each "
                   "claims the next free chunk (default %(default)s)")
    d.add_argument("--attention", default="sdpa", help="sdpa or eager (batched generation needs a padding mask; "
                   "default %(default)s)")

def _layers_arg(value: str) -> tuple[int, ...]:
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise InputError(f"draft-layers={value!r} is not a list of layer indices: use e.g. 0,1,2,3")
    if len(parts) > 16:
        raise InputError(f"draft-layers={value!r} names {len(parts)} layers: use 1..16")
    return tuple(int(p) for p in parts)


def cmd_train(args) -> int:
    from specviz.train import loop as train

    if args.init is not None and not (Path(args.init) / "config.json").is_file():
        raise InputError(f"init={args.init!r} is not a drafter folder (no config.json): give one written by `train`, "
                         "e.g. assets/drafters/smollm2-135m-eagle")
    for f in args.data or []:
        if not Path(f).is_file() and not (Path(f) / "manifest.json").is_file():
            raise InputError(f"data file {f!r} does not exist: give a JSONL or text file of prompts, a JSONL(.gz) "
                             "of self-distillation ids, or a folder written by `distill`")
    try:
        lr = float(args.lr)
    except ValueError:
        raise InputError(f"lr={args.lr!r} is not a number: use e.g. 1e-3") from None
    if not 0 < lr < 1:
        raise InputError(f"lr={lr} is out of range: use a value in (0, 1)")
    opts = train.TrainOptions(
        kind=args.kind, out=Path(args.out), target=args.target, data=tuple(args.data) if args.data else None,
        steps=int_arg("steps", args.steps, 1, 10**6),
        batch_tokens=int_arg("batch-tokens", args.batch_tokens, 64, 10**6),
        lr=lr, draft_vocab=None if args.draft_vocab is None else int_arg("draft-vocab", args.draft_vocab, 0, 10**7),
        features=args.features, medusa_heads=int_arg("heads", args.heads, 1, 8),
        tree_size=int_arg("tree-size", args.tree_size, 1, 64),
        exit_layer=int_arg("exit-layer", args.exit_layer, 1, 256),
        block_size=int_arg("block-size", args.block_size, 2, 64), hidden_layers=int_arg("layers", args.layers, 1, 16),
        draft_layers=_layers_arg(args.draft_layers), resume=args.resume, init=Path(args.init) if args.init else None,
        seed=int_arg("seed", args.seed, 0, 2**31),
        epochs=None if args.epochs is None else int_arg("epochs", args.epochs, 1, 1000),
        precision=args.precision)
    try:
        train.train(opts)
    except answers.DistillError as exc:  # a --data file without prompts: before the target loads
        raise InputError(str(exc)) from None
    return 0


def cmd_tree(args) -> int:
    """A trained Medusa or EAGLE drafter's tree re-chosen from measurement (train/retree.py)."""
    from specviz.drafters.config import DrafterError
    from specviz.train.retree import retree

    held = int_arg("held-out", args.held_out, 1, 10**6)
    for f in args.data or []:
        if not Path(f).is_file() and not (Path(f) / "manifest.json").is_file():
            raise InputError(f"data file {f!r} does not exist: give a JSONL(.gz) of self-distillation ids or a "
                             "folder written by `distill`")
        if Path(f).is_file() and not answers.is_example_file(f):  # before the target loads
            raise InputError(f"data file {f!r} is not self-distillation ids: give a JSONL(.gz) of prompt_ids and "
                             "answer_ids (as `distill` and `train` write them) or a folder written by `distill` "
                             "(python -m specviz distill --prompts FILE answers a prompt file)")
    try:
        retree(Path(args.drafter), args.data, held, args.write, log=lambda line: print(line, flush=True),
                     profile=Path(args.profile) if args.profile else None)
    except (DrafterError, answers.DistillError) as exc:
        raise InputError(str(exc)) from None
    return 0


def cmd_distill(args) -> int:
    """Answer a prompt file with the target, greedily, in resumable chunks (specviz/train/distill.py)."""
    import time

    import torch

    from specviz.models import loader as models
    from specviz.train import distill

    chunks = None if args.chunks is None else int_arg("chunks", args.chunks, 1, 10**6)
    max_tokens = None if args.max_tokens is None else int_arg("max-tokens", args.max_tokens, 1, 10**10)
    chunk_size = int_arg("chunk-size", args.chunk_size, 1, 10**6)
    max_new = int_arg("max-new-tokens", args.max_new_tokens, 1, 2048)
    threads = int_arg("threads", args.threads, 0, 1024)
    if args.attention not in ("sdpa", "eager"):
        raise InputError(f"attention={args.attention!r} is not usable for batched generation: use sdpa or eager")
    device = torch.device("cpu")
    dtype = models.parse_dtype(distill.default_dtype() if args.dtype == "auto" else args.dtype, device)
    dtype_name = str(dtype).replace("torch.", "")
    batch = (DISTILL_BATCH.get(dtype_name, 32) if args.batch_size is None
             else int_arg("batch-size", args.batch_size, 1, 1024))
    if threads:
        torch.set_num_threads(threads)
    prompts = Path(args.prompts) if args.prompts else distill.SHARED_PROMPTS
    out = Path(args.out) if args.out else answers.PROMPTS_OUT
    try:
        distill.read_prompt_rows(prompts)  # a bad file fails before the model loads
        source = models.resolve(args.target)
        t0 = time.perf_counter()
        target = models.get(args.target, device, dtype, attention=args.attention)
        print(f"loaded {args.target} ({source.gguf_file or source.location}) in {dtype_name}, attention "
              f"{target.attention}, {target.matmul} matmuls, {torch.get_num_threads()} threads, in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        settings = {"target": args.target, "gguf_file": source.gguf_file, "dtype": dtype_name,
                    "attention": target.attention, "max_new_tokens": max_new, "greedy": True, "chunk_size": chunk_size,
                    "matmul": target.matmul, "threads": torch.get_num_threads(), "probe": distill.PROBE}
        distill.generate_chunks(target, prompts, out, settings, batch_size=batch, chunks=chunks, max_tokens=max_tokens,
                                log=lambda line: print(line, flush=True))
    except answers.DistillError as exc:
        raise InputError(str(exc)) from None
    return 0


def main(argv: list[str] | None = None) -> int:
    from specviz.models.loader import ModelError

    args = parser().parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        check_inputs(args)  # the device, paths and drafter configs, before any model loads
        default_pair(args)  # reads the bench --method entries: a malformed one is a one-line error too
        return {"generate": cmd_generate, "bench": cmd_bench, "check": cmd_check, "profile": cmd_profile,
                "train": cmd_train, "distill": cmd_distill, "tree": cmd_tree,
                **SERVING_COMMANDS}[args.command](args)
    except (ConfigError, ModelError, InputError) as exc:
        print(f"specviz: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specviz: interrupted", file=sys.stderr)
        return 130
