"""Trained drafters (EAGLE, Medusa, LayerSkip, the distilled draft model): greedy identity, save/load, published
layouts, training smoke test."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from tiny import random_drafter, tiny_model

from specviz import engines, methods
from specviz.cli.main import main
from specviz.config import DecodeConfig
from specviz.core import answers
from specviz.drafters import trained as drafters
from specviz.drafters.config import DrafterConfig, DrafterError
from specviz.drafters.modules import DraftLM, load_into
from specviz.engines.draft_model import DistilledDrafter
from specviz.engines.eagle import EagleDrafter, eagle_tree_engine
from specviz.engines.layerskip import LayerSkipEngine, SplitLM
from specviz.engines.medusa import medusa_engine
from specviz.events import Verdict
from specviz.models.loader import ModelError
from specviz.train import distill, features, losses
from specviz.train import loop as train


def engine_for(target, d: drafters.Drafter, tree: bool = False):
    if d.kind == "layerskip":
        return LayerSkipEngine(target, d)
    if d.kind == "medusa":
        return medusa_engine(target, d)
    if d.kind == "draft":
        return engines.SpeculativeEngine("draft", target, DistilledDrafter(d, "test"))
    if tree:
        return eagle_tree_engine(target, d)
    return engines.SpeculativeEngine("eagle", target, EagleDrafter(d, "test"))


@pytest.mark.parametrize("kind,extra,tree", [("eagle", {}, False), ("eagle", {}, True),
                                             ("medusa", {"medusa_heads": 3}, True),
                                             ("layerskip", {"exit_layer": 1}, False),
                                             ("draft", {"draft_layers": [0]}, False)])
@pytest.mark.parametrize("compressed", [False, True])
def test_greedy_identity_tiny(tiny_target, kind, extra, tree, compressed):
    vocab_ids = torch.arange(0, 64, 2) if compressed else None
    eng = engine_for(tiny_target, random_drafter(tiny_target, kind, vocab_ids, **extra), tree)
    ar = engines.build("ar", tiny_target)
    for prompt in ([1, 2, 3], [5, 9, 11, 13, 2], [7]):
        cfg = DecodeConfig(method=kind, max_new_tokens=30)
        run = engines.generate(eng, prompt, cfg)
        assert run.token_ids == engines.generate(ar, prompt, cfg).token_ids
        assert len(run.token_ids) <= 30


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_medusa_as_a_chain_is_exact(tiny_target, temperature):
    """Medusa drafting a chain (one draw per head, as the step-through view and the check run it): greedy output
    equals AR; sampled runs use every head and stay within the cap."""
    from specviz.engines.medusa import MedusaChainDrafter

    eng = engines.SpeculativeEngine("medusa", tiny_target, MedusaChainDrafter(
        random_drafter(tiny_target, "medusa", torch.arange(0, 64, 2), medusa_heads=3), "test"))
    cfg = DecodeConfig(method="medusa", max_new_tokens=30, temperature=temperature, gamma=3, seed=2)
    run = engines.generate(eng, [5, 9, 11, 13, 2], cfg)
    assert run.events[0].drafts == () and len(run.token_ids) <= 30  # the first step is the target's prefill
    assert max(len(e.drafts) for e in run.events) == 3
    if temperature == 0:
        assert run.token_ids == engines.generate(engines.build("ar", tiny_target), [5, 9, 11, 13, 2], cfg).token_ids


def test_medusa_event_carries_the_whole_tree(tiny_target):
    d = random_drafter(tiny_target, "medusa", medusa_heads=3)
    eng = medusa_engine(tiny_target, d, choices=[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])
    events = list(eng.steps([1, 2, 3], DecodeConfig(method="medusa", max_new_tokens=20)))
    assert events[0].drafts == ()  # the first step is the target's prefill
    tree_steps = [e for e in events[1:] if e.drafts]
    assert tree_steps
    assert any(len(e.drafts) == 5 for e in tree_steps)
    for e in tree_steps:  # near the length cap the tree is cut to the room left
        n = len(e.drafts)
        assert [(n.depth, n.rank) for n in e.drafts] == [(0, 0), (0, 1), (1, 0), (1, 0), (2, 0)][:n]
        assert [n.parent for n in e.drafts] == [-1, -1, 0, 1, 2][:n]
        assert all(n.head == n.depth for n in e.drafts)
        accepted = [n for n in e.drafts if n.verdict is Verdict.ACCEPTED]
        assert len(e.emitted) == len(accepted) + 1 or e.finish_reason
        # the accepted nodes form one root-to-node path
        for a, b in zip(accepted, accepted[1:]):
            assert e.drafts.index(a) == b.parent


def test_gamma_caps_the_tree_depth(tiny_target):
    d = random_drafter(tiny_target, "medusa", medusa_heads=3)
    eng = medusa_engine(tiny_target, d, choices=[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])
    for gamma, depth in ((1, 0), (2, 1), (4, 2)):
        events = list(eng.steps([1, 2, 3], DecodeConfig(method="medusa", max_new_tokens=20, gamma=gamma)))
        assert max(n.depth for e in events for n in e.drafts) == depth


def test_sampling_runs_and_respects_the_cap(tiny_target):
    for kind, extra, tree in (("eagle", {}, False), ("eagle", {}, True), ("medusa", {"medusa_heads": 3}, True),
                              ("layerskip", {"exit_layer": 1}, False), ("draft", {"draft_layers": [0]}, False)):
        eng = engine_for(tiny_target, random_drafter(tiny_target, kind, torch.arange(0, 64, 2), **extra), tree)
        run = engines.generate(eng, [1, 2, 3], DecodeConfig(method=kind, temperature=1.0, max_new_tokens=25, seed=3))
        assert len(run.token_ids) == 25 or run.events[-1].finish_reason == "eos"
        again = engines.generate(eng, [1, 2, 3], DecodeConfig(method=kind, temperature=1.0, max_new_tokens=25, seed=3))
        assert again.token_ids == run.token_ids  # the run's generator makes it reproducible


def test_save_load_round_trip(tmp_path, tiny_target):
    d = random_drafter(tiny_target, "eagle", torch.arange(0, 64, 2))
    drafters.save(tmp_path / "d", d.module, d.cfg, d.vocab_ids, "# card\n")
    back = drafters.load(tmp_path / "d", tiny_target)
    assert back.cfg == d.cfg and torch.equal(back.vocab_ids, d.vocab_ids)
    f, e = torch.randn(1, 5, 32), torch.randn(1, 5, 32)
    pos = torch.arange(5)
    # weights are stored in fp16
    assert torch.allclose(back.module(f, e, pos)[0], d.module(f, e, pos)[0], atol=0.05)
    assert (tmp_path / "d" / "README.md").read_text() == "# card\n"


def test_missing_drafter_is_one_line(tmp_path, tiny_target):
    with pytest.raises(ModelError, match="has no config.json: train one"):
        drafters.load(tmp_path, tiny_target)


def test_medusa1_layout_loads(tmp_path, tiny_target):
    """A checkpoint in FasterDecoding/Medusa's layout: config medusa_num_heads, medusa_lm_head.pt with
    {k}.0.linear.* (the ResBlock) and {k}.1.weight (each head's own LM head)."""
    torch.manual_seed(0)
    state = {}
    for k in range(2):
        state[f"{k}.0.linear.weight"] = torch.randn(32, 32) * 0.1
        state[f"{k}.0.linear.bias"] = torch.zeros(32)
        state[f"{k}.1.weight"] = torch.randn(64, 32)
    torch.save(state, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                       "base_model_name_or_path": "tiny"}))
    d = drafters.load(tmp_path, tiny_target)
    assert d.kind == "medusa" and d.cfg.own_lm_heads and d.cfg.medusa_heads == 2
    x = torch.randn(32)
    expected = state["1.1.weight"] @ (x + torch.nn.functional.silu(state["1.0.linear.weight"] @ x))
    assert torch.allclose(d.logits(d.module(x[None])[1, 0], head=1), expected, atol=1e-4)
    cfg = DecodeConfig(method="medusa", max_new_tokens=20)
    run = engines.generate(medusa_engine(tiny_target, d), [4, 5, 6], cfg)
    assert run.token_ids == engines.generate(engines.build("ar", tiny_target), [4, 5, 6], cfg).token_ids


