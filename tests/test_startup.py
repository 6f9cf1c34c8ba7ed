"""This machine's calibration kept per machine (specviz/calibration.py) and the app's start-up in the background
(specviz/ui/startup.py): the cache's key, validation and invalidation, SPECVIZ_CALIBRATE, and the race run before the
machine is measured. No model: a stand-in target and the test profiles of test_tuning."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from specviz import calibration, hardware, tuning
from specviz.config import DecodeConfig
from specviz.core import profile as core_profile
from specviz.errors import ConfigError
from specviz.ui import startup
from specviz.ui.race_views import View
from tests.test_tuning import FAST, FLAT_COSTS, SLOW

GB = 1e9


class Target:
    """What calibration reads of a loaded target."""

    def __init__(self, name="smollm2-135m"):
        self.model = torch.nn.Module()  # weak-referenceable, as the profiles are kept with the model
        self.name, self.device, self.dtype, self.attention = name, torch.device("cpu"), torch.bfloat16, "fused"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A temporary cache folder, SPECVIZ_CALIBRATE unset, a fixed bandwidth read and no settled outcome."""
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(calibration.ENV, raising=False)
    monkeypatch.setattr(calibration, "quick_bandwidth", lambda device="cpu": 10 * GB)
    calibration.forget()
    yield tmp_path / "cache"
    calibration.forget()


def kept(key, bandwidth=10 * GB, profile=FAST, costs=FLAT_COSTS) -> calibration.Calibration:
    return calibration.Calibration(key, profile, costs, bandwidth, "2026-12-06 10:00")


@pytest.mark.parametrize("raw, expected", [(None, "auto"), ("", "auto"), ("0", "never"), ("1", "always"),
                                           (" 1 ", "always")])
def test_the_env_var_picks_the_mode(monkeypatch, raw, expected):
    if raw is not None:
        monkeypatch.setenv(calibration.ENV, raw)
    assert calibration.mode() == expected


@pytest.mark.parametrize("raw", ["2", "yes", "true", "-1", "on"])
def test_a_bad_env_var_is_one_line_naming_it(monkeypatch, raw):
    monkeypatch.setenv(calibration.ENV, raw)
    with pytest.raises(ConfigError) as err:
        calibration.mode()
    message = str(err.value)
    assert f"SPECVIZ_CALIBRATE={raw!r}" in message and "0" in message and "1" in message and "\n" not in message
    with pytest.raises(ConfigError):  # the CLI and the app reach it through hardware.adopt's calibration
        calibration.calibrate(Target())


def test_the_cache_folder_follows_the_env(monkeypatch, tmp_path):
    assert calibration.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv(calibration.DIR_ENV)
    monkeypatch.delenv("SPECVIZ_CACHE_DIR", raising=False)  # conftest points the session's cache at a temporary one
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert calibration.cache_dir() == tmp_path / "xdg" / "specviz"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert calibration.cache_dir() == tmp_path / "home" / ".cache" / "specviz"


def test_the_key_names_what_moves_the_figures():
    key = calibration.machine_key(Target())
    for field in ("cpu", "kernels", "kernel_sources", "cores", "threads", "torch", "target", "dtype", "attention"):
        assert field in key, field
    assert key["torch"] == torch.__version__ and key["target"] == "smollm2-135m" and key["dtype"] == "bfloat16"
    assert calibration.machine_key(Target()) == key  # the same machine, the same key
    assert calibration.machine_key(Target("another-model")) != key


def test_a_kept_calibration_round_trips():
    key = calibration.machine_key(Target())
    assert calibration.load(key)[0] is None
    assert "kept in" in calibration.store(kept(key))
    got, why = calibration.load(key, lambda: 10 * GB)
    assert got is not None and "2026-12-06" in why
    assert got.profile == FAST and got.costs == FLAT_COSTS and got.key == key


@pytest.mark.parametrize("field, value", [("cpu", "Another CPU"), ("kernels", "C row kernels, another build"),
                                          ("cores", 64), ("torch", "9.9.9"), ("target", "other"), ("threads", 64)])
def test_another_machine_build_or_target_finds_nothing_kept(field, value):
    key = calibration.machine_key(Target())
    calibration.store(kept(key))
    other = {**key, field: value}
    assert calibration.load(other, lambda: 10 * GB)[0] is None
    assert calibration.load(key, lambda: 10 * GB)[0] is not None


def test_a_file_whose_key_differs_is_refused_naming_the_field():
    key = calibration.machine_key(Target())
    path = calibration.path_for(key)
    calibration.store(kept(key))
    d = json.loads(path.read_text())
    d["key"]["cpu"] = "Another CPU"
    path.write_text(json.dumps(d))
    got, why = calibration.load(key, lambda: 10 * GB)
    assert got is None and "another cpu" in why


@pytest.mark.parametrize("now, valid", [(10 * GB, True), (6 * GB, True), (19 * GB, True), (4 * GB, False),
                                        (25 * GB, False)])
def test_the_bandwidth_must_agree_within_the_factor(now, valid):
    key = calibration.machine_key(Target())
    calibration.store(kept(key, bandwidth=10 * GB))
    got, why = calibration.load(key, lambda: now)
    assert (got is not None) == valid, why
    if not valid:
        assert "GB/s" in why


def test_an_unreadable_file_is_measured_again():
    key = calibration.machine_key(Target())
    path = calibration.path_for(key)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    got, why = calibration.load(key, lambda: 10 * GB)
    assert got is None and "unreadable" in why


