"""Dynamic trees (EAGLE-2; Medusa's product of head probabilities): the rerank on synthetic probabilities (closed
under ancestors, N kept, ordering, ties), greedy identity on the tiny models and the real target, the CLI's flags and
bad values, the tree panel's path probability on hover."""
from __future__ import annotations

import itertools

import pytest
import torch
from tiny import random_drafter

from specviz import engines, methods
from specviz.cli.main import main
from specviz.config import TREE_NODES_MAX, DecodeConfig
from specviz.core.cache import CachedLM
from specviz.core.trees import TreeError, best_nodes, subtree
from specviz.engines.eagle import EagleProposer, eagle_tree_engine
from specviz.engines.medusa import MedusaProposer, medusa_engine
from specviz.errors import ConfigError
from specviz.events import LOOKUP_HEAD, DraftToken, StepEvent, Verdict
from specviz.hardware import method_spec
from specviz.ui import controls, plots


def random_drafted(seed: int, n: int = 40) -> tuple[list[int], list[float]]:
    """A drafted tree as EAGLE-2 grows one: each node's parent comes before it, its path probability is its
    parent's times a probability (some exactly 1 or 0, some repeated, to make ties)."""
    g = torch.Generator().manual_seed(seed)
    parents, scores = [], []
    for i in range(n):
        parent = int(torch.randint(-1, i, (1,), generator=g)) if i else -1
        q = [1.0, 0.0, 0.5, 0.25][i % 4] if i % 5 == 0 else round(float(torch.rand(1, generator=g)), 1)
        parents.append(parent)
        scores.append((scores[parent] if parent >= 0 else 1.0) * q)
    return parents, scores


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("n", [1, 5, 12, 64])
def test_best_nodes_are_the_top_n_and_form_a_tree(seed, n):
    parents, scores = random_drafted(seed)
    keep = best_nodes(parents, scores, n)
    positive = [i for i in range(len(scores)) if scores[i] > 0]
    assert len(keep) == min(n, len(positive)) and len(set(keep)) == len(keep)
    assert all(scores[i] > 0 for i in keep)
    assert all(parents[i] in keep for i in keep if parents[i] >= 0)  # closed under ancestors
    assert [scores[i] for i in keep] == sorted((scores[i] for i in keep), reverse=True)  # in rank order
    dropped = [scores[i] for i in positive if i not in keep]
    assert not dropped or min(scores[i] for i in keep) >= max(dropped)  # the best n, no other n
    tree, source = subtree(parents, list(range(len(parents))), keep)
    assert sorted(source) == sorted(keep) and tree.size == len(keep)
    for node, i in enumerate(source):  # the tree's node carries the drafted node's parent
        assert tree.parents[node] == (-1 if parents[i] < 0 else source.index(parents[i]))


def test_ties_go_to_the_shallower_then_the_earlier_node():
    # a child as probable as its parent (q = 1) and two equal siblings: every cut keeps a tree
    parents, scores = [-1, 0, 0, 1, -1], [0.5, 0.5, 0.5, 0.5, 0.5]
    assert best_nodes(parents, scores, 5) == [0, 4, 1, 2, 3]
    assert best_nodes(parents, scores, 2) == [0, 4]
    assert best_nodes([-1, 0, -1], [0.4, 0.0, 0.3], 3) == [0, 2]  # probability 0 is never drafted
    with pytest.raises(TreeError, match="more probable"):
        best_nodes([-1, 0], [0.4, 0.5], 2)
    with pytest.raises(TreeError, match="must come before"):
        best_nodes([1, -1], [0.4, 0.5], 2)
    with pytest.raises(TreeError, match="without its parent"):
        subtree([-1, 0], [0, 0], [1])


def test_subtree_names_nodes_by_their_ranks():
    # drafted: root children ranks 0, 1; node 0's children ranks 0, 1; node 1's child rank 0
    parents, ranks = [-1, -1, 0, 0, 1], [0, 1, 0, 1, 0]
    tree, source = subtree(parents, ranks, [0, 1, 2, 4])
    assert tree.paths == ((0,), (1,), (0, 0), (1, 0)) and source == [0, 1, 2, 4]


