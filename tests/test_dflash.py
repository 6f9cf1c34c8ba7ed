"""DFlash (block drafted in one forward): greedy identity with AR, as a chain and as a tree; exact sampling (the block's
tree judged by the sampler suite's statistics, planted bugs caught); the grafts; the training forward equal to the
drafting one, the registry entry, save/load and a training smoke run on tiny random models."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from tiny import random_drafter, tiny_model

from specviz import engines, methods
from specviz.check import stats
from specviz.config import DecodeConfig
from specviz.core.sampling import verify_tree
from specviz.core.trees import Tree
from specviz.drafters import trained as drafters
from specviz.drafters.dflash import dflash_layers, mask_token
from specviz.drafters.modules import load_into
from specviz.engines.dflash import DFlashDrafter, DFlashEngine, DFlashProposer, block_nodes, build, top_tree
from specviz.engines.tree import TreeEngine
from specviz.events import LOOKUP_HEAD, Verdict
from specviz.train import dflash as dflash_train
from specviz.train import loop as train


def dflash_drafter(target, vocab_ids=None, block_size: int = 4, layers: int = 2, seed: int = 1):
    return random_drafter(target, "dflash", vocab_ids, seed=seed, feature_layers=[1, 2], block_size=block_size,
                          num_hidden_layers=layers, mask_token_id=62)


def target_feats(target, ids: torch.Tensor, layers: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = target.model.get_decoder()(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.last_hidden_state] + [out.hidden_states[k] for k in layers], -1)


@pytest.mark.parametrize("block_size", [2, 4, 8])
@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("chain", [False, True])
def test_greedy_identity_tiny(tiny_target, block_size, compressed, chain):
    """The race's engine (the tree loop, the block as a chain) and the chain loop (step-through, check) alike."""
    vocab_ids = torch.arange(0, 64, 2) if compressed else None
    eng = build(tiny_target, dflash_drafter(tiny_target, vocab_ids, block_size), chain=chain)
    assert isinstance(eng, DFlashEngine if chain else TreeEngine)
    ar = engines.build("ar", tiny_target)
    for prompt in ([1, 2, 3], [5, 9, 11, 13, 2], [7]):
        cfg = DecodeConfig(method="dflash", max_new_tokens=30, gamma=7)
        run = engines.generate(eng, prompt, cfg)
        assert run.token_ids == engines.generate(ar, prompt, cfg).token_ids
        for event in run.events:  # the whole block in one drafter forward, never more than its slots after the first
            assert len(event.drafts) <= block_size - 1 and event.draft_forwards == (1 if event.drafts else 0)
            assert event.tree_size == (0 if chain else len(event.drafts))
            assert [t.depth for t in event.drafts] == list(range(len(event.drafts)))  # a chain


TREES = {  # DecodeConfig fields, and the stored tree of the drafter (rank paths) where one is named
    "top-2 beam": ({"tree": "dynamic", "tree_topk": 2, "tree_nodes": 10}, None),
    "top-4, 8 nodes": ({"tree": "dynamic", "tree_depth": 2}, None),  # tree_depth: EAGLE's, not the block's
    "stored: chain + second choices": ({}, [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]),
    "chain + prompt lookup": ({"lookup": 4}, None),
}


@pytest.mark.parametrize("shape", list(TREES))
def test_tree_greedy_identity_tiny(tiny_target, shape):
    """Every tree of the block (and a grafted branch) gives AR's tokens, over the full and a compressed draft
    vocabulary in turn; a tree step's event has every node with a verdict, tree_size set, one drafter forward."""
    fields, stored = TREES[shape]
    compressed = list(TREES).index(shape) % 2 == 1
    d = dflash_drafter(tiny_target, torch.arange(0, 64, 2) if compressed else None, block_size=8)
    if stored:
        d = drafters.Drafter(d.module, replace(d.cfg, tree=[list(p) for p in stored]), tiny_target.model,
                             d.vocab_ids)
    eng, ar = build(tiny_target, d), engines.build("ar", tiny_target)
    branched = grafted = 0
    for prompt in ([1, 2, 3], [5, 9, 11, 13, 2, 5, 9, 11, 13]):
        cfg = DecodeConfig(method="dflash", max_new_tokens=30, gamma=5, **fields)
        run = engines.generate(eng, prompt, cfg)
        assert run.token_ids == engines.generate(ar, prompt, DecodeConfig(method="ar", max_new_tokens=30)).token_ids
        for event in run.events[1:]:  # after the prefill, a tree each step but the last (no room left: none)
            if not event.drafts and event.finish_reason:
                continue
            assert event.tree_size == len(event.drafts) > 0 and event.draft_forwards == 1
            assert all(t.verdict in (Verdict.ACCEPTED, Verdict.REJECTED, Verdict.DISCARDED) for t in event.drafts)
            assert max(t.depth for t in event.drafts) < 5 or shape == "chain + prompt lookup"
            branched += any(t.rank > 0 for t in event.drafts)
            grafted += any(t.head == LOOKUP_HEAD for t in event.drafts)
    assert branched if shape != "chain + prompt lookup" else grafted