def test_an_unwritable_cache_is_one_line_and_no_error(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(calibration.DIR_ENV, str(blocker / "sub"))
    assert calibration.store(kept(calibration.machine_key(Target()))).startswith("not kept")


@pytest.fixture
def measured(monkeypatch):
    """calibration.measure stood in: counts its calls and returns the SLOW profile's figures."""
    calls = []

    def measure(target, say):
        calls.append(target)
        say("measuring this machine: T(k) 9/9…")
        return calibration.Calibration(calibration.machine_key(target), SLOW, FLAT_COSTS, 10 * GB, "2026-12-06 11:00")

    monkeypatch.setattr(calibration, "measure", measure)
    return calls


def test_unset_measures_once_then_a_restart_reuses_the_kept_one(measured):
    target = Target()
    first = calibration.calibrate(target)
    assert first.source == "measured" and len(measured) == 1 and "kept in" in first.line
    assert first.choice == tuning.choose(tuning.load_grid("smollm2-135m"), SLOW, FLAT_COSTS)
    assert calibration.calibrate(target) is first and len(measured) == 1  # settled once per process
    calibration.forget()  # a restart
    again = Target()
    second = calibration.calibrate(again)
    assert second.source == "kept" and len(measured) == 1 and second.choice == first.choice
    assert core_profile.profile_of(again, measure=False) == SLOW  # the summary's prediction reads the kept T(k)


def test_calibrate_1_always_measures(monkeypatch, measured):
    calibration.calibrate(Target())
    calibration.forget()
    monkeypatch.setenv(calibration.ENV, "1")
    assert calibration.calibrate(Target()).source == "measured" and len(measured) == 2


def test_calibrate_0_never_measures(monkeypatch, measured):
    monkeypatch.setenv(calibration.ENV, "0")
    none = calibration.calibrate(Target())
    assert none.choice is None and none.source == "shipped" and not measured
    assert none.line.startswith("SPECVIZ_CALIBRATE=0") and "shipped defaults" in none.line
    calibration.forget()
    calibration.store(kept(calibration.machine_key(Target())))
    assert calibration.calibrate(Target()).source == "kept" and not measured  # a valid kept one is still used


def test_a_target_without_a_grid_keeps_its_defaults(measured):
    outcome = calibration.calibrate(Target("no-grid-model"))
    assert outcome.choice is None and outcome.source == "none" and not measured


def test_adopt_takes_the_kept_race_for_the_pair(monkeypatch):
    monkeypatch.setattr(hardware, "_tuned", {})
    from specviz.models import loader as models

    target = Target()
    target.dtype = models.default_dtype(target.device)  # the app's dtype: the grid prices it
    calibration.store(kept(calibration.machine_key(target), profile=SLOW))
    line = hardware.adopt(target)
    expected = tuning.choose(tuning.load_grid("smollm2-135m"), SLOW, FLAT_COSTS)
    assert line.startswith(f"default race {expected.race}") and "calibration of 2026-12-06" in line
    assert hardware.default_pair(target.device).race() == expected.race


# ── the start-up in the background ─────────────────────────────────────────────────────────────────────

def test_a_race_before_the_machine_is_measured_says_it_runs_the_shipped_default(monkeypatch):
    monkeypatch.setattr(hardware, "_tuned", {})
    state = startup.Startup()
    pair = hardware.default_pair()
    shipped = DecodeConfig(method=pair.method, gamma=pair.gamma, lookup=pair.lookup_for(pair.method),
                           retrieve=pair.retrieve_for(pair.method))
    assert startup.default_note(shipped, state) == ""  # no start-up in the background (an in-process app)
    state.begun = True
    note = startup.default_note(shipped, state)
    assert note.startswith(f"ran the shipped default {pair.race()}") and "still being measured" in note
    assert startup.default_note(shipped.with_(method="pld", gamma=2, lookup=0, retrieve=0), state) == ""
    views = list(startup.noted(iter([View("<div>Racing…</div>", "", "", "")]), note, state))
    assert "Racing…" in views[0].status and "ran the shipped default" in views[0].status
    state.done = True
    assert startup.default_note(shipped, state) == ""


def test_the_measurement_waits_while_a_race_runs():
    state = startup.Startup()
    said = threading.Event()

    def measure():
        state.say("measuring this machine: T(k) 3/9…")
        said.set()

    race = state.racing()
    race.__enter__()
    thread = threading.Thread(target=measure, daemon=True)
    thread.start()
    assert not said.wait(0.3) and "paused while a race runs" in state.line
    race.__exit__(None, None, None)
    assert said.wait(10) and state.line == "measuring this machine: T(k) 3/9…"
    state.say("loading the model…")  # loading never waits


def test_the_progress_line_and_a_failed_start_up():
    state = startup.Startup()
    assert startup.line_html(state) == ""
    done = threading.Event()

    def work(say):
        say("loading the model smollm2-135m…")
        raise RuntimeError("no weights")

    state.begin(work, after=done.set).join(10)
    assert state.done and state.failed and done.wait(10)
    line = startup.line_html(state)
    assert "⚠" in line and "start-up failed (RuntimeError" in line and "shipped default" in line


def test_the_app_refuses_a_bad_env_var_in_one_line_before_loading(monkeypatch, capsys):
    import app

    monkeypatch.setenv(calibration.ENV, "yes")
    monkeypatch.setattr(app, "build_ui", lambda: pytest.fail("the app went on to build"))
    with pytest.raises(SystemExit) as done:
        app.main()
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and err.startswith("specviz: SPECVIZ_CALIBRATE='yes'") and "\n" not in err
