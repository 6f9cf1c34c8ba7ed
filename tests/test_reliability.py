"""Reliability of the served app: many sessions at once, Stop, faults and hostile input, public mode.

Everything goes through the real client (gradio_client) or a real browser against the app launched
in-process (tests/conftest.py `app_url`), so in-process monkeypatches (a failing engine, public mode) reach
the server. Runs are short (max_new_tokens 4-8) so the file stays fast on two CPU cores.
"""
from __future__ import annotations

import os
import pickle
import re
import threading
import time
from pathlib import Path

import pytest
import torch

from specviz import engines
from specviz.models import drafts
from specviz.models import loader as models
from specviz.ui.logic import make_config

gradio_client = pytest.importorskip("gradio_client")
from gradio_client.utils import Status  # noqa: E402

N = 8
GOOD = "Name three primary colours."
# what must never reach a user: a traceback, a server path
LEAKS = re.compile(r"Traceback|File \"|site-packages|/work/|/tmp/|/home/|/usr/|\.py\b")


def race(client, **kwargs) -> dict:
    """/race; a run naming a draft model is a vanilla run (the CPU's default race, EAGLE, has none)."""
    method = {"method": "vanilla"} if "draft" in kwargs else {}
    return client.predict(**{"prompt": GOOD, "max_new_tokens": N, **method, **kwargs}, api_name="/race")


def race_error(client, **kwargs) -> str:
    """The one-line message of a run that must fail (gr.Error reaches the client as AppError)."""
    with pytest.raises(Exception) as info:
        race(client, **kwargs)
    message = str(info.value)
    assert not LEAKS.search(message), message
    return message


def assert_serving(client) -> None:
    out = race(client, max_new_tokens=4)
    assert out["ar_text"].strip() and out["spec_text"] == out["ar_text"]


def plain_text(target, prompt: str, cfg) -> str:
    """The AR lane's text for (prompt, cfg), computed here without the app."""
    run = engines.generate(engines.build("ar", target), target.encode_prompt(prompt), cfg.with_(method="ar"))
    return target.decode(run.token_ids)


@pytest.fixture(scope="module")
def client(app_url):
    return gradio_client.Client(app_url, verbose=False)


# --- many sessions at once ------------------------------------------------------------------------------

SESSIONS = [  # distinct prompts, seeds and settings; half of them sample
    dict(prompt="Why is the sky blue?", method="vanilla", temperature=0.0, seed=1),
    dict(prompt="Name a famous bridge in San Francisco.", method="vanilla", temperature=0.8, seed=22),
    dict(prompt="Repeat: red green blue, red green blue.", method="pld", temperature=0.0, seed=3),
    dict(prompt="Give one tip for sleeping well.", method="vanilla", temperature=1.0, seed=404),
    dict(prompt="What is 7 times 8?", method="pld", temperature=0.7, seed=5),
    dict(prompt="Write a two-word title for a sea shanty.", method="vanilla", temperature=0.0, seed=66),
    dict(prompt="Which planet is called the red planet?", method="vanilla", temperature=1.2, seed=7),
    dict(prompt="Translate 'good morning' into Spanish.", method="pld", temperature=0.0, seed=888),
]


