"""Medusa: Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads"
(ICML 2024).

K heads (drafters.modules.Medusa) read the target's feature at the last committed token, its final-norm hidden
state, and head k guesses the token k + 1 positions ahead, all at once: one drafter call per step, however deep the
tree. The candidate tree combines their top-ranked tokens: a node at depth k is a rank of head k's guess, its path
the ranks along the way (the "choices" format, chosen from the heads' measured rank accuracies by
drafters.trained.choose_tree; DecodeConfig.tree "dynamic" instead keeps the paths whose product of head
probabilities is highest). The tree loop (tree.py) verifies it and defines the verdicts; the next step reads the
target's feature of the last token it kept. As a chain (the step-through view, the drafter check), head k's draw is
draft k, verified by the chain loop (speculative.py).

Terms: γ caps the tree's depth (the number of heads used); τ is tokens committed per target forward. Medusa's
"typical acceptance" is not used: every candidate is verified exactly, so the output is the target's.
"""
from __future__ import annotations

import torch

from specviz.config import DecodeConfig
from specviz.core.sampling import warp
from specviz.core.trees import Tree
from specviz.drafters.trained import Drafter, choose_tree, path_value
from specviz.engines.features import FeatureHistory
from specviz.engines.speculative import Proposal, SpeculativeEngine, stop_drafting
from specviz.engines.tree import TreeEngine, TreeProposal
from specviz.models.loader import LoadedModel

# A default tree for 2 CPU cores, where verifying 16 tokens costs about two AR steps: the top-1 chain plus the
# runners-up that pay most often. Trained drafters store their own tree, chosen from measured accuracies.
MEDUSA_CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
                  (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0)]


class MedusaState:
    """A tree run's drafter state (a features.FeatureReader): the target's feature of the last token it kept."""
    features = True  # the final-norm hidden state

    def __init__(self):
        self.feature: torch.Tensor | None = None

    def observe(self, hidden: torch.Tensor) -> None:
        self.feature = hidden[-1]

    def rollback(self, n_valid: int) -> None:
        pass  # only the last feature is kept


class MedusaProposer:
    """Medusa's tree (tree.TreeProposer): every head once on the last feature, then the tree's nodes read off their
    ranked guesses."""

    def __init__(self, drafter: Drafter):
        self.d = drafter

    def start(self, vocab_size: int, eos_ids: frozenset[int]) -> MedusaState:
        return MedusaState()

    @torch.inference_mode()
    def propose(self, state: MedusaState, tokens: list[int], tree: Tree, cfg: DecodeConfig, room: int,
                generator: torch.Generator) -> TreeProposal | None:
        if state.feature is None:
            return None
        feats = self.d.module(self.d.inputs(state.feature[None]))[:, 0]  # (K, d)
        # (K, N)
        q_heads = torch.stack([warp(self.d.logits(f, head=k).float().cpu(), cfg) for k, f in enumerate(feats)])
        # the top-ranked tree, greedy or sampling (chosen nodes: point masses to verify_tree)
        if cfg.tree == "dynamic":  # the heads are independent: the paths of highest product of their probabilities
            depth = min(cfg.tree_depth, room, len(q_heads))
            ranked = torch.argsort(q_heads[:depth], dim=-1, descending=True)[:, :cfg.tree_topk]  # (depth, k)
            top = torch.gather(q_heads[:depth], 1, ranked)  # (depth, k) their probabilities
            tree = Tree.from_choices([p for p in choose_tree(top, cfg.tree_nodes) if path_value(top, p) > 0])
        else:
            tree = Tree.from_choices([p for p in tree.paths if len(p) <= room])
            ranked = torch.argsort(q_heads, dim=-1, descending=True)[:, :1 + max(tree.ranks)]  # (K, r)
        small = [int(ranked[tree.depths[i] - 1, tree.ranks[i]]) for i in range(tree.size)]
        q_nodes = [float(q_heads[tree.depths[i] - 1, s]) for i, s in enumerate(small)]
        ids = [int(t) for t in self.d.to_target_ids(torch.tensor(small)).tolist()]
        return TreeProposal(tree, ids, q_nodes, None, 1)


class MedusaChainDrafter:
    """Medusa as a chain drafter (the step-through view, the drafter check): draft k is head k's draw from
    the feature of the last committed token's position, verified as a chain like any drafter."""

    def __init__(self, drafter: Drafter, name: str):
        self.drafter, self.name = drafter, name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "MedusaChainSession":
        return MedusaChainSession(self.drafter, vocab_size, eos_ids)


class MedusaChainSession(FeatureHistory):
    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        if len(self.feats) < len(tokens) - 1 or not len(self.feats) or gamma <= 0:
            return Proposal.empty(self.vocab_size)  # the first step is the target's prefill
        feats = self.d.module(self.d.inputs(self.feats[len(tokens) - 2][None]))[:, 0]  # (K, d)
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        for k in range(min(gamma, len(feats))):
            token, q, confidence = self.d.draw(self.d.logits(feats[k], head=k), cfg, generator)
            drafted.append(token)
            qs.append(q)
            if stop_drafting(token, confidence, self.eos_ids, cfg):
                break
        return Proposal(drafted, torch.stack(qs), 1)


def medusa_engine(target: LoadedModel, drafter: Drafter, choices=None) -> TreeEngine:
    """Medusa's tree engine: `choices`, else the drafter's stored tree, else MEDUSA_CHOICES, cut to its heads."""
    choices = [p for p in (choices or drafter.cfg.tree or MEDUSA_CHOICES) if len(p) <= drafter.cfg.medusa_heads]
    return TreeEngine("medusa", target, MedusaProposer(drafter), choices)


def build(target: LoadedModel, drafter: Drafter, chain: bool = False, name: str = ""):
    """Medusa's engine (methods.MethodSpec.engine): its tree, or with chain=True (the step-through) one draw per head
    verified as a chain."""
    if chain:
        return SpeculativeEngine("medusa", target, MedusaChainDrafter(drafter, name))
    return medusa_engine(target, drafter)
