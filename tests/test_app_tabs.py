"""The "Step through" and "Check a drafter" tabs through a real client (gradio_client), on the real default
pair: the step-through handler sequence reset -> next -> next -> run to end, and one quick check run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

gradio_client = pytest.importorskip("gradio_client")

PROMPT = "Name three primary colours."
SETTINGS = dict(prompt=PROMPT, method="vanilla", draft="int8", gamma="3", temperature=1.0, seed=7, max_new_tokens=8)


@pytest.fixture(scope="module")
def client(app_url):
    return gradio_client.Client(app_url, verbose=False)


def data_of(out):
    """The JSON output (the last) of a step endpoint; State is not part of the API."""
    return out[-1]


def verdicts(cycle):
    return [p["verdict"] for p in cycle["positions"]]


def test_step_through_sequence(client):
    start = data_of(client.predict(**SETTINGS, api_name="/step_reset"))
    assert start["step"] == 0 and start["cycle"] is None and not start["finished"] and start["seed"] == 7
    first = data_of(client.predict(**SETTINGS, api_name="/step_next"))
    second = data_of(client.predict(**SETTINGS, api_name="/step_next"))
    assert (first["step"], second["step"]) == (1, 2)  # the session's state carried between calls
    for d in (first, second):
        v = verdicts(d["cycle"])
        assert v[-1] in ("resampled", "bonus", "plain")  # the target's own token closes each cycle
        drafted = [p for p in d["cycle"]["positions"] if p["kind"] == "draft"]
        assert len(drafted) == d["cycle"]["gamma"] == 3
        for p in drafted:
            if p["verdict"] in ("accepted", "rejected"):
                assert p["bars"] and 0.0 <= p["u"] <= 1.0 and 0.0 <= p["accept_prob"] <= 1.0
                assert (p["u"] < p["accept_prob"]) == (p["verdict"] == "accepted")
    assert second["measured"]["tokens"] > first["measured"]["tokens"]
    final = data_of(client.predict(**SETTINGS, api_name="/step_run"))
    assert final["finished"] and final["finish_reason"] in ("length", "eos")
    assert final["measured"]["tokens"] <= 8 and final["step"] >= 3
    # the same seed reproduces the run: a fresh reset and run to end give the same text
    client.predict(**SETTINGS, api_name="/step_reset")
    again = data_of(client.predict(**SETTINGS, api_name="/step_run"))
    assert again["text"] == final["text"] and again["step"] == final["step"]


def test_step_through_greedy_shows_the_argmax(client):
    settings = {**SETTINGS, "temperature": 0.0}
    client.predict(**settings, api_name="/step_reset")
    d = data_of(client.predict(**settings, api_name="/step_next"))
    for p in d["cycle"]["positions"]:
        if p["verdict"] == "accepted":
            assert p["target_argmax"] == p["text"] and p["u"] is None
        if p["verdict"] == "rejected":
            assert p["target_argmax"] != p["text"]


def test_step_bad_input_is_one_line_and_the_app_keeps_serving(client):
    out = client.predict(**{**SETTINGS, "max_new_tokens": 0}, api_name="/step_reset")
    assert "max_new_tokens=0 is out of range" in out[0] and "Traceback" not in out[0]
    out = client.predict(**{**SETTINGS, "draft": "./no/such-model"}, api_name="/step_reset")
    assert "does not exist" in out[0]
    assert data_of(client.predict(**SETTINGS, api_name="/step_reset"))["step"] == 0


@pytest.mark.parametrize("method", ["pld", "medusa"])
def test_check_tab_produces_a_verdict_and_reports(client, method):
    """A quick check through the app: prompt lookup, and the shipped Medusa heads (drafting a chain, their
    sampling test conditioned on the prefill's token)."""
    out = client.predict(target="smollm2-135m", method=method, draft="int8", gamma="3", temperature=1.0, samples=20,
                         prompts=1, max_new_tokens=8, api_name="/check")
    verdict, figures, *plots, json_file, html_file = out
    assert "correct" in verdict and "sv-verdict-ok" in verdict
    assert "greedy identity" in figures and "1/1" in figures
    assert "copies? repeats / new" in figures  # the first draft where the answer repeats its context, and elsewhere
    assert ("tokens are among its 8192" in figures) == (method == "medusa")  # a compressed draft vocabulary
    assert sum(p is not None for p in plots) >= 2
    data = json.loads(Path(json_file).read_text())
    assert data["method"] == method and data["fidelity"]["samples"] == 20 and data["verdict"] in verdict
    assert (data["fidelity"]["given"] is None) == (method == "pld")
    page = Path(html_file).read_text()
    assert page.startswith("<!doctype html>") and data["verdict"].split(";")[0] in page


def test_check_tab_bad_values_are_one_line(client):
    from specviz.ui.check import run_check_ui

    # values the form's own limits would refuse, straight into the handler
    for kwargs, needle in [({"samples": 5}, "samples=5 is out of range"), ({"prompts": 9}, "prompts=9 is out of range"),
                           ({"method": "ar"}, "cannot be checked"), ({"temperature": 0}, "temperature=0")]:
        out = run_check_ui(**{"method": "pld", "prompts": 1, "max_new_tokens": 8, **kwargs},
                           progress=lambda *a, **k: None)
        assert needle in out[0] and out[-1] is None and "\n" not in out[0]
    out = client.predict(target="./no/such-model", method="pld", samples=20, prompts=1, max_new_tokens=8,
                         api_name="/check")
    assert "does not exist" in out[0] and "sv-verdict-bad" in out[0]


def test_roofline_panel_measures_this_machine(client):
    text, fig = client.predict(target="smollm2-135m", api_name="/roofline")
    plot = json.loads(fig["plot"])
    assert "tok/s ceiling" in plot["layout"]["title"]["text"]
    assert plot["data"][0]["x"] == ["1", "2", "4", "8", "16", "32"]
    assert "MB</b> here" in text and "T(8)/T(1)" in text
    bad, _ = client.predict(target="./no/such-model", api_name="/roofline")
    assert "sv-verdict-bad" in bad and "\n" not in bad
