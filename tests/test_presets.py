"""The race form's presets (specviz/ui/presets.py): each fills the fields it names from the machine's measured choices
and DecodeConfig's defaults, with values DecodeConfig accepts, and the form's handler puts them in the fields."""
from __future__ import annotations

import warnings

import pytest

from specviz import hardware
from specviz.config import DecodeConfig
from specviz.ui import controls, presets, race
from specviz.ui.logic import make_config

# a machine whose measured choices differ from DecodeConfig's defaults everywhere, so a preset that ignored them shows
PAIR = hardware.Pair("target-x", "draft-x", method="eagle", gammas=(("eagle", 2), ("pld", 6), ("vanilla", 3)),
                     lookups=(("eagle", 3),), retrieves=(("eagle", 1),))
DEFAULTS = DecodeConfig()


@pytest.mark.parametrize("name", presets.NAMES)
def test_each_preset_names_every_field_with_values_decode_config_accepts(name):
    s = presets.settings(name, PAIR)
    assert set(s) == set(presets.FIELDS)
    cfg = make_config(s["method"], str(s["gamma"]), s["temperature"], s["top_p"], DEFAULTS.max_new_tokens,
                      DEFAULTS.seed, str(s["lookup"]), str(s["retrieve"]))
    cfg = cfg.with_(**controls.tree_settings(s["method"], s["tree"], s["tree_nodes"]))
    assert (cfg.method, cfg.gamma, cfg.lookup, cfg.retrieve) == (s["method"], s["gamma"], s["lookup"], s["retrieve"])
    assert s["gamma"] == PAIR.gamma_for(s["method"])  # each method at its fastest γ measured here
    assert s["draft"] == PAIR.draft


def test_the_presets_differ_where_their_names_say():
    best, eagle, pld, vanilla, sampled = (presets.settings(n, PAIR) for n in presets.NAMES)
    assert best == presets.settings(presets.BEST, PAIR)
    assert (best["method"], best["lookup"], best["retrieve"]) == ("eagle", 3, 1)  # the machine's own race
    assert (eagle["method"], eagle["lookup"], eagle["retrieve"]) == ("eagle", 0, 0)  # the trained drafter alone
    assert (pld["method"], pld["gamma"]) == ("pld", 6)
    assert (vanilla["method"], vanilla["gamma"]) == ("vanilla", 3)
    assert sampled == {**best, "temperature": presets.SAMPLING_TEMPERATURE}
    assert all(s["temperature"] == DEFAULTS.temperature for s in (best, eagle, pld, vanilla))  # greedy


def test_an_unknown_preset_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"preset='fastest' is not a preset: use one of This machine's best"):
        presets.settings("fastest", PAIR)


def test_choosing_a_preset_fills_the_form_and_shows_the_fields_its_method_takes(monkeypatch):
    monkeypatch.setattr(hardware, "default_pair", lambda device=None: PAIR)
    for name in presets.NAMES:
        s = presets.settings(name, PAIR)
        with warnings.catch_warnings():  # no "value not in the list of choices" lines in the server's log
            warnings.simplefilter("error")
            out = race.preset_chosen(name)  # by output name (wiring.by_name)
            race.method_changed(s["method"])
        method, draft, gamma, lookup, retrieve, tree, tree_nodes, temperature, top_p = (out[k] for k in (
            "method", "draft", "gamma", "lookup", "retrieve", "tree", "tree_nodes", "temperature", "top_p"))
        fields = controls.race_fields(s["method"])
        assert (method["value"], draft["value"], gamma["value"], lookup["value"], retrieve["value"]) == (
            s["method"], s["draft"], str(s["gamma"]), str(s["lookup"]), str(s["retrieve"])), name
        assert (tree["value"], tree_nodes["value"], temperature, top_p) == (
            s["tree"], str(s["tree_nodes"]), s["temperature"], s["top_p"]), name
        shown = (draft["visible"], lookup["visible"], tree["visible"])
        assert shown == (fields.draft, fields.lookup, fields.tree), name


def test_the_menus_offer_only_methods_a_visitor_can_run(tmp_path, monkeypatch):
    """A trained method with no shipped drafter (DFlash until one is trained) stays off the race's and the
    step-through's menus; the untrained ones and the shipped trained ones stay on."""
    from specviz import methods, paths
    from specviz.ui import common

    monkeypatch.setattr(paths, "DRAFTERS", tmp_path)
    (tmp_path / "smollm2-135m-eagle").mkdir()
    shown = common.at_hand(methods.SPECULATIVE, "smollm2-135m")
    assert "eagle" in shown and "pld" in shown and "vanilla" in shown
    assert not [m for m in shown if methods.spec(m).trained and m != "eagle"]
    assert "dflash" not in common.at_hand(methods.SPECULATIVE)  # none is shipped yet