def test_eagle1_layout_loads(tmp_path, tiny_target):
    """A checkpoint in yuhuili/EAGLE's layout: a llama config.json and pytorch_model.bin with fc.*,
    layers.0.* (no input norm on the first layer) and embed_tokens (ignored: the target's are used)."""
    ours = random_drafter(tiny_target, "eagle", input_norm=False)
    state = {k: v.clone() for k, v in ours.module.state_dict().items()}
    state["embed_tokens.weight"] = torch.randn(64, 32)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 32,
                                                       "num_attention_heads": 4, "num_key_value_heads": 2,
                                                       "intermediate_size": 64, "rms_norm_eps": 1e-6}))
    d = drafters.load(tmp_path, tiny_target)
    assert d.kind == "eagle" and not d.cfg.input_norm
    f, e = torch.randn(1, 4, 32), torch.randn(1, 4, 32)
    assert torch.allclose(d.module(f, e, torch.arange(4))[0], ours.module(f, e, torch.arange(4))[0], atol=1e-5)


def test_pickled_code_is_refused(tmp_path, tiny_target):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 1}))
    with open(tmp_path / "medusa_lm_head.pt", "wb") as f:
        pickle.dump({"0.0.linear.weight": Evil()}, f)
    with pytest.raises(ModelError, match="refused"):
        drafters.load(tmp_path, tiny_target)


def test_draft_model_copied_from_every_target_layer_is_the_target(tiny_target):
    """A draft model started from all of the target's layers (full vocabulary) computes the target itself:
    its layers, RoPE and incremental KV cache match transformers', so every greedy draft is accepted."""
    cfg = DrafterConfig.for_target("draft", tiny_target.name, tiny_target.model.config, 0, draft_layers=[0, 1])
    d = drafters.Drafter(DraftLM.from_target(cfg, tiny_target.model), cfg, tiny_target.model, None)
    eng = engine_for(tiny_target, d)
    run = engines.generate(eng, [5, 9, 11, 13, 2], DecodeConfig(method="draft", max_new_tokens=40, gamma=4))
    judged = [t.verdict for e in run.events for t in e.drafts]
    assert len(judged) > 20 and set(judged) == {Verdict.ACCEPTED}
    assert run.token_ids == engines.generate(engines.build("ar", tiny_target), [5, 9, 11, 13, 2],
                                             DecodeConfig(max_new_tokens=40)).token_ids


def test_choose_tree_grows_from_the_root():
    acc = torch.tensor([[0.8, 0.1, 0.05], [0.6, 0.2, 0.1], [0.5, 0.2, 0.1]])
    tree = drafters.choose_tree(acc, 5)
    assert tree[:3] == [(0,), (1,), (0, 0)] and len(tree) == 5
    assert all(p[:-1] in tree for p in tree if len(p) > 1)


def test_tree_for_cost_follows_the_profile():
    """The tree size trades expected tokens for verification cost: with flat verification (T(k) = T(1)) a bigger
    tree pays; when each extra token costs a full step, a single node does; the expectation is the sum of path
    products."""
    acc = torch.tensor([[0.7, 0.15, 0.05], [0.6, 0.15, 0.05], [0.5, 0.1, 0.05], [0.5, 0.1, 0.05]])
    flat, _, _ = drafters.tree_for_cost(acc, lambda n: 1.0, 0.0, max_size=12)
    steep, tokens, speed = drafters.tree_for_cost(acc, lambda n: float(n), 0.0, max_size=12)
    assert len(flat) == 12 and steep == [(0,)]
    assert tokens == pytest.approx(1.7) and speed == pytest.approx(1.7 / 2)
    assert drafters.path_value(acc, (0, 1)) == pytest.approx(0.7 * 0.15)
    mid, _, _ = drafters.tree_for_cost(acc, lambda n: 1.0 + 0.05 * (n - 1), 0.1, max_size=12)
    assert 1 < len(mid) < 12 and all(p[:-1] in mid for p in mid if len(p) > 1)
    # Medusa pays its heads once per step, whatever the depth: the same prediction, one fixed cost added
    once, tokens, speed = drafters.tree_for_cost(acc, lambda n: float(n), 0.0, max_size=12, step_cost=0.5)
    assert once == [(0,)] and speed == pytest.approx(1.7 / 2.5)
    deep, _, _ = drafters.tree_for_cost(acc, lambda n: 1.0, 0.0, max_size=12, step_cost=0.5)
    assert max(len(p) for p in deep) == 4  # no per-level cost: depth is free


