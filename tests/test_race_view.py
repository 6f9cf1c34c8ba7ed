"""The race tab's lesson at the end (specviz/ui/lesson.py) and its controls that follow the method
(specviz/ui/controls.py, read from the registry in specviz/methods.py). Golden events, no model."""
from __future__ import annotations

from dataclasses import replace

import pytest
from test_app_logic import snapshot
from test_render import AR, PARTIAL

from specviz import methods
from specviz.config import DecodeConfig
from specviz.events import EmittedToken as E
from specviz.events import StepEvent
from specviz.events import Verdict as V
from specviz.ui import controls, lesson, race_html

# AR's "The sky" in one step
SAME = [StepEvent(step=0, drafts=(), emitted=(E(11, "The", V.ACCEPTED, 0.9), E(12, " sky", V.BONUS, 0.7)))]


def test_greedy_identical_texts_say_so_and_show_both_one_above_the_other():
    out = race_html.summary_html(snapshot(AR, SAME))
    assert "identical to plain decoding" in out
    assert 'data-texts="same"' in out and "identical, token for token" in out and "greedy" in out
    texts = out[out.index('id="texts"'):]
    assert texts.index('data-lane="ar"') < texts.index('data-lane="spec"')  # plain above speculative
    assert texts.count(">The sky</div>") == 2 and "<mark" not in texts


def test_sampled_texts_say_where_and_why_they_differ():
    cfg = DecodeConfig(method="vanilla", temperature=1.0)
    spec = [replace(PARTIAL, emitted=PARTIAL.emitted[:1] + (E(9, " sea", V.RESAMPLED),))]  # "The sea" vs "The sky"
    out = race_html.summary_html(snapshot(AR, spec, cfg))
    assert 'data-texts="differ"' in out
    assert "agree on the first 1 token and part at token 2" in out
    assert "different random draws" in out and "same distribution" in out
    assert '<mark title="from here on the two texts differ"> sea</mark>' in out


def test_the_lesson_line_for_sampled_texts_that_came_out_the_same():
    assert "happened to agree" in lesson.lesson_line([1, 2], [1, 2], greedy=False)
    assert "bug" in lesson.lesson_line([1, 2], [1, 3], greedy=True)


@pytest.mark.parametrize("method", methods.SPECULATIVE)
def test_race_fields_follow_the_registry(method):
    entry, fields = methods.spec(method), controls.race_fields(method)
    assert fields.draft == entry.uses_draft_model
    assert (fields.lookup, fields.retrieve) == ("lookup" in entry.grafts, "retrieve" in entry.grafts)
    assert fields.gamma == entry.gamma_applies and fields.gamma_info == entry.gamma
    hidden = (not fields.draft) + (not fields.lookup or not fields.retrieve) + (not fields.gamma)
    assert len(fields.reasons) == hidden  # one reason per hidden field (the two branches share one)
    assert (fields.note_html() != "") == bool(hidden)


def test_race_fields_for_the_methods_a_workshop_meets():
    vanilla, pld, eagle = (controls.race_fields(m) for m in ("vanilla", "pld", "eagle"))
    assert vanilla.draft and not vanilla.lookup and "hang on a tree" in vanilla.note_html()
    assert not pld.draft and not pld.lookup
    assert not eagle.draft and eagle.lookup and eagle.retrieve and "No draft model (eagle" in eagle.note_html()


@pytest.mark.parametrize("method", methods.names(lambda s: s.chain))
def test_step_fields_show_the_draft_model_only_for_a_draft_model_method(method):
    fields = controls.step_fields(method)
    assert fields.draft == methods.spec(method).uses_draft_model
    assert not fields.lookup and not fields.retrieve
    assert ('id="step-method-note"' in fields.note_html("step-method-note")) == (not fields.draft)