def test_eight_concurrent_sessions_each_get_their_own_results(app_url, target):
    results: dict[int, dict] = {}
    ranks: dict[int, int] = {}
    errors: list[BaseException] = []

    def session(i: int, asked: dict) -> None:
        try:
            c = gradio_client.Client(app_url, verbose=False)
            job = c.submit(**asked, gamma="4", max_new_tokens=N, api_name="/race")
            ranks[i] = -1
            while not job.done():
                st = job.status()
                if st.code == Status.IN_QUEUE and st.rank is not None:
                    ranks[i] = max(ranks[i], st.rank)
                time.sleep(0.02)
            results[i] = job.result()
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=session, args=(i, s)) for i, s in enumerate(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    wall = time.perf_counter() - t0
    print(f"\n8 concurrent sessions finished in {wall:.1f} s; highest queue rank seen per session: {ranks}")
    assert not errors, errors
    assert sorted(results) == list(range(len(SESSIONS)))
    assert max(ranks.values()) > 0  # the queue told waiting sessions their position

    for i, asked in enumerate(SESSIONS):
        out = results[i]
        cfg = make_config(asked["method"], "4", asked["temperature"], 1.0, N, asked["seed"])
        for key in ("method", "temperature", "seed", "max_new_tokens"):
            assert out["config"][key] == cfg.to_dict()[key], (i, key)
        # no cross-talk: each session's plain lane is exactly what its own prompt and seed give
        assert out["ar_text"] == plain_text(target, asked["prompt"], cfg), i
        if cfg.greedy:
            assert out["spec_text"] == out["ar_text"], i
    # a sampled speculative lane is reproduced by its seed alone
    from specviz.ui.logic import race_result
    i = 1
    cfg = make_config(SESSIONS[i]["method"], "4", SESSIONS[i]["temperature"], 1.0, N, SESSIONS[i]["seed"])
    assert race_result(SESSIONS[i]["prompt"], cfg)["spec_text"] == results[i]["spec_text"]

    # memory stays bounded: each model once, the int8 copy once
    assert len(models._cache) <= models.CACHE_SIZE
    # (other tests of the session may have loaded the target in another dtype or with another attention, such as
    # the sdpa control of the bitwise tests: count the app's own, the default attention)
    assert sum(1 for key in models._cache if key == ("smollm2-135m", "cpu", str(target.dtype), None)) == 1
    assert target.model in drafts._int8_copies
    assert len(drafts._int8_copies) <= sum(1 for key in models._cache if key[0] == "smollm2-135m")


# --- Stop -----------------------------------------------------------------------------------------------

def stream_args(prompt: str, max_new_tokens: int) -> tuple:
    return (prompt, "vanilla", "int8", "4", 0.0, 1.0, max_new_tokens, 0, "0", "0")


def test_stop_cancels_within_a_second_and_frees_the_worker(app_url, target):
    a, b = gradio_client.Client(app_url, verbose=False), gradio_client.Client(app_url, verbose=False)
    long_job = a.submit(*stream_args("Tell me a long story about a dragon.", 1000), api_name="/race_stream")
    deadline = time.time() + 120
    while len(long_job.outputs()) < 3 and time.time() < deadline:  # it is racing, tokens are streaming
        time.sleep(0.05)
    assert len(long_job.outputs()) >= 3 and not long_job.done()
    next_job = b.submit(prompt=GOOD, max_new_tokens=N, api_name="/race")  # waits behind the long run
    time.sleep(0.3)
    assert next_job.status().code == Status.IN_QUEUE

    t_cancel = time.perf_counter()
    long_job.cancel()
    while next_job.status().code in (Status.IN_QUEUE, Status.JOINING_QUEUE, Status.STARTING):
        time.sleep(0.01)
    free_s = time.perf_counter() - t_cancel
    out = next_job.result(timeout=120)
    n_at_cancel = len(long_job.outputs())
    time.sleep(1.0)
    print(f"\nStop -> next job being served: {free_s:.2f} s")
    assert free_s < 1.5
    assert len(long_job.outputs()) == n_at_cancel  # no more updates for the stopped session
    # the other session is untouched: its own prompt, exact greedy output
    assert out["ar_text"] == plain_text(target, GOOD, make_config(max_new_tokens=N))
    assert out["spec_text"] == out["ar_text"]
    assert_serving(b)


# --- faults ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broken_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("broken")
    (folder / "config.json").write_text("{ this is not json")
    return folder


def test_model_load_failures_are_readable_and_the_app_keeps_serving(client, broken_folder, monkeypatch):
    assert "does not exist" in race_error(client, draft="./no/such-model")
    assert "is unknown" in race_error(client, draft="not a model")
    message = str(pytest.raises(Exception, race, client, draft=str(broken_folder)).value)
    assert "could not load model" in message and "not a valid JSON" in message and "Traceback" not in message
    assert_serving(client)

    def load_crashes(spec, *args, **kwargs):  # a failure that is not a ModelError, with a path inside
        raise KeyError(f"/secret/server/path/{spec}")

    monkeypatch.setattr(models, "load", load_crashes)
    message = race_error(client, draft="org/unlucky-model")
    assert "the run failed while loading the models (KeyError); the app is still serving" in message
    assert "secret" not in message
    monkeypatch.undo()
    assert_serving(client)


def failing_steps(original, after: int):
    """An engine's steps() that yields `after` events and then raises, like a bug deep in an engine."""
    def steps(self, prompt_ids, cfg):
        for i, event in enumerate(original(self, prompt_ids, cfg)):
            if i == after:
                raise RuntimeError("CUDA-ish failure in /secret/engine/path.py line 42")
            yield event
    return steps


def break_engines(monkeypatch, after: int = 1) -> None:
    """Every run's engine fails after `after` steps: the chain drafters' and the tree drafters' (the CPU's default
    race)."""
    from specviz.engines.speculative import SpeculativeEngine
    from specviz.engines.tree import TreeEngine

    for engine in (SpeculativeEngine, TreeEngine):
        monkeypatch.setattr(engine, "steps", failing_steps(engine.steps, after=after))


def test_an_engine_exception_mid_run_is_one_line_and_logged(client, app_url, monkeypatch, caplog):
    break_engines(monkeypatch)
    message = race_error(client)
    assert "the run failed inside the engine (RuntimeError); the app is still serving — try again" in message
    assert "secret" not in message
    # the streaming UI endpoint: the run ends with the message in the status bar, tokens kept on screen
    job = client.submit(*stream_args(GOOD, N), api_name="/race_stream")
    job.result(timeout=120)
    statuses = [o[0] for o in job.outputs() if isinstance(o[0], str) and "sv-status" in o[0]]
    assert "sv-status-error" in statuses[-1] and "inside the engine (RuntimeError)" in statuses[-1]
    assert not LEAKS.search(statuses[-1]) and "secret" not in statuses[-1]
    # the server log keeps the whole story
    logged = [r for r in caplog.records if r.name == "specviz.app" and r.exc_info]
    assert logged and "secret/engine/path" in str(logged[-1].exc_info[1])
    monkeypatch.undo()
    assert_serving(client)


# --- bad input ------------------------------------------------------------------------------------------

class Exploit:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def other_tokenizer_draft(tmp_path_factory) -> Path:
    """A tiny Llama with its own 64-word WordLevel tokenizer, saved like a real model folder."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("wordlevel-draft")
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(61)]
    tok = Tokenizer(tok_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                 bos_token_id=1, eos_token_id=2)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def pickle_draft(tmp_path_factory, target) -> tuple[Path, Path]:
    """A model folder whose pytorch_model.bin runs a shell command when unpickled; and the marker it makes."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("pickle-draft")
    marker = folder.parent / "pickle-draft-ran"
    target.tokenizer.save_pretrained(folder)
    LlamaConfig(vocab_size=target.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(folder)
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"model.embed_tokens.weight": Exploit(marker)}, f, protocol=2)
    return folder, marker