@pytest.mark.parametrize("bf16", [False, True])
def test_head_kl_is_the_kl_of_the_logits_and_its_gradient(monkeypatch, bf16):
    """losses.head_kl, computed a block of rows at a time with its gradient taken in the same pass, gives the
    masked mean KL(softmax(true @ head.T) || softmax(pred @ head.T)), its gradient, and the top tokens, as the
    whole-tensor formula does (in bf16 autocast its matmuls round: then only close)."""
    monkeypatch.setattr(losses, "HEAD_BLOCK", 7)  # several blocks and a ragged last one
    gen = torch.Generator().manual_seed(0)
    head = torch.randn(50, 16, generator=gen)
    true = torch.randn(3, 11, 16, generator=gen)
    mask = torch.rand(3, 11, generator=gen) > 0.3
    pred = torch.randn(3, 11, 16, generator=gen, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        kl, t_top, p_top = losses.head_kl(pred, true, head, mask, ranks=3)
    grad, = torch.autograd.grad(kl * 2.5, pred)
    ref_pred = pred.detach().clone().requires_grad_()
    t_logits, p_logits = (true[mask] @ head.T).double(), (ref_pred[mask] @ head.T).double()
    ref = (t_logits.softmax(-1) * (t_logits.log_softmax(-1) - p_logits.log_softmax(-1))).sum(-1).mean()
    ref_grad, = torch.autograd.grad(ref * 2.5, ref_pred)
    tol = dict(rtol=0.05, atol=0.02) if bf16 else dict(rtol=1e-5, atol=1e-6)
    assert float(kl) == pytest.approx(float(ref), rel=tol["rtol"], abs=tol["atol"])
    torch.testing.assert_close(grad, ref_grad.float(), **tol)
    assert grad[~mask].abs().max() == 0  # unscored rows get no gradient
    if not bf16:
        assert t_top.tolist() == t_logits.argmax(-1).tolist()
        assert p_top.tolist() == p_logits.topk(3, -1).indices.tolist()


def test_training_batches_hold_sequences_of_like_length():
    """A training batch is a window of sequences of similar length around a random one, padded tokens within
    the budget (a batch pads to its longest sequence), so little of it is padding; every sequence comes up."""
    lengths = [100, 400, 105, 390, 107, 410, 103, 106, 395, 101] * 4
    seqs = [[i] * n for i, n in enumerate(lengths)]
    batches = features.Batches(seqs, torch.zeros(sum(lengths), 2), 820, seed=0)
    picked, fill = set(), []
    for _ in range(300):
        ids, _, valid = batches.sample()
        assert valid.numel() <= 820
        fill.append(float(valid.float().mean()))
        picked.update(ids[:, 0].tolist())
    assert picked == set(range(len(seqs))) and sum(fill) / len(fill) > 0.9
    ids, _, valid = features.Batches(seqs, torch.zeros(sum(lengths), 2), 10**9, 0).sample(shuffle=False)
    assert ids[:, 0].tolist() == list(range(len(seqs)))  # held-out: all of them, in order


def test_a_kind_trained_on_answers_scores_no_prompt_row():
    """DFlash trains on answers only (methods: answers_only): the prompt rows stay in the batch as context, with
    their features, but none is valid, so no block is anchored or scored in a templated prompt."""
    seqs = [[1] * 10, [2] * 7]
    feats = torch.arange(17.0)[:, None]
    ids, f, valid = features.Batches(seqs, feats, 100, 0, starts=[4, 6]).sample(shuffle=False)
    assert valid.tolist() == [[False] * 4 + [True] * 6, [False] * 6 + [True] + [False] * 3]
    assert f[0, :, 0].tolist() == list(range(10)) and ids[1, :7].tolist() == [2] * 7
    assert methods.spec("dflash").answers_only and not methods.spec("eagle").answers_only


@pytest.mark.parametrize("kind", ["eagle", "medusa", "layerskip", "draft"])
def test_training_smoke(tmp_path, kind):
    """A few steps on tiny data: the target answers the prompts, features are cached, the loss falls,
    the drafter is saved, measured on held-out prompts and still exact; then resume continues."""
    target = tiny_model(0)
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(" ".join(str((i * 7 + j) % 60 + 1) for j in range(6)) for i in range(24)))
    opts = train.TrainOptions(kind=kind, out=tmp_path / "run", target="tiny", data=str(data), steps=12,
                              batch_tokens=512, lr=3e-3, draft_vocab=32, medusa_heads=2, max_new_tokens=16,
                              exit_layer=1, draft_layers=(0,), eval_prompts=1, checkpoint_every=6)
    result = train.train(opts, log=lambda *_: None, target=target)
    assert sum(result.losses[-3:]) < sum(result.losses[:3])
    assert result.held_out["identical"] == "1/1"
    assert (result.folder / "model.safetensors").is_file() and "Reproduce" in (result.folder / "README.md").read_text()
    assert (tmp_path / "run" / "data.jsonl").is_file() and (tmp_path / "run" / "features.f16").is_file()
    # your own data: its answers are the drafter's datastore, which serves --retrieve where the target has none
    answer_ids = [e["answer_ids"] for e in answers.read_examples(tmp_path / "run" / "data.jsonl")]
    assert len(drafters.load(result.folder, target).datastore) == sum(map(len, answer_ids))
    if kind == "medusa":
        cfg = DecodeConfig(method=kind, max_new_tokens=24, retrieve=4)
        run = engines.generate(engines.build_trained(result.folder, target), [7, 8, 9], cfg)
        ar = engines.generate(engines.build("ar", target), [7, 8, 9], DecodeConfig(method="ar", max_new_tokens=24))
        assert run.token_ids == ar.token_ids
    opts.steps, opts.resume = 14, True
    resumed = train.train(opts, log=lambda *_: None, target=target)
    assert len(resumed.losses) == 2  # continued from step 12
    # --init: a new run goes on from the trained drafter, in its layout and vocabulary (the layout options given
    # are ignored), and starts where that one ended rather than from scratch
    warm = dataclasses.replace(opts, out=tmp_path / "warm", init=result.folder, resume=False, steps=2, draft_vocab=None,
                               medusa_heads=3, exit_layer=2, draft_layers=(0, 1))
    warmed = train.train(warm, log=lambda *_: None, target=target)
    assert warmed.losses[0] < result.losses[0]
    assert drafters.read_layout(warmed.folder, target)[1]["vocab_ids"].tolist() == \
        drafters.read_layout(result.folder, target)[1]["vocab_ids"].tolist()
    assert f"--init {result.folder}" in (warmed.folder / "README.md").read_text()
    # --init with another --draft-vocab: the same weights read other rows of the target's head, the N most
    # frequent tokens of the data, and the run still decodes exactly
    wider = train.train(dataclasses.replace(warm, out=tmp_path / "wider", draft_vocab=48), log=lambda *_: None,
                        target=target)
    cfg, state = drafters.read_layout(wider.folder, target)
    seqs = list(distill.sequences(distill.split(answers.read_examples(tmp_path / "run" / "data.jsonl"))[0]))
    assert cfg.draft_vocab == 48 and state["vocab_ids"].tolist() == drafters.frequent_vocab(seqs, 64, 48).tolist()
    assert wider.held_out["identical"] == "1/1" and "--draft-vocab 48" in (wider.folder / "README.md").read_text()
    other = "draft" if kind != "draft" else "eagle"
    with pytest.raises(DrafterError, match=f"is a {kind} drafter: train {kind} from it"):
        train.train(dataclasses.replace(warm, kind=other, out=tmp_path / "other"), log=lambda *_: None, target=target)


def test_training_takes_generated_ids_and_prompts_together(tmp_path):
    """--data mixes files: self-distillation ids are used as they are, prompts are answered by the target."""
    target = tiny_model(0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(" ".join(str((i * 5 + j) % 60 + 1) for j in range(5)) for i in range(20)))
    ids = tmp_path / "ids.jsonl"
    ids.write_text("\n".join(json.dumps({"i": i, "prompt_ids": [1 + i % 50, 2, 3], "answer_ids": [4, 5, 6, 7]})
                             for i in range(40)) + "\n")
    assert answers.is_example_file(ids) and not answers.is_example_file(prompts)
    opts = train.TrainOptions(kind="draft", out=tmp_path / "run", target="tiny", data=(str(ids), str(prompts)), steps=2,
                              batch_tokens=256, draft_vocab=0, max_new_tokens=8, draft_layers=(0,), eval_prompts=1)
    examples = train.examples_for(opts, target, lambda *_: None)
    assert len(examples) == 60 and sum(e["answer_ids"] == [4, 5, 6, 7] for e in examples) >= 40
    assert len(answers.read_examples(tmp_path / "run" / "data.jsonl")) == 20  # only the prompts were answered
    card = train.card(DrafterConfig.for_target("draft", "tiny", target.model.config), opts)
    assert f"--data {ids} {prompts}" in card


