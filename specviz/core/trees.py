"""Candidate trees (Medusa's "choices" format) compiled once into masks and positions, and their greedy
verification in one target forward on a stock transformers model (4D attention mask + explicit positions).

A tree hangs off the root, the last committed token. Node i has a parent (-1 = the root), a depth (1 for
the root's children) and a rank (which of its head's top-k candidates it is). A choices list names every
node by its path of ranks: [(0,), (1,), (0, 0)] is the root's top-2 children and the top-1 child of the first.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from specviz.models.attention import Visible


class TreeError(ValueError):
    """A malformed tree spec; the message is one line."""


@dataclass(frozen=True)
class Tree:
    parents: tuple[int, ...]   # (n,) parent node index, -1 = the root
    depths: tuple[int, ...]    # (n,) 1-based depth
    ranks: tuple[int, ...]     # (n,) rank among the candidates of its head
    paths: tuple[tuple[int, ...], ...]  # (n,) the choices path of each node

    @classmethod
    def from_choices(cls, choices) -> "Tree":
        paths = sorted({tuple(int(r) for r in c) for c in choices}, key=lambda p: (len(p), p))
        if not paths or any(len(p) == 0 or min(p) < 0 for p in paths):
            raise TreeError(f"tree choices {choices!r} are not valid: use non-empty tuples of ranks >= 0")
        index = {p: i for i, p in enumerate(paths)}
        parents = []
        for p in paths:
            if len(p) > 1 and p[:-1] not in index:
                raise TreeError(f"tree choice {p} has no parent {p[:-1]} in the choices")
            parents.append(index[p[:-1]] if len(p) > 1 else -1)
        return cls(tuple(parents), tuple(len(p) for p in paths), tuple(p[-1] for p in paths), tuple(paths))

    @property
    def size(self) -> int:
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    @functools.cached_property
    def lineages(self) -> tuple[tuple[int, ...], ...]:
        """Each node's ancestors and itself, root side first (what ancestry() marks in its row)."""
        out: list[tuple[int, ...]] = []
        for i, p in enumerate(self.parents):  # parents come before children (sorted by depth)
            out.append((out[p] if p >= 0 else ()) + (i,))
        return tuple(out)

    def ancestry(self) -> torch.Tensor:
        """(n, n) bool: [i, j] is True when node j is node i or one of its ancestors."""
        n = self.size
        mask = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(self.parents):  # parents come before children (sorted by depth)
            if p >= 0:
                mask[i] |= mask[p]
        return mask

    def leaf_paths(self) -> list[list[int]]:
        """Root-to-leaf node index lists."""
        leaves = [i for i in range(self.size) if not self.children(i)]
        out = []
        for leaf in leaves:
            path, node = [], leaf
            while node >= 0:
                path.append(node)
                node = self.parents[node]
            out.append(path[::-1])
        return out


def best_nodes(parents: list[int], scores: list[float], n: int) -> list[int]:
    """The n drafted nodes of highest path probability (EAGLE-2's rerank), as indices into `parents`/`scores`
    (parents[i] < i, -1 = the root), in rank order. A child's path probability is its parent's times a probability,
    never more, and ties go to the shallower node, then the earlier one: every prefix of the order is closed under
    ancestors, so the nodes kept always form a tree. Nodes of probability 0 are never kept."""
    depth: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise TreeError(f"node {i} has parent {p}: a parent must come before its child")
        if p >= 0 and scores[i] > scores[p]:
            raise TreeError(f"node {i} is more probable ({scores[i]:g}) than its parent {p} ({scores[p]:g})")
        depth.append(1 if p < 0 else depth[p] + 1)
    order = sorted((i for i in range(len(parents)) if scores[i] > 0), key=lambda i: (-scores[i], depth[i], i))
    return order[:n]