def test_top_tree_is_the_exact_top_paths():
    """top_tree keeps the n paths of highest product of the slots' sorted probabilities, checked against every path
    of a k-ary tree enumerated."""
    gen = torch.Generator().manual_seed(0)
    for depth, k, n in [(3, 2, 5), (4, 3, 9), (2, 4, 8), (5, 2, 12)]:
        values = torch.rand(depth, k, generator=gen).sort(descending=True).values.tolist()
        every = {}
        for d in range(1, depth + 1):
            for path in itertools.product(range(k), repeat=d):
                every[path] = torch.tensor([values[i][r] for i, r in enumerate(path)]).prod().item()
        best = sorted(every, key=lambda p: -every[p])[:n]
        assert set(top_tree(values, k, n).paths) == set(best), (depth, k, n)


def test_block_nodes_rank_the_slot_draft_first():
    """Greedy: rank r is the slot's r-th most probable token. Sampling: rank 0 is the slot's draw (the same for every
    node of a depth), the ranks after it the most probable tokens other than the draw, chosen (no q)."""
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]])
    tree = Tree.from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 2)])
    small, q, drawn = block_nodes(tree, probs, True, None)
    assert small == [0, 1, 3, 2, 3, 1] and q == pytest.approx([0.5, 0.3, 0.4, 0.3, 0.4, 0.2]) and drawn is None
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(40):
        small, q, drawn = block_nodes(tree, probs, False, gen)
        x1, x2 = small[0], small[2]
        assert small[4] == x2 and small[1] == [t for t in (0, 1, 2, 3) if t != x1][0]
        others = [t for t in (3, 2, 1, 0) if t != x2]  # slot 2's tokens by probability, its draw left out
        assert small[3] == others[0] and small[5] == others[1]
        assert [d is not None for d in drawn] == [True, False, True, False, True, False]
        assert drawn[2] is not None and torch.equal(drawn[2], probs[1])
        seen.add((x1, x2))
    assert len(seen) > 3  # drawn, not the argmax


# ── sampling: the first two tokens through a block's tree follow the target (the sampler suite's statistics) ──

V, N = 10, 10000


def first_two(tree_of, p1, p2, q, gen, bug=None) -> list[int]:
    """One step over a two-slot block (q (2, V): the slots' distributions, independent of the tokens before them,
    as DFlash's are) with the tree `tree_of(q)`, judged by verify_tree against the target's p1 then p2[a]; the next
    step's draw completes a step that ended after one token."""
    tree = tree_of(q)
    small, _, drawn = block_nodes(tree, q, False, gen)
    if bug:
        drawn = bug(tree, drawn, q)
    rows = [p1] + [p2[small[i]] if tree.depths[i] == 1 else torch.full((V,), 1 / V) for i in range(tree.size)]
    result = verify_tree(tree.parents, small, drawn, torch.stack(rows), gen)
    out = [small[i] for i in result.path] + [result.next_token]
    if len(out) == 1:
        out.append(int(torch.multinomial(p2[out[0]], 1, generator=gen)))
    return out[:2]


SHAPES = {
    "chain": lambda q: Tree.from_choices([(0,), (0, 0)]),
    "chain + second choices": lambda q: Tree.from_choices([(0,), (1,), (0, 0), (0, 1)]),
    "top-2 of both slots": lambda q: Tree.from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]),
    "dynamic top-3, 5 nodes": lambda q: top_tree(torch.topk(q, 3).values.tolist(), 3, 5),
}