def test_train_cli_rejects_bad_values(capsys, tmp_path):
    assert main(["train", "eagle", "--out", str(tmp_path), "--steps", "0"]) == 2
    assert "steps=0 is out of range" in capsys.readouterr().err
    assert main(["train", "medusa", "--out", str(tmp_path), "--data", str(tmp_path / "nope.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["train", "draft", "--out", str(tmp_path), "--draft-layers", "0,x"]) == 2
    assert "draft-layers='0,x' is not a list of layer indices" in capsys.readouterr().err
    assert main(["train", "eagle", "--out", str(tmp_path), "--init", str(tmp_path / "none")]) == 2
    assert "is not a drafter folder (no config.json)" in capsys.readouterr().err


SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "drafters"


@pytest.mark.parametrize("kind", ["eagle", "medusa", "layerskip", "draft"])
def test_shipped_drafter_greedy_identity_real_target(target, kind):
    """The shipped drafters on the real default target: identical to AR and actually accepting drafts."""
    assert (SHIPPED / f"smollm2-135m-{kind}" / "model.safetensors").is_file()
    eng = engines.build(kind, target)
    ar = engines.build("ar", target)
    prompts = ["Explain how a rainbow forms.", "Write a Python function that returns the largest of three numbers."]
    tokens = steps = 0
    for prompt in prompts:
        ids = target.encode_prompt(prompt)
        cfg = DecodeConfig(method=kind, max_new_tokens=48)
        run = engines.generate(eng, ids, cfg)
        assert run.token_ids == engines.generate(ar, ids, cfg).token_ids
        tokens, steps = tokens + len(run.token_ids), steps + len(run.events)
    # it drafts tokens the target accepts: at least one step in ten gains a token (Medusa's shipped 2-node tree
    # gains at most one per step, and measured 1.16 tokens per step here)
    assert tokens / steps > 1.1


def test_eagle_tree_top_path_equals_the_chain(tiny_target):
    """The level-by-level tree expansion (masks, positions, KV) drafts, along its all-rank-0 path, exactly
    the tokens the chain drafter drafts one by one."""
    from specviz.core.cache import CachedLM
    from specviz.core.trees import Tree
    from specviz.engines.eagle import EagleProposer

    d = random_drafter(tiny_target, "eagle", torch.arange(0, 64, 2), seed=4)
    tokens = [3, 8, 13, 21, 34, 55, 2, 7]
    _, hidden = CachedLM(tiny_target.model, tiny_target.device).logits(tokens[:-1], keep=1, features=True)
    cfg = DecodeConfig(method="eagle")
    chain = EagleDrafter(d, "t").session(64, frozenset())
    chain.observe(hidden)
    proposal = chain.propose(tokens, 4, cfg, torch.Generator())
    tree_state = EagleProposer(d).start(64, frozenset())
    tree_state.observe(hidden)
    tree = Tree.from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0), (1, 0, 0)])
    prop = EagleProposer(d).propose(tree_state, tokens, tree, cfg, 10, torch.Generator())
    top_path = [prop.node_tokens[prop.tree.paths.index((0,) * k)] for k in range(1, 5)]
    assert top_path == proposal.token_ids
    assert tree_state.kv_len == chain.kv_len == len(tokens) - 1  # drafted pairs never stay in the cache


def test_split_forward_equals_the_full_model(tiny_target):
    """LayerSkip's two halves over one cache (early layers while drafting, late layers at verification,
    a crop after a rejection) give the full model's logits."""
    from specviz.core.cache import CachedLM

    tokens = [3, 8, 13, 21, 34, 55, 2, 7, 9, 11]
    lm = SplitLM(tiny_target.model, tiny_target.device, 1)
    lm.logits(tokens[:5])
    lm.early(tokens[:6])
    lm.early(tokens[:7])  # two drafted positions through the first layer only
    split = lm.logits(tokens[:7], tokens[7:9], keep=4)
    full = CachedLM(tiny_target.model, tiny_target.device).logits(tokens[:9], keep=4)
    assert torch.allclose(split, full, atol=1e-4)
    lm.rollback(6)  # a rejection: every layer back to 6 positions
    again = lm.logits(tokens[:6], tokens[6:8], keep=2)
    assert torch.allclose(again, CachedLM(tiny_target.model, tiny_target.device).logits(tokens[:8], keep=2), atol=1e-4)


def test_split_forward_runs_the_prompts_late_layers_alone(tiny_target):
    """As plain decoding does: the prompt's late layers in a forward of their own, then the drafts' (on AMX CPUs
    a forward past 32 rows takes other bf16 kernels, so prompt and drafts in one forward changed the prompt's
    keys' bits, and 2 of 48 Spec-Bench answers differed from AR)."""
    from specviz.core.cache import CachedLM

    tokens = [3, 8, 13, 21, 34, 55, 2, 7, 9, 11]
    lm = SplitLM(tiny_target.model, tiny_target.device, 1)
    calls, layers = [], lm._layers
    lm._layers = lambda hidden, start, which: (calls.append((which[0], start, hidden.shape[1]))
                                               or layers(hidden, start, which))
    lm.early(tokens[:6])  # the prompt, then two drafts through the first layer only
    lm.early(tokens[:7])
    split = lm.logits(tokens[:6], tokens[6:8], keep=3)
    assert [c for c in calls if c[0] == 1] == [(1, 0, 6), (1, 6, 2)]
    assert torch.allclose(split, CachedLM(tiny_target.model, tiny_target.device).logits(tokens[:8], keep=3), atol=1e-4)


def test_exit_features_are_the_early_hidden_states(tmp_path, tiny_target):
    """What layerskip trains on: the hidden state after L layers, as the full model computes it."""
    ex = [{"i": 0, "prompt_ids": [3, 8, 13], "answer_ids": [21, 34, 55, 2]}]
    feats = features.exit_features_for(ex, tiny_target, 1, tmp_path / "x.pt", lambda *_: None)
    with torch.no_grad():
        ref = tiny_target.model.get_decoder()(input_ids=torch.tensor([[3, 8, 13, 21, 34, 55, 2]]),
                                             output_hidden_states=True).hidden_states[1][0]
    assert torch.allclose(feats.float(), ref, atol=1e-2)


@pytest.mark.parametrize("kind", ["eagle", "medusa", "layerskip", "draft"])
def test_step_through_takes_the_shipped_chain_drafters(target, kind):
    """The step-through view runs chain cycles, even for Medusa and for EAGLE whose shipped config drafts a tree."""
    from specviz.ui import teach

    cfg = DecodeConfig(method=kind, max_new_tokens=16)
    session = teach.start("Name three colours.", cfg, target, None)
    views = teach.run_to_end(session)
    assert views and session.finished
    ar = engines.generate(engines.build("ar", target), target.encode_prompt("Name three colours."), cfg)
    assert session.token_ids == ar.token_ids


def test_fused_features_are_the_hidden_states_of_those_layers(tiny_target):
    """CachedLM.logits with a tuple of layers returns those hidden states of every fed position, side by side
    (what EAGLE-3 reads), the same as one full forward computes, and none for a padding row."""
    from specviz.core.cache import CachedLM

    lm = CachedLM(tiny_target.model, tiny_target.device, pad_one_row=True)
    seq = [5, 9, 11, 13, 2, 7]
    _, first = lm.logits(seq[:4], features=(1, 0))
    _, second = lm.logits(seq[:5], features=(1, 0))  # one token: padded, the padding row's states dropped
    assert first.shape == (4, 64) and second.shape == (1, 64)
    full = tiny_target.model.get_decoder()(input_ids=torch.tensor([seq[:5]]), output_hidden_states=True).hidden_states
    expected = torch.cat([full[1][0], full[0][0]], -1)
    assert torch.allclose(torch.cat([first, second]), expected, atol=1e-5)


@pytest.mark.parametrize("tokens", [10, 2048])
def test_feature_pass_batches_sequences_without_changing_them(tmp_path, tiny_target, monkeypatch, tokens):
    """features.features_for runs sequences of similar length together, right-padded, up to FEATURE_TOKENS padded
    tokens a forward: each sequence's rows are still those of its own forward, in the data's order ([final |
    the fused layers])."""
    monkeypatch.setattr(features, "FEATURE_TOKENS", tokens)
    examples = [{"prompt_ids": [3 + i, 5, 7][: 1 + i % 3], "answer_ids": [9, 11 + i, 4][: 1 + (i * 2) % 3]}
                for i in range(11)]  # lengths 2..6, two batches
    feats, seqs = features.features_for(examples, tiny_target, tmp_path / "f.f16", lambda *_: None, layers=(1, 0))
    decoder = tiny_target.model.get_decoder()
    expected = []
    for seq in seqs:
        out = decoder(input_ids=torch.tensor([seq]), output_hidden_states=True)
        expected.append(torch.cat([out.last_hidden_state[0], out.hidden_states[1][0], out.hidden_states[0][0]], -1))
    torch.testing.assert_close(feats.float(), torch.cat(expected).to(torch.float16).float(), atol=2e-3, rtol=2e-3)


