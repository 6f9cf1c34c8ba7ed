"""One registry of decoding methods: what each one is, what it takes, and where its code lives.

Every list of method names (the trained ones, the chain drafters, the checkable ones, ...) and every per-method
choice is derived from `METHODS` here, by `names(predicate)` or the tuples at the end, so adding a method means
one entry below plus its engine file and its tests. Torch-free: engines, drafter modules and training losses are
named by dotted paths ("package.module:attribute", the module that defines the attribute) and imported on first
use (`load`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

from specviz.errors import ConfigError


@dataclass(frozen=True)
class MethodSpec:
    name: str                        # DecodeConfig.method, the CLI's --method and the app's dropdown value
    label: str                       # how prose names it: "prompt lookup", "EAGLE", ...
    description: str                 # one line: what drafts, and from what
    family: str                      # "baseline" | "draft model" | "lookup" | "trained"
    drafts: str                      # what it drafts in the race: "none" (AR) | "chain" | "tree"
    engine: str                      # "module:function" (target, source, chain, name) -> Engine, where source is the
                                     # draft (a model spec or LoadedModel) or, for a trained method, its loaded Drafter
    trained: bool = False            # a drafter trained against the target: `python -m specviz train NAME`, --drafter
    uses_draft_model: bool = False   # drafts with a separate draft model: --draft MODEL
    grafts: tuple[str, ...] = ()     # DecodeConfig branches its tree verifies too: "lookup" (prompt lookup), "retrieve"
    chain: bool = False              # can draft a chain: the step-through tab takes it
    # `python -m specviz check --method NAME` takes it (a chain drafter over the chain loop)
    checkable: bool = False
    gamma: str = ""                  # what γ means for it ("" = does not apply: AR)
    drafter: str = ""                # "module:Class" of its chain drafter (check, step-through): Class() for prompt
                                     # lookup, Class(draft model), or Class(Drafter, name) for a trained one
    # trained methods only (the drafter kind, DrafterConfig.kind, is the method's name)
    module: str = ""                 # "module:Class" of its nn.Module, built from a DrafterConfig (EAGLE: EAGLE-1's
                                     # layout; drafters.module_class picks EAGLE-3's for one that fuses feature layers)
    loss: str = ""                   # "module:function" its training loss (train/loop.py)
    layout: tuple[str, ...] = ()     # the DrafterConfig fields its training options set ("exit_layer", ...)
    small: bool = False              # a few rows through small matmuls a call (a one-layer drafter, DFlash's block):
                                     # bf16 on specviz's packed kernels beside a bf16 CPU target
    tree_from: str = ""              # how its tree is chosen: "heads" (rank accuracy per head, drafting cost once a
                                     # step) | "depths" (per draft depth, cost per level) | "" (no tree)
    exporter: str = ""               # "module:attribute" of its export for serving engines (serving.export_common.
                                     # DrafterExport: `python -m specviz export NAME`, `serve --drafter NAME`); "" none
    drafts_block: bool = False       # one forward drafts its whole trained block: an engine serving it drafts
                                     # block_size - 1 tokens a step, the block it was trained on (vLLM, llama.cpp)
    answers_only: bool = False       # its training scores the answers only (a templated prompt is never drafted)
    tuned: bool = False              # the race grid times its defaults (γ, lookup, retrieve): tuning.py, hardware.adopt

    @property
    def tree(self) -> bool:
        """It drafts a tree in the race (Medusa; EAGLE when its drafter names one, as the shipped one does)."""
        return self.drafts == "tree"

    @property
    def speculative(self) -> bool:
        """Not the plain AR baseline: it drafts, and the race, bench and app compare it with AR."""
        return self.drafts != "none"

    @property
    def gamma_applies(self) -> bool:
        return bool(self.gamma)

    @property
    def has_weights(self) -> bool:
        """It drafts with weights it loads (a draft model or a trained drafter), which --draft / --drafter / @ name."""
        return self.trained or self.uses_draft_model

    @property
    def kind(self) -> str:
        """Its drafters' DrafterConfig.kind ("" when it has none)."""
        return self.name if self.trained else ""


_TREE_GAMMA = "caps the depth of its tree (of the chain it drafts in the step-through)"
_CHAIN_GAMMA = "drafted tokens per step"

