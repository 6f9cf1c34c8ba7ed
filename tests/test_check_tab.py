"""The "Check a drafter" tab's form, through its handlers (no model, no browser): the drafter list is every
checkable method of the registry, every trained kind included; the draft field follows the method; its messages are
the app's own, never the CLI's flags."""
from __future__ import annotations

import html
import re

import gradio as gr
import pytest

from specviz import methods
from specviz.methods import TRAINED_METHODS
from specviz.ui import check


@pytest.fixture(scope="module")
def tab():
    """The tab built in a Blocks: (its components by elem_id, the method field's change handler)."""
    with gr.Blocks() as demo:
        check.check_tab()
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    method = by_id["check-method"]
    change = next(f for f in demo.fns.values() if any(t[0] == method._id and t[1] == "change" for t in f.targets))
    assert [o._id for o in change.outputs] == [by_id["check-draft"]._id]
    return by_id, change.fn


def test_every_trained_kind_is_offered(tab):
    by_id, _ = tab
    offered = [value for _, value in by_id["check-method"].choices]
    assert set(TRAINED_METHODS) <= set(offered) and "layerskip" in offered
    assert offered == list(methods.names(lambda s: s.checkable))
    info = by_id["check-method"].info
    assert all(name in info for name in offered)  # each named in the info line, from the registry


def test_the_draft_field_follows_the_method(tab):
    by_id, changed = tab
    assert by_id["check-draft"].value == "int8" and by_id["check-draft"].visible
    eagle = changed("eagle")
    assert eagle["value"] == check.SHIPPED and eagle["choices"] == [check.SHIPPED] and eagle["visible"]
    assert "EAGLE drafter" == eagle["label"] and "int8" not in str(eagle)
    for kind in TRAINED_METHODS:  # every trained kind: the shipped drafter, never the draft model's int8
        if methods.spec(kind).checkable:
            assert changed(kind)["value"] == check.SHIPPED
    assert changed("pld")["visible"] is False
    back = changed("vanilla")
    assert back["value"] == "int8" and back["visible"] and back["label"] == "Draft model"


def message(**kwargs) -> str:
    out = check.run_check_ui(**{"prompts": 1, "max_new_tokens": 8, **kwargs})
    return html.unescape(re.sub("<[^>]+>", "", out[0]))


@pytest.mark.parametrize("kwargs, needle", [
    (dict(method="eagle", draft="/no/such/folder"), "drafter folder '/no/such/folder' does not exist on this machine"),
    (dict(method="layerskip", draft="./missing"), "pick “shipped” for the drafter specviz ships"),
    (dict(method="medusa", target="HuggingFaceTB/SmolLM2-360M-Instruct", draft="shipped"),
     "no medusa drafter is shipped for target 'HuggingFaceTB/SmolLM2-360M-Instruct'"),
])
def test_messages_are_the_apps_own(monkeypatch, kwargs, needle):
    monkeypatch.delenv("SPECVIZ_PUBLIC", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    line = message(**kwargs)
    assert needle in line and "\n" not in line
    assert not re.search(r"(?<![\w-])--\w", line), line  # no command-line flag reaches a browser
