"""What the commands share: the decode options, the default pair, loading the target, and a bench entry's grammar."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

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
    p.add_argument("--drafter", default=None, help=f"{', '.join(TRAINED_METHODS)}: a folder written by `train` or a "
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
    p.add_argument("--tree", default=None, help="eagle, medusa: static = the drafter's stored tree; dynamic "
                   "= a tree grown each step from the drafter's confidence (EAGLE-2) (default: the shape of the "
                   f"method's race chosen on this machine, else {DEFAULTS.tree})")
    p.add_argument("--tree-nodes", default=None, help="--tree dynamic: nodes verified, those of highest "
                   f"path probability, 1..{TREE_NODES_MAX} (default: the race chosen on this machine's, else "
                   f"{DEFAULTS.tree_nodes})")
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
    A left-out --gamma, --lookup, --retrieve, --tree or --tree-nodes is the method's on this machine's default pair
    (hardware.Pair: the race chosen from this machine's own T(k) once `tune` has measured it)."""
    from specviz import hardware

    pair = hardware.default_pair(args.device or None)
    pick = lambda given, default: default if given is None else given  # noqa: E731
    shape, nodes = pair.tree_for(method)
    branches = {"lookup": pick(args.lookup, pair.lookup_for(method)), "retrieve": pick(args.retrieve,
                pair.retrieve_for(method)), "tree": pick(args.tree, shape), "tree_nodes": pick(args.tree_nodes, nodes),
                "tree_depth": args.tree_depth, "tree_topk": args.tree_topk, **(grafts or {})}
    return DecodeConfig(method=method, gamma=pick(args.gamma, pair.gamma_for(method)), temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
                        **branches)


TUNED = registry.names(lambda s: s.tuned)  # the methods whose defaults the race grid times


def tune(args, target, methods) -> None:
    """Where a method's defaults matter (a left-out --gamma, --lookup or --retrieve for EAGLE or prompt lookup, or
    bench's `default`), measure this machine once and take the race chosen from its T(k) (hardware.adopt), saying
    which and why on stderr."""
    from specviz import hardware

    if not (DEFAULT_RACE in methods or (any(m in TUNED for m in methods)
                                        and None in (args.gamma, args.lookup, args.retrieve))):
        return
    try:  # a sampled run races (and prices) the race chosen for sampling; a bad value fails in DecodeConfig
        temperature, new_tokens = float(args.temperature or 0), int(args.max_new_tokens)
    except (TypeError, ValueError):
        temperature, new_tokens = 0.0, DEFAULTS.max_new_tokens
    line = hardware.adopt(target, temperature=temperature, new_tokens=new_tokens,
                          prompt_tokens=getattr(args, "prompt_tokens", 0))
    args.tuned_line = line  # bench's JSON keeps the line as printed: this run's length and prompt priced
    if line:
        print(f"specviz: {line}", file=sys.stderr)


def load_target(args):
    from specviz.models import loader as models

    device = models.parse_device(args.device)
    return models.get(args.target, device, models.parse_dtype(args.dtype, device))


OUTPUTS = {  # each command's output path flags (the argparse attribute) and whether each names a file or a folder
    "generate": (("metrics_file", "file"),),
    "bench": (("json", "file"), ("metrics_file", "file")),
    "check": (("json", "file"), ("report", "file")),
    "profile": (("json", "file"),),
    "train": (("out", "folder"),),
    "distill": (("out", "folder"),),
    "export": (("out", "folder"),),
    "watch": (("json", "file"),),
    "probe": (("json", "file"), ("html", "file")),
    "serve": (("log", "file"),),
}


def check_outputs(args) -> None:
    """Every output path the command was given (OUTPUTS), checked before any long work (writable_path)."""
    for attr, kind in OUTPUTS.get(args.command, ()):
        value = getattr(args, attr, None)
        if value:
            writable_path(attr.replace("_", "-"), value, folder=kind == "folder")


