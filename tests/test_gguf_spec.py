"""`export eagle|dflash --format gguf` without llama.cpp (the unit tier): the GGUFs carry every tensor and key the
pinned llama.cpp loader asks for (src/models/eagle3.cpp, dflash.cpp), named and shaped as it asks, read back with
gguf's own reader; the logits the pinned graph computes from them equal specviz's drafter's (gguf_graph.Graph); a
planted wrong name, a planted q/k layout and planted d2t offsets are caught; `serve --engine llama.cpp` plans
`--spec-type draft-eagle3|draft-dflash` with DFlash's whole block. llama-server serving them is in
tests/test_llama_server.py."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from specviz.drafters.trained import build_module, save
from specviz.serving import engine_export, engines, gguf_graph, gguf_spec
from specviz.serving.export_common import ExportError, target_tensors

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A stand-in target folder: smollm2-135m's shapes and a random embedding (the tokenizer: the embedded GGUF's)."""
    folder = tmp_path_factory.mktemp("gguf-target")
    save_file({"model.embed_tokens.weight": torch.randn(49152, 576, generator=torch.Generator().manual_seed(0))},
              folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"hidden_size": 576, "vocab_size": 49152, "num_hidden_layers": 30,
                                                    "architectures": ["LlamaForCausalLM"]}))
    (folder / "export.json").write_text(json.dumps({"source_sha256": "x"}))
    return folder


@pytest.fixture(scope="module")
def eagle3(target, tmp_path_factory):
    out = engine_export.export_drafter(engine_export.shipped("eagle"), target, log=lambda _: None, fmt="gguf",
                                       out=tmp_path_factory.mktemp("e") / "eagle3-gguf")
    return out, *engine_export.read_drafter(engine_export.shipped("eagle"))


@pytest.fixture(scope="module")
def dflash(target, tmp_path_factory):
    """A random DFlash drafter of the default target's shapes (2 layers, block 8, a cut vocabulary), exported."""
    from specviz.drafters.config import DrafterConfig

    cfg = DrafterConfig(kind="dflash", target="smollm2-135m", hidden_size=576, vocab_size=49152, draft_vocab=4096,
                        num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536, rope_theta=100000.0,
                        feature_layers=[2, 8, 15, 22, 28], block_size=8, num_hidden_layers=2, mask_token_id=2)
    torch.manual_seed(3)
    module = build_module(cfg)
    for name, p in module.named_parameters():
        if "norm" in name:  # norms away from 1, so a norm read from the wrong tensor shows
            p.data = 1 + 0.3 * torch.randn_like(p)
    ids = torch.randperm(49152, generator=torch.Generator().manual_seed(4))[:4096].sort().values
    folder = tmp_path_factory.mktemp("dflash") / "drafter"
    save(folder, module, cfg, ids, "a random DFlash drafter for tests")
    out = engine_export.export_drafter(folder, target, log=lambda _: None, fmt="gguf",
                                       out=tmp_path_factory.mktemp("d") / "dflash-gguf")
    return out, *engine_export.read_drafter(folder)


def fields(path: Path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.") or
            k == "tokenizer.ggml.mask_token_id"}, {t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name)
                                                  for t in reader.tensors}


