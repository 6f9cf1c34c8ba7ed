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
