"""The method registry (specviz/methods.py): every name list and per-method choice is derived from it."""
import subprocess
import sys

import pytest
import torch
from tiny import random_drafter

from specviz import engines, methods
from specviz.config import DecodeConfig
from specviz.drafters import trained as drafters
from specviz.drafters.config import KINDS, DrafterConfig, DrafterError
from specviz.engines.speculative import SpeculativeEngine
from specviz.engines.tree import TreeEngine
from specviz.errors import ConfigError

# The shipped methods, in registry order. A method added later comes after them and needs no change here: the
# checks below pin these seven and derive everything else from the registry.
ORDER = ("ar", "vanilla", "pld", "eagle", "medusa", "layerskip", "draft")


def shipped(names: tuple[str, ...]) -> tuple[str, ...]:
    """The shipped methods among `names`, in their order."""
    return tuple(n for n in names if n in ORDER)


def test_registry_order_and_fields():
    assert methods.names()[:len(ORDER)] == ORDER and tuple(methods.METHODS) == methods.names()
    for name, s in methods.METHODS.items():
        assert s.name == name and s.label and s.description and "\n" not in s.description
        assert s.family in ("baseline", "draft model", "lookup", "trained")
        assert s.drafts in ("none", "chain", "tree")
        assert set(s.grafts) <= {"lookup", "retrieve"}
        assert s.gamma_applies == s.speculative  # γ means something for every drafter, nothing for AR
        assert s.kind == (name if s.trained else "")
        assert bool(s.loss) == bool(s.module) == bool(s.layout) == s.trained  # trained: `python -m specviz train NAME`
        assert not s.tree_from or s.tree  # a tree chosen at training: a tree drafter (DFlash's comes from its block)
        assert not (s.trained and s.uses_draft_model)
        if s.checkable:
            assert s.chain and s.drafter  # the check runs a chain drafter over the chain loop
    with pytest.raises(Exception):
        methods.METHODS["ar"].name = "x"  # frozen


def test_derived_name_lists_match_the_registry():
    from specviz import hardware
    from specviz.check import run as check
    from specviz.engines import costs
    from specviz.ui import logic

    names = methods.names
    assert methods.TRAINED_METHODS == names(lambda s: s.trained) == KINDS
    assert methods.CHAIN_METHODS == names(lambda s: s.chain)
    assert methods.CHECK_METHODS == names(lambda s: s.checkable)
    assert logic.SPEC_METHODS == methods.SPECULATIVE == names(lambda s: s.speculative)
    assert shipped(methods.TRAINED_METHODS) == ("eagle", "medusa", "layerskip", "draft")
    assert shipped(methods.CHAIN_METHODS) == ("vanilla", "pld", "eagle", "medusa", "layerskip", "draft")
    assert shipped(methods.CHECK_METHODS) == ("vanilla", "pld", "eagle", "medusa", "layerskip", "draft")
    assert shipped(methods.SPECULATIVE) == ORDER[1:]
    assert shipped(names(lambda s: "lookup" in s.grafts)) == ("eagle", "medusa")
    assert shipped(drafters.SMALL_KINDS) == ("eagle", "medusa", "layerskip")
    assert shipped(check.CHECKED_TRAINED) == ("eagle", "medusa", "layerskip", "draft")
    assert shipped(costs.COST_METHODS) == ("vanilla", "eagle", "medusa", "layerskip", "draft")
    assert shipped(tuple(m for m, _ in hardware.CPU_LOOKUPS)) == ("eagle", "medusa")
    assert {n for _, n in hardware.CPU_LOOKUPS} == {hardware.CPU_LOOKUP}
    assert {n for m, n in hardware.CPU_RETRIEVES if m != "dflash"} == {hardware.CPU_RETRIEVE}
    assert dict(hardware.CPU_RETRIEVES)["dflash"] == 2  # DFlash's measured race (hardware.CPU_TREES)
    assert [m for m in ORDER if methods.spec(m).uses_draft_model] == ["vanilla"]
    assert [m for m in ORDER if methods.spec(m).tree] == ["eagle", "medusa"]


@pytest.mark.parametrize("name", methods.names())
def test_every_name_builds_a_config(name):
    cfg = DecodeConfig(method=name)
    assert cfg.method == name and methods.spec(name) is methods.METHODS[name]


@pytest.mark.parametrize("bad", ["eagle3", "", "AR", None, 3])
def test_unknown_name_is_one_line(bad):
    with pytest.raises(ConfigError) as spec_error:
        methods.spec(bad)
    message = str(spec_error.value)
    assert message == f"method={bad!r} is unknown: use one of {', '.join(methods.names())}"
    assert message.startswith(f"method={bad!r} is unknown: use one of ar, vanilla, pld, eagle, medusa, layerskip")
    if isinstance(bad, str):
        with pytest.raises(ConfigError) as config_error:
            DecodeConfig(method=bad)
        assert str(config_error.value) == message  # the same line as DecodeConfig's