def test_the_eagle3_gguf_is_what_the_pinned_loader_asks_for(eagle3):
    out, cfg, state = eagle3
    kv, tensors = fields(out / gguf_spec.FILE)
    assert kv["general.architecture"] == "eagle3"
    assert kv["eagle3.target_layers"] == [2, 15, 27] == list(cfg.feature_layers)
    assert (kv["eagle3.target_hidden_size"], kv["eagle3.embedding_length"], kv["eagle3.block_count"]) == (576, 576, 1)
    assert kv["eagle3.norm_before_residual"] is False and kv["eagle3.norm_before_fc"] is False
    assert (kv["eagle3.attention.head_count"], kv["eagle3.attention.head_count_kv"]) == (9, 3)
    assert kv["eagle3.rope.freq_base"] == pytest.approx(100000.0)
    # ne order (innermost first), as src/models/eagle3.cpp creates them
    assert tensors["fc.weight"] == ((1728, 576), "F32")
    assert tensors["blk.0.attn_q.weight"] == ((1152, 576), "F32") and tensors["blk.0.attn_k.weight"][0] == (1152, 192)
    assert tensors["blk.0.attn_norm_2.weight"] == ((576,), "F32")
    assert tensors["output.weight"] == ((576, 8192), "F32") and tensors["d2t"] == ((8192,), "I64")
    assert "token_embd.weight" not in tensors and "t2d" not in tensors  # the target's embeddings, as converted
    assert set(tensors) == set(gguf_graph.expected("eagle3", cfg, 8192, True))
    d2t = gguf.GGUFReader(str(out / gguf_spec.FILE)).get_tensor(len(tensors) - 1)
    assert d2t.name == "d2t" and np.array_equal(d2t.data, state["vocab_ids"].numpy())  # absolute ids, not offsets
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["export_format"] == "gguf" and manifest["check"]["argmax_equal"] == 64
    assert "--spec-type draft-eagle3" in (out / "README.md").read_text()


def test_the_dflash_gguf_is_what_the_pinned_loader_asks_for(dflash):
    out, cfg, state = dflash
    kv, tensors = fields(out / gguf_spec.FILE)
    assert kv["general.architecture"] == "dflash"
    assert kv["dflash.target_layers"] == [2, 8, 15, 22, 28]  # the converter's target_layer_ids + 1
    assert (kv["dflash.block_size"], kv["tokenizer.ggml.mask_token_id"], kv["dflash.block_count"]) == (8, 2, 2)
    assert tensors["fc.weight"] == ((2880, 576), "F32") and tensors["enc.output_norm.weight"] == ((576,), "F32")
    assert tensors["blk.1.attn_q_norm.weight"] == ((64,), "F32") and tensors["blk.1.attn_k.weight"][0] == (576, 192)
    assert tensors["output.weight"][0] == (576, 4096) and tensors["d2t"] == ((4096,), "I64")
    assert set(tensors) == set(gguf_graph.expected("dflash", cfg, 4096, True))
    check = json.loads((out / "export.json").read_text())["check"]
    assert check["argmax_equal"] == check["rows"] == 7  # the block's slots after the first
    assert "--spec-draft-n-max 7" in (out / "README.md").read_text()