WORKS = [
    pytest.param({"prompt": "🦜🔥 Explain 🌍 in one line 😊👍🏽"}, id="emoji"),
    pytest.param({"prompt": "ما هو لون السماء؟ ומה צבע הים?"}, id="right-to-left"),
    pytest.param({"prompt": "Hello\x00\x07\x1b[31m world\u202e\ufeff\u200b\r\n\tagain"}, id="control-chars"),
]


@pytest.mark.parametrize("kwargs", WORKS)
def test_unusual_text_works(client, kwargs):
    out = race(client, max_new_tokens=4, **kwargs)
    assert out["ar_text"] and out["spec_text"] == out["ar_text"]


REFUSED = [
    pytest.param({"prompt": ""}, "prompt is empty", id="empty-prompt"),
    pytest.param({"prompt": "x" * 100_000}, "prompt has 100000 characters: the limit is 16000", id="100k-prompt"),
    pytest.param({"gamma": "x"}, "gamma='x' is not valid", id="gamma-x"),
    pytest.param({"gamma": "99"}, "gamma=99 is out of range", id="gamma-99"),
    pytest.param({"temperature": -1}, "temperature=-1 is out of range", id="temperature--1"),
    pytest.param({"top_p": 0}, "top_p=0 is out of range", id="top_p-0"),
    pytest.param({"max_new_tokens": 0}, "max_new_tokens=0 is out of range", id="max_new_tokens-0"),
    pytest.param({"max_new_tokens": 10**6}, "max_new_tokens=1000000 is out of range", id="max_new_tokens-1e6"),
    pytest.param({"seed": "abc"}, "seed='abc' is not a number", id="seed-abc"),
    pytest.param({"method": "magic"}, "method='magic' is not a speculative method", id="method-unknown"),
    pytest.param({"draft": "gpt-17"}, "model spec 'gpt-17' is unknown", id="model-unknown"),
]