def test_feature_pass_resumes_after_a_kill_and_is_reused(tmp_path, tiny_target, monkeypatch):
    """The features file is memory-mapped and its .json records the groups done: a pass killed part-way redoes only
    the groups after the last record, a finished one is reused as it is, and other layers start over."""
    monkeypatch.setattr(features, "FEATURE_TOKENS", 10)
    examples = [{"prompt_ids": [3 + i, 5, 7][: 1 + i % 3], "answer_ids": [9, 11 + i, 4][: 1 + (i * 2) % 3]}
                for i in range(11)]
    path, logs = tmp_path / "f.f16", []
    full, seqs = features.features_for(examples, tiny_target, path, logs.append, layers=(1,))
    expected, meta = full.clone(), json.loads((tmp_path / "f.f16.json").read_text())
    assert meta["done"] > 2 and path.stat().st_size == meta["rows"] * meta["width"] * 2
    del full
    kept = torch.from_file(str(path), shared=True, size=expected.numel(), dtype=torch.float16).view(expected.shape)
    kept[:] = float("nan")  # as if the rows were never written; the record says the first 2 groups were done
    del kept
    (tmp_path / "f.f16.json").write_text(json.dumps({**meta, "done": 2}))
    forwards = []
    hook = tiny_target.model.get_decoder().register_forward_hook(lambda *_: forwards.append(1))
    try:
        resumed, _ = features.features_for(examples, tiny_target, path, logs.append, layers=(1,))
    finally:
        hook.remove()
    assert logs[-1] == f"features: resuming {path} after 2 of {meta['done']} groups of sequences"
    assert len(forwards) == meta["done"] - 2  # only the groups after the record ran
    kept_rows = resumed.isnan().all(-1)  # the 2 done groups' rows are left as the file holds them
    assert 0 < int(kept_rows.sum()) < len(resumed) // 2
    torch.testing.assert_close(resumed[~kept_rows], expected[~kept_rows], rtol=0, atol=0)
    reused, _ = features.features_for(examples, tiny_target, path, logs.append, layers=(1,))
    assert logs[-1] == f"features: reusing {path}"
    torch.testing.assert_close(reused, resumed, rtol=0, atol=0, equal_nan=True)  # the file as it is
    other, _ = features.features_for(examples, tiny_target, path, logs.append, layers=(0,))
    assert len(logs) == 2 and other.shape == expected.shape and not other.isnan().any()  # computed afresh
    assert not torch.equal(other, expected)


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("compressed", [False, True])
def test_eagle3_greedy_identity_tiny(tiny_target, tree, compressed):
    """EAGLE-3 (fused features from two layers, its own norm) drafts chains and trees; greedy output is AR's."""
    vocab_ids = torch.arange(0, 64, 2) if compressed else None
    d = random_drafter(tiny_target, "eagle", vocab_ids, feature_layers=[1, 0, 1])
    assert d.features == (1, 0, 1) and d.feature_size == 96
    eng = engine_for(tiny_target, d, tree)
    ar = engines.build("ar", tiny_target)
    for prompt in ([1, 2, 3], [5, 9, 11, 13, 2]):
        cfg = DecodeConfig(method="eagle", max_new_tokens=30)
        run = engines.generate(eng, prompt, cfg)
        assert run.token_ids == engines.generate(ar, prompt, cfg).token_ids


def test_eagle3_layout_loads(tmp_path, tiny_target):
    """A checkpoint in EAGLE-3's published layout: fc over three concatenated target features, midlayer.* (with
    hidden_norm; attention 2d wide), norm, its own lm_head over a draft vocabulary, d2t/t2d maps, embed_tokens
    (ignored). It drafts with exactly those weights: the head's row r scores target token r + d2t[r]."""
    cfg = DrafterConfig.for_target("eagle", tiny_target.name, tiny_target.model.config, 16,
                                            feature_layers=[1, 1, 0], own_lm_head=True)
    torch.manual_seed(3)
    ours = drafters.build_module(cfg)
    state = {k: torch.randn_like(v) * 0.3 for k, v in ours.state_dict().items()}
    assert state["midlayer.self_attn.q_proj.weight"].shape == (32, 64) and state["fc.weight"].shape == (32, 96)
    draft_to_target = torch.arange(0, 64, 4)  # 16 draft tokens
    state["d2t"] = draft_to_target - torch.arange(16)
    state["t2d"] = torch.isin(torch.arange(64), draft_to_target)
    state["embed_tokens.weight"] = torch.randn(64, 32)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 64, "rms_norm_eps": 1e-6, "draft_vocab_size": 16,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 1, 0]}}))
    d = drafters.load(tmp_path, tiny_target)
    assert d.kind == "eagle" and d.cfg.feature_layers == [1, 1, 0] and d.cfg.draft_vocab == 16
    assert torch.equal(d.vocab_ids.cpu(), draft_to_target)
    h = torch.randn(3, 32)
    rms = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * state["norm.weight"]
    assert torch.allclose(d.logits(h), rms @ state["lm_head.weight"].T, atol=1e-4)
    ours.load_state_dict({k: v for k, v in state.items() if k in ours.state_dict()})
    f, e = torch.randn(1, 4, 96), torch.randn(1, 4, 32)
    assert torch.allclose(d.module(d.module.lift(f), e, torch.arange(4))[0], ours(ours.lift(f), e, torch.arange(4))[0],
                          atol=1e-5)
    cfg = DecodeConfig(method="eagle", max_new_tokens=20)
    run = engines.generate(engine_for(tiny_target, d), [4, 5, 6], cfg)
    assert run.token_ids == engines.generate(engines.build("ar", tiny_target), [4, 5, 6], cfg).token_ids
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 32, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}}))
    with pytest.raises(DrafterError, match="has 2 layers"):
        drafters.load(tmp_path, tiny_target)
    with pytest.raises(DrafterError,
                       match="has its own LM head over 16 tokens, so draft-vocab=8 cannot apply"):
        train.rechoose_vocab(d.cfg, train.TrainOptions(init=tmp_path, draft_vocab=8), [[1, 2]], 64, print)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_tree_command_rechooses_tree(tmp_path, monkeypatch, capsys, kind):
    """`python -m specviz tree DRAFTER --write`: a trained Medusa or EAGLE drafter's tree re-chosen from its held-out
    accuracy (per head, per draft depth) and a verify profile, saved in config.json and the card; the drafter still
    loads and decodes exactly. Where each verified token costs a whole step, one node is best."""
    from specviz import metrics
    from specviz.cli.main import main

    target = tiny_model(0)
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(" ".join(str((i * 7 + j) % 60 + 1) for j in range(6)) for i in range(48)))
    opts = train.TrainOptions(kind=kind, out=tmp_path / "run", target="tiny", data=str(data), steps=6,
                              batch_tokens=512, lr=3e-3, draft_vocab=32, medusa_heads=2, max_new_tokens=16,
                              eval_prompts=1, checkpoint_every=6, tree_size=6)
    folder = train.train(opts, log=lambda *_: None, target=target).folder
    from dataclasses import asdict

    from specviz.models import loader as models

    def profile_file(name, profile, cost, target_name="tiny"):  # as `python -m specviz profile --json` writes it
        path = tmp_path / name
        path.write_text(json.dumps({"target": target_name, "profile": asdict(profile),
                                    "costs": [{"method": kind, "c": cost}]}))
        return str(path)

    flat = metrics.CostProfile("cpu", "float32", "sdpa", 8, 1, [1, 32], [1.0, 1.0], [1.0, 1.0])
    monkeypatch.setattr(models, "get", lambda *a, **k: target)  # the tiny target, not a hub model
    data_args = ["--data", str(tmp_path / "run" / "data.jsonl"), "--held-out", "4", "--write"]
    assert main(["tree", str(folder), *data_args, "--profile", profile_file("flat.json", flat, 0.0)]) == 0
    assert len(drafters.load(folder, target).cfg.tree) > 1  # where verifying more tokens costs nothing: a tree
    steep = metrics.CostProfile("cpu", "float32", "sdpa", 8, 1, [1, 2, 8], [1.0, 2.0, 8.0], [1.0, 2.0, 8.0])
    steep_file = profile_file("steep.json", steep, 0.1)
    assert main(["tree", str(folder), *data_args, "--profile", steep_file]) == 0
    d = drafters.load(folder, target)
    assert len(d.cfg.tree) == 1 and d.cfg.training["tree_choice"]["nodes"] == 1
    assert d.cfg.training["tree_choice"]["profile"] == steep_file
    assert f"--profile {steep_file}" in (folder / "README.md").read_text()
    # a profile that is not one, or another target's: one line, and the drafter is left as it was
    config = (folder / "config.json").read_text()
    assert main(["tree", str(folder), *data_args, "--profile", str(tmp_path / "run" / "data.jsonl")]) == 2
    assert "is not a verify profile written by `python -m specviz profile --json`" in capsys.readouterr().err
    other = profile_file("other.json", flat, 0.0, "smollm2-135m")
    assert main(["tree", str(folder), *data_args, "--profile", other]) == 2
    assert "was measured on target 'smollm2-135m', not on the drafter's target 'tiny'" in capsys.readouterr().err
    assert (folder / "config.json").read_text() == config
    accuracy = d.cfg.training["head_rank_accuracy_held_out" if kind == "medusa" else "depth_rank_accuracy_held_out"]
    assert len(accuracy) == 2 if kind == "medusa" else len(accuracy) >= 1
    assert "Tree re-chosen without retraining" in (folder / "README.md").read_text()
    spec, ar = engines.build_trained(folder, target), engines.build("ar", target)
    cfg = DecodeConfig(method=kind, max_new_tokens=12)
    assert engines.generate(spec, [5, 6, 7], cfg).token_ids == engines.generate(ar, [5, 6, 7], cfg).token_ids
    # not a drafter folder: one line
    assert main(["tree", str(folder.parent), "--held-out", "4"]) == 2
    assert "not a drafter trained here" in capsys.readouterr().err