def cfg_dynamic(method: str, **kw) -> DecodeConfig:
    return DecodeConfig(method=method, tree="dynamic", **kw)


@pytest.mark.parametrize("kind,extra,shape", [("eagle", {}, dict(tree_nodes=8, tree_depth=4, tree_topk=3)),
                                              ("eagle", {}, dict(tree_nodes=20, tree_depth=5, tree_topk=4)),
                                              ("eagle", {}, dict(tree_nodes=1, tree_depth=1, tree_topk=1)),
                                              ("medusa", {"medusa_heads": 3}, dict(tree_nodes=10, tree_depth=3,
                                                                                   tree_topk=4))])
@pytest.mark.parametrize("compressed", [False, True])
def test_greedy_identity_tiny(tiny_target, kind, extra, shape, compressed):
    d = random_drafter(tiny_target, kind, torch.arange(0, 64, 2) if compressed else None, **extra)
    eng = eagle_tree_engine(tiny_target, d) if kind == "eagle" else medusa_engine(tiny_target, d)
    ar = engines.build("ar", tiny_target)
    for prompt in ([1, 2, 3], [5, 9, 11, 13, 2], [7]):
        cfg = cfg_dynamic(kind, max_new_tokens=30, gamma=16, **shape)
        run = engines.generate(eng, prompt, cfg)
        assert run.token_ids == engines.generate(ar, prompt, cfg.with_(method="ar", tree="static")).token_ids
        sizes = [len(e.drafts) for e in run.events[1:-1]]  # the prefill drafts nothing, nor a step at the cap
        assert max(sizes) == shape["tree_nodes"] and min(sizes) >= 1  # every step drafts, N at most
        assert max(n.depth + 1 for e in run.events for n in e.drafts) <= shape["tree_depth"]


def eagle_state(target, d, tokens):
    _, hidden = CachedLM(target.model, target.device).logits(tokens[:-1], keep=1, features=True)
    state = EagleProposer(d).start(target.vocab_size, frozenset())
    state.observe(hidden)
    return state


def test_eagle_dynamic_tree_is_what_its_drafter_proposes(tiny_target):
    """The grown tree's nodes are the drafter's own proposals: the static proposer, given the same tree shape, drafts
    the same tokens with the same probabilities (its level-by-level expansion is tested against the chain); the
    root's children are the top-k of the drafter's first distribution; the kept nodes are the top N by path
    probability among those drafted, and each level was expanded from its k most probable nodes."""
    d = random_drafter(tiny_target, "eagle", torch.arange(0, 64, 2), seed=4)
    tokens = [3, 8, 13, 21, 34, 55, 2, 7]
    cfg = cfg_dynamic("eagle", tree_nodes=64, tree_depth=4, tree_topk=3)
    full = EagleProposer(d).propose(eagle_state(tiny_target, d, tokens), tokens, None, cfg, 16, torch.Generator())
    assert full.tree.size == 3 + 3 * 9 and max(full.tree.depths) == 4 and full.forwards == 4  # all drafted
    static = EagleProposer(d).propose(eagle_state(tiny_target, d, tokens), tokens, full.tree, cfg.with_(tree="static"),
                                      16, torch.Generator())
    assert static.tree == full.tree and static.node_tokens == full.node_tokens
    assert static.q_nodes == pytest.approx(full.q_nodes, rel=1e-4)
    path_p = plots.path_probabilities([DraftToken(0, "", Verdict.DISCARDED, q, parent=p)
                                       for q, p in zip(full.q_nodes, full.tree.parents)])
    for depth in (1, 2, 3):  # the nodes expanded: the 3 most probable of their level
        level = [i for i in range(full.tree.size) if full.tree.depths[i] == depth]
        expanded = {full.tree.parents[i] for i in range(full.tree.size) if full.tree.depths[i] == depth + 1}
        best = sorted(level, key=lambda i: -path_p[i])[:3]
        assert sorted(expanded) == sorted(best)
    for n in (1, 6, 13):
        small = EagleProposer(d).propose(eagle_state(tiny_target, d, tokens), tokens, None,
                                         cfg.with_(tree_nodes=n), 16, torch.Generator())
        want = sorted(range(full.tree.size), key=lambda i: -path_p[i])[:n]
        assert set(small.tree.paths) == {full.tree.paths[i] for i in want}
        assert small.tree.size == n
    shallow = EagleProposer(d).propose(eagle_state(tiny_target, d, tokens), tokens, None, cfg, 2, torch.Generator())
    assert max(shallow.tree.depths) == 2  # the room (γ, the length cap) caps the depth