def joint_counts(shape: str, bug=None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p1 = stats.random_dist(gen, V)
    p2 = torch.stack([stats.random_dist(gen, V, zeros=2) for _ in range(V)])  # (V, V): p(b | a)
    q = torch.stack([stats.random_dist(gen, V), stats.random_dist(gen, V, zeros=3)])
    q[0] = 0.4 * q[0] + 0.6 * torch.nn.functional.one_hot(torch.argmin(p1), V)  # a confident drafter, often wrong
    counts = torch.zeros(V * V)
    for _ in range(N):
        a, b = first_two(SHAPES[shape], p1, p2, q, gen, bug)
        counts[a * V + b] += 1
    return counts, (p1[:, None] * p2).flatten()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_two_tokens_through_the_block_tree_follow_the_target(shape):
    fit = stats.fit(*joint_counts(shape))
    assert fit.passed(), (shape, fit.p_value, fit.tv, fit.tv_bound)


# (A draw judged as a point mass is no bug: the point-mass rule is exact for any candidate the target's draws do not
# see; it only accepts less, sum q(x) p(x) against sum min(p, q).)
def _judged_against_the_other_slot(tree, drawn, q):
    return tuple(None if x is None else q[d % 2] for x, d in zip(drawn, tree.depths))  # slot i's draw, q of another


def _choices_judged_as_drawn(tree, drawn, q):
    return tuple(q[d - 1] for d in tree.depths)  # the second choices verified as if drawn from q


@pytest.mark.parametrize("bug", [_judged_against_the_other_slot, _choices_judged_as_drawn])
def test_planted_bugs_are_caught(bug):
    fit = stats.fit(*joint_counts("chain + second choices", bug))
    assert not fit.passed() and fit.p_value < 1e-6, (bug.__name__, fit.p_value, fit.tv, fit.tv_bound)


@pytest.mark.parametrize("loop", ["chain", "tree"])
def test_a_drafter_that_copies_the_target_is_accepted_whole(tiny_target, loop):
    """A planted perfect drafter (its logits replaced by the target's own next tokens) has every draft accepted:
    the block's slots line up with the positions the target verifies (an off-by-one would reject them). In the
    tree loop with each slot's second choice beside it, only the chain is accepted."""
    d = dflash_drafter(tiny_target, block_size=4)
    ar = engines.build("ar", tiny_target)
    prompt = [5, 9, 11]
    truth = engines.generate(ar, prompt, DecodeConfig(method="ar", max_new_tokens=40)).token_ids
    seq = prompt + truth

    def oracle(s):
        s.block_logits = lambda tokens: (torch.nn.functional.one_hot(
            torch.tensor(seq[len(tokens):len(tokens) + 3]), 64).float() * 50) if s._n else None
        return s

    class Oracle(DFlashDrafter):
        def session(self, vocab_size, eos_ids):
            return oracle(super().session(vocab_size, eos_ids))

    class OracleTree(DFlashProposer):
        def start(self, vocab_size, eos_ids):
            return oracle(super().start(vocab_size, eos_ids))

    eng = (DFlashEngine("dflash", tiny_target, Oracle(d)) if loop == "chain" else
           TreeEngine("dflash", tiny_target, OracleTree(d), [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 1)]))
    run = engines.generate(eng, prompt, DecodeConfig(method="dflash", max_new_tokens=30, gamma=3))
    assert run.token_ids == truth[:30]
    verdicts = [(t.verdict, t.rank) for e in run.events for t in e.drafts]
    assert verdicts and all(v is Verdict.ACCEPTED for v, rank in verdicts if rank == 0)
    assert all(v is not Verdict.ACCEPTED for v, rank in verdicts if rank > 0)
    assert len(run.events) <= 1 + -(-29 // 4)  # the prefill's step, then 4 tokens a step


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampled_runs_follow_the_seed_and_use_the_block(tiny_target, temperature):
    eng = build(tiny_target, dflash_drafter(tiny_target, torch.arange(0, 64, 2), 4))
    cfg = DecodeConfig(method="dflash", max_new_tokens=40, temperature=temperature, seed=3, gamma=3)
    a, b = engines.generate(eng, [1, 2, 3], cfg), engines.generate(eng, [1, 2, 3], cfg)
    assert a.token_ids == b.token_ids and 0 < len(a.token_ids) <= 40
    assert max(len(e.drafts) for e in a.events) == 3
    for e in a.events:
        for t in e.drafts:
            if t.verdict is not Verdict.DISCARDED:
                assert 0.0 <= t.accept_prob <= 1.0


def test_training_forward_is_the_drafting_forward(tiny_target):
    """Blocks at several anchors in one training forward (block_mask) give what the drafter gives each block alone
    when drafting: the context of the states before its anchor, the block bidirectional."""
    d = dflash_drafter(tiny_target, block_size=4)
    m, bs, dim = d.module.float(), 4, 32
    ids = torch.randint(1, 60, (2, 14))
    feats = target_feats(tiny_target, ids, [1, 2])
    anchor, ok = torch.tensor([[1, 5, 9], [3, 12, 0]]), torch.tensor([[True, True, True], [True, True, False]])
    pos = (anchor[:, :, None] + torch.arange(bs)).clamp(max=13)
    block = torch.where(torch.arange(bs) == 0, ids.gather(1, anchor)[:, :, None], torch.full_like(pos, 62))
    with torch.no_grad():
        ctx = m.context_kv(feats[..., dim:], torch.arange(14))
        out = m(d.embed(block.view(2, -1)), pos.view(2, -1), ctx,
                dflash_train.block_mask(anchor, ok, 14, bs)).view(2, 3, bs, dim)
        for r, n in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]:
            a = int(anchor[r, n])
            alone = m(d.embed(block[r, n])[None], pos[r, n], m.context_kv(feats[r:r + 1, :a, dim:], torch.arange(a)))
            assert torch.allclose(out[r, n], alone[0], atol=1e-5), (r, n)