METHODS: dict[str, MethodSpec] = {s.name: s for s in (
    MethodSpec("ar", "plain autoregressive", "one target forward per token, no drafting: the baseline",
               "baseline", "none", "specviz.engines.ar:build"),
    MethodSpec("vanilla", "draft model", "a small draft model sharing the target's tokenizer (default: an int8 copy)",
               "draft model", "chain", "specviz.engines.draft_model:build_vanilla", uses_draft_model=True,
               chain=True, checkable=True, gamma=_CHAIN_GAMMA, drafter="specviz.engines.draft_model:ModelDrafter"),
    MethodSpec("pld", "prompt lookup", "continues the last n-gram from where it appeared earlier in the context",
               "lookup", "chain", "specviz.engines.pld:build", chain=True, checkable=True, gamma=_CHAIN_GAMMA,
               drafter="specviz.engines.pld:PromptLookupDrafter", tuned=True),
    MethodSpec("eagle", "EAGLE", "one trained decoder layer over the target's features, drafting a tree",
               "trained", "tree", "specviz.engines.eagle:build", trained=True, grafts=("lookup", "retrieve"),
               chain=True, checkable=True, gamma=_TREE_GAMMA, drafter="specviz.engines.eagle:EagleDrafter",
               module="specviz.drafters.modules:Eagle", loss="specviz.train.losses:eagle_loss",
               layout=("feature_layers",), small=True, tree_from="depths",
               exporter="specviz.serving.export_eagle:EXPORT", tuned=True),
    MethodSpec("medusa", "Medusa", "trained heads on the target's last hidden state, proposing a candidate tree",
               "trained", "tree", "specviz.engines.medusa:build", trained=True, grafts=("lookup", "retrieve"),
               chain=True, checkable=True, gamma=_TREE_GAMMA, drafter="specviz.engines.medusa:MedusaChainDrafter",
               module="specviz.drafters.modules:Medusa", loss="specviz.train.losses:medusa_loss",
               layout=("medusa_heads",), small=True, tree_from="heads",
               exporter="specviz.serving.export_medusa:EXPORT"),
    MethodSpec("layerskip", "LayerSkip", "the target's own first layers and a trained exit adapter",
               "trained", "chain", "specviz.engines.layerskip:build", trained=True, chain=True, gamma=_CHAIN_GAMMA,
               checkable=True, drafter="specviz.engines.layerskip_chain:LayerSkipChainDrafter",
               module="specviz.drafters.modules:ExitAdapter", loss="specviz.train.losses:layerskip_loss",
               layout=("exit_layer",), small=True),
    MethodSpec("draft", "distilled draft model",
               "a few decoder layers of its own, distilled from the target, sharing its embeddings and LM head",
               "trained", "chain", "specviz.engines.draft_model:build_distilled", trained=True, chain=True,
               checkable=True, gamma=_CHAIN_GAMMA, drafter="specviz.engines.draft_model:DistilledDrafter",
               module="specviz.drafters.modules:DraftLM", loss="specviz.train.losses:draft_loss",
               layout=("draft_layers",), exporter="specviz.serving.export_draft:EXPORT"),
    MethodSpec("dflash", "DFlash",
               "a few trained decoder layers over the target's hidden states, drafting a whole block in one forward",
               "trained", "tree", "specviz.engines.dflash:build", trained=True, grafts=("lookup", "retrieve"),
               chain=True, checkable=True, gamma="caps the depth of its block's tree (at most its block size - 1)",
               drafter="specviz.engines.dflash:DFlashDrafter", module="specviz.drafters.dflash:DFlash",
               loss="specviz.train.dflash:dflash_loss", answers_only=True, drafts_block=True, small=True,
               layout=("feature_layers", "block_size", "num_hidden_layers", "mask_token_id"),
               exporter="specviz.serving.export_dflash:EXPORT"),
)}


def names(predicate: Optional[Callable[[MethodSpec], bool]] = None) -> tuple[str, ...]:
    """The names of the methods `predicate` holds for (all without one), in registry order."""
    return tuple(n for n, s in METHODS.items() if predicate is None or predicate(s))


def drafts_block(name: str) -> bool:
    """Whether `name`'s drafter drafts every depth of its trained block in one forward (MethodSpec.drafts_block;
    an unknown name: no)."""
    return name in METHODS and METHODS[name].drafts_block


def spec(name: str) -> MethodSpec:
    """The registry entry of `name`; a one-line ConfigError naming the value and what is accepted otherwise."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"method={name!r} is unknown: use one of {', '.join(METHODS)}") from None


@lru_cache(maxsize=None)
def load(path: str):
    """The object a dotted path "package.module:attribute" names, imported on first use."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


SPECULATIVE = names(lambda s: s.speculative)  # every method but the AR baseline (the race's, bench's and app's choices)
TRAINED_METHODS = names(lambda s: s.trained)  # drafters trained against the target (python -m specviz train KIND)
CHAIN_METHODS = names(lambda s: s.chain)      # draft a chain (Medusa: one draw per head): the step-through's choices
CHECK_METHODS = names(lambda s: s.checkable)  # python -m specviz check --method: chain drafters over the chain loop
