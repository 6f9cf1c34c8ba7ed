"""`export eagle --format speculators` without vLLM (the unit tier): the config.json fields vLLM 0.32 reads
(speculators_model_type, proposal_methods[0].speculative_tokens, verifier.name_or_path, transformer_layer_config, the
EAGLE-3 fields and norm switches) and what vLLM builds from them (export_speculators.vllm_view, which follows vLLM's
SpeculatorsConfig); a planted wrong switch and planted wrong weights are caught; bad --format values are one line.
vLLM serving the export is in tests/test_engines_live.py."""
import json
from pathlib import Path

import pytest

from specviz.cli.main import main
from specviz.serving import engine_export, engines, export_speculators

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(target folder, the speculators export of the shipped EAGLE-3 drafter, the target's embedding)."""
    import torch
    from safetensors.torch import save_file

    tmp = tmp_path_factory.mktemp("speculators")
    target = tmp / "target"
    target.mkdir()
    embed = torch.randn(49152, 576, generator=torch.Generator().manual_seed(0))
    save_file({"model.embed_tokens.weight": embed}, target / "model.safetensors")
    (target / "config.json").write_text(json.dumps({"hidden_size": 576, "vocab_size": 49152, "num_hidden_layers": 30,
                                                    "architectures": ["LlamaForCausalLM"]}))
    (target / "export.json").write_text(json.dumps({"source_sha256": "x"}))
    out = engine_export.export_drafter(engine_export.shipped("eagle"), target, out=tmp / "s", log=lambda _: None,
                                       fmt="speculators")
    return target, out, embed


def test_the_config_carries_what_vllm_reads(exported):
    target, out, _ = exported
    config = json.loads((out / "config.json").read_text())
    cfg, state = engine_export.read_drafter(engine_export.shipped("eagle"))
    spec = config["speculators_config"]
    assert config["speculators_model_type"] == "eagle3"
    assert spec["proposal_methods"][0]["speculative_tokens"] == engines.GAMMA
    assert spec["verifier"]["name_or_path"] == str(target.resolve())
    layer = config["transformer_layer_config"]
    assert (layer["model_type"], layer["num_hidden_layers"], layer["hidden_size"]) == ("llama", 1, 576)
    assert config["draft_vocab_size"] == cfg.draft_vocab == 8192
    assert config["eagle_aux_hidden_state_layer_ids"] == list(cfg.feature_layers)
    assert config["norm_before_residual"] is False  # vLLM's default in this format is True: it must be written
    draft, speculative = export_speculators.vllm_view(config)
    assert draft["architectures"] == ["Eagle3LlamaForCausalLM"] and draft["draft_vocab_size"] == 8192
    assert not any(draft[k] for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"))
    assert speculative == {"method": "eagle3", "num_speculative_tokens": engines.GAMMA,
                           "verifier": str(target.resolve())}
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["export_format"] == "speculators"
    assert manifest["check"]["argmax_equal"] == manifest["check"]["rows"] == 64
    assert (out / "README.md").read_text().count("--format speculators") == 2


def test_a_planted_wrong_switch_or_weight_is_caught(exported, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    target, out, embed = exported
    cfg, state = engine_export.read_drafter(engine_export.shipped("eagle"))
    tc = json.loads((target / "config.json").read_text())
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    config = json.loads((bad / "config.json").read_text())
    del config["norm_before_residual"]  # vLLM would norm before the residual
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(engine_export.ExportError, match="'norm_before_residual': True"):
        export_speculators.check_speculators(cfg, state, embed, tc, bad)
    shutil.copy(out / "config.json", bad / "config.json")
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["fc.weight"] = torch.flip(tensors["fc.weight"], [1])  # the three target features in the wrong order
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(engine_export.ExportError, match="logits differ"):
        export_speculators.check_speculators(cfg, state, embed, tc, bad)


@pytest.mark.parametrize("argv, says", [
    (["export", "eagle", "--format", "onnx"], "format='onnx' is unknown: use one of native, speculators, gguf"),
    (["export", "medusa", "--format", "speculators"],
     "format='speculators' is written for eagle drafters only, not medusa: use --format native"),
    (["export", "target", "--format", "speculators"], "format='speculators' is a drafter's format"),
    (["serve", "--engine", "vllm", "--drafter", "eagle", "--format", "gguf"],
     "format='gguf' is served by llama.cpp with a trained drafter (--engine llama.cpp --drafter eagle), not vllm"),
    (["serve", "--engine", "vllm", "--drafter", "ngram", "--format", "speculators"],
     "format='speculators' is served by vLLM with a trained drafter"),
    (["serve", "--engine", "llama.cpp", "--drafter", "draft", "--format", "speculators"],
     "format='speculators' is written for eagle drafters only, not draft"),
])
def test_bad_formats_are_one_line(argv, says, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(engine_export, "export_target", lambda *a, **k: pytest.fail("nothing may be exported"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
