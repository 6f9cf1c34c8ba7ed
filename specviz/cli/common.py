"""What the commands share: the decode options, the default pair, loading the target, and a bench entry's grammar."""
from __future__ import annotations

import argparse
import sys

from specviz import methods as registry
from specviz.config import DEFAULT_TARGET, GAMMA_MAX, TREE_NODES_MAX, TREE_TOPK_MAX, DecodeConfig
from specviz.errors import ConfigError
from specviz.hardware import DEFAULT_RACE, GPU_DRAFT, GPU_TARGET, method_spec
from specviz.methods import METHODS, TRAINED_METHODS

DEFAULTS = DecodeConfig()


class InputError(ValueError):
    """Bad CLI input other than a decode setting (a missing or malformed prompt file)."""


PAIR_HELP = f"{DEFAULT_TARGET} on CPU; on a GPU {GPU_TARGET} with the draft {GPU_DRAFT}"


def default_pair(args) -> None:
    """Left-out --target/--draft: this device's default pair (specviz/hardware.py; trained drafters keep their
    target)."""
    if args.command not in ("generate", "bench", "check", "profile"):
        return
    from specviz import hardware

    methods = [method_spec(m)[0] for m in args.method] if isinstance(args.method, list) else [args.method or "vanilla"]
    pair = hardware.GPU_PAIR  # for an explicit target: only the GPU pair's target comes with a draft of its own
    if args.target is None:
        pair = hardware.default_pair(args.device or None)
        if pair.note:
            print(f"specviz: {pair.note}", file=sys.stderr)
        args.target = pair.target_for_all(methods)
    if args.draft is None and (args.command != "check" or all(registry.spec(m).uses_draft_model for m in methods)):
        args.draft = pair.draft_for(args.target)


def decode_args(p: argparse.ArgumentParser, methods=METHODS) -> None:
    p.add_argument("--target", default=None, help="model spec: smollm2-135m, ORG/NAME, folder or .gguf (default "
                                                  f"{PAIR_HELP})")
    p.add_argument("--draft", default=None, help="draft for vanilla: int8 or a model spec sharing the target's "
                                                 "tokenizer (default: int8, or the GPU pair's draft)")
    p.add_argument("--drafter", default=None, help="eagle, medusa, layerskip, draft: a folder written by `train` or a "
                                                   "Hub id (default: the drafter shipped for the target)")
    p.add_argument("--gamma", default=None, help=f"drafted tokens per step, 1..{GAMMA_MAX} or auto (default: the "
                                                 "method's fastest on this machine, as the app chooses it)")
    p.add_argument("--temperature", default=DEFAULTS.temperature, help="0 = greedy (default %(default)s)")
    p.add_argument("--top-k", default=DEFAULTS.top_k, help="0 = off (default %(default)s)")
    p.add_argument("--top-p", default=DEFAULTS.top_p, help="nucleus mass in (0, 1] (default %(default)s)")
    p.add_argument("--max-new-tokens", default=DEFAULTS.max_new_tokens, help="(default %(default)s)")
    p.add_argument("--seed", default=DEFAULTS.seed, help="(default %(default)s)")
    p.add_argument("--lookup", default=None, help="eagle, medusa: also verify prompt lookup's "
                   "continuation of up to this many tokens as one more branch of the tree; 0 = off (default: the "
                   "length fastest on this machine)")
    p.add_argument("--retrieve", default=None, help="eagle, medusa, the embedded target or a "
                   "drafter trained on your own data: likewise up to this many nodes of what most often followed the "
                   "context in the target's own answers (the datastore), a chain or a small tree; 0 = off "
                   "(default: the size fastest on this machine)")
    p.add_argument("--tree", default=DEFAULTS.tree, help="eagle, medusa: static = the drafter's stored tree; dynamic "
                   "= a tree grown each step from the drafter's confidence (EAGLE-2) (default %(default)s)")
    p.add_argument("--tree-nodes", default=DEFAULTS.tree_nodes, help="--tree dynamic: nodes verified, those of highest "
                   f"path probability, 1..{TREE_NODES_MAX} (default %(default)s)")
    p.add_argument("--tree-depth", default=DEFAULTS.tree_depth, help=f"--tree dynamic: levels grown, 1..{GAMMA_MAX}; "
                   "--gamma caps it too (default %(default)s)")
    p.add_argument("--tree-topk", default=DEFAULTS.tree_topk, help="--tree dynamic: nodes expanded per level and "
                   f"children proposed by each, 1..{TREE_TOPK_MAX} (default %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on GPU and on CPUs with a bf16 vector path, else fp32), "
                                                   "float32, bfloat16, float16")


def config_of(args, method: str, grafts: dict | None = None) -> DecodeConfig:
    """The decode settings of the command line; `grafts` ({"lookup": n} and/or {"retrieve": n}, a bench entry's own
    branches, and {"tree": "dynamic"} with {"tree_nodes": n}) overrides --lookup, --retrieve and --tree(-nodes).
    A left-out --gamma, --lookup or --retrieve is the method's on this machine's default pair (hardware.Pair: the
    race chosen from this machine's own T(k) once `tune` has measured it)."""
    from specviz import hardware

    pair = hardware.default_pair(args.device or None)
    pick = lambda given, default: default if given is None else given  # noqa: E731
    branches = {"lookup": pick(args.lookup, pair.lookup_for(method)), "retrieve": pick(args.retrieve,
                pair.retrieve_for(method)), "tree": args.tree, "tree_nodes": args.tree_nodes,
                "tree_depth": args.tree_depth, "tree_topk": args.tree_topk, **(grafts or {})}
    return DecodeConfig(method=method, gamma=pick(args.gamma, pair.gamma_for(method)), temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
                        **branches)


TUNED = registry.names(lambda s: s.name in ("eagle", "pld"))  # the methods whose defaults the race grid times


def tune(args, target, methods) -> None:
    """Where a method's defaults matter (a left-out --gamma, --lookup or --retrieve for EAGLE or prompt lookup, or
    bench's `default`), measure this machine once and take the race chosen from its T(k) (hardware.adopt), saying
    which and why on stderr."""
    from specviz import hardware

    if not (DEFAULT_RACE in methods or (any(m in TUNED for m in methods)
                                        and None in (args.gamma, args.lookup, args.retrieve))):
        return
    line = hardware.adopt(target)
    if line:
        print(f"specviz: {line}", file=sys.stderr)


def load_target(args):
    import torch

    from specviz.models import loader as models

    device = torch.device(args.device) if args.device else models.default_device()
    if device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
        raise ConfigError(f"device={args.device!r} is not available: use cpu"
                          + (" or cuda" if torch.cuda.is_available() else ""))
    return models.get(args.target, device, models.parse_dtype(args.dtype, device))


def draft_for(args, method: str) -> str | None:
    """What a method drafts with: --drafter for the trained drafters, --draft for vanilla."""
    return args.drafter if method in TRAINED_METHODS else args.draft




def _ranged(name: str, value, low, high, kind=int):
    """value as `kind` (int or float) within low..high, else one line naming it (InputError)."""
    try:
        number = kind(value)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise InputError(f"{name}={value!r} is not {what}: use {low:g}..{high:g}") from None
    if not low <= number <= high:
        raise InputError(f"{name}={number:g} is out of range: use {low:g}..{high:g}")
    return number


def int_arg(name: str, value, low: int, high: int) -> int:
    return _ranged(name, value, low, high, int)


def float_arg(name: str, value, low: float, high: float) -> float:
    return _ranged(name, value, low, high, float)