def test_tree_write_replaces_only_its_line_of_the_model_card(tmp_path, monkeypatch, capsys):
    """`tree --write` rewrites the card's one "Tree re-chosen without retraining" line and keeps every other line: it
    cut everything after that line (a copy of the shipped EAGLE card went from 105 lines to 57). A tree that comes out
    as it was is called unchanged, not "3 nodes instead of 3"."""
    from specviz import metrics
    from specviz.models import loader as models
    from specviz.paths import DRAFTERS
    from specviz.train.retree import CARD_LINE

    target = tiny_model(0)
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(" ".join(str((i * 7 + j) % 60 + 1) for j in range(6)) for i in range(48)))
    opts = train.TrainOptions(kind="eagle", out=tmp_path / "run", target="tiny", data=str(data), steps=6,
                              batch_tokens=512, lr=3e-3, draft_vocab=32, max_new_tokens=16, eval_prompts=1,
                              checkpoint_every=6, tree_size=6)
    folder = train.train(opts, log=lambda *_: None, target=target).folder
    flat = metrics.CostProfile("cpu", "float32", "sdpa", 8, 1, [1, 32], [1.0, 1.0], [1.0, 1.0])
    profile = tmp_path / "flat.json"
    profile.write_text(json.dumps({"target": "tiny", "profile": dataclasses.asdict(flat),
                                   "costs": [{"method": "eagle", "c": 0.0}]}))
    monkeypatch.setattr(models, "get", lambda *a, **k: target)
    card = (DRAFTERS / "smollm2-135m-eagle" / "README.md").read_text().splitlines()  # read only: a copy is written
    at = next(i for i, line in enumerate(card) if line.startswith(CARD_LINE))
    assert at < len(card) - 10  # sections follow the line
    (folder / "README.md").write_text("\n".join(card) + "\n")
    argv = ["tree", str(folder), "--data", str(tmp_path / "run" / "data.jsonl"), "--held-out", "4", "--write",
            "--profile", str(profile)]
    for _ in range(2):
        capsys.readouterr()
        assert main(argv) == 0
        after = (folder / "README.md").read_text().splitlines()
        assert len(after) == len(card) and after[:at] == card[:at] and after[at + 1:] == card[at + 1:]
        assert after[at].startswith(CARD_LINE) and f"--profile {profile}" in after[at]
    assert "unchanged (" in after[at] and "instead of" not in after[at], after[at]  # the second run: the same tree
    assert "tree: unchanged (" in capsys.readouterr().out


def test_graft_follows_the_tree_then_grows_a_branch():
    from specviz.core.trees import Tree
    from specviz.engines.tree import TreeProposal, graft
    from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD

    tree = Tree.from_choices([(0,), (1,), (0, 0)])
    prop = TreeProposal(tree, [10, 20, 30], [0.6, 0.3, 0.5], None, 2)
    assert graft(prop, [20], LOOKUP_HEAD) is prop and graft(prop, [], LOOKUP_HEAD) is prop  # nothing new: the same
    grown = graft(prop, [10, 40, 50], LOOKUP_HEAD)  # follows node (0,), then grows beside (0, 0)
    assert grown.tree.paths == ((0,), (1,), (0, 0), (0, 1), (0, 1, 0))
    assert grown.node_tokens == [10, 20, 30, 40, 50] and grown.q_nodes == [0.6, 0.3, 0.5, 1.0, 1.0]
    assert grown.grafted == ((3, LOOKUP_HEAD), (4, LOOKUP_HEAD)) and grown.forwards == 2
    assert graft(prop, [60], LOOKUP_HEAD).tree.paths == ((0,), (1,), (2,), (0, 0))
    # a second branch from another source: the first one's nodes keep their source though their indices move
    both = graft(grown, [60, 70], RETRIEVAL_HEAD)
    assert both.tree.paths == ((0,), (1,), (2,), (0, 0), (0, 1), (2, 0), (0, 1, 0))
    assert [both.node_tokens[i] for i, _ in both.grafted] == [60, 40, 70, 50]
    assert dict(both.grafted) == {2: RETRIEVAL_HEAD, 4: LOOKUP_HEAD, 5: RETRIEVAL_HEAD, 6: LOOKUP_HEAD}
    assert graft(grown, [10, 40, 50, 80], RETRIEVAL_HEAD).grafted[-1] == (5, RETRIEVAL_HEAD)  # shares, then grows