def test_loss_weights_decay_and_stats_count_positions(tiny_target):
    d = dflash_drafter(tiny_target, block_size=8)
    m = d.module.float().train()
    ids = torch.randint(1, 60, (2, 40))
    feats = target_feats(tiny_target, ids, [1, 2])
    valid = torch.ones(2, 40, dtype=torch.bool)
    loss, stats = dflash_train.dflash_loss(m, tiny_target.model.lm_head.weight, d.target_embed, ids, feats, valid, 0.0)
    assert loss.requires_grad and set(stats) == {f"top1_{k}" for k in range(1, 8)} | {"tau"}
    assert 1.0 <= stats["tau"] <= 8.0 and dflash_train.decay(16) == 7.0 and dflash_train.decay(8) == 4.0
    m.eval()  # held out: the same anchors every time
    assert dflash_train.dflash_loss(m, tiny_target.model.lm_head.weight, d.target_embed, ids, feats, valid, 0.0)[1] == \
        dflash_train.dflash_loss(m, tiny_target.model.lm_head.weight, d.target_embed, ids, feats, valid, 0.0)[1]


def test_layers_and_mask_token():
    assert dflash_layers(30) == [2, 8, 15, 22, 28]  # the reference's target_layer_ids 1..27, + 1 (embeddings row)
    assert dflash_layers(2) == [1, 2] and dflash_layers(4) == [2]

    class Tok:
        bos_token_id, eos_token_id, pad_token_id, all_special_ids = 1, 2, 2, [0, 1, 2, 7, 9]
    assert mask_token(Tok(), 64) == 9 and mask_token(object(), 64) == 63


def test_registry_entry_save_load_and_check(tmp_path, tiny_target):
    s = methods.spec("dflash")
    assert s.trained and s.chain and s.checkable and s.drafts == "tree" and s.grafts == ("lookup", "retrieve")
    d = dflash_drafter(tiny_target, torch.arange(0, 64, 2))
    drafters.save(tmp_path / "d", d.module, d.cfg, d.vocab_ids, "# card\n")
    eng = engines.build_trained(tmp_path / "d", tiny_target)
    assert isinstance(eng, TreeEngine) and isinstance(eng.proposer, DFlashProposer) and eng.method == "dflash"
    assert isinstance(engines.build_trained(tmp_path / "d", tiny_target, chain=True), DFlashEngine)
    assert drafters.describe(d.cfg).startswith("DFlash, 2 decoder layers drafting blocks of 4")
    cfg = DecodeConfig(method="dflash", max_new_tokens=20)
    assert engines.generate(eng, [3, 4], cfg).token_ids == \
        engines.generate(engines.build("ar", tiny_target), [3, 4], cfg).token_ids
    from specviz.check import run as check

    drafter, draft = check.drafter_for("dflash", tiny_target, str(tmp_path / "d"))
    assert isinstance(drafter, DFlashDrafter) and draft is None


