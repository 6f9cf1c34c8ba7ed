"""ZeroGPU: with a stand-in `spaces` module and SPACES_ZERO_GPU=1 the app wraps its model-running handlers in
spaces.GPU with durations from the policy caps, and still serves /race; without the variable nothing is wrapped
and `spaces` is never imported. The stand-in records (function name, duration) and wraps like spaces does
(a generator function stays a generator function)."""
from __future__ import annotations

import pickle
import sys
import textwrap

import pytest
from conftest import serving

from specviz import zerogpu
from specviz.config import DecodeConfig
from specviz.policy import Policy
from specviz.ui import teach

gradio_client = pytest.importorskip("gradio_client")
import app  # noqa: E402  (gradio first: it imports `spaces` itself when it can, and then never again)

STAND_IN = textwrap.dedent('''
    """A stand-in for Hugging Face's `spaces` package: GPU(fn, duration=...) records the call and wraps fn."""
    import functools
    import inspect

    CALLS = []


    def GPU(task=None, *, duration=None, size=None):
        if task is None:
            return lambda fn: GPU(fn, duration=duration, size=size)
        CALLS.append((task.__name__, duration))
        if inspect.isgeneratorfunction(task):
            @functools.wraps(task)
            def wrapper(*args, **kwargs):
                yield from task(*args, **kwargs)
        else:
            @functools.wraps(task)
            def wrapper(*args, **kwargs):
                return task(*args, **kwargs)
        wrapper.zerogpu_duration = duration
        return wrapper
''')
MODEL_HANDLERS = {"run_race", "race_api", "run_many", "many_api", "run_check_ui", "step_reset", "step_next", "step_run"}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """`spaces` importable from a temporary folder (and not imported yet); forgotten again afterwards."""
    (tmp_path / "spaces.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("spaces", None)
    for name in (zerogpu.ENV, "SPECVIZ_PUBLIC", "SPACE_ID", "SPECVIZ_MAX_RUN_SECONDS", "SPECVIZ_MAX_NEW_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    sys.modules.pop("spaces", None)


def wrapped_handlers(demo) -> dict[str, object]:
    """{handler name: its duration} for the app's handlers that went through spaces.GPU."""
    return {f.fn.__name__: f.fn.zerogpu_duration for f in demo.fns.values() if hasattr(f.fn, "zerogpu_duration")}


def test_durations_come_from_the_policy_caps(monkeypatch):
    public = Policy(public=True, max_new_tokens=256, max_run_seconds=120)
    assert zerogpu.run_duration(public) == 120 + zerogpu.SETUP_S
    assert zerogpu.run_duration(Policy(public=True, max_new_tokens=256, max_run_seconds=60)) == 60 + zerogpu.SETUP_S
    assert zerogpu.run_duration(Policy()) == zerogpu.UNCAPPED_RUN_S + zerogpu.SETUP_S  # private: no cap set
    # a check: prompts × tokens plus one step per seed, at the cap's rate (120 s for 256 tokens)
    assert zerogpu.check_duration(3, 200, 32, public) == 30 + 139  # ceil(30 + 120 / 256 × 296)
    assert zerogpu.check_duration(6, 2000, 256, public) > zerogpu.check_duration(3, 200, 32, public)
    monkeypatch.setenv("SPECVIZ_PUBLIC", "1")
    monkeypatch.setenv("SPECVIZ_MAX_RUN_SECONDS", "90")
    assert zerogpu.run_duration() == 90 + zerogpu.SETUP_S


def test_without_the_variable_nothing_is_wrapped_and_spaces_is_not_imported(stand_in):
    assert not zerogpu.enabled() and not zerogpu.activate()
    demo = app.build_ui()
    assert wrapped_handlers(demo) == {} and "spaces" not in sys.modules
    stand_in.setenv(zerogpu.ENV, "0")
    assert not zerogpu.enabled()


def test_with_zero_gpu_the_model_handlers_are_wrapped(stand_in):
    from specviz.ui import check as check_tab

    stand_in.setenv(zerogpu.ENV, "1")
    assert zerogpu.activate() and "spaces" in sys.modules
    demo = app.build_ui()
    durations = wrapped_handlers(demo)
    assert set(durations) == MODEL_HANDLERS  # the plots' and the tree slider's handlers run no model
    run = zerogpu.run_duration()
    assert {name: durations[name] for name in MODEL_HANDLERS - {"run_check_ui"}} == dict.fromkeys(
        MODEL_HANDLERS - {"run_check_ui"}, run)
    check = durations["run_check_ui"]  # sized per call, from the handler's own arguments
    assert check is check_tab.check_gpu_seconds
    assert check("smollm2-135m", "vanilla", "int8", "4", 1.0, 200, 3, 32, None) == zerogpu.check_duration(3, 200, 32)
    assert check(samples=10**6, prompts="x") == zerogpu.check_duration(6, check_tab.CHECK_SAMPLES_MAX, 32)
    assert sorted(sys.modules["spaces"].CALLS) == sorted((name, durations[name]) for name in MODEL_HANDLERS)


def test_race_through_gradio_client_on_zero_gpu(stand_in, target):
    """The wrapped /race still answers, and greedy speculative decoding equals plain decoding."""
    stand_in.setenv(zerogpu.ENV, "1")
    zerogpu.activate()
    with serving(app.build_ui()) as url:
        out = gradio_client.Client(url, verbose=False).predict(prompt="Name three primary colours.", method="vanilla",
                                                                 max_new_tokens=16, api_name="/race")
    assert out["ar_text"].strip() and out["spec_text"] == out["ar_text"]
    assert out["summary"]["identical"] is True and out["draft"] == "int8"
    assert out["hardware"].startswith("CPU (") and out["hardware"].endswith(("fp32", "bf16"))


def test_a_step_through_session_pickles_as_its_recipe(target):
    """ZeroGPU pickles handler arguments and results: a session travels as (settings, steps), never its models,
    and resumes draw for draw."""
    cfg = DecodeConfig(method="pld", max_new_tokens=12, temperature=1.0, seed=5)
    session = teach.start("Repeat: one two three, one two three.", cfg, "smollm2-135m", "int8")
    teach.advance(session)
    teach.advance(session)
    data = pickle.dumps(session)
    assert len(data) < 10_000  # no weights, no KV cache
    replay = pickle.loads(data)
    assert isinstance(replay, teach.Replay) and replay.steps == 2
    assert replay.measured() == session.measured()
    resumed = teach.resume(replay)
    assert resumed.token_ids == session.token_ids and len(resumed.events) == 2
    teach.advance(session)
    teach.advance(resumed)
    assert resumed.token_ids == session.token_ids
    assert teach.resume(session) is session


def test_step_handlers_take_a_session_that_crossed_a_process(target):
    """What ZeroGPU does between clicks: the state comes back pickled; the next step continues the same run."""
    from specviz.ui import step

    settings = dict(prompt="Repeat: one two three, one two three.", method="pld", draft="", gamma="4",
                    temperature=1.0, seed=5, max_new_tokens=12, alpha=0.7, c=0.1)
    live = step.step_next(**settings, session=step.step_reset(**settings)[0])[0]
    travelled = pickle.loads(pickle.dumps(live))
    assert isinstance(travelled, teach.Replay)
    assert step.step_theory(travelled, 0.7, 0.1) is not None  # the theory plot reads the recipe's measurements
    after_travel, after_live = (step.step_next(**settings, session=s) for s in (travelled, live))
    assert "⚠" not in after_travel[1] and after_travel[6]["step"] == after_live[6]["step"] == 2
    assert after_travel[6]["text"] == after_live[6]["text"]
