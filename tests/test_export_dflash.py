"""`export` of a DFlash drafter without vLLM (the unit tier): the config.json fields vLLM 0.32's DFlashDraftModel
reads, every tensor name its loader takes (listed here from vllm/model_executor/models/qwen3_dflash.py, not from the
exporter), lm_head and d2t; a planted wrong name, wrong weights and a wrong mask token are caught, and a drafter vLLM
cannot serve is refused in one line. vLLM serving the export is in tests/test_engines_live.py."""
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from specviz.drafters import trained
from specviz.drafters.config import DrafterConfig
from specviz.serving import export_dflash
from specviz.serving.export_common import ExportError

TC = {"hidden_size": 64, "vocab_size": 512, "num_hidden_layers": 6, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
      "max_position_embeddings": 1024, "bos_token_id": 1, "eos_token_id": 2}
# what DFlashQwen3ForCausalLM.load_weights takes for one layer (before its `model.` prefix and q/k/v, gate/up stacking)
VLLM_LAYER = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
              "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
              "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
              "mlp.up_proj.weight", "mlp.down_proj.weight"]


def drafter(vocab_ids=None, **extra):
    """(cfg, state) of a random 2-layer DFlash drafter for the small target TC."""
    fields = {"feature_layers": [1, 3, 4], "block_size": 4, "num_hidden_layers": 2, "mask_token_id": 7, **extra}
    cfg = DrafterConfig.for_target("dflash", "tiny", SimpleNamespace(**TC),
                                   0 if vocab_ids is None else len(vocab_ids), **fields)
    torch.manual_seed(0)
    module = trained.build_module(cfg)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.3)
    state = dict(module.state_dict())
    if vocab_ids is not None:
        state["vocab_ids"] = vocab_ids.to(torch.int32)
    return cfg, state


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dflash-target")
    save_file({"model.embed_tokens.weight": torch.randn(512, 64, generator=torch.Generator().manual_seed(1))},
              folder / "model.safetensors")
    return folder


def export(target, out, vocab_ids=None, **extra):
    cfg, state = drafter(vocab_ids, **extra)
    out.mkdir()
    check = export_dflash.write_dflash(cfg, state, TC, target, out)
    return cfg, state, check


def test_the_config_and_weights_are_what_vllm_loads(target, tmp_path):
    vocab_ids = torch.arange(3, 403, 4)  # a cut vocabulary of 100 ids
    cfg, state, check = export(target, tmp_path / "out", vocab_ids)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"]["target_layer_ids"] == [0, 2, 3]  # feature_layers [1, 3, 4] - 1
    assert config["dflash_config"]["mask_token_id"] == 7 and config["dflash_config"]["causal"] is False
    assert config["layer_types"] == ["full_attention"] * 2 and config["num_hidden_layers"] == 2
    assert (config["block_size"], config["head_dim"], config["draft_vocab_size"], config["vocab_size"]) == \
        (4, 16, 100, 512)
    assert config["rope_parameters"]["rope_theta"] == 10000.0 and config["target_hidden_size"] == 64
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    want = {"fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t"}
    want |= {f"layers.{i}.{name}" for i in range(2) for name in VLLM_LAYER}
    assert set(tensors) == want
    assert tensors["fc.weight"].shape == (64, 3 * 64) and all(t.dtype in (torch.float32, torch.int64)
                                                               for t in tensors.values())
    assert torch.equal(tensors["d2t"] + torch.arange(100), vocab_ids)  # vLLM: target id = draft id + d2t
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(tensors["lm_head.weight"], embed[vocab_ids])
    assert check["argmax_equal"] == check["rows"] == 3 and check["max_abs_logit_diff"] < 1e-4
    assert check["num_speculative_tokens"] == 3  # the whole block after its first slot


def test_a_full_vocabulary_has_no_d2t(target, tmp_path):
    export(target, tmp_path / "out")
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "d2t" not in tensors and tensors["lm_head.weight"].shape == (512, 64)


def test_planted_wrong_names_weights_and_mask_are_caught(target, tmp_path):
    cfg, state, _ = export(target, tmp_path / "out", torch.arange(0, 200, 2))
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "out", bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["layers.1.mlp.upproj.weight"] = tensors.pop("layers.1.mlp.up_proj.weight")  # a name vLLM does not take
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(ExportError, match=r"miss \['layers.1.mlp.up_proj.weight'\] and reject "
                                          r"\['layers.1.mlp.upproj.weight'\]"):
        export_dflash.check_dflash(cfg, state, embed, TC, bad)
    tensors["layers.1.mlp.up_proj.weight"] = tensors.pop("layers.1.mlp.upproj.weight")
    tensors["fc.weight"] = torch.flip(tensors["fc.weight"], [1])  # the target's layers in the wrong order
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(ExportError, match="logits .* differ"):
        export_dflash.check_dflash(cfg, state, embed, TC, bad)
    shutil.copy(tmp_path / "out" / "model.safetensors", bad / "model.safetensors")
    config = json.loads((bad / "config.json").read_text())
    config["dflash_config"]["mask_token_id"] = 8  # vLLM would fill the block with another token
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="logits .* differ"):
        export_dflash.check_dflash(cfg, state, embed, TC, bad)
    config["dflash_config"]["mask_token_id"] = 7
    config["dflash_config"]["target_layer_ids"] = [0, 2, 5]  # layer 5's output is the target's last
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="target_layer_ids"):
        export_dflash.check_dflash(cfg, state, embed, TC, bad)


def test_a_drafter_vllm_cannot_serve_is_refused():
    assert export_dflash.refuses(drafter()[0]) is None
    assert "feature layer 0" in export_dflash.refuses(drafter(feature_layers=[0, 3])[0])
    with pytest.raises(ExportError, match=r"feature_layers=\[1, 6\]"):
        cfg, state = drafter(feature_layers=[1, 6])
        export_dflash.write_dflash(cfg, state, TC, None, None)
