"""`python app.py` answers before its models are ready: started as a subprocess on a free port with an empty
calibration cache, its page shows the start-up's progress while the models load and the machine is measured, and a
race run before that ends completes, saying it ran the shipped default; then the machine's calibration is kept.
A browser test (headless Chromium) that loads the real model in the subprocess. No timing assertions: the deadlines
below only bound a hang."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 600  # a hang, not a speed target: loading and measuring take minutes on a busy 2-core CPU


def wait_for(check, what: str, proc: subprocess.Popen, deadline_s: float = DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"app.py exited ({proc.returncode}) while waiting for {what}")
        got = check()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"no {what} within {deadline_s} s")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def started_app(tmp_path_factory):
    """app.py in a subprocess on a free port, its calibration cache an empty folder; yields (url, cache, log)."""
    cache = tmp_path_factory.mktemp("calibration")
    log = cache.parent / "app.log"
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "SPECVIZ_CALIBRATION_DIR": str(cache),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("SPECVIZ_CALIBRATE", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_for(lambda: answers(url), "answer on the port", proc)
        yield url, cache, log, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_page_shows_progress_and_an_early_race_runs_the_shipped_default(started_app, browser):
    from gradio_client import Client

    url, cache, log, proc = started_app
    assert "models ready" not in log.read_text()
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(url)
        line = page.locator("#startup-line")
        line.wait_for(timeout=120_000)
        first = line.inner_text()
        assert line.get_attribute("data-done") == "false", first  # shown before the models are ready
        assert "loading" in first or "measuring" in first, first
        assert "models ready" not in log.read_text()

        client = Client(url, verbose=False)
        result = client.predict(prompt="Why is the sky blue?", max_new_tokens=16, api_name="/race")
        assert result["spec_text"] and result["ar_text"] and result["summary"]  # the race completed
        assert result["note"].startswith("ran the shipped default"), result["note"]

        wait_for(lambda: line.get_attribute("data-done") == "true", "ready line", proc)
        ready = line.inner_text()
        assert "ready: this machine races" in ready and "measured now" in ready, ready
        # the page names the race Run now starts: the empty speculative pane's title follows the machine's race, on
        # this page (open since before ready) and on one opened now
        title = f"Speculative ({ready.split('ready: this machine races ', 1)[1].split(' (', 1)[0]})"
        fresh = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            fresh.goto(url)
            for shown in (page, fresh):
                shown.locator("#pane-spec").get_by_text(title, exact=True).wait_for(timeout=30_000)
        finally:
            fresh.close()
        assert list(cache.glob("calibration-*.json")), "the calibration was not kept"
        after = client.predict(prompt="Why is the sky blue?", max_new_tokens=8, api_name="/race")
        assert after["note"] == ""  # once ready, the machine's own race, nothing to say
    finally:
        page.close()
