"""The default pair per machine (GPU pair on CUDA when the Hub answers, else the embedded one, saying so), the
trained drafters tied to their target, the CLI's defaults, and the one-line hardware description."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specviz import hardware
from specviz.cli import main as cli
from specviz.hardware import CPU_LOOKUP, EMBEDDED_PAIR, GPU_DRAFT, GPU_PAIR, GPU_TARGET

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def never() -> bool:
    raise AssertionError("the Hub must not be asked on a CPU")


def test_choose_pair():
    assert hardware.choose_pair(False, never) == EMBEDDED_PAIR
    assert hardware.choose_pair(True, lambda: True) == GPU_PAIR
    offline = hardware.choose_pair(True, lambda: False)
    assert (offline.target, offline.draft) == ("smollm2-135m", "int8")
    assert offline.note == "Hub unreachable: using the embedded pair smollm2-135m + int8"


def test_this_cpu_gets_the_embedded_pair_without_asking_the_hub(monkeypatch):
    monkeypatch.setattr(hardware, "hub_reachable", never)
    monkeypatch.setattr(hardware, "_tuned", {})  # before this machine is measured (hardware.adopt)
    hardware._pair_for.cache_clear()
    try:
        assert hardware.default_pair(torch.device("cpu")) == EMBEDDED_PAIR
        if not torch.cuda.is_available():
            assert hardware.default_pair() == EMBEDDED_PAIR
    finally:
        hardware._pair_for.cache_clear()


@pytest.mark.parametrize("pair, method, draft, expected", [
    (GPU_PAIR, "vanilla", "", (GPU_TARGET, GPU_DRAFT)),
    (GPU_PAIR, "vanilla", "int8", (GPU_TARGET, "int8")),
    (GPU_PAIR, "pld", None, (GPU_TARGET, GPU_DRAFT)),
    (GPU_PAIR, "eagle", GPU_DRAFT, ("smollm2-135m", "int8")),     # the form's vanilla draft: the shipped drafter
    (GPU_PAIR, "medusa", "", ("smollm2-135m", "int8")),
    (EMBEDDED_PAIR, "vanilla", None, ("smollm2-135m", "int8")),
    (EMBEDDED_PAIR, "eagle", "out/my-eagle", ("smollm2-135m", "out/my-eagle")),
])
def test_run_args_tie_trained_drafters_to_their_target(pair, method, draft, expected):
    assert pair.run_args(method, draft) == expected


def test_hub_probe_is_quick_and_never_raises(monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hardware.hub_reachable(("specviz-test/not-cached",)) is False
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def unreachable(url, timeout=None):
        assert timeout == hardware.HUB_TIMEOUT_S
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", unreachable)
    assert hardware.hub_reachable(("specviz-test/not-cached",)) is False
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, timeout=None: object())
    assert hardware.hub_reachable(("specviz-test/not-cached",)) is True


def test_a_hub_id_the_hub_does_not_answer_for_is_one_line_before_transformers_tries(monkeypatch):
    """An unknown Hub id offline took 48 s (transformers' five retries) before its one line; now the short probe
    answers first, and transformers is never asked."""
    import transformers

    from specviz import hub
    from specviz.models import loader

    asked = []
    monkeypatch.setattr(hub, "reachable", lambda repos: asked.append(list(repos)) or False)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: pytest.fail("transformers was asked for a repo the Hub did not answer for"))
    with pytest.raises(loader.ModelError, match=r"could not load model 'not/a-model': 'not/a-model' is not in this "
                                                r"machine's Hugging Face cache and the Hub did not answer"):
        loader.load("not/a-model", torch.device("cpu"), torch.float32)
    assert asked == [["not/a-model"]]


def test_describe(monkeypatch):
    text = hardware.describe(torch.device("cpu"), torch.float32)
    assert text.startswith("CPU (") and text.endswith("cores), fp32")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert hardware.describe(torch.device("cuda"), torch.bfloat16) == "NVIDIA H200 (cuda), bf16"


def parsed(argv: list[str], pair: hardware.Pair, monkeypatch):
    monkeypatch.setattr(hardware, "default_pair", lambda device=None: pair)
    args = cli.parser().parse_args(argv)
    cli.default_pair(args)
    return args


@pytest.mark.parametrize("argv, target, draft", [
    (["generate", "--prompt", "x"], GPU_TARGET, GPU_DRAFT),
    (["generate", "--prompt", "x", "--method", "eagle"], "smollm2-135m", "int8"),
    (["generate", "--prompt", "x", "--target", "smollm2-135m"], "smollm2-135m", "int8"),
    (["generate", "--prompt", "x", "--draft", "int8"], GPU_TARGET, "int8"),
    (["bench", "--prompts", "p.txt", "--json", "o.json", "--method", "vanilla", "eagle:2"], "smollm2-135m", "int8"),
    (["bench", "--prompts", "p.txt", "--json", "o.json", "--method", "pld", "eagle:2@out/x"], "smollm2-135m", "int8"),
    (["check"], GPU_TARGET, GPU_DRAFT),
    (["check", "--method", "pld"], GPU_TARGET, None),
])
def test_cli_defaults_on_a_gpu(argv, target, draft, monkeypatch):
    args = parsed(argv, GPU_PAIR, monkeypatch)
    assert (args.target, args.draft) == (target, draft)


def test_cli_says_when_the_hub_is_unreachable(monkeypatch, capsys):
    args = parsed(["generate", "--prompt", "x"], hardware.choose_pair(True, lambda: False), monkeypatch)
    assert (args.target, args.draft) == ("smollm2-135m", "int8")
    assert capsys.readouterr().err.strip() == "specviz: Hub unreachable: using the embedded pair smollm2-135m + int8"


def test_cli_defaults_on_a_cpu(monkeypatch):
    args = parsed(["generate", "--prompt", "x"], EMBEDDED_PAIR, monkeypatch)
    assert (args.target, args.draft) == ("smollm2-135m", "int8")


def test_default_gamma_per_method_is_the_measured_one():
    """On a CPU the default race is EAGLE at γ 1, the first level of its shipped tree (measured fastest over the fused
    AR: hardware.CPU_METHOD), prompt lookup defaults to γ 2 and the other trained chain drafters to γ 1 (README,
    Results); methods without a measured γ (vanilla, Medusa's tree depth) and the GPU pair keep DecodeConfig's."""
    from specviz.config import DecodeConfig

    assert (EMBEDDED_PAIR.method, EMBEDDED_PAIR.gamma) == ("eagle", 1)
    assert EMBEDDED_PAIR.gamma_for("pld") == 2
    assert [EMBEDDED_PAIR.gamma_for(m) for m in ("eagle", "draft", "layerskip")] == [1, 1, 1]
    tree = json.loads((ASSETS / "drafters" / "smollm2-135m-eagle" / "config.json").read_text())["tree"]
    assert sum(len(p) <= EMBEDDED_PAIR.gamma_for("eagle") for p in tree) >= 2  # γ caps the depth: a tree still drafts
    assert EMBEDDED_PAIR.gamma_for("vanilla") == EMBEDDED_PAIR.gamma_for("medusa") == DecodeConfig.gamma
    assert GPU_PAIR.gamma == GPU_PAIR.gamma_for("eagle") == DecodeConfig.gamma


def test_default_lookup_branch_rides_on_the_tree_drafters_only():
    """On a CPU EAGLE and Medusa carry prompt lookup's branch of the measured length; no other method can (DecodeConfig
    refuses it) and the GPU pair measured none."""
    from specviz.config import DecodeConfig
    from specviz.methods import names

    LOOKUP_METHODS = names(lambda s: "lookup" in s.grafts)
    assert CPU_LOOKUP > 0
    assert [EMBEDDED_PAIR.lookup_for(m) for m in LOOKUP_METHODS] == [CPU_LOOKUP] * len(LOOKUP_METHODS)
    assert EMBEDDED_PAIR.lookup_for("pld") == EMBEDDED_PAIR.lookup_for("vanilla") == DecodeConfig.lookup == 0
    assert GPU_PAIR.lookup_for("eagle") == 0
    for method in LOOKUP_METHODS:
        DecodeConfig(method=method, lookup=EMBEDDED_PAIR.lookup_for(method))  # valid


def test_default_datastore_branch_rides_on_the_tree_drafters_only():
    """Likewise the datastore's branch: on a CPU on EAGLE and Medusa with the embedded target, nowhere on the GPU
    pair."""
    from specviz.config import DecodeConfig
    from specviz.hardware import CPU_GRAFTS, CPU_RETRIEVE
    from specviz.methods import names

    LOOKUP_METHODS = names(lambda s: "lookup" in s.grafts)
    assert CPU_RETRIEVE > 0
    assert [EMBEDDED_PAIR.retrieve_for(m) for m in LOOKUP_METHODS] == [2 if m == "dflash" else CPU_RETRIEVE
                                                                       for m in LOOKUP_METHODS]  # DFlash's measured
    assert EMBEDDED_PAIR.retrieve_for("pld") == EMBEDDED_PAIR.retrieve_for("vanilla") == DecodeConfig.retrieve == 0
    assert GPU_PAIR.retrieve_for("eagle") == 0
    assert CPU_GRAFTS == {"lookup": CPU_LOOKUP, "retrieve": CPU_RETRIEVE}
    for method in LOOKUP_METHODS:
        DecodeConfig(method=method, retrieve=EMBEDDED_PAIR.retrieve_for(method))  # valid
