"""Candidate trees: compiled masks, one-forward tree verification on a stock model, path KV kept."""
import pytest
import torch

from specviz.cache import CachedLM
from specviz.sampling import verify_chain
from specviz.trees import Tree, TreeError, greedy_walk

CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)]
PROMPT = [5, 9, 17, 3, 22, 9, 17, 3]


def test_from_choices_and_ancestry():
    tree = Tree.from_choices(CHOICES)
    assert tree.size == 8 and tree.depths == (1, 1, 1, 2, 2, 2, 3, 3)
    assert tree.parents == (-1, -1, -1, 0, 0, 1, 3, 4)
    anc = tree.ancestry()
    assert anc[6].nonzero().flatten().tolist() == [0, 3, 6]
    assert sorted(map(tuple, tree.leaf_paths())) == [(0, 3, 6), (0, 4, 7), (1, 5), (2,)]
    with pytest.raises(TreeError, match="has no parent"):
        Tree.from_choices([(0, 0)])


def node_tokens_for(tree, vocab=64, seed=0):
    """Distinct tokens for all nodes, so siblings never share a token."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(vocab, generator=g)[:tree.size].tolist()


def test_tree_logits_equal_chain_logits_per_path(tiny_target):
    tree = Tree.from_choices(CHOICES)
    nodes = node_tokens_for(tree)
    lm = CachedLM(tiny_target.model, tiny_target.device)
    lm.logits(PROMPT[:-1])  # the root (last prompt token) stays unseen
    tree_rows = lm.tree_logits(PROMPT, tree, nodes)
    for path in tree.leaf_paths():
        chain = CachedLM(tiny_target.model, tiny_target.device)
        rows = chain.logits(PROMPT, [nodes[i] for i in path], keep=len(path) + 1)
        expect = torch.stack([tree_rows[0]] + [tree_rows[i + 1] for i in path])
        assert torch.allclose(rows, expect, atol=1e-4), path


def test_greedy_tree_acceptance_matches_chain_verification(tiny_target):
    """For every root-to-leaf path, verifying it as a chain accepts exactly its common prefix with the
    tree walk's accepted path; the longest accepted chain is the walk, with the same next token."""
    tree = Tree.from_choices(CHOICES)
    probe = CachedLM(tiny_target.model, tiny_target.device).tree_logits(PROMPT, tree, node_tokens_for(tree))
    for seed in range(4):
        nodes = node_tokens_for(tree, seed=seed)
        first = int(probe[0].argmax())  # root row does not depend on the nodes
        if first not in nodes[:3]:
            nodes[seed % 3] = first  # one of the root's children is right, so something is accepted
        rows = CachedLM(tiny_target.model, tiny_target.device).tree_logits(PROMPT, tree, nodes)
        path, nxt = greedy_walk(tree, nodes, rows.argmax(-1).tolist())
        assert len(path) >= 1
        for leaf_path in tree.leaf_paths():
            ids = torch.tensor([nodes[i] for i in leaf_path])
            p = torch.softmax(torch.stack([rows[0]] + [rows[i + 1] for i in leaf_path]), -1)
            r = verify_chain(ids, torch.nn.functional.one_hot(ids, 64).float(), p, True, None)
            common = 0
            while common < min(len(path), len(leaf_path)) and path[common] == leaf_path[common]:
                common += 1
            assert r.n_accepted == common, (seed, leaf_path, path)
            if common == len(path):
                assert r.next_token == nxt


def test_keep_path_equals_fresh_prefix(tiny_target):
    tree = Tree.from_choices(CHOICES)
    nodes = node_tokens_for(tree, seed=3)
    lm = CachedLM(tiny_target.model, tiny_target.device)
    lm.tree_logits(PROMPT, tree, nodes)
    path = [1, 5]
    lm.keep_path(len(PROMPT), path)
    kept = PROMPT + [nodes[i] for i in path]
    after = lm.logits(kept + [7])[0]
    fresh = CachedLM(tiny_target.model, tiny_target.device).logits(kept + [7])[0]
    assert torch.allclose(after, fresh, atol=1e-5)
