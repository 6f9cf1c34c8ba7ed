"""DFlash (block drafted in one forward): greedy identity with AR, exact sampling, the training forward equal to the
drafting one, the registry entry, save/load and a training smoke run on tiny random models."""
from __future__ import annotations

import pytest
import torch
from tiny import random_drafter, tiny_model

from specviz import engines, methods
from specviz.config import DecodeConfig
from specviz.drafters import trained as drafters
from specviz.drafters.dflash import dflash_layers, mask_token
from specviz.engines.dflash import DFlashDrafter, DFlashEngine, build
from specviz.events import Verdict
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
def test_greedy_identity_tiny(tiny_target, block_size, compressed):
    vocab_ids = torch.arange(0, 64, 2) if compressed else None
    eng = build(tiny_target, dflash_drafter(tiny_target, vocab_ids, block_size))
    ar = engines.build("ar", tiny_target)
    for prompt in ([1, 2, 3], [5, 9, 11, 13, 2], [7]):
        cfg = DecodeConfig(method="dflash", max_new_tokens=30, gamma=7)
        run = engines.generate(eng, prompt, cfg)
        assert run.token_ids == engines.generate(ar, prompt, cfg).token_ids
        for event in run.events:  # the whole block in one drafter forward, never more than its slots after the first
            assert len(event.drafts) <= block_size - 1 and event.draft_forwards == (1 if event.drafts else 0)


def test_a_drafter_that_copies_the_target_is_accepted_whole(tiny_target):
    """A planted perfect drafter (its logits replaced by the target's own next tokens) has every draft accepted:
    the block's slots line up with the positions the target verifies (an off-by-one would reject them)."""
    d = dflash_drafter(tiny_target, block_size=4)
    ar = engines.build("ar", tiny_target)
    prompt = [5, 9, 11]
    truth = engines.generate(ar, prompt, DecodeConfig(method="ar", max_new_tokens=40)).token_ids
    seq = prompt + truth

    class Oracle(DFlashDrafter):
        def session(self, vocab_size, eos_ids):
            s = super().session(vocab_size, eos_ids)
            s.block_logits = lambda tokens: (torch.nn.functional.one_hot(
                torch.tensor(seq[len(tokens):len(tokens) + 3]), 64).float() * 50) if s._n else None
            return s

    eng = DFlashEngine("dflash", tiny_target, Oracle(d))
    run = engines.generate(eng, prompt, DecodeConfig(method="dflash", max_new_tokens=30, gamma=3))
    assert run.token_ids == truth[:30]
    verdicts = [t.verdict for e in run.events for t in e.drafts]
    assert verdicts and all(v is Verdict.ACCEPTED for v in verdicts)
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
    assert s.trained and s.chain and s.checkable and s.drafts == "chain"
    d = dflash_drafter(tiny_target, torch.arange(0, 64, 2))
    drafters.save(tmp_path / "d", d.module, d.cfg, d.vocab_ids, "# card\n")
    eng = engines.build_trained(tmp_path / "d", tiny_target)
    assert isinstance(eng, DFlashEngine) and eng.method == "dflash"
    assert drafters.describe(d.cfg).startswith("DFlash, 2 decoder layers drafting blocks of 4")
    cfg = DecodeConfig(method="dflash", max_new_tokens=20)
    assert engines.generate(eng, [3, 4], cfg).token_ids == \
        engines.generate(engines.build("ar", tiny_target), [3, 4], cfg).token_ids
    from specviz.check import run as check

    drafter, draft = check.drafter_for("dflash", tiny_target, str(tmp_path / "d"))
    assert isinstance(drafter, DFlashDrafter) and draft is None


def test_training_smoke(tmp_path):
    """A few steps on tiny data: features cached, the loss falls, the drafter saved, measured and exact; resumed."""
    target = tiny_model(0)
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(" ".join(str((i * 7 + j) % 60 + 1) for j in range(6)) for i in range(24)))
    opts = train.TrainOptions(kind="dflash", out=tmp_path / "run", target="tiny", data=str(data), steps=12,
                              batch_tokens=512, lr=3e-3, draft_vocab=32, max_new_tokens=16, eval_prompts=1,
                              checkpoint_every=6, block_size=4, hidden_layers=1)
    result = train.train(opts, log=lambda *_: None, target=target)
    assert sum(result.losses[-3:]) < sum(result.losses[:3])
    assert result.held_out["identical"] == "1/1"
    cfg, _ = drafters.read_layout(result.folder, target)
    assert (cfg.kind, cfg.block_size, cfg.num_hidden_layers, cfg.feature_layers) == ("dflash", 4, 1, [1, 2])
    opts.steps, opts.resume = 14, True
    assert len(train.train(opts, log=lambda *_: None, target=target).losses) == 2
