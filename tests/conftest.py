"""Shared fixtures: the real default target (loaded once per session) and a tiny random model (tests/tiny.py)."""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import tempfile
import warnings

import pytest
import torch
from tiny import tiny_model

from specviz.models import loader as models

warnings.filterwarnings("ignore", category=DeprecationWarning)
# what the product keeps between starts (the calibration, GGUFs converted once) goes to one folder per test session,
# never the user's ~/.cache: runs stay independent, and the app processes the tests start share the session's copy
TEST_CACHE = tempfile.mkdtemp(prefix="specviz-test-cache-")
os.environ["SPECVIZ_CACHE_DIR"] = TEST_CACHE
atexit.register(shutil.rmtree, TEST_CACHE, ignore_errors=True)
# 2 threads, as the app runs; SPECVIZ_TEST_THREADS=1 leaves the other core to a job beside the tests (a training run)
torch.set_num_threads(int(os.environ.get("SPECVIZ_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def tiny_target() -> models.LoadedModel:
    return tiny_model(0)


@pytest.fixture(scope="session")
def tiny_draft() -> models.LoadedModel:
    return tiny_model(1)


@pytest.fixture(scope="session")
def target() -> models.LoadedModel:
    """The embedded default target, SmolLM2-135M-Instruct on CPU in this machine's default dtype (bf16 where
    the CPU has a bf16 vector path: the bitwise engine), as the app and the CLI load it."""
    cpu = torch.device("cpu")
    return models.get("smollm2-135m", cpu, models.default_dtype(cpu))


@pytest.fixture(scope="session")
def target_bf16(target) -> models.LoadedModel:
    """The default target in bf16 on CPU: the bitwise engine (row-wise attention)."""
    return target if target.dtype == torch.bfloat16 else models.get("smollm2-135m", torch.device("cpu"), torch.bfloat16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(demo, **launch):
    """Serve a built app in-process on a free port (its own queue, as `python app.py` serves it, with `launch`'s
    extra launch() options); yields the URL."""
    port = free_port()
    demo.queue(default_concurrency_limit=1).launch(prevent_thread_lock=True, server_name="127.0.0.1",
                                                   server_port=port, quiet=True, show_error=False, **launch)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def app_url(target):  # `target` loads the real model once; the app reuses it through models.get's cache
    """The app launched in-process on a free port."""
    import app
    from specviz import hardware

    hardware.adopt(target)  # as app.warm_up does: the default race chosen from this machine's T(k)
    with serving(app.build_ui(), **app.launch_options()) as url:  # with its /metrics route
        yield url


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


# Test tiers (README, "Tests"): `make test-fast` runs the unit tier alone (-m "not integration and not browser and not
# gpu"); `make test` runs every tier. A test is `browser` when it drives headless Chromium, `integration` when it
# loads the real default target (through these fixtures, or marked so by hand where it loads it another way).
REAL_MODEL_FIXTURES = {"target", "target_bf16", "app_url"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "browser" in item.fixturenames or item.path.name.startswith("test_browser"):
            item.add_marker(pytest.mark.browser)
        elif REAL_MODEL_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load (or target export) fails the test: the input must be refused before the target (~30 s) loads."""
    from specviz.models import loader as models
    from specviz.serving import engine_export

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")
    monkeypatch.setattr(models, "get", refuse)
    monkeypatch.setattr(models, "load", refuse)
    monkeypatch.setattr(engine_export, "export_target", refuse)
