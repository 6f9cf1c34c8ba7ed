"""The app through a real client: launch it in-process on a free port and call the named /race endpoint."""
from __future__ import annotations

import pytest

from specviz import hardware

gradio_client = pytest.importorskip("gradio_client")

PROMPT = "Name three primary colours."
N = 24


@pytest.fixture(scope="module")
def client(app_url):
    return gradio_client.Client(app_url, verbose=False)


def test_race_endpoint_greedy_matches_plain_decoding(client):
    out = client.predict(prompt=PROMPT, max_new_tokens=N, api_name="/race")
    assert out["ar_text"].strip() and out["spec_text"].strip()
    assert out["spec_text"] == out["ar_text"]  # greedy speculative decoding is exact
    s = out["summary"]
    for key in ("speedup", "cost_ratio", "mean_gamma", "predicted_speedup", "identical", "first_divergence"):
        assert key in s
    assert s["identical"] is True and s["first_divergence"] is None
    assert s["ar"]["new_tokens"] == s["spec"]["new_tokens"] <= N
    assert s["ar"]["tau"] == 1.0 and s["spec"]["tau"] >= 1.0
    assert 0.0 <= s["spec"]["alpha"] <= 1.0
    assert s["speedup"] > 0 and s["predicted_speedup"] > 0 and s["cost_ratio"] > 0
    assert s["prediction_formula"] in ("tree: per-node acceptance", "Leviathan (chain)")
    what_if = out["what_if"]  # the race re-timed: this machine first, then each device's roofline bound
    assert what_if["rows"][0]["name"] == "this machine" and len(what_if["rows"]) > 1
    pair = hardware.default_pair()
    # this machine's default race
    assert out["config"]["method"] == pair.method and out["config"]["gamma"] == pair.gamma
    assert out["config"]["max_new_tokens"] == N


def test_race_endpoint_prompt_lookup(client):
    out = client.predict(prompt="Repeat exactly: one two three, one two three, one two three.", method="pld",
                         gamma="auto", max_new_tokens=N, api_name="/race")
    assert out["spec_text"] == out["ar_text"]
    assert out["summary"]["spec"]["method"] == "pld" and out["draft"] is None


@pytest.mark.parametrize("method", ["eagle", "medusa", "draft"])
def test_race_endpoint_trained_drafters(client, method):
    """The shipped EAGLE, Medusa and draft-model drafters through the app: identical to plain decoding, drafts
    accepted."""
    out = client.predict(prompt="Explain why the sky is blue.", method=method, max_new_tokens=N, api_name="/race")
    assert out["spec_text"] == out["ar_text"]
    s = out["summary"]
    assert s["identical"] is True and s["spec"]["method"] == method
    assert s["spec"]["accepted"] > 0 and s["spec"]["tau"] > 1.0 and out["draft"] is None  # drafts were kept
    assert out["config"]["gamma"] == hardware.default_pair().gamma_for(method)  # the method's measured γ
    assert out["config"]["lookup"] == hardware.default_pair().lookup_for(method)  # and prompt lookup's branch
    assert out["config"]["retrieve"] == hardware.default_pair().retrieve_for(method)  # and the datastore's


def test_race_endpoint_branches_on_and_off(client):
    """EAGLE with prompt lookup's and the datastore's branches on its tree, with one of them, and without: all
    identical to plain decoding."""
    prompt = "Repeat exactly: red apple, green pear, red apple, green pear, red apple."
    for lookup, retrieve in (("4", "4"), ("0", "6"), ("0", "0")):
        out = client.predict(prompt=prompt, method="eagle", lookup=lookup, retrieve=retrieve, max_new_tokens=N,
                             api_name="/race")
        assert out["spec_text"] == out["ar_text"]
        assert (out["config"]["lookup"], out["config"]["retrieve"]) == (int(lookup), int(retrieve))


@pytest.mark.parametrize("kwargs, needle", [
    ({"gamma": "0"}, "gamma"),
    ({"top_p": 0.0}, "top_p"),
    ({"method": "ar"}, "speculative method"),
    ({"method": "pld", "lookup": "3"}, "lookup=3 applies to the tree drafters only"),
    ({"method": "eagle", "retrieve": "x"}, "retrieve"),
    ({"prompt": "   "}, "prompt is empty"),
    ({"method": "vanilla", "draft": "./no/such-model"}, "does not exist"),
])
def test_bad_input_is_a_readable_error_and_the_app_keeps_serving(client, kwargs, needle):
    with pytest.raises(Exception) as info:
        client.predict(**{"prompt": PROMPT, "max_new_tokens": 4, **kwargs}, api_name="/race")
    assert needle in str(info.value)


def test_streaming_endpoint_yields_updates_and_a_final_summary(client):
    job = client.submit(PROMPT, "vanilla", "int8", "4", 0.0, 1.0, N, 0, "0", "0", api_name="/race_stream")
    outputs = list(job)  # every streamed update
    assert len(outputs) >= 2  # the loading/first-token update, then the final state
    final = job.outputs()[-1]
    status, pane_ar, pane_spec, summary = final[:4]
    assert 'data-state="done"' in pane_ar and 'data-state="done"' in pane_spec
    assert 'data-verdict="accepted"' in pane_spec and 'data-verdict="plain"' in pane_ar
    assert "identical to plain decoding" in summary
