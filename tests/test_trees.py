"""Candidate trees: compiled masks, one-forward tree verification on a stock model, path KV kept."""
import pytest
import torch

from specviz.core.cache import CachedLM
from specviz.core.sampling import verify_chain
from specviz.core.trees import Tree, TreeError, greedy_walk, tree_inputs, tree_visible
from specviz.models.attention import visible_index

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


@pytest.mark.parametrize("max_rows", [3, 4, 5])
def test_long_verification_forwards_run_in_pieces(tiny_target, max_rows):
    """With max_rows (AMX CPUs: models.BF16_ROWS), a forward carrying drafts, a tree or a chain, runs in pieces
    of at most that many rows and never one, each over the cache the pieces before it filled: the same rows,
    features and cache as one forward. A prompt's own forward is not cut."""
    tree = Tree.from_choices(CHOICES)
    nodes = node_tokens_for(tree)
    whole = CachedLM(tiny_target.model, tiny_target.device)
    cut = CachedLM(tiny_target.model, tiny_target.device, max_rows=max_rows)
    sizes = []
    decoder = cut.decoder
    cut.decoder = lambda **kw: sizes.append(kw["input_ids"].shape[1]) or decoder(**kw)
    for lm in (whole, cut):
        lm.logits(PROMPT[:-1])
    assert sizes == [len(PROMPT) - 1]
    expect, expect_states = whole.tree_logits(PROMPT, tree, nodes, features=(2, 0))
    rows, states = cut.tree_logits(PROMPT, tree, nodes, features=(2, 0))
    assert sum(sizes[1:]) == 1 + tree.size and all(2 <= n <= max_rows for n in sizes[1:])
    assert torch.allclose(rows, expect, atol=1e-5) and torch.allclose(states, expect_states, atol=1e-5)
    for lm in (whole, cut):
        lm.keep_path(len(PROMPT), [0, 3])
    context = PROMPT + [nodes[0], nodes[3]]
    del sizes[:]
    chain = whole.logits(context, [1, 2, 3, 4, 5], keep=5), cut.logits(context, [1, 2, 3, 4, 5], keep=5)
    assert sum(sizes) == 5 and all(2 <= n <= max_rows for n in sizes) and len(sizes) == -(-5 // max_rows)
    assert torch.allclose(*chain, atol=1e-5)


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


@pytest.mark.parametrize("path", [[1, 5], [0, 4, 7], [0, 3, 6], []])  # moved, partly in place, in place, none
def test_keep_path_equals_fresh_prefix(tiny_target, path):
    tree = Tree.from_choices(CHOICES)
    nodes = node_tokens_for(tree, seed=3)
    lm = CachedLM(tiny_target.model, tiny_target.device)
    lm.tree_logits(PROMPT, tree, nodes)
    lm.keep_path(len(PROMPT), path)
    assert lm.cache.get_seq_length() == lm.seen == len(PROMPT) + len(path)
    kept = PROMPT + [nodes[i] for i in path]
    after = lm.logits(kept + [7])[0]
    fresh = CachedLM(tiny_target.model, tiny_target.device).logits(kept + [7])[0]
    assert torch.allclose(after, fresh, atol=1e-5)


def spelled_out(visible) -> tuple[torch.Tensor, torch.Tensor]:
    """An attention.Visible's rows as visible_index gives them (flat int32 slots, int64 row offsets): what llama.c's
    row_spans spells out."""
    rows = [list(range(lead)) + [visible.base + i for i in visible.index[a:b].tolist()]
            for lead, a, b in zip(visible.lead.tolist(), visible.offsets[:-1].tolist(), visible.offsets[1:].tolist())]
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor([len(r) for r in rows], dtype=torch.int64).cumsum(0)
    return torch.tensor([i for r in rows for i in r], dtype=torch.int32), offsets


@pytest.mark.parametrize("n_prefix,n_fed", [(1, 1), (7, 1), (40, 3), (300, 2)])
def test_tree_visible_is_what_the_mask_says(n_prefix, n_fed):
    """The fused decoder's tree rows read tree_visible's slots; they are the ones visible_index takes from
    tree_inputs' mask (the stock model's), row for row, with the same positions, for trees of every shape here."""
    for choices in ([(0,)], [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)], [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)],
                    [(0,), (1,), (2,), (3,), (1, 0), (1, 0, 0), (3, 0), (3, 1)]):
        tree = Tree.from_choices(choices)
        positions, mask = tree_inputs(n_prefix, n_fed, tree, "sdpa", torch.bfloat16)
        index, offsets = visible_index(mask, n_fed + tree.size, n_prefix + tree.size)
        got_positions, visible = tree_visible(n_prefix, n_fed, tree)
        got_index, got_offsets = spelled_out(visible)
        assert got_positions.tolist() == positions[0].tolist()
        assert visible.index.dtype == index.dtype and visible.offsets.dtype == offsets.dtype
        assert got_index.tolist() == index.tolist() and got_offsets.tolist() == offsets.tolist()