@pytest.mark.parametrize("kind,extra", [("eagle", {}), ("medusa", {"medusa_heads": 3})])
def test_lookup_branch_keeps_greedy_output_and_shows_its_nodes(tiny_target, kind, extra):
    """A tree drafter with prompt lookup's continuation grafted on: greedy output equals AR, the grafted nodes
    carry LOOKUP_HEAD, and sampling verifies them too (point masses: tests/test_tree_sampling.py)."""
    from specviz.events import LOOKUP_HEAD

    eng = engine_for(tiny_target, random_drafter(tiny_target, kind, torch.arange(0, 64, 2), **extra), tree=True)
    prompt = [5, 9, 11, 13, 5, 9, 11, 13, 5, 9]
    ar = engines.generate(engines.build("ar", tiny_target), prompt, DecodeConfig(method="ar", max_new_tokens=40))
    run = engines.generate(eng, prompt, DecodeConfig(method=kind, max_new_tokens=40, lookup=4))
    assert run.token_ids == ar.token_ids
    looked_up = [n for e in run.events for n in e.drafts if n.head == LOOKUP_HEAD]
    assert looked_up and all(n.q_draft == 1.0 for n in looked_up)
    sampled = engines.generate(eng, prompt, DecodeConfig(method=kind, max_new_tokens=40, lookup=4, temperature=1.0))
    judged = [n for e in sampled.events for n in e.drafts if n.head == LOOKUP_HEAD and n.verdict.value != "discarded"]
    assert judged and all(n.accept_prob is not None for n in judged)


@pytest.mark.parametrize("kind,extra", [("eagle", {}), ("medusa", {"medusa_heads": 3})])
def test_datastore_branch_keeps_greedy_output_and_shows_its_nodes(tiny_target, kind, extra):
    """A tree drafter with a datastore's continuation grafted on (both branches at once): greedy output equals AR,
    the datastore's nodes carry RETRIEVAL_HEAD, and sampling verifies them too."""
    from specviz.core import retrieval
    from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD

    eng = engine_for(tiny_target, random_drafter(tiny_target, kind, torch.arange(0, 64, 2), **extra), tree=True)
    prompt = [5, 9, 11, 13, 5, 9]
    ar = engines.generate(engines.build("ar", tiny_target), prompt, DecodeConfig(method="ar", max_new_tokens=40))
    retrieval.use(tiny_target.name, retrieval.Datastore([prompt + ar.token_ids[:20], [3, 4, 5, 6]]))
    try:
        alone = engines.generate(eng, prompt, DecodeConfig(method=kind, max_new_tokens=40, retrieve=4))
        both = engines.generate(eng, prompt, DecodeConfig(method=kind, max_new_tokens=40, lookup=2, retrieve=4))
        # sampled text leaves the answer at once: a datastore that has every pair of tokens continues any context
        retrieval.use(tiny_target.name, retrieval.Datastore([[a, b, 7, 8] for a in range(63) for b in range(63)]))
        sampled = engines.generate(eng, prompt, DecodeConfig(method=kind, max_new_tokens=40, retrieve=4,
                                                             temperature=1.0))
    finally:
        retrieval.forget(tiny_target.name)
    assert alone.token_ids == both.token_ids == ar.token_ids
    retrieved = [n for e in alone.events for n in e.drafts if n.head == RETRIEVAL_HEAD]
    assert retrieved and all(n.q_draft == 1.0 for n in retrieved)
    assert sum(n.verdict.value == "accepted" for n in retrieved) >= 4  # it had seen the answer's first 20 tokens
    assert not [n for e in alone.events for n in e.drafts if n.head == LOOKUP_HEAD]
    assert [n for e in sampled.events for n in e.drafts if n.head == RETRIEVAL_HEAD]


def test_datastore_branch_steps_aside_behind_a_full_lookup_match():
    """Behind a match of prompt lookup's longest n-gram (3 tokens) only the lookup's branch is grafted; behind a
    shorter one, both."""
    from types import SimpleNamespace

    from specviz.core.retrieval import Datastore
    from specviz.core.trees import Tree
    from specviz.engines.tree import TreeEngine, TreeProposal, TreeRun
    from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD

    store = Datastore([[2, 3, 40, 41], [9, 3, 40, 41]])
    prop = TreeProposal(Tree.from_choices([(0,)]), [99], [0.5], None, 1)

    def sources(tokens):
        run = TreeRun(DecodeConfig(method="eagle", lookup=4, retrieve=4), None, None, None, 0, tokens, store)
        engine = SimpleNamespace(target=SimpleNamespace(eos_ids=frozenset({0})))
        return sorted({head for _, head in TreeEngine.graft_branches(engine, prop, run, cap=8).grafted})

    assert sources([1, 2, 3, 7, 1, 2, 3]) == [LOOKUP_HEAD]                  # (1, 2, 3) matched: the lookup alone
    assert sources([5, 2, 3, 7, 1, 2, 3]) == [RETRIEVAL_HEAD, LOOKUP_HEAD]  # only (2, 3) matched: both
    assert sources([8, 8, 2, 3]) == [RETRIEVAL_HEAD]                        # no lookup match: the datastore's


def test_datastore_branch_needs_a_datastore(tiny_target):
    from specviz.errors import ConfigError

    eng = engine_for(tiny_target, random_drafter(tiny_target, "eagle", torch.arange(0, 64, 2)), tree=True)
    with pytest.raises(ConfigError, match=r"^retrieve=3 needs a datastore of the target's own answers: there is one "
                                          r"for smollm2-135m and for drafters trained on your own data "
                                          r"\(python -m specviz train --data\), not for tiny-0$"):
        engines.generate(eng, [5, 6], DecodeConfig(method="eagle", max_new_tokens=4, retrieve=3))


def test_lookup_is_for_tree_drafters():
    from specviz.errors import ConfigError

    with pytest.raises(ConfigError, match="lookup=3 applies to the tree drafters only"):
        DecodeConfig(method="pld", lookup=3)
    with pytest.raises(ConfigError, match="lookup=-1 is out of range"):
        DecodeConfig(method="eagle", lookup=-1)
    assert DecodeConfig(method="eagle", lookup="2").lookup == 2
    with pytest.raises(ConfigError, match="retrieve=3 applies to the tree drafters only"):
        DecodeConfig(method="vanilla", retrieve=3)
    with pytest.raises(ConfigError, match="retrieve=17 is out of range"):
        DecodeConfig(method="medusa", retrieve=17)
    assert DecodeConfig(method="medusa", retrieve="5").retrieve == 5


def test_small_drafters_run_in_bf16_on_the_packed_matmul_beside_a_bf16_cpu_target(target_bf16):
    """With a bf16 target on a CPU, the one-layer drafters compute in bf16 on specviz's packed matmul (their weights
    and the draft head packed once) and draft as the fp32 module does: the same top-1 token at nearly every position
    of a real answer."""
    from specviz.models import fused, kernels

    if not kernels.available():
        pytest.skip("no C compiler or no AVX2/FMA here: the drafters stay in fp32")
    folder = Path(__file__).parents[1] / "assets" / "drafters" / "smollm2-135m-eagle"
    d = drafters.load(folder, target_bf16)
    assert d.dtype == torch.bfloat16 and d.row_kernel and d.head_packed is not None
    linears = [m for m in d.module.modules() if isinstance(m, kernels.RowLinear)]
    assert linears and all(isinstance(m, fused.PackedLinear) for m in linears)  # every Linear on the packed matmul
    cfg, state = drafters.read_layout(folder, target_bf16)
    state.pop("vocab_ids", None)
    fp32 = drafters.build_module(cfg)
    load_into(fp32, state, "fp32 copy")
    ids = target_bf16.encode_prompt("Explain why the sky is blue in two sentences.")
    answer = engines.generate(engines.build("ar", target_bf16), ids,
                              DecodeConfig(method="ar", max_new_tokens=24)).token_ids
    with torch.inference_mode():
        out = target_bf16.model(torch.tensor([ids + answer]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in cfg.feature_layers], -1)[:, :-1]  # (1, n - 1, 3d)
        nxt = torch.tensor([ids + answer])[:, 1:]
        pos = torch.arange(feats.shape[1])
        tops = []
        for module, dtype in ((d.module, torch.bfloat16), (fp32.eval(), torch.float32)):
            h, _ = module(module.lift(feats.to(dtype)), target_bf16.model.get_input_embeddings()(nxt).to(dtype), pos)
            rows = module.readout(h[0]).to(dtype)
            tops.append(torch.nn.functional.linear(rows, d.head_weight.to(dtype)).argmax(-1))
    agree = float((tops[0] == tops[1]).float().mean())
    assert agree >= 0.9, agree