@pytest.mark.parametrize("name", methods.names())
@pytest.mark.parametrize("branch", ["lookup", "retrieve"])
def test_grafts_only_where_the_spec_says(name, branch):
    if branch in methods.spec(name).grafts:
        assert getattr(DecodeConfig(method=name, **{branch: 4}), branch) == 4
    else:
        with pytest.raises(ConfigError, match=f"^{branch}=4 applies to the tree drafters only: use it with eagle or "
                                              f"medusa or dflash, not {name}$"):
            DecodeConfig(method=name, **{branch: 4})


def test_dotted_paths_resolve_in_their_defining_modules():
    """Each "module:attribute" names the module that defines the attribute, not one that merely imports it."""
    for s in methods.METHODS.values():
        for path in (s.engine, s.drafter, s.module, s.loss):
            if path:
                target = methods.load(path)
                assert callable(target), path
                assert target.__module__ == path.partition(":")[0], f"{path}: defined in {target.__module__}"


def test_each_exporter_is_found_through_the_registry():
    """`export` and `serve` convert exactly the methods whose entry names an exporter, each a DrafterExport."""
    from specviz.serving import engine_export
    from specviz.serving.export_common import DrafterExport

    with_export = methods.names(lambda s: bool(s.exporter))
    assert engine_export.KINDS == with_export and set(with_export) >= {"eagle", "medusa", "draft"}
    for name in with_export:
        assert isinstance(methods.load(methods.spec(name).exporter), DrafterExport), name
        assert engine_export.exporter(name) is methods.load(methods.spec(name).exporter)
    assert engine_export.exporter("layerskip") is None and engine_export.exporter("nope") is None


def test_registry_and_config_are_torch_free():
    code = "import sys, specviz.config, specviz.methods; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_untrained_engines_follow_the_registry(tiny_target, tiny_draft):
    assert engines.build("ar", tiny_target).method == "ar"
    assert isinstance(engines.build("pld", tiny_target), SpeculativeEngine)
    vanilla = engines.build("vanilla", tiny_target, tiny_draft)
    assert vanilla.method == "vanilla" and vanilla.drafter.draft is tiny_draft


@pytest.mark.parametrize("kind,extra", [("eagle", {"tree": [[0], [1], [0, 0]]}), ("medusa", {"medusa_heads": 2}),
                                        ("layerskip", {"exit_layer": 1}), ("draft", {"draft_layers": [0]}),
                                        ("dflash", {"feature_layers": [1, 2], "block_size": 4, "num_hidden_layers": 1,
                                                    "mask_token_id": 62})])
def test_trained_engines_follow_the_registry(tmp_path, tiny_target, kind, extra):
    d = random_drafter(tiny_target, kind, torch.arange(0, 64, 2), **extra)
    drafters.save(tmp_path / "d", d.module, d.cfg, d.vocab_ids, "# card\n")
    s = methods.spec(kind)
    race, chain = (engines.build_trained(tmp_path / "d", tiny_target, chain=c) for c in (False, True))
    assert race.method == chain.method == kind
    assert isinstance(race, TreeEngine) == s.tree and not isinstance(chain, TreeEngine)
    assert torch.equal(race.draft_vocab_ids, d.vocab_ids)
    assert drafters.describe(d.cfg).endswith("draft vocabulary 32 of 64")
    if s.checkable:
        from specviz.check import run as check

        drafter, draft = check.drafter_for(kind, tiny_target, str(tmp_path / "d"))
        assert isinstance(drafter, methods.load(s.drafter)) and draft is None


def test_describe_names_each_layout(tiny_target):
    cfg = lambda kind, **extra: DrafterConfig.for_target(kind, "t", tiny_target.model.config, **extra)  # noqa: E731
    assert drafters.describe(cfg("eagle")) == "EAGLE, one decoder layer, full vocabulary"
    eagle3 = drafters.describe(cfg("eagle", feature_layers=[1, 2]))
    assert eagle3.startswith("EAGLE-3, one decoder layer over the target's hidden states after layers [1, 2]")
    assert drafters.describe(cfg("medusa", medusa_heads=3)) == "Medusa, 3 heads, full vocabulary"
    assert drafters.describe(cfg("layerskip", exit_layer=1)).startswith("LayerSkip: the target's first 1 layers")
    assert drafters.describe(cfg("draft", draft_layers=[0])).startswith("a distilled draft model of 1 decoder layers")
    with pytest.raises(DrafterError, match="drafter kind 'x' is unknown: use one of eagle, medusa"):
        drafters.build_module(cfg("x"))
