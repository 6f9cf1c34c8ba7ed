"""DFlash: Chen, Liang, Liu 2026, "DFlash: Block Diffusion for Flash Speculative Decoding" (arXiv 2602.06036).

A trained drafter (drafters/dflash.py) drafts a whole block in ONE forward: the last committed token (the target's
own: resampled, bonus or the prefill's) at the block's first slot, mask tokens after it, reading the target's hidden
states at every committed position before it as keys and values (its context). Its output at slot i is read
through the target's (compressed) LM head as q_i, the drafter's distribution of the i-th token after the committed
one; the i-th draft is drawn from q_i (greedy: its argmax). q_i does not depend on the earlier drafts, which the
chain verification allows: each draft is still judged by min(1, p_i / q_i) against the distribution it was drawn
from, so the output is the target's, token for token when greedy (core.sampling.verify_chain, in the chain loop
of speculative.py, which defines the verdicts and the events: the step-through's and the drafter check's loop).

The context's keys and values are cached per drafter layer and only ever hold true target states (a verified step
appends those of the positions it kept), so each step projects just the new rows, then runs the block's rows.

In the race (build) the block is verified by the tree loop (tree.py, which defines those verdicts too): as a chain,
the drafter's stored tree, or (DecodeConfig.tree "dynamic", where the machine's T(k) says rows are cheap) the
cfg.tree_nodes nodes of highest path probability over each slot's top cfg.tree_topk, γ slots deep (`top_tree`; a
deeper block costs no drafter forward, so cfg.tree_depth, EAGLE's levels of forwards, does not apply), with prompt
lookup's and the datastore's branches grafted on (cfg.lookup, cfg.retrieve). As the block's q_i do not depend on
the drafts before slot i, a node of rank r at depth i carries q_i's r-th candidate whatever its parent
(`block_nodes`): rank 0 the slot's own draft x_i (drawn from q_i, sampling: the chain's token), the ranks after it
q_i's most probable tokens other than x_i, point masses. Sampling, each node's children are judged in rank order
(core.sampling.verify_tree): x_i against q_i, then the point masses against the residual, which is exact for any
point masses chosen after x_i is known; the tree's shape is chosen from q's sorted probabilities only, never from
the draws, so the walk reaching a node tells nothing of the x_i judged there.

Terms: γ caps the drafts a step (at most block_size - 1: the slots after the first; the tree's depth); τ is tokens
committed per target forward; a node's path probability is the product of q_i's probabilities of the ranks on its
path.
"""
from __future__ import annotations

import torch

from specviz.config import DecodeConfig
from specviz.core.sampling import pick, warp
from specviz.core.trees import Tree, best_nodes, subtree
from specviz.drafters.trained import Drafter
from specviz.engines.features import FeatureHistory
from specviz.engines.speculative import Proposal, SpeculativeEngine, stop_drafting
from specviz.engines.tree import TreeEngine, TreeProposal
from specviz.models.loader import LoadedModel


class DFlashDrafter:
    """DFlash as a chain drafter (speculative.Drafter)."""

    def __init__(self, drafter: Drafter, name: str = ""):
        self.drafter, self.name = drafter, name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "DFlashSession":
        return DFlashSession(self.drafter, vocab_size, eos_ids)