def test_custom_loss_replaces_the_kinds_loss(tmp_path):
    """train.train's custom_loss (an experiment's own loss: experiments/probes/copy_weight_train.py) runs in place
    of the kind's, for the training steps and the held-out score alike."""
    target = tiny_model(0)
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(" ".join(str((i * 7 + j) % 60 + 1) for j in range(6)) for i in range(24)))
    training = []

    def loss(module, *args, **kwargs):
        training.append(module.training)
        return losses.eagle_loss(module, *args, **kwargs)

    opts = train.TrainOptions(kind="eagle", out=tmp_path / "run", target="tiny", data=str(data), steps=2,
                              batch_tokens=512, lr=3e-3, draft_vocab=32, max_new_tokens=16, eval_prompts=1,
                              checkpoint_every=2)
    train.train(opts, log=lambda *_: None, target=target, custom_loss=loss)
    assert training.count(True) == 2 and training.count(False) >= 1


def test_eagle3_context_in_one_call_has_the_bits_of_its_parts(target_bf16):
    """EAGLE's context step as one C call (fused.FusedEagle3.context: the drafter's step from the target's features
    with the tokens' embeddings gathered in C, its readout and the packed draft head over the last row) gives the bits
    of the calls it replaces (step, readout, linear_packed): the rows' outputs, the draft logits and the drafter's
    cache, on a first call and on one that continues the cache; a token off by one is told apart. EAGLE's session
    drafts through it."""
    from specviz.engines.eagle import EagleSession
    from specviz.models import kernels

    if not kernels.available():
        pytest.skip("no C compiler or no AVX2/FMA here: the drafter stays in torch")
    d = drafters.load(Path(__file__).parents[1] / "assets" / "drafters" / "smollm2-135m-eagle", target_bf16)
    assert EagleSession(d, target_bf16.vocab_size, frozenset())._table is not None
    ids = target_bf16.encode_prompt("Name three rivers and the seas they reach.")
    answer = engines.generate(engines.build("ar", target_bf16), ids,
                              DecodeConfig(method="ar", max_new_tokens=16)).token_ids
    with torch.inference_mode():
        out = target_bf16.model(torch.tensor([ids + answer]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in d.cfg.feature_layers], -1)[0, :-1].to(torch.bfloat16)
        nxt = (ids + answer)[1:]
        n, table, n_head = feats.shape[0], d.target_embed.weight, d.head_weight.shape[0]
        parts, whole = d.fused.new_cache(), d.fused.new_cache()
        for start, end in ((0, n - 3), (n - 3, n)):  # the prompt's pairs, then three more past them
            rows = feats[start:end].contiguous()
            ref = d.fused.step(parts, d.embed(torch.tensor(nxt[start:end])), start, torch.arange(start, end),
                               feats=rows)
            ref_logits = d.logits(ref[-1]).float()
            mine, logits = d.fused.context(whole, table, nxt[start:end], rows, start, d.head_packed, n_head)
            assert torch.equal(mine, ref) and torch.equal(logits, ref_logits)
        assert torch.equal(whole.keys[:, :, :n], parts.keys[:, :, :n])
        assert torch.equal(whole.values[:, :, :n], parts.values[:, :, :n])
        _, off = d.fused.context(d.fused.new_cache(), table, [t + 1 for t in nxt[:n - 3]], feats[:n - 3].contiguous(),
                                 0, d.head_packed, n_head)
        assert not torch.equal(off, d.logits(d.fused.step(d.fused.new_cache(), d.embed(torch.tensor(nxt[:n - 3])), 0,
                                                          torch.arange(n - 3), feats=feats[:n - 3])[-1]).float())


def test_eagle3_step_in_one_call_drafts_as_the_module(target_bf16):
    """Beside a bf16 CPU target the shipped EAGLE-3 drafter's step runs as one C call (fused.FusedEagle3): on a real
    answer's features its outputs are the torch module's up to attention's summation order (a few bf16 steps at the
    largest values), it drafts the same top-1 token at nearly every position, a chain step and a tree level with a
    mask take the same rows as the module's, and EAGLE's session drafts through it."""
    from specviz.engines.eagle import EagleSession
    from specviz.models import kernels

    if not kernels.available():
        pytest.skip("no C compiler or no AVX2/FMA here: the drafter stays in torch")
    folder = Path(__file__).parents[1] / "assets" / "drafters" / "smollm2-135m-eagle"
    d = drafters.load(folder, target_bf16)
    assert d.fused is not None and EagleSession(d, target_bf16.vocab_size, frozenset()).fused is d.fused
    cfg = d.cfg
    ids = target_bf16.encode_prompt("Explain why the sky is blue in two sentences.")
    answer = engines.generate(engines.build("ar", target_bf16), ids,
                              DecodeConfig(method="ar", max_new_tokens=24)).token_ids
    with torch.inference_mode():
        out = target_bf16.model(torch.tensor([ids + answer]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in cfg.feature_layers], -1)[0, :-1]  # (n - 1, 3d)
        nxt = torch.tensor(ids + answer)[1:]
        n = feats.shape[0]
        m = d.module
        ref, kv = m(m.lift(feats[None].to(torch.bfloat16)), d.embed(nxt)[None], torch.arange(n))
        cache = d.fused.new_cache()
        mine = d.fused.step(cache, d.embed(nxt), 0, torch.arange(n), feats=feats)
        scale = float(ref.abs().max())
        assert float((ref[0].float() - mine.float()).abs().max()) <= scale / 32
        agree = float((d.logits(ref[0]).argmax(-1) == d.logits(mine).argmax(-1)).float().mean())
        assert agree >= 0.9, agree
        # a tree level: two children of the last position, each seeing the context and itself
        kids = torch.tensor([nxt[-1].item(), 5])
        mask = torch.ones(2, n + 2, dtype=torch.bool)
        mask[0, n + 1] = mask[1, n] = False
        ref2, _ = m(ref[:, -1:].expand(1, 2, -1), d.embed(kids)[None], torch.tensor([n, n]), kv, mask)
        mine2 = d.fused.step(cache, d.embed(kids), n, torch.tensor([n, n]), hidden=mine[-1:].expand(2, -1), mask=mask)
        assert torch.equal(d.logits(ref2[0]).argmax(-1), d.logits(mine2).argmax(-1))
        # what a row sees is its own: the same child alone gets the same bits as beside its sibling
        alone = d.fused.step(cache, d.embed(kids[:1]), n, torch.tensor([n]), hidden=mine[-1:], mask=mask[:1, :n + 1])
        assert torch.equal(alone[0], mine2[0])