def rewrite(path: Path, out: Path, rename=None, change=None) -> Path:
    """A copy of the GGUF with its tensors renamed ({old: new}) or changed ({name: fn(array)})."""
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    tensors = {(rename or {}).get(t.name, t.name): (change or {}).get(t.name, lambda a: a)(np.array(t.data))
               for t in reader.tensors}

    def keys(writer):
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub)

    target = out / gguf_spec.FILE
    writer = gguf.GGUFWriter(str(target), arch)
    keys(writer)
    for name, value in tensors.items():
        writer.add_tensor(name, value, raw_dtype=gguf.GGMLQuantizationType.I64 if value.dtype == np.int64 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def test_a_planted_wrong_name_is_caught(eagle3, dflash, tmp_path):
    out, cfg, state = eagle3
    bad = rewrite(out / gguf_spec.FILE, tmp_path, rename={"blk.0.attn_norm_2.weight": "blk.0.hidden_norm.weight"})
    with pytest.raises(ExportError, match=r"missing tensors \['blk.0.attn_norm_2.weight'\]; tensors it does not "
                                          r"load \['blk.0.hidden_norm.weight'\]"):
        gguf_graph.check("eagle3", cfg, state, torch.zeros(49152, 576), bad)
    out, cfg, state = dflash
    bad = rewrite(out / gguf_spec.FILE, tmp_path, rename={"enc.output_norm.weight": "hidden_norm.weight"})
    with pytest.raises(ExportError, match="missing tensors"):
        gguf_graph.check("dflash", cfg, state, torch.zeros(49152, 576), bad)


def test_planted_wrong_layouts_are_caught(eagle3, target, tmp_path):
    """EAGLE-3's q and k unpermuted (llama.cpp ropes it pairwise) and d2t written as vLLM's offsets: both caught by
    the logits the pinned graph computes."""
    out, cfg, state = eagle3
    embed = target_tensors(target)["model.embed_tokens.weight"]
    q = state["midlayer.self_attn.q_proj.weight"].float().numpy()
    bad = rewrite(out / gguf_spec.FILE, tmp_path, change={"blk.0.attn_q.weight": lambda a: q})
    with pytest.raises(ExportError, match="logits as llama.cpp computes them differ"):
        gguf_graph.check("eagle3", cfg, state, embed, bad)
    offsets = lambda a: a - np.arange(a.size)  # noqa: E731
    bad = rewrite(out / gguf_spec.FILE, tmp_path, change={"d2t": offsets})
    with pytest.raises(ExportError, match="d2t does not give the drafter's vocab_ids"):
        gguf_graph.check("eagle3", cfg, state, embed, bad)


def test_a_planted_wrong_dflash_weight_is_caught(dflash, target, tmp_path):
    """The context's norm swapped for the decoder's final norm: the shapes fit, the logits do not."""
    out, cfg, state = dflash
    embed = target_tensors(target)["model.embed_tokens.weight"]
    norm = state["norm.weight"].float().numpy()
    bad = rewrite(out / gguf_spec.FILE, tmp_path, change={"enc.output_norm.weight": lambda a: norm})
    with pytest.raises(ExportError, match="logits as llama.cpp computes them differ"):
        gguf_graph.check("dflash", cfg, state, embed, bad)


def test_serve_plans_the_spec_types(eagle3, dflash, target, tmp_path, monkeypatch):
    """llama.cpp's plan: draft-eagle3 with γ, draft-dflash with the whole trained block (n_max = block_size - 1)."""
    monkeypatch.setattr(engines.llama, "binary", lambda: Path("/bin/true"))
    monkeypatch.setattr(engines, "_exports", lambda kind, folder, *a: (target, {"eagle": eagle3, "dflash": dflash}
                                                                       [kind][0]))
    dfolder = tmp_path / "df"
    dfolder.mkdir()
    (dfolder / "config.json").write_text(json.dumps({"block_size": 8}))
    monkeypatch.setattr(engines, "drafter_kind", lambda v: (v, dfolder if v == "dflash" else
                                                            engine_export.shipped(v)))
    p = engines.plan("llama.cpp", "eagle", log=lambda _: None)
    assert (p.speculative["--spec-type"], p.speculative["--spec-draft-n-max"]) == ("draft-eagle3", str(engines.GAMMA))
    assert p.draft == str(eagle3[0] / gguf_spec.FILE)
    p = engines.plan("llama.cpp", "dflash", log=lambda _: None)
    assert (p.speculative["--spec-type"], p.speculative["--spec-draft-n-max"]) == ("draft-dflash", "7")


def test_bad_gguf_requests_are_one_line(tmp_path):
    cfg, state = engine_export.read_drafter(engine_export.shipped("eagle"))
    cfg.feature_layers = [2, 15]
    with pytest.raises(ExportError, match=r"feature_layers=\[2, 15\]: llama.cpp's EAGLE-3 reads exactly 3"):
        gguf_spec.write_eagle3_gguf(cfg, state, {}, tmp_path, tmp_path)
    with pytest.raises(ExportError, match="format='gguf' is written for eagle, dflash drafters only, not medusa"):
        engine_export.exporter("medusa", "gguf")
    with pytest.raises(engines.ServeError, match=r"format='gguf' is served by llama.cpp .*not vllm"):
        engines.plan("vllm", "eagle", fmt="gguf", log=lambda _: None)
    shutil.rmtree(tmp_path, ignore_errors=True)