def tiny_run(tmp_path, out: str, steps: int, max_new_tokens: int) -> train.TrainOptions:
    """A DFlash run on the tiny target: 24 prompts of 6 tokens, blocks of 4, one layer."""
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(" ".join(str((i * 7 + j) % 60 + 1) for j in range(6)) for i in range(24)))
    return train.TrainOptions(kind="dflash", out=tmp_path / out, target="tiny", data=str(data), steps=steps,
                              batch_tokens=512, lr=3e-3, draft_vocab=32, max_new_tokens=max_new_tokens,
                              eval_prompts=1, checkpoint_every=6, block_size=4, hidden_layers=1)


def test_training_smoke(tmp_path):
    """A few steps on tiny data: features cached, the loss falls, the drafter saved, measured and exact; resumed."""
    target = tiny_model(0)
    opts = tiny_run(tmp_path, "run", 12, 16)
    result = train.train(opts, log=lambda *_: None, target=target)
    assert sum(result.losses[-3:]) < sum(result.losses[:3])
    assert result.held_out["identical"] == "1/1"
    cfg, _ = drafters.read_layout(result.folder, target)
    assert (cfg.kind, cfg.block_size, cfg.num_hidden_layers, cfg.feature_layers) == ("dflash", 4, 1, [1, 2])
    opts.steps, opts.resume = 14, True
    assert len(train.train(opts, log=lambda *_: None, target=target).losses) == 2


def test_a_run_from_init_scores_the_init_first_and_its_snapshot_keeps_the_init_vocabulary(tmp_path):
    """--init: the held-out curve starts at step 0 with the init's own score (the weights kept as the best so far, so
    a run that only loses returns them), and dflash_snapshot --init rebuilds the folder in the init's layout and draft
    vocabulary, which the run kept, not a vocabulary re-chosen from the new data."""
    import json

    from specviz.train.dflash_snapshot import snapshot

    target = tiny_model(0)
    opts = tiny_run(tmp_path, "first", 6, 8)
    first = train.train(opts, log=lambda *_: None, target=target).folder
    other = tmp_path / "other.txt"  # other tokens: a vocabulary chosen from them differs from the init's
    other.write_text("\n".join(" ".join(str((i * 5 + j) % 30 + 31) for j in range(6)) for i in range(24)))
    lines: list[str] = []
    warm = replace(opts, out=tmp_path / "warm", data=str(other), init=first, steps=2, draft_vocab=None, lr=0.0)
    train.train(warm, log=lambda *a: lines.append(" ".join(map(str, a))), target=target)
    assert any(line.startswith("step 0: held-out top1_1") for line in lines), lines
    ckpt = torch.load(tmp_path / "warm" / "checkpoint.pt", weights_only=False)
    assert ckpt["best"][1] is not None  # at lr 0 the weights never move: step 0's score is the best, kept
    rows = tmp_path / "other.jsonl"
    rows.write_text("".join(json.dumps({"prompt_ids": [1, 2], "answer_ids": [(i * 5 + j) % 30 + 31 for j in range(6)]})
                            + "\n" for i in range(24)))
    dest = snapshot(tmp_path / "warm", [str(rows)], tmp_path / "snap", target, 4, 32, log=lambda *_: None, init=first)
    _, init_state = drafters.read_layout(first, target)
    cfg, state = drafters.read_layout(dest, target)
    assert torch.equal(state["vocab_ids"].long(), init_state["vocab_ids"].long())
    assert (cfg.block_size, cfg.num_hidden_layers) == (4, 1) and json.loads((dest / "config.json").read_text())[
        "training"]["init"] == str(first)