def test_medusa_dynamic_tree_is_the_top_paths_of_the_head_product(tiny_target):
    d = random_drafter(tiny_target, "medusa", None, medusa_heads=3, seed=3)
    _, hidden = CachedLM(tiny_target.model, tiny_target.device).logits([3, 8, 13, 21], keep=1, features=True)
    proposer = MedusaProposer(d)
    state = proposer.start(64, frozenset())
    state.observe(hidden)
    cfg = cfg_dynamic("medusa", tree_nodes=9, tree_depth=3, tree_topk=3)
    prop = proposer.propose(state, [3, 8, 13, 21], None, cfg, 16, torch.Generator())
    feats = d.module(d.inputs(state.feature[None]))[:, 0]
    probs = torch.stack([torch.softmax(d.logits(f, head=k).float(), -1) for k, f in enumerate(feats)])  # (3, 64)
    top = torch.topk(probs, 3)
    value = {p: float(torch.prod(torch.stack([top.values[k, r] for k, r in enumerate(p)])))
             for n in (1, 2, 3) for p in itertools.product(range(3), repeat=n)}
    kept = sorted(prop.tree.paths, key=lambda p: -value[p])
    assert prop.tree.size == 9 and min(value[p] for p in kept) >= max(v for p, v in value.items() if p not in kept)
    for i, p in enumerate(prop.tree.paths):
        assert prop.node_tokens[i] == int(top.indices[len(p) - 1, p[-1]])
        assert prop.q_nodes[i] == pytest.approx(float(top.values[len(p) - 1, p[-1]]), rel=1e-5)


def test_dynamic_applies_to_tree_drafters_and_checks_its_numbers():
    assert cfg_dynamic("eagle").tree_nodes == DecodeConfig().tree_nodes
    with pytest.raises(ConfigError, match="tree='dynamic' applies to the tree drafters only: use it with eagle or "
                                          "medusa or dflash, not pld"):
        cfg_dynamic("pld")
    with pytest.raises(ConfigError, match=f"tree_nodes=0 is out of range: use 1..{TREE_NODES_MAX} nodes"):
        cfg_dynamic("eagle", tree_nodes=0)
    assert method_spec("eagle:4+pld:6+dyn:12")[2] == {"lookup": "6", "tree": "dynamic", "tree_nodes": "12"}
    assert method_spec("medusa+dyn")[2] == {"tree": "dynamic"}


BAD = [
    (["--method", "eagle", "--tree", "bushy"], "tree='bushy' is unknown: use static"),
    (["--method", "eagle", "--tree", "dynamic", "--tree-nodes", "0"], "tree_nodes=0 is out of range: use 1..64 nodes"),
    (["--method", "eagle", "--tree-nodes", "65"], "tree_nodes=65 is out of range: use 1..64 nodes"),
    (["--method", "eagle", "--tree-depth", "deep"], "tree_depth='deep' is not a number"),
    (["--method", "eagle", "--tree-depth", "17"], "tree_depth=17 is out of range: use 1..16 levels"),
    (["--method", "medusa", "--tree-topk", "2.5"], "tree_topk='2.5' is not an integer: use 1..16 children per node"),
    (["--method", "pld", "--tree", "dynamic"], "tree='dynamic' applies to the tree drafters only: use it with eagle "
                                               "or medusa or dflash, not pld"),
]