def subtree(parents: list[int], ranks: list[int], keep: list[int]) -> tuple[Tree, list[int]]:
    """The Tree of the kept nodes (closed under ancestors; ranks[i] = node i's rank among its parent's candidates),
    and for each of its nodes the index in `parents` it came from."""
    paths: dict[int, tuple[int, ...]] = {}
    for i in sorted(keep):  # parents before children
        p = parents[i]
        if p >= 0 and p not in paths:
            raise TreeError(f"node {i} is kept without its parent {p}")
        paths[i] = (paths[p] if p >= 0 else ()) + (ranks[i],)
    tree = Tree.from_choices(paths.values())
    if tree.size != len(paths):
        raise TreeError("two kept siblings share a rank")
    source = {path: i for i, path in paths.items()}
    return tree, [source[path] for path in tree.paths]


def tree_inputs(n_prefix: int, n_fed: int, tree: Tree, attn_implementation: str, dtype: torch.dtype):
    """Position ids (1, q) and the 4D mask (1, 1, q, kv) for feeding `n_fed` committed tokens (the last
    of which is the root) followed by the tree's nodes, after `n_prefix - n_fed` cached positions."""
    cached = n_prefix - n_fed
    q = n_fed + tree.size
    kv = cached + q
    allowed = torch.zeros(q, kv, dtype=torch.bool)
    allowed[:, :cached] = True
    allowed[:n_fed, cached:cached + n_fed] = torch.tril(torch.ones(n_fed, n_fed, dtype=torch.bool))
    allowed[n_fed:, cached:cached + n_fed] = True  # every node sees the whole committed context
    allowed[n_fed:, cached + n_fed:] = tree.ancestry()
    root = n_prefix - 1
    positions = list(range(cached, n_prefix)) + [root + d for d in tree.depths]
    position_ids = torch.tensor([positions], dtype=torch.long)
    if attn_implementation == "eager":
        mask = torch.zeros(q, kv, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    else:
        mask = allowed
    return position_ids, mask[None, None]


def tree_visible(n_prefix: int, n_fed: int, tree: Tree) -> tuple[torch.Tensor, Visible]:
    """What tree_inputs' mask says, as the fused decoder reads it, with the positions (q,): the n_fed fed rows see
    the context causally, each node the whole context and then its ancestors and itself (attention.Visible, its
    lineages made once per tree and n_fed). Two small tensors a step: not a (q, kv) mask and a nonzero over it, nor
    the context's slots spelled out for every row (C does that)."""
    cached = n_prefix - n_fed
    index, offsets = _lineage_slots(tree, n_fed)
    lead = torch.tensor(list(range(cached + 1, n_prefix + 1)) + [n_prefix] * tree.size)
    positions = torch.tensor(list(range(cached, n_prefix)) + [n_prefix - 1 + d for d in tree.depths])
    return positions, Visible(lead, index, offsets, n_prefix)


@functools.lru_cache(maxsize=256)
def _lineage_slots(tree: Tree, n_fed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each node's ancestors and itself as slots past the context (int32, row after row), and the row offsets of
    n_fed fed rows (none) and the nodes (int64)."""
    index = torch.tensor([i for up in tree.lineages for i in up], dtype=torch.int32)
    offsets = torch.zeros(n_fed + tree.size + 1, dtype=torch.int64)
    offsets[n_fed + 1:] = torch.tensor([len(up) for up in tree.lineages]).cumsum(0)
    return index, offsets


def greedy_walk(tree: Tree, node_tokens: list[int], choice: list[int]) -> tuple[list[int], int]:
    """Greedy tree verification. choice[k] is the target's argmax after row k, where row 0 is the root and
    row i + 1 is node i. Returns the accepted path (node indices) and the target's next token after it."""
    path, row = [], 0
    while True:
        parent = path[-1] if path else -1
        match = [i for i, p in enumerate(tree.parents) if p == parent and node_tokens[i] == choice[row]]
        if not match:
            return path, choice[row]
        path.append(match[0])
        row = match[0] + 1