@pytest.mark.parametrize("kwargs, needle", REFUSED)
def test_bad_input_gets_its_message(client, kwargs, needle):
    message = race_error(client, **kwargs)
    assert needle in message
    assert "\n" not in message.strip()


def test_draft_with_another_tokenizer_names_both(client, other_tokenizer_draft):
    message = str(pytest.raises(Exception, race, client, draft=str(other_tokenizer_draft)).value)
    assert "draft tokenizer" in message and "target tokenizer" in message
    assert other_tokenizer_draft.name in message and "'smollm2-135m' (49152 tokens)" in message
    assert "(64 tokens)" in message


def test_pickle_drafter_is_refused_without_running_it(client, pickle_draft):
    folder, marker = pickle_draft
    message = str(pytest.raises(Exception, race, client, draft=str(folder)).value)
    assert "refused" in message and "pickled code" in message and "use safetensors" in message
    assert not marker.exists()  # the payload never ran
    assert_serving(client)


def test_no_session_sees_another_sessions_data(client):
    secret = "The password of session A is PARROT-7731."
    race(client, prompt=secret, max_new_tokens=4)
    for kwargs in ({"gamma": "x"}, {"draft": "gpt-17"}, {"prompt": ""}):
        assert "PARROT" not in race_error(client, **kwargs)
    out = race(client, max_new_tokens=4)
    assert "PARROT" not in out["ar_text"] + out["spec_text"]


# --- public mode ----------------------------------------------------------------------------------------

def test_public_mode_refuses_paths_and_unlisted_models_without_echoing_paths(client, pickle_draft, broken_folder,
                                                                             monkeypatch):
    monkeypatch.setenv("SPECVIZ_PUBLIC", "1")
    for draft in (str(pickle_draft[0]), "./models/mine", "~/secret-model", "someone/unlisted-model"):
        message = race_error(client, draft=draft)
        assert "is not available here: use one of" in message, message
    job = client.submit(*stream_args(GOOD, N)[:2], str(broken_folder), *stream_args(GOOD, N)[3:],
                        api_name="/race_stream")
    job.result(timeout=60)
    assert "is not available here" in job.outputs()[-1][0] and str(broken_folder) not in job.outputs()[-1][0]
    # an operator allow-lists a folder that then fails to load: the message still names no path
    monkeypatch.setenv("SPECVIZ_ALLOWED_MODELS", f"smollm2-135m,int8,{broken_folder}")
    message = race_error(client, draft=str(broken_folder))
    assert "could not load model '<path>'" in message and "not a valid JSON" in message
    assert race(client, max_new_tokens=4)["spec_text"]  # the allow-listed default still runs
    monkeypatch.setenv("SPECVIZ_MAX_NEW_TOKENS", "16")
    assert "max_new_tokens=17 is above the limit here" in race_error(client, max_new_tokens=17)


# --- the same in a real browser -------------------------------------------------------------------------

def test_browser_engine_fault_then_the_next_run_works(app_url, browser, monkeypatch):
    from tests.browser_kit import set_number

    break_engines(monkeypatch)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.wait_for_selector("#run")
    page.wait_for_timeout(2_500)  # the start-up line's first ticks may move the form to this machine's race: let them
    set_number(page, "max-new-tokens", N)
    page.locator("#run").click()
    page.wait_for_selector("#status .sv-status-error", timeout=60_000)
    status = page.locator("#status").inner_text()
    assert "the run failed inside the engine (RuntimeError); the app is still serving" in status
    assert not LEAKS.search(status) and "secret" not in status
    assert "Traceback" not in page.content()
    monkeypatch.undo()
    set_number(page, "max-new-tokens", N)  # again: in the full suite the second run raced 128 (CI, twice; alone: 8)
    page.locator("#run").click()  # the same page, the next run
    page.wait_for_selector("#pane-spec .sv-pane-box[data-state=done]", timeout=60_000)
    page.wait_for_selector("#pane-ar .sv-pane-box[data-state=done]", timeout=60_000)  # speculation may finish first
    page.wait_for_selector("#summary .sv-badge", timeout=60_000)
    assert page.locator("#pane-ar [data-verdict=plain]").count() == N
    assert "identical to plain decoding" in page.locator("#summary").inner_text()