@pytest.mark.parametrize("extra,message", BAD)
def test_bad_tree_flags_are_one_line(capsys, extra, message):
    assert main(["generate", "--prompt", "hi", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_bad_bench_entry_is_one_line(capsys, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    out = str(tmp_path / "o.json")
    assert main(["bench", "--prompts", str(prompts), "--method", "eagle+dyn:0", "--json", out]) == 2
    err = capsys.readouterr().err
    assert "tree_nodes=0 is out of range" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("method", methods.SPECULATIVE)
def test_tree_fields_show_for_tree_drafters_only(method):
    shown = controls.race_fields(method).tree
    assert shown == methods.spec(method).tree
    settings = controls.tree_settings(method, "dynamic", "12")
    assert settings == ({"tree": "dynamic", "tree_nodes": "12"} if shown else {})
    assert DecodeConfig(method=method, **settings).tree == ("dynamic" if shown else "static")


def test_tree_panel_shows_path_probability_on_hover():
    nodes = (DraftToken(1, "A", Verdict.ACCEPTED, 0.5, 0.6, None, -1, 0),
             DraftToken(2, "B", Verdict.REJECTED, 0.4, 0.3, None, 0, 1),
             DraftToken(3, "C", Verdict.DISCARDED, 0.25, None, None, 1, 2),
             DraftToken(4, "D", Verdict.DISCARDED, 1.0, None, None, 0, 1, LOOKUP_HEAD))
    event = StepEvent(step=2, drafts=nodes, emitted=(), draft_s=0.01, verify_s=0.02, draft_forwards=3,
                      target_forwards=1, gamma=4)
    assert plots.path_probabilities(nodes) == pytest.approx([0.5, 0.2, 0.05, None])
    hovers = {text: hover for trace in plots.tree_figure(event).data if trace.hovertext
              for text, hover in zip(trace.text, trace.hovertext)}
    assert "path probability=0.200" in hovers["B"] and "path probability=0.050" in hovers["C"]
    assert "path probability" not in hovers["A"]  # at depth 1 it is q_draft
    assert "path probability" not in hovers["D"]  # a graft's q = 1 is no probability


@pytest.mark.parametrize("spec", ["eagle", "eagle+pld:6+ret:6", "medusa"])
def test_greedy_identity_real_target(target, spec):
    name, _, grafts, _, _ = method_spec(spec)
    eng, ar = engines.build(name, target), engines.build("ar", target)
    for prompt in ("Write a haiku about the sea.", "List three uses of a paperclip, then explain the first."):
        ids = target.encode_prompt(prompt)
        cfg = DecodeConfig(method=name, max_new_tokens=48, gamma=4, tree="dynamic", **grafts)
        run = engines.generate(eng, ids, cfg)
        assert run.token_ids == engines.generate(ar, ids, DecodeConfig(method="ar", max_new_tokens=48)).token_ids
        drafted = [e for e in run.events if e.drafts]
        own = [[n for n in e.drafts if n.head >= 0] for e in drafted]
        assert max(len(nodes) for nodes in own) == cfg.tree_nodes  # the tree grown, not the stored one
        assert sum(len(e.emitted) for e in run.events) / len(run.events) > 1.2  # it drafts what the target keeps


def test_race_api_takes_the_tree_for_tree_drafters_only(target):
    """The app's /race handler: a dynamic tree on EAGLE (identical to plain decoding, its config says so); on a chain
    drafter the hidden tree fields are ignored, as the form hides them."""
    from specviz.ui.race import race_api

    out = race_api("Name three rivers in Europe.", method="eagle", tree="dynamic", tree_nodes=6, max_new_tokens=24)
    assert out["spec_text"] == out["ar_text"] and out["summary"]["identical"] is True
    assert (out["config"]["tree"], out["config"]["tree_nodes"]) == ("dynamic", 6)
    out = race_api("Name three rivers in Europe.", method="pld", tree="dynamic", tree_nodes=6, max_new_tokens=8)
    assert out["config"]["tree"] == "static"
