"""Gradio outputs wired by name (specviz/ui/wiring.py): a handler's {name: value} reaches the component of that name
whatever the order of the event's outputs, a name not wired fails naming it, and nothing to update is gradio's skip.
The race tab's handlers name only outputs their events wire (built in a real gr.Blocks)."""
from __future__ import annotations

import inspect

import gradio as gr
import pytest

from specviz.ui import race, race_views, wiring


def test_values_reach_their_components_by_name_in_any_order():
    a, b, c = "A", "B", "C"  # stand-ins for components: any hashable
    handler, outputs = wiring.by_name(lambda x: {"second": x + 1, "first": x}, {"first": a, "second": b, "third": c})
    assert outputs == [a, b, c]
    assert handler(1) == {a: 1, b: 2}  # "third" left out: unchanged


def test_a_generator_stays_a_generator_with_its_signature():
    def stream(prompt, tokens=3):
        yield {"status": prompt}
        yield {}

    handler, _ = wiring.by_name(stream, {"status": "S"})
    assert inspect.isgeneratorfunction(handler)
    assert list(inspect.signature(handler).parameters) == ["prompt", "tokens"]  # gradio maps inputs by it
    assert list(handler("go")) == [{"S": "go"}, gr.skip()]


def test_a_name_not_wired_fails_naming_it():
    handler, _ = wiring.by_name(lambda: {"statsu": 1}, {"status": "S"})
    with pytest.raises(KeyError, match=r"\['statsu'\] are not wired.*\['status'\]"):
        handler()


def test_a_view_shows_its_outputs_by_name_and_leaves_none_out():
    view = race_views.View("st", "ar", "spec", "sum", tree="fig")
    assert view.shown() == {"status": "st", "pane_ar": "ar", "pane_spec": "spec", "summary": "sum", "tree": "fig"}


def test_the_race_tabs_handlers_name_only_wired_outputs():
    """Every name the race tab's View and form handlers can return is among its events' outputs (the Blocks' own
    wiring, read back from the built app)."""
    with gr.Blocks() as demo:
        race.race_tab()
    wired = {fn.name: {getattr(o, "elem_id", None) for o in fn.outputs} for fn in demo.fns.values()}
    assert {"pane-ar", "pane-spec", "status", "summary", "replay"} <= wired["run_race"]
    assert {"pane-ar", "pane-spec", "status", "replay"} <= wired["stop_run"]
    assert {"draft", "gamma", "lookup", "retrieve", "tree", "tree-nodes"} <= wired["method_changed"]
    assert {"method", "temperature", "top-p"} | wired["method_changed"] <= wired["preset_chosen"]
    assert "preset" in wired["edited_by_hand"]


def test_a_page_opened_after_ready_names_the_machines_race_as_it_loads():
    """The start-up's follow-up (startup.follow_ready) runs as the page loads, not only at the timer's first tick:
    a page opened after ready showed the shipped race's title in the empty pane for a second."""
    with gr.Blocks() as demo:
        race.race_tab()
    on_load = [{getattr(o, "elem_id", None) for o in fn.outputs} for fn in demo.fns.values()
               if any(event == "load" for _, event in fn.targets)]
    assert any({"pane-spec", "method", "startup"} <= outputs for outputs in on_load), on_load


@pytest.mark.parametrize("tab, elem_id", [("race", "method"), ("check", "check-method")])
def test_each_method_menu_says_what_every_method_in_it_is(tab, elem_id):
    """The method menus' info lines come from the registry (common.method_info): the race form's was written by
    hand and left dflash out."""
    from specviz.ui import check

    with gr.Blocks() as demo:
        (race.race_tab if tab == "race" else check.check_tab)()
    menu = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)
    names = [c[1] if isinstance(c, (tuple, list)) else c for c in menu.choices]
    assert names and all(f"{n}:" in menu.info or f"{n}," in menu.info for n in names), (names, menu.info)
