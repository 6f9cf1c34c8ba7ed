"""EAGLE: Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (ICML 2024); EAGLE-2:
Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees" (EMNLP 2024); EAGLE-3: Li et
al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test".

A one-layer drafter extrapolates the target's features (features.py), token by token. Its input at position i is
(the target's feature at i, the token at i + 1); its output is its guess of the feature at i + 1, which the target's
(compressed) LM head turns into the next draft token, and which is fed back for the token after. EAGLE-3 reads the
target's hidden states after three layers, fused by its `fc` (Eagle3.lift), and reads its output through its own
norm (Eagle3.readout). After each verification the target's true features of the kept positions replace the
drafter's own guesses, so only true features are ever kept in the drafter's one-layer KV cache (`EagleSession`).

It drafts a tree (`EagleProposer`, verified by tree.py: the tree loop, which defines the verdicts): the stored shape
(EAGLE's static tree), or grown each step from the drafter's confidence (EAGLE-2: the top-k children of the k most
probable nodes of each level, then the N nodes of highest path probability). As a chain (the step-through view, the
drafter check, or a drafter with no stored tree) it is verified by the chain loop (speculative.py).

Terms: γ caps the tree's depth (the chain's length); τ is tokens committed per target forward; a node's path
probability is the product of the drafter's warped probabilities along its path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.config import DecodeConfig
from specviz.core.sampling import warp
from specviz.core.trees import Tree, best_nodes, subtree
from specviz.drafters.trained import Drafter
from specviz.engines.features import FeatureHistory
from specviz.engines.speculative import Proposal, SpeculativeEngine, stop_drafting
from specviz.engines.tree import TreeEngine, TreeProposal
from specviz.models.loader import LoadedModel

# A default static tree for 2 CPU cores; trained drafters store their own, chosen from measured accuracies per depth.
EAGLE_CHOICES = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0), (0, 0, 0, 0, 0)]


class EagleDrafter:
    """EAGLE as a chain drafter (speculative.ChainDrafter)."""

    def __init__(self, drafter: Drafter, name: str):
        self.drafter, self.name = drafter, name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "EagleSession":
        return EagleSession(self.drafter, vocab_size, eos_ids)


class EagleSession(FeatureHistory):
    """EAGLE's per-run state, chain or tree (a features.FeatureReader): the target's features and the drafter layer's
    KV cache over the pairs (true feature, next token) fed so far."""

    def __init__(self, drafter: Drafter, vocab_size: int, eos_ids: frozenset[int]):
        super().__init__(drafter, vocab_size, eos_ids)
        self.fused = drafter.fused  # the module's step in one C call (models.fused.FusedEagle3), or None: torch
        self.buffer = self.fused.new_cache() if self.fused is not None else None
        # the drafter layer's cache past the pairs fed with true features: the torch module's (keys, values), or the
        # fused step's count of slots filled in `buffer` (a drafted node's slots are simply written over)
        self.kv = 0 if self.fused is not None else None
        self.kv_len = 0
        # the target's embeddings, where context() runs as one C call: the fused step, a packed head, bf16 rows
        self._table = drafter.c_table

    def rollback(self, n_valid: int) -> None:
        super().rollback(n_valid)
        if self.kv_len > n_valid:
            self.kv = n_valid if self.fused is not None else (self.kv[0][:, :, :n_valid], self.kv[1][:, :, :n_valid])
            self.kv_len = n_valid

    def _layer(self, kv, inputs: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
               mask: torch.Tensor | None = None, lift: bool = False):
        """One drafter call over m rows past `kv` (self.kv's kind): inputs (m, f) the target's features (lift) or
        predicted features, ids (m,) their tokens (target ids), positions (m,) their rope positions, mask (m, past +
        m) bool (None: causal). Returns their predicted features (m, d) and the grown kv."""
        embeds = self.d.embed(ids)
        if self.fused is not None:
            out = self.fused.step(self.buffer, embeds, kv, positions, feats=inputs if lift else None,
                                  hidden=None if lift else inputs, mask=mask)
            return out, kv + len(ids)
        module = self.d.module
        x = module.lift(self.d.inputs(inputs[None])) if lift else inputs[None]
        out, kv = module(x, embeds[None], positions, kv, mask)
        return out[0], kv

    @torch.inference_mode()
    def context(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Feed the pairs (true feature, next token) not yet in the drafter's cache; return the predicted feature of
        the last committed token's position, which the first draft tokens are read from, and the draft logits read
        from it (N,) float32. None before the target's first forward (no features yet). Beside the fused step, one C
        call (fused.FusedEagle3.context) does it all."""
        m = self._n
        if m == 0 or m < len(tokens) - 1:
            return None
        new, feats = tokens[self.kv_len + 1:m + 1], self._rows[self.kv_len:m]
        if self._table is not None and feats.dtype == torch.bfloat16:
            out, logits = self.fused.context(self.buffer, self._table, new, feats, self.kv, self.d.head_packed,
                                             self.d.head_weight.shape[0])
            self.kv += len(new)
        else:
            device = self.d.head_weight.device
            ids = torch.tensor(new, dtype=torch.long, device=device)
            out, self.kv = self._layer(self.kv, feats, ids, torch.arange(self.kv_len, m, device=device), lift=True)
            logits = self.d.logits(out[-1]).float().cpu()
        self.kv_len = m
        return out[-1], logits

    @torch.inference_mode()
    def feed_nodes(self, kv, inputs: torch.Tensor, ids: torch.Tensor, visible: torch.Tensor, depth: int):
        """One drafter call over m tree nodes at `depth` (1 = the root's children), past the context in the cache:
        inputs (m, f) their parents' predicted features, ids (m,) their tokens (target ids), visible (m, t) bool
        which of the t tree nodes in `kv` after the context, these m last, each one attends to (its ancestors and
        itself) besides the whole context. Returns their predicted features (m, f) and the grown cache."""
        device = self.d.head_weight.device
        n_ctx = self.kv_len
        mask = torch.ones(len(ids), n_ctx + visible.shape[1], dtype=torch.bool, device=device)
        mask[:, n_ctx:] = visible.to(device)
        positions = torch.full((len(ids),), n_ctx + depth - 1, dtype=torch.long, device=device)
        return self._layer(kv, inputs, ids.to(device), positions, mask)

    @torch.inference_mode()
    def grow_tree(self, root: tuple[torch.Tensor, torch.Tensor], cfg: DecodeConfig, depth: int) -> "GrownTree":
        """EAGLE-2's dynamic tree from the root's predicted feature and draft logits (context): the root's top-k
        children, then for each further level up to `depth` one drafter call over the k nodes of the level with the
        highest path probability (the product of the drafter's probabilities, warped as the target's are, along the
        path), each proposing its top-k children; then the cfg.tree_nodes drafted nodes of highest path probability
        (trees.best_nodes)."""
        k = cfg.tree_topk
        parents: list[int] = []   # every drafted node, level by level: its parent (-1 = the root)
        small: list[int] = []     # its draft-vocabulary index
        q: list[float] = []       # its probability under its parent's warped distribution
        score: list[float] = []   # its path probability
        ranks: list[int] = []     # its rank among its parent's children

        def propose_children(parent: int, probs: torch.Tensor) -> None:  # probs (N,)
            top = torch.topk(probs, min(k, probs.shape[-1]))
            base = score[parent] if parent >= 0 else 1.0
            for rank, (value, index) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                parents.append(parent)
                small.append(index)
                q.append(value)
                score.append(base * min(value, 1.0))  # a renormalised probability may round past 1
                ranks.append(rank)

        feat, logits = root
        propose_children(-1, warp(logits, cfg))
        kv, fed, forwards = self.kv, [], 0  # fed: the drafted nodes whose pairs are in kv, in order
        level = list(range(len(parents)))
        node_feat = {-1: feat}  # the predicted feature each fed node's children are read from
        for d in range(2, depth + 1):
            frontier = sorted((i for i in level if score[i] > 0), key=lambda i: -score[i])[:k]
            if not frontier:
                break
            cols = fed + frontier
            visible = torch.tensor([[self._ancestor(parents, j, i) for j in cols] for i in frontier])
            inputs = torch.stack([node_feat[parents[i]] for i in frontier])  # (m, f)
            ids = self.d.to_target_ids(torch.tensor([small[i] for i in frontier]))
            out, kv = self.feed_nodes(kv, inputs, ids, visible, d - 1)
            forwards += 1
            fed += frontier
            probs = warp(self.d.logits(out).float().cpu(), cfg)  # (m, N)
            start = len(parents)
            for row, i in enumerate(frontier):
                node_feat[i] = out[row]
                propose_children(i, probs[row])
            level = list(range(start, len(parents)))
        keep = best_nodes(parents, score, cfg.tree_nodes)
        tree, source = subtree(parents, ranks, keep)
        ids = self.d.to_target_ids(torch.tensor([small[i] for i in source]))
        return GrownTree(tree, [int(t) for t in ids.tolist()], [q[i] for i in source], forwards + 1)

    @staticmethod
    def _ancestor(parents: list[int], j: int, i: int) -> bool:
        """Node j is node i or one of its ancestors."""
        while i >= 0 and i != j:
            i = parents[i]
        return i == j

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        root = self.context(tokens) if gamma > 0 else None
        if root is None:  # the first step is the target's prefill
            return Proposal.empty(self.vocab_size)
        (feat, logits), device = root, self.d.head_weight.device
        kv, pos = self.kv, self.kv_len
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        while True:
            token, q, confidence = self.d.draw(logits, cfg, generator)
            drafted.append(token)
            qs.append(q)
            if len(drafted) >= gamma or stop_drafting(token, confidence, self.eos_ids, cfg):
                break
            ids, positions = torch.tensor([token], device=device), torch.tensor([pos], device=device)
            out, kv = self._layer(kv, feat[None], ids, positions)
            feat, pos = out[-1], pos + 1
            logits = self.d.logits(feat)
        return Proposal(drafted, torch.stack(qs), len(drafted))


@dataclass(frozen=True)
class GrownTree:
    """A tree EagleSession.grow_tree drafted: what engines.tree.TreeProposal carries."""
    tree: Tree
    node_tokens: list[int]   # (n,) target token ids
    q_nodes: list[float]     # (n,) each node's probability under its parent's warped distribution
    forwards: int            # drafter calls: the context's and one per level grown


class EagleProposer:
    """EAGLE's tree (tree.TreeProposer): grown level by level, each node attending to the true context and its own
    ancestors, each node's children read from its predicted feature; EAGLE-2's dynamic tree (cfg.tree "dynamic")
    keeps the nodes of highest path probability (EagleSession.grow_tree)."""

    def __init__(self, drafter: Drafter):
        self.d = drafter
        self._cuts: dict[tuple, tuple[Tree, torch.Tensor]] = {}  # cut()'s trees

    def start(self, vocab_size: int, eos_ids: frozenset[int]) -> EagleSession:
        return EagleSession(self.d, vocab_size, eos_ids)

    @torch.inference_mode()
    def propose(self, state: EagleSession, tokens: list[int], tree: Tree, cfg: DecodeConfig, room: int,
                generator: torch.Generator) -> TreeProposal | None:
        root = state.context(tokens)  # greedy or sampling: the top-ranked tree (point masses when sampling)
        if root is None:
            return None
        if cfg.tree == "dynamic":  # EAGLE-2: a tree grown from the drafter's confidence
            grown = state.grow_tree(root, cfg, min(cfg.tree_depth, room))
            return TreeProposal(grown.tree, grown.node_tokens, grown.q_nodes, None, grown.forwards)
        tree, ancestry = self.cut(tree, room)
        node_feat: dict[int, torch.Tensor] = {-1: root[0]}  # the predicted feature each node's children come from
        small: list[int] = [0] * tree.size
        q_nodes: list[float] = [0.0] * tree.size
        fed: list[int] = []  # tree nodes whose pairs are in `kv`, in order
        kv, forwards = state.kv, 0
        for depth in range(1, max(tree.depths) + 1):
            level = [i for i in range(tree.size) if tree.depths[i] == depth]
            for parent in sorted({tree.parents[i] for i in level}):
                logits = root[1] if parent < 0 else self.d.logits(node_feat[parent]).float().cpu()
                probs = warp(logits, cfg)  # (N,)
                kids = [i for i in level if tree.parents[i] == parent]
                values, indices = (t.tolist() for t in torch.topk(probs, 1 + max(tree.ranks[i] for i in kids)))
                for i in kids:  # (one list each: a tensor read a node cost tens of us right after a forward)
                    small[i], q_nodes[i] = indices[tree.ranks[i]], values[tree.ranks[i]]
            grow = [i for i in level if tree.children(i)]  # nodes whose children are proposed next
            if not grow:
                break
            ids = self.d.to_target_ids(torch.tensor([small[i] for i in grow]))
            inputs = torch.stack([node_feat[tree.parents[i]] for i in grow])
            visible = ancestry[grow][:, fed + grow]  # each node sees the true context, its ancestors and itself
            out, kv = state.feed_nodes(kv, inputs, ids, visible, depth)
            forwards += 1
            for row, i in enumerate(grow):
                node_feat[i] = out[row]
            fed += grow
        return TreeProposal(tree, self.d.target_ids(small), q_nodes, None, forwards + 1)

    def cut(self, tree: Tree, room: int) -> tuple[Tree, torch.Tensor]:
        """The stored tree without its nodes deeper than `room`, and its ancestry mask: made once per (tree, room)."""
        key = (tree.paths, room)
        if key not in self._cuts:
            cut = Tree.from_choices([p for p in tree.paths if len(p) <= room])
            self._cuts[key] = cut, cut.ancestry()
        return self._cuts[key]


def eagle_tree_engine(target: LoadedModel, drafter: Drafter, choices=None) -> TreeEngine:
    """EAGLE's tree engine: `choices`, else the drafter's stored tree, else EAGLE_CHOICES."""
    return TreeEngine("eagle", target, EagleProposer(drafter), choices or drafter.cfg.tree or EAGLE_CHOICES)


def build(target: LoadedModel, drafter: Drafter, chain: bool = False, name: str = ""):
    """EAGLE's engine (methods.MethodSpec.engine): its tree when the drafter's config names one, else (and with
    chain=True, the step-through) a chain."""
    if drafter.cfg.tree and not chain:
        return eagle_tree_engine(target, drafter)
    return SpeculativeEngine("eagle", target, EagleDrafter(drafter, name))
