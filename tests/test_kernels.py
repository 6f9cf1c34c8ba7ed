"""specviz/models/kernels/: the C row kernels' build (flags, cache key, warnings), the one line a failed build logs
before torch's kernels take over, and describe() naming what runs here."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess

import pytest
import torch

from specviz import hardware
from specviz.models import kernels

NEEDS = {"avx2", "fma"}


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """kernels as before its first call, building into an empty cache under tmp_path; everything restored after."""
    if not NEEDS <= kernels.cpu_flags():
        pytest.skip("this CPU lacks AVX2/FMA: nothing is compiled")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECVIZ_NO_KERNELS", raising=False)
    monkeypatch.setenv("SPECVIZ_KERNEL_ISA", "avx2")  # one build per test
    for name, value in (("_lib", None), ("_isa", None), ("_tried", False), ("_why", {})):
        monkeypatch.setattr(kernels, name, value)
    kernels.library.cache_clear()
    yield monkeypatch
    kernels.library.cache_clear()  # the real builds load again (from the real cache) on their next call


def copy_sources(tmp_path, monkeypatch):
    """The kernel sources copied into tmp_path/src, which the loader then compiles."""
    folder = tmp_path / "src"
    folder.mkdir()
    for name in (*kernels.SOURCES, *kernels.HEADERS):
        shutil.copy(kernels.SOURCE_DIR / name, folder / name)
    monkeypatch.setattr(kernels, "SOURCE_DIR", folder)
    return folder


def test_the_build_keeps_its_flags_and_its_sources_sit_in_the_package():
    """The same compiler call as the single-file kernels (the same bits), warnings on; the .c files and the header
    are plain files beside __init__.py (package data: specviz/models/kernels/*.c, *.h)."""
    command = kernels.compile_command("avx512", kernels.Path("/tmp/k.so"))
    folder = kernels.SOURCE_DIR
    assert command[1:] == ["-O3", "-mavx2", "-mfma", "-mavx512f", "-Wall", "-Wextra", "-fopenmp", "-fPIC", "-shared",
                           *(str(folder / name) for name in kernels.SOURCES), "-o", "/tmp/k.so", "-lm"]
    assert kernels.ISAS["avx2"][0] == ("-mavx2", "-mfma")
    assert {"rowwise_linear.c", "attend.c"} <= set(kernels.SOURCES) and "common.h" in kernels.HEADERS
    assert all((folder / name).is_file() for name in (*kernels.SOURCES, *kernels.HEADERS))
    assert folder == kernels.Path(kernels.__file__).resolve().parent


@pytest.mark.parametrize("isa", sorted(kernels.ISAS))
def test_the_sources_compile_without_warnings(tmp_path, isa):
    if compiler() is None:
        pytest.skip("no C compiler here")
    done = subprocess.run(kernels.compile_command(isa, tmp_path / "k.so"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_a_broken_source_logs_one_line_and_torch_runs(fresh, tmp_path, caplog):
    if compiler() is None:
        pytest.skip("no C compiler here")
    folder = copy_sources(tmp_path, fresh)
    with open(folder / "attend.c", "a") as f:
        f.write("\nint specviz_broken(void) { return }\n")
    with caplog.at_level(logging.WARNING, logger="specviz.kernels"):
        assert not kernels.available()
    records = [r for r in caplog.records if r.name == "specviz.kernels"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    line = records[0].getMessage()
    assert "\n" not in line and "attend.c:" in line and "error" in line and "torch path runs instead" in line
    assert str(folder) not in line  # the path shortened to the file's name
    assert kernels.describe().startswith("torch fallback: attend.c:") and "error" in kernels.describe()
    assert not list((tmp_path / "cache" / "specviz").glob("*.so"))  # nothing half-built left behind
    assert "torch fallback" in hardware.describe(torch.device("cpu"), torch.bfloat16)


def test_no_compiler_logs_one_line_and_torch_runs(fresh, caplog):
    fresh.setenv("CC", "/nonexistent/specviz-cc")
    with caplog.at_level(logging.WARNING, logger="specviz.kernels"):
        assert not kernels.available()
    records = [r.getMessage() for r in caplog.records if r.name == "specviz.kernels"]
    assert records == ["specviz kernels: the AVX2/FMA build failed (no C compiler found (/nonexistent/specviz-cc)); "
                       "the slow torch path runs instead"]
    assert kernels.describe() == "torch fallback: no C compiler found (/nonexistent/specviz-cc)"


def test_an_edited_source_rebuilds(fresh, tmp_path):
    """The cache key holds the sources' contents: an edit (a comment, here) builds a new library."""
    if compiler() is None:
        pytest.skip("no C compiler here")
    folder = copy_sources(tmp_path, fresh)
    assert kernels.library("avx2") is not None
    cache = tmp_path / "cache" / "specviz"
    first = {p.name for p in cache.glob("*.so")}
    with open(folder / "common.h", "a") as f:
        f.write("/* edited */\n")
    kernels.library.cache_clear()
    assert kernels.library("avx2") is not None
    second = {p.name for p in cache.glob("*.so")}
    assert len(first) == 1 and len(second) == 2 and first < second


def test_describe_names_the_isa(monkeypatch):
    if not kernels.available():
        assert kernels.describe().startswith("torch fallback: ")
        pytest.skip(f"no kernels here ({kernels.describe()})")
    assert kernels.describe() == f"C row kernels, {kernels.ISA_NAMES[kernels.best_isa()]} build"
    line = hardware.describe(torch.device("cpu"), torch.bfloat16)
    assert line.startswith("CPU (") and line.endswith(f"cores; {kernels.describe()}), bf16")
    assert kernels.describe() not in hardware.describe(torch.device("cpu"), torch.float32)  # bf16 only
    monkeypatch.setenv("SPECVIZ_KERNEL_ISA", "avx2")
    for name, value in (("_lib", None), ("_isa", None), ("_tried", False)):
        monkeypatch.setattr(kernels, name, value)
    assert kernels.describe() == "C row kernels, AVX2/FMA build"
    monkeypatch.setenv("SPECVIZ_NO_KERNELS", "1")
    monkeypatch.setattr(kernels, "_tried", False)
    monkeypatch.setattr(kernels, "_lib", None)
    assert kernels.describe() == "torch fallback: SPECVIZ_NO_KERNELS=1"
