"""Shared fixtures: the real default target (loaded once per session) and a tiny random model."""
from __future__ import annotations

import socket
import warnings

import pytest
import torch

from specviz import models

warnings.filterwarnings("ignore", category=DeprecationWarning)
torch.set_num_threads(2)


class TinyTokenizer:
    """Enough of a tokenizer for engines on a tiny random model: token i reads as '<i>'."""

    def __init__(self, vocab: int, eos: int):
        self.vocab, self.eos_token_id, self.chat_template = vocab, eos, None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)

    def get_vocab(self):
        return {f"<{i}>": i for i in range(self.vocab)}

    def __len__(self):
        return self.vocab

    def __call__(self, text):
        return {"input_ids": [int(t) % self.vocab for t in text.split()]}


def tiny_model(seed: int = 0, vocab: int = 64, layers: int = 2, eos: int = 63) -> models.LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=eos, bos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so greedy runs are not all near-ties
        model.lm_head.weight.mul_(40.0)
    return models.LoadedModel(f"tiny-{seed}", model, TinyTokenizer(vocab, eos), torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def tiny_target() -> models.LoadedModel:
    return tiny_model(0)


@pytest.fixture(scope="session")
def tiny_draft() -> models.LoadedModel:
    return tiny_model(1)


@pytest.fixture(scope="session")
def target() -> models.LoadedModel:
    """The embedded default target, SmolLM2-135M-Instruct in fp32 on CPU."""
    return models.get("smollm2-135m", torch.device("cpu"), torch.float32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(target):  # `target` loads the real model once; the app reuses it through models.get's cache
    """The app launched in-process on a free port (its own queue, as `python app.py` serves it)."""
    import app

    demo = app.build_ui()
    port = free_port()
    demo.queue(default_concurrency_limit=1).launch(prevent_thread_lock=True, server_name="127.0.0.1",
                                                   server_port=port, quiet=True, show_error=False)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the whole session; the browser tests skip, saying why, without it."""
    import os

    from tests.browser_kit import ARGS, CHROMIUM

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium to run the browser tests")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()