class DFlashSession(FeatureHistory):
    """One run's state: the target's hidden states of the committed positions (FeatureHistory) and every drafter
    layer's context (keys, values) over the first kv_len of them: the torch module's, or where the drafter has its C
    step (models.fused.FusedDFlash: its bf16 module on the packed matmul, a packed head, the target's bf16
    embeddings) the first kv_len slots of `buffer`, whose next ones each block writes over."""

    def __init__(self, drafter: Drafter, vocab_size: int, eos_ids: frozenset[int]):
        super().__init__(drafter, vocab_size, eos_ids)
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.kv_len = 0
        self.fused = drafter.fused if drafter.c_table is not None else None
        self.buffer = self.fused.new_cache() if self.fused is not None else None

    def rollback(self, n_valid: int) -> None:
        super().rollback(n_valid)
        if self.kv_len > n_valid:
            if self.kv is not None:
                self.kv = [(k[:, :, :n_valid], v[:, :, :n_valid]) for k, v in self.kv]
            self.kv_len = n_valid

    def context(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Every layer's context over positions 0..n-1 (n: the positions with target states), projecting the rows
        not yet cached (in the C step's buffer: None)."""
        m, device = self._n, self.d.head_weight.device
        if self.fused is not None:
            if m > self.kv_len:
                self.fused.context(self.buffer, self._rows[self.kv_len:m], self.kv_len)
                self.kv_len = m
            return None
        if m > self.kv_len:
            new = self.d.module.context_kv(self.d.inputs(self._rows[self.kv_len:m][None]),
                                           torch.arange(self.kv_len, m, device=device))
            self.kv = new if self.kv is None else [(torch.cat([k, nk], 2), torch.cat([v, nv], 2))
                                                   for (k, v), (nk, nv) in zip(self.kv, new)]
            self.kv_len = m
        return self.kv

    @torch.inference_mode()
    def block_logits(self, tokens: list[int]) -> torch.Tensor | None:
        """The drafter's one forward over the block after `tokens`: draft logits (block_size - 1, N) for the
        tokens after the last committed one. None before the target's first forward (no states yet)."""
        m = self._n
        if m == 0 or m != len(tokens) - 1:  # the block starts at the last committed token, whose state is not in
            return None
        cfg, device = self.d.cfg, self.d.head_weight.device
        if self.fused is not None:
            self.context()
            return self.fused.block(self.buffer, self.d.c_table,
                                    [tokens[-1]] + [cfg.mask_token_id] * (cfg.block_size - 1), m, self.d.head_packed,
                                    self.d.head_weight.shape[0])
        ids = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.long, device=device)
        ids[0] = tokens[-1]
        out = self.d.module(self.d.embed(ids)[None], torch.arange(m, m + cfg.block_size, device=device),
                            self.context())
        return self.d.logits(out[0, 1:]).float().cpu()

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        logits = self.block_logits(tokens) if gamma > 0 else None
        if logits is None:  # the first step is the target's prefill
            return Proposal.empty(self.vocab_size)
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        for row in logits[:gamma]:  # each slot's draft from its own distribution: one forward drafted them all
            token, q, confidence = self.d.draw(row, cfg, generator)
            drafted.append(token)
            qs.append(q)
            if stop_drafting(token, confidence, self.eos_ids, cfg):
                break
        return Proposal(drafted, torch.stack(qs), 1)


def top_tree(values: list[list[float]], k: int, n: int) -> Tree | None:
    """The n nodes of highest path probability when each position's candidates are its top k: values[i][r] is the
    r-th largest probability of the block's slot i + 1 (depth i + 1). A node's path probability is the product
    along its path; the positions are independent, so a level's best n nodes are children of the level above's
    best n (any other has n better nodes beside it), and keeping those at each level keeps the exact top n
    (trees.best_nodes). None when no node has a probability above 0."""
    parents: list[int] = []
    ranks: list[int] = []
    score: list[float] = []
    frontier = [-1]
    for row in values:
        start = len(parents)
        for parent in frontier:
            base = score[parent] if parent >= 0 else 1.0
            for rank, value in enumerate(row[:k]):
                parents.append(parent)
                ranks.append(rank)
                score.append(base * min(value, 1.0))  # a renormalised probability may round past 1
        frontier = sorted((i for i in range(start, len(parents)) if score[i] > 0), key=lambda i: -score[i])[:n]
    keep = best_nodes(parents, score, n)
    return subtree(parents, ranks, keep)[0] if keep else None


def block_nodes(tree: Tree, probs: torch.Tensor, greedy: bool, generator: torch.Generator
                ) -> tuple[list[int], list[float], tuple[torch.Tensor | None, ...] | None]:
    """Each node's draft-vocabulary token, its probability under its slot's q, and (sampling; None when greedy) the
    distribution it was drawn from (its slot's q, for rank 0: the slot's own draft) or None (chosen: a point mass),
    given the block's warped distributions probs (slots, N):
    rank 0 at depth i is x_i, q_i's draw (greedy: its argmax), drawn once per slot whatever the node's parent; rank
    r > 0 is the r-th most probable token of q_i other than x_i. Every rank must be below N."""
    depth = max(tree.depths)
    width = min(1 + max(tree.ranks) + 1, probs.shape[-1])
    top = torch.topk(probs[:depth], width).indices.tolist()  # (depth, width)
    order: list[list[int]] = []
    for i, row in enumerate(top):
        x = row[0] if greedy else pick(probs[i], False, generator)
        order.append([x] + [t for t in row if t != x])
    small = [order[d - 1][r] for d, r in zip(tree.depths, tree.ranks)]
    q = probs[[d - 1 for d in tree.depths], small].tolist()
    drawn = None if greedy else tuple(probs[d - 1] if r == 0 else None for d, r in zip(tree.depths, tree.ranks))
    return small, q, drawn


class DFlashProposer:
    """DFlash's block as a tree (tree.TreeProposer), from the one drafter forward (DFlashSession.block_logits): the
    stored tree (TreeEngine.tree: the drafter's, else the chain of the block) cut to γ levels, or with cfg.tree
    "dynamic" the top_tree of the block's distributions; tokens by block_nodes."""

    def __init__(self, drafter: Drafter):
        self.d = drafter
        self._cuts: dict[tuple, Tree] = {}

    def start(self, vocab_size: int, eos_ids: frozenset[int]) -> DFlashSession:
        return DFlashSession(self.d, vocab_size, eos_ids)

    @torch.inference_mode()
    def propose(self, state: DFlashSession, tokens: list[int], tree: Tree, cfg: DecodeConfig, room: int,
                generator: torch.Generator) -> TreeProposal | None:
        logits = state.block_logits(tokens)
        if logits is None:  # the first step is the target's prefill
            return None
        depth = min(room, len(logits))
        probs = warp(logits[:depth], cfg)  # (depth, N): q_1..q_depth
        if cfg.tree == "dynamic":
            k = min(cfg.tree_topk, probs.shape[-1] - 1)
            values = torch.topk(probs, k).values.tolist()  # γ sets the depth (cfg.tree_depth: EAGLE's levels)
            tree = top_tree(values, k, cfg.tree_nodes) or self.cut(tree, 1)
        else:
            tree = self.cut(tree, depth)
        small, q_nodes, drawn = block_nodes(tree, probs, cfg.greedy, generator)
        full = None if drawn is None else self.d.scatter(probs)  # (depth, V): each slot's q, once
        q_drawn = None if drawn is None else tuple(None if q is None else full[d - 1]
                                                   for q, d in zip(drawn, tree.depths))
        return TreeProposal(tree, self.d.target_ids(small), q_nodes, q_drawn, 1)

    def cut(self, tree: Tree, depth: int) -> Tree:
        """The stored tree without its nodes deeper than `depth`: made once per (tree, depth)."""
        key = (tree.paths, depth)
        if key not in self._cuts:
            self._cuts[key] = Tree.from_choices([p for p in tree.paths if len(p) <= depth])
        return self._cuts[key]


def build(target: LoadedModel, drafter: Drafter, chain: bool = False, name: str = ""):
    """DFlash's engine (methods.MethodSpec.engine): the tree loop over the drafter's stored tree, else the block as a
    chain (DecodeConfig.tree "dynamic": the top paths of the block; cfg.lookup, cfg.retrieve: grafted branches);
    with chain=True (the step-through, the drafter check) the chain loop."""
    if chain:
        return DFlashEngine("dflash", target, DFlashDrafter(drafter, name))
    block = drafter.cfg.block_size - 1
    return TreeEngine("dflash", target, DFlashProposer(drafter),
                      drafter.cfg.tree or [(0,) * depth for depth in range(1, block + 1)])


class DFlashEngine(SpeculativeEngine):
    """The chain loop with γ capped at the drafter's block_size - 1 (a block drafts no more)."""

    def draft(self, run, gamma: int) -> Proposal:
        return super().draft(run, min(gamma, self.drafter.drafter.cfg.block_size - 1))