def test_a_block_drafter_runs_on_the_packed_matmul_beside_a_bf16_cpu_target(target_bf16, tmp_path):
    """DFlash is one of the small drafters (a block of rows through small matmuls): loaded beside a bf16 CPU target,
    every Linear of its module and its draft head run on specviz's packed matmul, and a block's drafts are the fp32
    module's at nearly every slot (drafts only propose: verification stays exact either way)."""
    from specviz.models import fused, kernels

    if not kernels.available():
        pytest.skip("no C compiler or no AVX2/FMA here: the drafters stay in fp32")
    t = target_bf16
    d = random_drafter(t, "dflash", torch.arange(4096), feature_layers=dflash_layers(t.model.config.num_hidden_layers),
                       block_size=8, num_hidden_layers=2, mask_token_id=mask_token(t.tokenizer, t.vocab_size))
    for p in d.module.parameters():  # weights of a drafter's scale, so bf16 and fp32 agree on the top token
        torch.nn.init.normal_(p, std=0.05)
    folder = tmp_path / f"{t.name}-dflash"
    drafters.save(folder, d.module.float(), d.cfg, d.vocab_ids.cpu(), "# a random DFlash drafter (test_dflash.py)\n")
    packed = drafters.load(folder, t)
    assert packed.dtype == torch.bfloat16 and packed.row_kernel and packed.head_packed is not None
    linears = [m for m in packed.module.modules() if isinstance(m, (torch.nn.Linear, kernels.RowLinear))]
    assert linears and all(isinstance(m, fused.PackedLinear) for m in linears)
    cfg, state = drafters.read_layout(folder, t)
    state.pop("vocab_ids", None)
    fp32 = drafters.build_module(cfg)
    load_into(fp32, state, "fp32 copy")
    ids = t.encode_prompt("Explain why the sky is blue in two sentences.")
    with torch.inference_mode():
        feats = torch.randn(1, len(ids), packed.feature_size)
        block = torch.full((cfg.block_size,), cfg.mask_token_id)
        block[0] = ids[-1]
        pos = torch.arange(len(ids), len(ids) + cfg.block_size)
        out = packed.module(packed.embed(block)[None], pos,
                            packed.module.context_kv(packed.inputs(feats), torch.arange(len(ids))))
        ref = fp32(packed.embed(block)[None].float(), pos,
                   fp32.context_kv(feats.to(torch.bfloat16).float(), torch.arange(len(ids))))
        ours = packed.logits(out[0, 1:]).float().argmax(-1)
        theirs = (ref[0, 1:] @ packed.head_weight.float().T).argmax(-1)
    assert int((ours == theirs).sum()) >= cfg.block_size - 2, (ours, theirs)


def test_the_c_block_drafts_what_the_module_drafts(target_bf16, tmp_path):
    """Beside a bf16 CPU target a DFlash drafter's step is two C calls (fused.FusedDFlash: the context's new rows, then
    the block with its norm and packed head): its logits are the torch module's on the same packed matmul to within
    the last bits (attend.c's attention, not torch's), step after step as the context grows and rolls back, and a
    greedy race through it is plain decoding's, token for token."""
    from specviz.engines.dflash import DFlashSession
    from specviz.models import fused, kernels

    if not kernels.available():
        pytest.skip("no C compiler or no AVX2/FMA here: the drafters stay in fp32")
    t = target_bf16
    d = random_drafter(t, "dflash", torch.arange(4096), feature_layers=dflash_layers(t.model.config.num_hidden_layers),
                       block_size=8, num_hidden_layers=2, mask_token_id=mask_token(t.tokenizer, t.vocab_size))
    for p in d.module.parameters():
        torch.nn.init.normal_(p, std=0.05)
    for name, p in d.module.named_parameters():  # norms of a trained drafter's scale, not one
        if name.endswith("norm.weight"):
            torch.nn.init.uniform_(p, 0.5, 1.5)
    folder = tmp_path / f"{t.name}-dflash"
    drafters.save(folder, d.module.float(), d.cfg, d.vocab_ids.cpu(), "# a random DFlash drafter (test_dflash.py)\n")
    packed = drafters.load(folder, t)
    assert isinstance(packed.fused, fused.FusedDFlash)
    ids = list(t.encode_prompt("Explain why the sky is blue in two sentences."))
    feats = torch.randn(len(ids) + 4, packed.feature_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    c, ref = (DFlashSession(packed, t.vocab_size, frozenset()) for _ in range(2))
    ref.fused = None  # the torch module's forward over its own (keys, values)
    assert c.fused is not None
    agree = slots = 0
    for n_valid, new in ((0, len(ids)), (len(ids), 3), (len(ids) + 1, 2)):  # a step that kept 3, a rollback, 2 more
        for s in (c, ref):
            s.rollback(n_valid)
            s.observe(feats[n_valid:n_valid + new])
        tokens = (ids + [5, 6, 7, 8])[:n_valid + new + 1]
        ours, theirs = c.block_logits(tokens), ref.block_logits(tokens)
        assert ours.shape == theirs.shape == (7, 4096)
        assert (ours - theirs).abs().max() <= 0.02 * theirs.abs().max(), (ours - theirs).abs().max()
        agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        slots += 7
    assert agree >= slots - 2, (agree, slots)
    eng = build(t, packed)
    cfg = DecodeConfig(method="dflash", max_new_tokens=24, gamma=7, tree="dynamic", tree_nodes=8)
    run = engines.generate(eng, ids, cfg)
    assert run.token_ids == engines.generate(engines.build("ar", t), ids, cfg).token_ids