def writable_path(name: str, value, folder: bool = False) -> Path:
    """`value`, an output file (or with folder=True, a folder) that the command will write at its end: not a folder
    (a file), under the nearest existing folder on its path, where a file can be created (tried, and removed: as root
    os.access says yes even to /proc). Creates and changes nothing; InputError, one line naming it, otherwise."""
    path = Path(value).expanduser()
    hint = "give a path in a writable folder"
    try:
        if folder and path.exists() and not path.is_dir():
            raise InputError(f"{name}={str(value)!r} is a file, not a folder: give a new or existing folder")
        if not folder and path.is_dir():
            raise InputError(f"{name}={str(value)!r} is a folder: give the path of a file to write")
        parent = path if folder and path.is_dir() else path.parent
        while not parent.exists() and parent != parent.parent:  # what the command's mkdir(parents=True) would make
            parent = parent.parent
        if not parent.is_dir():
            raise InputError(f"{name}={str(value)!r} cannot be written: {str(parent)!r} is a file, not a folder: "
                             f"{hint}")
        fd, probe = tempfile.mkstemp(prefix=".specviz-write-check-", dir=parent)
        os.close(fd)
        os.unlink(probe)
        if path.is_file():
            with open(path, "a"):  # appends nothing: the file is left as it is
                pass
    except OSError as exc:
        raise InputError(f"{name}={str(value)!r} cannot be written ({exc.strerror or type(exc).__name__}): "
                         f"{hint}") from None
    return path


def check_inputs(args) -> None:
    """What a command names on disk or by value, checked before any model loads (the target takes ~30 s): its
    output paths, the device, the target spec, and each race's --draft / --drafter (a trained drafter's config.json
    is read and validated here too). One line (InputError / ModelError / ConfigError) naming the value otherwise."""
    check_outputs(args)
    if getattr(args, "device", None):
        from specviz.models import loader as models

        models.parse_device(args.device)
    if args.command not in ("generate", "bench", "check", "profile"):
        return
    from specviz.models import loader as models

    if isinstance(getattr(args, "target", None), str):
        models.resolve(args.target)
    for method, draft in races_of(args):
        check_draft(method, draft)


def races_of(args) -> list[tuple[str, str | None]]:
    """(method, what it drafts with) for each race the command runs (bench: its entries' @drafter or --drafter)."""
    if args.command == "profile":
        return [("vanilla", args.draft)]
    if isinstance(args.method, list):  # bench's entries: name[:gamma][+...][@drafter]
        out = []
        for entry in args.method:
            if entry == DEFAULT_RACE:  # the shipped drafters of this machine's race
                continue
            method, _, _, at, what = method_spec(entry)
            if method in METHODS:
                out.append((method, what if at else draft_for(args, method)))
        return out
    method = args.method or "vanilla"
    draft = args.draft if args.command == "check" else draft_for(args, method)
    return [(method, draft)] if method in METHODS else []


def check_draft(method: str, draft: str | None) -> None:
    """A race's draft model spec (`int8` or one models.resolve takes) or trained drafter folder, checked without
    loading it: a folder's config.json must parse, hold valid settings and name the method's kind
    (drafters.config)."""
    from specviz.config import DEFAULT_DRAFT
    from specviz.drafters.config import DrafterConfig, check_kind, not_a_drafter_folder, read_config
    from specviz.models import loader as models

    spec = registry.spec(method)
    if not draft or draft == DEFAULT_DRAFT or not spec.has_weights:
        return
    if spec.uses_draft_model:
        models.resolve(draft)
        return
    path = Path(draft).expanduser()
    if path.is_dir():
        raw = read_config(path)
        if "kind" in raw:
            DrafterConfig.from_dict(raw, f"drafter {draft!r}")
            check_kind(raw["kind"], method, draft)
    elif path.exists() or draft.startswith((".", "/", "~")) or draft.count("/") != 1:  # not a Hub id ORG/NAME
        raise ConfigError(not_a_drafter_folder(path, method))


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
